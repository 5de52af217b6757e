"""A psfleet server is protected (issue 15, finding 2): token, storage roots, TLS.

Real servers on 127.0.0.1 over real gRPC (docs/security.md):

- Admin calls (Stop, Save, Load, CreateTable) and data calls without the token, or with
  a wrong one, are UNAUTHENTICATED and change nothing: the rows of a live table stay
  as they were, no file is written, no table created, the server keeps serving. The
  health check answers without a token.
- Save and Load outside the storage roots are PERMISSION_DENIED and write nothing,
  ``..`` traversal and a symbolic link out of a root included; the message names the
  folder, the roots and PSFLEET_STORAGE_ROOTS.
- A server without a token refuses to bind an address other machines reach.
- TLS: a TLS client works; a plaintext client is refused at once with a clear error
  naming PSFLEET_TLS_CA (also while waiting for the servers); mutual TLS refuses a
  client without a certificate, naming PSFLEET_TLS_CLIENT_CERT.
- The launcher's self-signed pair: key mode 0600, certificate for 127.0.0.1/localhost.
The launched jobs (generated token, TLS job end to end) are in test_security_jobs.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psfleet.errors import ConfigError
from psfleet.launch.tls import write_self_signed_pair
from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig, start_server
from psfleet.ps.service import TableService
from psfleet.rpc import RpcClient, RpcConfig, wait_servers_ready
from psfleet.rpc import messages as msg
from psfleet.rpc import psfleet_pb2_grpc as pb_grpc
from psfleet.rpc.access import StorageRoots, is_loopback, split_location
from psfleet.rpc.server import AUTH_METADATA_KEY
from psfleet.rpc.tls import TlsConfig

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
TOKEN = "the-job-token"
DIM = 4
KEYS = np.arange(1, 41, dtype=np.uint64)
SGD = RuleConfig(name="sgd", learning_rate=0.5)


def _config(**fields: object) -> RpcConfig:
    return RpcConfig(deadline_s=10.0, max_retries=1, backoff_initial_s=0.05,
                     server_threads=4, **fields)  # type: ignore[arg-type]


@contextlib.contextmanager
def _server(config: RpcConfig) -> Iterator[tuple[TableService, str]]:
    service, server = start_server(HOST, 0, config, TableService(barrier_timeout_s=1.0))
    try:
        yield service, server.endpoint
    finally:
        server.stop(grace_s=0.5)


@contextlib.contextmanager
def _client(endpoint: str, config: RpcConfig) -> Iterator[RemoteClient]:
    client = RemoteClient([endpoint], config)
    try:
        yield client
    finally:
        client.close()


def _status(endpoint: str, method: str, request: object,
            token: str | None) -> tuple[grpc.StatusCode, str]:
    """Call ``method`` over a plain channel with ``token`` (None: no metadata)."""
    metadata = () if token is None else ((AUTH_METADATA_KEY, token),)
    with grpc.insecure_channel(endpoint) as channel:
        stub = pb_grpc.ParameterServerStub(channel)
        try:
            getattr(stub, method)(request, timeout=10.0, metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _health(endpoint: str) -> int:
    with grpc.insecure_channel(endpoint) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5.0)
    return int(reply.status)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


# -- the token ----------------------------------------------------------------------------

def test_calls_without_or_with_a_wrong_token_are_unauthenticated_and_change_nothing(
        tmp_path: Path) -> None:
    config = _config(auth_token=TOKEN, storage_roots=(str(tmp_path),))
    with _server(config) as (service, endpoint), _client(endpoint, config) as client:
        client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD))
        client.pull_sparse(0, KEYS)
        saved = tmp_path / "saved"
        client.save(str(saved))  # the job's own save, authorised
        saved_files = _files(saved)
        client.push_sparse(0, KEYS, np.ones((KEYS.size, DIM), np.float32))
        rows = client.pull_sparse(0, KEYS, create=False)
        fresh = tmp_path / "fresh"
        calls = {
            "Stop": msg.StopRequest(worker_index=0),
            "Save": msg.SaveRequest(dirname=str(fresh), server_index=0),
            # A Load would put the saved rows (before the push) back.
            "Load": msg.LoadRequest(dirname=str(saved), server_index=0, server_num=1),
            "CreateTable": msg.CreateTableRequest(
                table_id=9, config_json=SparseTableConfig(name="x", dim=2).model_dump_json(),
                server_num=1),
            "PullSparse": msg.PullSparseRequest(table_id=0, keys=KEYS.tobytes(), create=True),
            "Stats": msg.StatsRequest(),
        }
        for token in (None, "", "wrong", TOKEN + "x", TOKEN[:-1]):
            for method, request in calls.items():
                code, details = _status(endpoint, method, request, token)
                assert code == grpc.StatusCode.UNAUTHENTICATED, (method, token, code)
                assert "PSFLEET_AUTH_TOKEN" in details and TOKEN not in details
        assert not service.stop_requested.is_set()
        assert not fresh.exists() and _files(saved) == saved_files
        assert sorted(service.tables) == [0]
        assert np.array_equal(client.pull_sparse(0, KEYS, create=False), rows)
        assert client.stats()[0].tables[0].rows == KEYS.size
        assert _health(endpoint) == health_pb2.HealthCheckResponse.SERVING  # no token needed
        # The same calls with the token do what they say.
        assert _status(endpoint, "Save", calls["Save"], TOKEN)[0] == grpc.StatusCode.OK
        assert "server-0" in _files(fresh)[0]
        assert _status(endpoint, "Stop", calls["Stop"], TOKEN)[0] == grpc.StatusCode.OK
        assert service.stop_requested.is_set()


def test_the_client_names_the_token_variable_when_refused() -> None:
    with _server(_config(auth_token=TOKEN)) as (_, endpoint):
        rpc = RpcClient(endpoint, _config(auth_token="guess"))
        try:
            with pytest.raises(ConfigError, match=r"Stop on server .* rejected: missing or "
                                                  r"wrong auth token \(set PSFLEET_AUTH_TOKEN"):
                rpc.call("Stop", msg.StopRequest())
        finally:
            rpc.close()


def test_a_server_without_a_token_serves_on_loopback_only() -> None:
    with pytest.raises(ConfigError, match=r"server on '0\.0\.0\.0' without PSFLEET_AUTH_TOKEN"
                                          r".*secrets\.token_urlsafe"):
        start_server("0.0.0.0", 0, _config())
    _, server = start_server("0.0.0.0", 0, _config(auth_token=TOKEN))
    server.stop(grace_s=0.1)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")


# -- storage roots ---------------------------------------------------------------------

def test_save_and_load_outside_the_roots_are_permission_denied_and_write_nothing(
        tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    (allowed / "link").symlink_to(outside, target_is_directory=True)
    config = _config(auth_token=TOKEN, storage_roots=(str(allowed), "memory://ok"))
    with _server(config) as (service, endpoint), _client(endpoint, config) as client:
        client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD))
        rows = client.pull_sparse(0, KEYS)
        refused = [str(outside), str(allowed / ".." / "outside"), f"{allowed}/../outside/x",
                   str(allowed / "link"), str(allowed / "link" / "deeper"),
                   f"file://{outside}", "memory://other", "memory://ok/../other",
                   str(tmp_path / "allowed2"), "/etc"]
        for dirname in refused:
            for method, request in (
                    ("Save", msg.SaveRequest(dirname=dirname, server_index=0)),
                    ("Load", msg.LoadRequest(dirname=dirname, server_index=0, server_num=1))):
                code, details = _status(endpoint, method, request, TOKEN)
                assert code == grpc.StatusCode.PERMISSION_DENIED, (method, dirname, code)
                assert repr(dirname) in details and str(allowed) in details
                assert "PSFLEET_STORAGE_ROOTS" in details
        assert not outside.exists() and not (tmp_path / "allowed2").exists()
        assert np.array_equal(client.pull_sparse(0, KEYS, create=False), rows)
        # The client says the same as a ConfigError; inside the roots all is allowed.
        with pytest.raises(ConfigError, match=r"Save on server .* refused: Save: .*outside "
                                              r"this server's storage roots"):
            client.save(str(outside))
        client.save(str(allowed / "a" / ".." / "model"))
        client.save("memory://ok/model")
        client.load(str(allowed / "model"))
        assert _files(allowed / "model")[0].startswith("server-0")
        assert not service.stop_requested.is_set()


def test_locations_are_normalised_before_the_check(tmp_path: Path) -> None:
    assert split_location(f"{tmp_path}/a/../b") == ("file", f"{os.path.realpath(tmp_path)}/b")
    assert split_location(f"file://{tmp_path}/b") == ("file", f"{os.path.realpath(tmp_path)}/b")
    assert split_location("S3://bucket/x/../../../y") == ("s3", "/y")
    roots = StorageRoots.resolve([str(tmp_path / "ck"), "s3://bucket/ck"])
    assert roots.refusal("Save", str(tmp_path / "ck" / "ckpt-1")) is None
    assert roots.refusal("Save", "s3://bucket/ck/ckpt-1") is None
    assert roots.refusal("Save", str(tmp_path / "ck2")) is not None  # not a prefix match
    assert roots.refusal("Save", "s3://bucket/ck2") is not None
    assert roots.refusal("Load", "gs://bucket/ck") is not None
    assert StorageRoots.resolve(None).roots == (os.getcwd(),)
    assert "not a usable folder name" in str(roots.refusal("Save", f"{tmp_path}/ck/\x00"))


# -- TLS -----------------------------------------------------------------------------------

def test_tls_server_serves_tls_clients_and_refuses_plaintext_clearly(tmp_path: Path) -> None:
    pair = write_self_signed_pair(tmp_path / "tls")
    tls_server = TlsConfig(cert=str(pair.cert), key=str(pair.key))
    tls_client = TlsConfig(ca=str(pair.cert))
    with _server(_config(auth_token=TOKEN, tls=tls_server)) as (service, endpoint):
        secured = _config(auth_token=TOKEN, tls=tls_client)
        with _client(endpoint, secured) as client:
            client.wait_ready(5.0)
            client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD))
            rows = client.pull_sparse(0, KEYS)
            assert rows.shape == (KEYS.size, DIM)
        plain = RpcClient(endpoint, _config(auth_token=TOKEN))
        try:
            started = time.monotonic()
            with pytest.raises(ConfigError, match=rf"server {endpoint} wants TLS and this "
                                                  r"client speaks plaintext: set PSFLEET_TLS_CA"):
                plain.call("Stop", msg.StopRequest())
            assert time.monotonic() - started < 5.0  # named at once, not retried
            assert not plain.is_serving()
            with pytest.raises(ConfigError, match="wants TLS"):
                wait_servers_ready([plain], timeout_s=30.0)
        finally:
            plain.close()
        assert not service.stop_requested.is_set()
        other = write_self_signed_pair(tmp_path / "other")
        # Not retried either, even by a client that retries a restarting server long.
        wrong_ca = RpcClient(endpoint, dataclasses.replace(_config(
            auth_token=TOKEN, tls=TlsConfig(ca=str(other.cert))), max_retries=1000))
        try:
            started = time.monotonic()
            with pytest.raises(ConfigError, match=r"TLS certificate was not accepted.*"
                                                  r"PSFLEET_TLS_CA must be the CA"):
                wrong_ca.call("Stats", msg.StatsRequest())
            assert time.monotonic() - started < 5.0
        finally:
            wrong_ca.close()
    # A TLS client against a plaintext server is named too.
    with _server(_config(auth_token=TOKEN)) as (_, endpoint):
        rpc = RpcClient(endpoint, _config(auth_token=TOKEN, tls=tls_client))
        try:
            with pytest.raises(ConfigError, match="speaks plaintext and this client TLS"):
                rpc.call("Stats", msg.StatsRequest())
        finally:
            rpc.close()


def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path: Path) -> None:
    pair = write_self_signed_pair(tmp_path / "server")
    client_pair = write_self_signed_pair(tmp_path / "client", "psfleet worker")
    server_tls = TlsConfig(cert=str(pair.cert), key=str(pair.key), client_ca=str(client_pair.cert))
    with _server(_config(auth_token=TOKEN, tls=server_tls)) as (_, endpoint):
        without = RpcClient(endpoint, _config(auth_token=TOKEN, tls=TlsConfig(ca=str(pair.cert))))
        try:
            with pytest.raises(ConfigError, match=r"requires a client certificate \(mutual "
                                                  r"TLS\): set PSFLEET_TLS_CLIENT_CERT"):
                without.call("Stats", msg.StatsRequest())
        finally:
            without.close()
        with_cert = TlsConfig(ca=str(pair.cert), client_cert=str(client_pair.cert),
                              client_key=str(client_pair.key))
        with _client(endpoint, _config(auth_token=TOKEN, tls=with_cert)) as client:
            client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD))
            assert client.stats()[0].tables[0].name == "emb"


def test_tls_variables_go_together_and_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PSFLEET_TLS_CERT is set but PSFLEET_TLS_KEY is not"):
        TlsConfig(cert="c.pem")
    with pytest.raises(ConfigError, match="PSFLEET_TLS_CLIENT_CA needs PSFLEET_TLS_CERT"):
        TlsConfig(client_ca="ca.pem")
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError, match=r"PSFLEET_TLS_CA: cannot read .*nope\.pem"):
        RpcClient(f"{HOST}:1", _config(tls=TlsConfig(ca=missing)))


def test_self_signed_pair_key_is_private_and_names_the_local_host(tmp_path: Path) -> None:
    pair = write_self_signed_pair(tmp_path / "tls")
    assert pair.key.stat().st_mode & 0o777 == 0o600
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    again = write_self_signed_pair(tmp_path / "tls")  # replaced, still 0600
    assert again.key.stat().st_mode & 0o777 == 0o600
    assert again.cert.read_bytes() != cert.public_bytes(serialization.Encoding.PEM)


def test_init_server_allows_its_checkpoint_and_model_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from psfleet.fleet import Fleet, UserDefinedRoleMaker
    from psfleet.types import Role

    monkeypatch.delenv("PSFLEET_STORAGE_ROOTS", raising=False)
    fleet = Fleet()
    fleet.init(UserDefinedRoleMaker(0, Role.SERVER, 1, [f"{HOST}:6170"]))
    try:
        fleet.init_server(checkpoint_dir=str(tmp_path / "ck"),
                          storage_roots=[tmp_path / "model"])
        roots = fleet.rpc_config.storage_roots
        assert roots == (os.getcwd(), str(tmp_path / "model"), str(tmp_path / "ck"))
        resolved = StorageRoots.resolve(roots)
        assert resolved.refusal("Save", str(tmp_path / "model" / "run" / "model")) is None
        assert resolved.refusal("Save", str(tmp_path / "ck" / "ckpt-000001-step1")) is None
        assert resolved.refusal("Save", str(tmp_path / "elsewhere")) is not None
    finally:
        fleet.reset()


def test_a_client_of_the_same_user_completes_its_config_from_the_log_folder(
        tmp_path: Path) -> None:
    from psfleet.launch.security import job_client_config

    assert job_client_config(tmp_path, _config()) == _config()  # nothing there
    (tmp_path / ".auth_token").write_text("tok\n")
    pair = write_self_signed_pair(tmp_path / "tls")
    filled = job_client_config(tmp_path, _config())
    assert filled.auth_token == "tok" and filled.tls == TlsConfig(ca=str(pair.cert))
    own = _config(auth_token="mine", tls=TlsConfig(ca="ca.pem"))
    assert job_client_config(tmp_path, own) == own  # the caller's own settings win
