"""What a psfleet server answers to a bad call, and how (issue 15, F1, F4, finding 11).

In-process servers on 127.0.0.1 over real gRPC, called through a channel without
serializers (so undecodable bodies can be sent):

- F1: the token is checked before the body is decoded: without it every call is
  UNAUTHENTICATED, whatever its body; with it an undecodable body is INVALID_ARGUMENT
  naming the method, the message type and the DecodeError, and the handler never runs.
- F4: every status message is at most ``MAX_STATUS_MESSAGE_BYTES`` on the wire (ASCII
  or not), clipped with a note of its full length, so the client gets the real status
  (above its metadata limits, a soft 8 KiB and a hard 16 KiB, it got RESOURCE_EXHAUSTED
  "Stream removed", at random between the two).
- Errors map to statuses in one table: a Load of a save that does not exist is
  FAILED_PRECONDITION (make the save first), no longer ABORTED.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from psfleet.errors import (
    ConfigError,
    DataError,
    InvalidRequestError,
    RemoteError,
    ResourceExhaustedError,
    RpcError,
)
from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig, TableService, start_server
from psfleet.rpc import RpcConfig, serve
from psfleet.rpc import messages as msg
from psfleet.rpc.server import (
    AUTH_METADATA_KEY,
    MAX_STATUS_MESSAGE_BYTES,
    status_code_of,
    status_message,
)

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
TOKEN = "status-token"
#: field 1 (length-delimited) of length 2^32-1: no message of psfleet.proto decodes it
UNDECODABLE = b"\x0a\xff\xff\xff\xff\x0f"
KEYS = np.arange(1, 65, dtype=np.uint64)


def _config(tmp_path: Path, token: str | None = TOKEN) -> RpcConfig:
    return RpcConfig(deadline_s=10.0, max_retries=0, server_threads=4, auth_token=token,
                     storage_roots=(str(tmp_path),))


def _wire_bytes(text: str) -> int:
    """Length of ``text`` as the grpc-message header (UTF-8, percent-encoded)."""
    return sum(1 if 0x20 <= b <= 0x7E and b != 0x25 else 3 for b in text.encode())


def _send(endpoint: str, method: str, body: bytes, token: str | None = TOKEN,
          extra: tuple[tuple[str, str], ...] = ()) -> tuple[str, str]:
    """Send ``body`` as is to ``method`` (``extra``: more metadata); (status code name,
    message)."""
    metadata = (() if token is None else ((AUTH_METADATA_KEY, token),)) + extra
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(f"/psfleet.ParameterServer/{method}")
        try:
            call(body, timeout=10.0, metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or ""
    return "OK", ""


@contextlib.contextmanager
def _table_server(tmp_path: Path) -> Iterator[tuple[TableService, str, RemoteClient]]:
    """A TableService with sparse table 0 (dim 4, rows KEYS) served with TOKEN."""
    config = _config(tmp_path)
    service, server = start_server(HOST, 0, config, TableService(barrier_timeout_s=1.0))
    client = RemoteClient([server.endpoint], config)
    try:
        client.create_sparse_table(0, SparseTableConfig(
            name="emb", dim=4, rule=RuleConfig(name="sgd", learning_rate=0.5)))
        client.pull_sparse(0, KEYS)
        yield service, server.endpoint, client
    finally:
        client.close()
        server.stop(grace_s=0.5)


class _Raising:
    """A handler whose PullSparse raises ``error`` and counts its calls."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.calls = 0

    def PullSparse(self, request: Any) -> Any:  # noqa: N802
        self.calls += 1
        raise self.error


@contextlib.contextmanager
def _raising_server(tmp_path: Path, error: BaseException) -> Iterator[tuple[_Raising, str]]:
    handler = _Raising(error)
    server = serve(handler, HOST, 0, _config(tmp_path))  # type: ignore[arg-type]
    try:
        yield handler, server.endpoint
    finally:
        server.stop(grace_s=0.5)


# -- F1: token first, then decoding --------------------------------------------------------

@pytest.mark.parametrize("method", ["PushSparse", "PullSparse", "CreateTable", "Save", "Stop"])
def test_undecodable_body_is_invalid_argument_naming_the_message(tmp_path: Path,
                                                                 method: str) -> None:
    with _table_server(tmp_path) as (service, endpoint, client):
        rows = client.pull_sparse(0, KEYS, create=False)
        code, details = _send(endpoint, method, UNDECODABLE)
        assert code == "INVALID_ARGUMENT"
        assert details.startswith(f"{method}: the request body (6 bytes) is not a "
                                  f"{method}Request message (DecodeError: "), details
        assert "same psfleet version" in details
        assert not service.stop_requested.is_set()
        assert sorted(service.tables) == [0]
        assert np.array_equal(client.pull_sparse(0, KEYS, create=False), rows)


@pytest.mark.parametrize("token", [None, "", "wrong"])
def test_token_is_checked_before_the_body_is_decoded(tmp_path: Path,
                                                     token: str | None) -> None:
    with _raising_server(tmp_path, RuntimeError("must not run")) as (handler, endpoint):
        for body in (UNDECODABLE, b"\xff" * 1000,
                     msg.PullSparseRequest(table_id=0, keys=KEYS.tobytes()).SerializeToString()):
            code, details = _send(endpoint, "PullSparse", body, token)
            assert code == "UNAUTHENTICATED", (body[:10], code, details)
            assert "PSFLEET_AUTH_TOKEN" in details and "Request message" not in details
        assert handler.calls == 0
        # With the token the undecodable body is the caller's error, the valid one runs.
        assert _send(endpoint, "PullSparse", UNDECODABLE)[0] == "INVALID_ARGUMENT"
        assert handler.calls == 0
        code, details = _send(endpoint, "PullSparse", msg.PullSparseRequest(
            table_id=0).SerializeToString())
        assert (code, details) == ("INTERNAL", "PullSparse: RuntimeError: must not run")
        assert handler.calls == 1
        # An rpc the handler does not implement: UNIMPLEMENTED, as without psfleet.
        assert _send(endpoint, "Stats", b"")[0] == "UNIMPLEMENTED"


# -- F4: every status message is capped ----------------------------------------------------

def test_status_message_is_capped_on_the_wire_with_the_full_length() -> None:
    assert status_message("short") == "short"
    fits = "a" * MAX_STATUS_MESSAGE_BYTES
    assert status_message(fits) == fits  # exactly the limit: whole
    room = MAX_STATUS_MESSAGE_BYTES - 64
    assert status_message(fits + "b") == "a" * room + f"... ({len(fits) + 1} characters)"
    wide = "表" * 100_000  # 3 UTF-8 bytes, each percent-encoded: 9 wire bytes
    assert status_message(wide) == "表" * (room // 9) + "... (100000 characters)"
    percent = "%" * 10_000  # '%' itself is encoded as %25
    assert status_message(percent) == "%" * (room // 3) + "... (10000 characters)"
    assert status_message("bad \udcff name") == "bad \\udcff name"  # not UTF-8: escaped
    surrogate = "\udcff" + "x" * 10_000  # a lone surrogate cannot be sent as UTF-8
    assert status_message(surrogate).startswith("\\udcff" + "x" * 100)
    for text in (fits + "b", wide, percent, surrogate, "é" * 5000):
        assert _wire_bytes(status_message(text)) <= MAX_STATUS_MESSAGE_BYTES


@pytest.mark.parametrize("text", ["x" * 100_000, "表" * 20_000, "line\n" * 10_000])
def test_a_long_error_reaches_the_client_clipped_with_its_status(tmp_path: Path,
                                                                 text: str) -> None:
    error = InvalidRequestError(text)
    with _raising_server(tmp_path, error) as (_, endpoint):
        # Above the client's soft metadata limit a response is refused at random: 20 tries.
        outcomes = {_send(endpoint, "PullSparse", b"") for _ in range(20)}
    assert len(outcomes) == 1, outcomes
    code, details = outcomes.pop()
    assert code == "INVALID_ARGUMENT"
    assert details == status_message(text)
    assert details.endswith(f"... ({len(text)} characters)")
    assert details.startswith(text[:100])
    assert _wire_bytes(details) <= MAX_STATUS_MESSAGE_BYTES


def test_create_table_conflict_with_a_long_name_is_invalid_argument(tmp_path: Path) -> None:
    with _table_server(tmp_path) as (_, endpoint, client):
        long_name = SparseTableConfig(name="n" * 100_000, dim=4)
        code, details = _send(endpoint, "CreateTable", msg.CreateTableRequest(
            table_id=0, config_json=long_name.model_dump_json()).SerializeToString())
        assert code == "INVALID_ARGUMENT"
        assert details.startswith("table 0 ") and "emb" in details, details[:300]
        assert _wire_bytes(details) <= MAX_STATUS_MESSAGE_BYTES
        with pytest.raises(ConfigError, match="table 0 "):
            client.create_sparse_table(0, long_name)


# -- the error -> status table -------------------------------------------------------------

def test_an_unguarded_memory_error_is_resource_exhausted_naming_the_table(
        tmp_path: Path) -> None:
    """The service turns MemoryErrors into ResourceExhaustedErrors naming the table and
    its size where it allocates rows; one it does not catch still names the rpc and the
    table id of the request."""
    with _raising_server(tmp_path, MemoryError("cannot allocate 4 GiB")) as (_, endpoint):
        code, details = _send(endpoint, "PullSparse", msg.PullSparseRequest(
            table_id=7).SerializeToString())
    assert code == "RESOURCE_EXHAUSTED"
    assert details.startswith("PullSparse on table 7: the server ran out of memory "
                              "(cannot allocate 4 GiB); give it more memory"), details


def test_errors_map_to_statuses_in_one_table() -> None:
    cases: dict[BaseException, str] = {
        ResourceExhaustedError("pull on table 3 ('adam', 10 rows)"): "RESOURCE_EXHAUSTED",
        MemoryError(): "RESOURCE_EXHAUSTED",
        InvalidRequestError("bad buffer"): "INVALID_ARGUMENT",
        ConfigError("bad config"): "INVALID_ARGUMENT",
        DataError("load: no saved file"): "FAILED_PRECONDITION",
        RemoteError("no table 7"): "FAILED_PRECONDITION",
        RpcError("later"): "ABORTED",
        KeyError("bug"): "INTERNAL",
    }
    for error, code in cases.items():
        assert status_code_of(error).name == code, error


def test_load_of_a_save_that_does_not_exist_is_failed_precondition(tmp_path: Path) -> None:
    with _table_server(tmp_path) as (_, endpoint, client):
        rows = client.pull_sparse(0, KEYS, create=False)
        missing = tmp_path / "never-saved"
        code, details = _send(endpoint, "Load", msg.LoadRequest(
            dirname=str(missing), server_index=0, server_num=1).SerializeToString())
        assert code == "FAILED_PRECONDITION"
        assert str(missing) in details and "table 0" in details, details
        assert not missing.exists()
        # A save that exists loads, through the same path.
        client.save(str(tmp_path / "saved"))
        client.push_sparse(0, KEYS, np.ones((KEYS.size, 4), np.float32))
        assert _send(endpoint, "Load", msg.LoadRequest(
            dirname=str(tmp_path / "saved"), server_index=0,
            server_num=1).SerializeToString()) == ("OK", "")
        assert np.array_equal(client.pull_sparse(0, KEYS, create=False), rows)


def test_valid_requests_still_decode_and_answer(tmp_path: Path) -> None:
    """The hot rpcs with the handler decoding: values as the in-process service."""
    with _table_server(tmp_path) as (service, _, client):
        grads = np.linspace(-1, 1, KEYS.size * 4, dtype=np.float32).reshape(-1, 4)
        before = service.pull_sparse(0, KEYS, create=False).copy()
        client.push_sparse(0, KEYS, grads)
        expected = before - np.float32(0.5) * grads  # SGD, learning rate 0.5
        got = client.pull_sparse(0, KEYS, create=False)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_a_load_that_fails_on_one_table_leaves_every_table_as_it_was(tmp_path: Path) -> None:
    with _table_server(tmp_path) as (_, endpoint, client):
        client.create_sparse_table(1, SparseTableConfig(
            name="other", dim=4, rule=RuleConfig(name="sgd", learning_rate=0.5)))
        client.pull_sparse(1, KEYS)
        saved = tmp_path / "saved"
        client.save(str(saved))
        client.push_sparse(0, KEYS, np.ones((KEYS.size, 4), np.float32))
        live = client.pull_sparse(0, KEYS, create=False)
        (damaged,) = saved.rglob("table-1.sparse")
        damaged.write_bytes(damaged.read_bytes()[:-64])  # the last rows cut off
        code, details = _send(endpoint, "Load", msg.LoadRequest(
            dirname=str(saved), server_index=0, server_num=1).SerializeToString())
        assert code == "FAILED_PRECONDITION" and "truncated" in details, details
        # table 0 was read from the save before table 1 failed: still the live values
        assert np.array_equal(client.pull_sparse(0, KEYS, create=False), live)
