"""Requests bounded before any work, and the control plane's inputs checked (issue 44,
findings 1, 4 and 5), on in-process servers over real gRPC (127.0.0.1, port 0).

Each test reproduces one finding of the issue on the code before the fix:

- ``SetReplicas`` with more shares than ``ServerLimits.max_shares`` was served, building
  a service per share under the server's lock (30,000 wedged it); it is refused at once.
  ``fleetrun --shares``, ``PSFLEET_SHARES`` and ``cluster.shares`` have the same bound;
- a ``Rejoin`` of incarnation 0 declared incarnation -1 dead and failed in
  ``map_to_message`` (INTERNAL); ``CopyShare`` of an unknown share was a KeyError
  (INTERNAL); a share in the call's metadata outside the map an IndexError;
- an unreplicated server (launched with replication 1) took a ``SetReplicas`` layout and
  a map, then refused its own table; it refuses the control plane instead;
- admin request ids were shared by Save, Shrink and AgeOneDay: a Shrink with a Save's id
  got the Save's reply (INTERNAL "Failed to serialize response!");
- ``CreateTable`` took ``server_num`` 0 and a name of 5 MB;
- a request above ``ServerLimits.max_request_bytes`` is refused by gRPC from its
  declared length (RESOURCE_EXHAUSTED), before it is decoded.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from test_rpc_status import _send as send_raw

from psfleet.errors import ConfigError
from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig, TableService, start_server
from psfleet.ps.replica.host import Layout
from psfleet.ps.types import ServerLimits
from psfleet.rec.cluster_config import ClusterConfig
from psfleet.replication import MAX_SHARES, check_shares, shares_from_env
from psfleet.rpc import RpcConfig, RunningServer
from psfleet.rpc import messages as msg
from psfleet.rpc.server import AUTH_METADATA_KEY, SHARE_METADATA_KEY

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
TOKEN = "limits-token"
CONFIG = RpcConfig(deadline_s=10.0, max_retries=0, server_threads=4, auth_token=TOKEN)
KEYS = np.arange(1, 65, dtype=np.uint64)
DEAD_PEER = "127.0.0.1:9"


def _send(endpoint: str, method: str, request: object,
          share: int | None = None) -> tuple[str, str]:
    """Send ``request`` to ``method`` with the token; (status code name, message)."""
    extra = () if share is None else ((SHARE_METADATA_KEY, str(share)),)
    body = request.SerializeToString()  # type: ignore[attr-defined]
    return send_raw(endpoint, method, body, TOKEN, extra)


@contextlib.contextmanager
def _server(replication: int | None = None, config: RpcConfig = CONFIG
            ) -> Iterator[tuple[TableService, RunningServer, RemoteClient]]:
    """A server with sparse table 0 (dim 4, rows KEYS); ``replication`` as told at launch."""
    service, server = start_server(HOST, 0, config, TableService(barrier_timeout_s=1.0),
                                   replication=replication)
    client = RemoteClient([server.endpoint], CONFIG)
    try:
        client.create_sparse_table(0, SparseTableConfig(
            name="emb", dim=4, rule=RuleConfig(name="sgd", learning_rate=0.5)))
        client.pull_sparse(0, KEYS)
        yield service, server, client
    finally:
        client.close()
        server.stop(grace_s=0.5)


def _layout(endpoint: str, shares: int = 2) -> msg.ReplicasRequest:
    return msg.ReplicasRequest(endpoints=[endpoint, DEAD_PEER], host_index=0, replication=2,
                               shares=shares)


def test_set_replicas_with_too_many_shares_is_refused_before_any_work() -> None:
    with _server() as (service, server, client):
        code, details = _send(server.endpoint, "SetReplicas",
                              _layout(server.endpoint, MAX_SHARES + 1))
        assert code == "INVALID_ARGUMENT", (code, details)
        assert f"{MAX_SHARES + 1} shares is above {MAX_SHARES}" in details
        assert "max_shares" in details
        assert server.handler._layout is None  # type: ignore[attr-defined]  # nothing taken
        code, details = _send(server.endpoint, "SetReplicas",
                              msg.ReplicasRequest(endpoints=["e"] * 5000, host_index=0,
                                                  replication=1))
        assert code == "INVALID_ARGUMENT" and "max_hosts" in details, (code, details)
        # 2 hosts, replication 1, 3 shares: more shares than hosts needs replication 2
        code, details = _send(server.endpoint, "SetReplicas", msg.ReplicasRequest(
            endpoints=[server.endpoint, DEAD_PEER], host_index=0, replication=1, shares=3))
        assert code == "INVALID_ARGUMENT" and "more only with replication >= 2" in details
        assert client.pull_sparse(0, KEYS, create=False).shape == (KEYS.size, 4)


@pytest.mark.parametrize("shares", [MAX_SHARES + 1, 30_000])
def test_share_counts_are_bounded_everywhere_they_are_set(shares: int) -> None:
    with pytest.raises(ConfigError, match=rf"--shares: {shares} shares is above {MAX_SHARES}"):
        check_shares(shares, 2, 2, "--shares")
    with pytest.raises(ConfigError, match=rf"PSFLEET_SHARES: {shares} shares is above"):
        shares_from_env(2, 2, {"PSFLEET_SHARES": str(shares)})
    with pytest.raises(ValueError, match="shares"):
        ClusterConfig(server_num=2, replication=2, shares=shares)
    assert check_shares(MAX_SHARES, 2, 2, "--shares") == MAX_SHARES
    assert ServerLimits().max_shares == MAX_SHARES


def test_control_plane_inputs_are_checked_with_clear_statuses() -> None:
    with _server() as (service, server, client):
        endpoint = server.endpoint
        assert _send(endpoint, "SetReplicas", _layout(endpoint)) == ("OK", "")
        # Unequal lists that go in pairs (was: INTERNAL ValueError from zip).
        bad_map = msg.ShareMapMessage(dead_hosts=[1], dead_incarnations=[])
        code, details = _send(endpoint, "MergeMap", bad_map)
        assert code == "INVALID_ARGUMENT", (code, details)
        assert "dead_hosts 1, dead_incarnations 0" in details
        code, _ = _send(endpoint, "Failover", msg.FailoverRequest(host=1, map=bad_map))
        assert code == "INVALID_ARGUMENT"
        # A Rejoin of incarnation 0 (was: INTERNAL, incarnation -1 in map_to_message).
        code, details = _send(endpoint, "Rejoin", msg.RejoinRequest(host=1, incarnation=0))
        assert code == "INVALID_ARGUMENT" and "incarnation >= 1" in details, (code, details)
        code, details = _send(endpoint, "Rejoin", msg.RejoinRequest(host=7, incarnation=1))
        assert code == "INVALID_ARGUMENT" and "host 7 is not a host" in details
        # CopyShare of an unknown share (was: INTERNAL KeyError).
        code, details = _send(endpoint, "CopyShare",
                              msg.CopyShareRequest(share=99, host=1, incarnation=1))
        assert code == "INVALID_ARGUMENT" and "share 99 is not a share" in details
        # A share in the call's metadata outside the map (was: INTERNAL IndexError).
        code, details = _send(endpoint, "PullSparse",
                              msg.PullSparseRequest(table_id=0, keys=KEYS.tobytes()), share=5)
        assert code == "INVALID_ARGUMENT" and "psfleet-share" in details, (code, details)
        code, _ = _send(endpoint, "Drain", msg.DrainRequest(timeout_s=float("nan")))
        assert code == "INVALID_ARGUMENT"
        # The server still serves its own share.
        assert client.pull_sparse(0, KEYS, create=False).shape == (KEYS.size, 4)


def test_unreplicated_server_refuses_the_control_plane_and_keeps_its_table() -> None:
    with _server(replication=1) as (service, server, client):
        before = client.pull_sparse(0, KEYS, create=False)
        endpoint = server.endpoint
        requests = {
            # host 1 of 2: its own share would be share 1; then host 1 declared dead
            "SetReplicas": msg.ReplicasRequest(endpoints=[DEAD_PEER, endpoint], host_index=1,
                                               replication=1),
            "MergeMap": msg.ShareMapMessage(dead_hosts=[1], dead_incarnations=[0]),
            "Failover": msg.FailoverRequest(host=1),
            "Rejoin": msg.RejoinRequest(host=1, incarnation=1),
            "CopyShare": msg.CopyShareRequest(share=0, host=1, incarnation=1),
            "ReceiveShare": msg.ReceiveShareRequest(share=0),
            "Join": msg.JoinRequest(host=2, endpoint=DEAD_PEER),
        }
        for method, request in requests.items():
            code, details = _send(endpoint, method, request)
            assert code == "FAILED_PRECONDITION", (method, code, details)
            assert "started without replication" in details, details
        after = client.pull_sparse(0, KEYS, create=False)
        assert after.tobytes() == before.tobytes()


def test_admin_request_ids_are_per_method(tmp_path: Path) -> None:
    config = dataclasses.replace(CONFIG, storage_roots=(str(tmp_path),))
    with _server(config=config) as (service, server, client):
        request_id = msg.PushId(client_id=77, seq=1)
        code, details = _send(server.endpoint, "Save", msg.SaveRequest(
            dirname=str(tmp_path / "save"), request_id=request_id))
        assert code == "OK", details
        # The same id for a Shrink: its own call, not the Save's reply.
        shrink = msg.ShrinkRequest(all_tables=True, request_id=request_id)
        with grpc.insecure_channel(server.endpoint) as channel:
            call = channel.unary_unary("/psfleet.ParameterServer/Shrink",
                                       request_serializer=msg.ShrinkRequest.SerializeToString,
                                       response_deserializer=msg.ShrinkResponse.FromString)
            reply = call(shrink, timeout=10.0, metadata=[(AUTH_METADATA_KEY, TOKEN)])
        assert isinstance(reply, msg.ShrinkResponse) and reply.deleted == 0
        assert _send(server.endpoint, "AgeOneDay",
                     msg.AgeOneDayRequest(all_tables=True, request_id=request_id)) == ("OK", "")


def test_create_table_refuses_server_num_0_and_absurd_names() -> None:
    with _server() as (service, server, client):
        config = SparseTableConfig(name="new", dim=4)
        code, details = _send(server.endpoint, "CreateTable", msg.CreateTableRequest(
            table_id=5, config_json=config.model_dump_json(), server_num=0))
        assert code == "INVALID_ARGUMENT" and "server_num 0" in details, (code, details)
        code, details = _send(server.endpoint, "CreateTable", msg.CreateTableRequest(
            table_id=5, config_json=config.model_dump_json(), server_index=3, server_num=2))
        assert code == "INVALID_ARGUMENT" and "server_index 3" in details, (code, details)
        huge = SparseTableConfig(name="n" * 5_000_000, dim=4)
        code, details = _send(server.endpoint, "CreateTable", msg.CreateTableRequest(
            table_id=6, config_json=huge.model_dump_json(), server_num=1))
        assert code == "INVALID_ARGUMENT", (code, details[:300])
        assert "a name of 5000000 characters" in details and "max_name_chars" in details
        assert sorted(service.tables) == [0]


def test_a_request_above_max_request_bytes_is_refused_from_its_declared_size() -> None:
    limits = ServerLimits(max_request_bytes=1 << 20)
    service, server = start_server(HOST, 0, CONFIG, TableService(limits=limits))
    try:
        client = RemoteClient([server.endpoint], CONFIG)
        client.create_sparse_table(0, SparseTableConfig(name="emb", dim=4))
        client.close()
        many = np.arange(1, (1 << 18) + 2, dtype=np.uint64)  # 2 MiB of keys
        code, details = _send(server.endpoint, "PullSparse",
                              msg.PullSparseRequest(table_id=0, keys=many.tobytes(),
                                                    create=True))
        assert code == "RESOURCE_EXHAUSTED", (code, details)
        assert len(service.tables[0]) == 0  # nothing created
        assert _send(server.endpoint, "PullSparse", msg.PullSparseRequest(
            table_id=0, keys=KEYS.tobytes(), create=True)) == ("OK", "")
    finally:
        server.stop(grace_s=0.5)


def test_an_added_server_takes_its_own_layout_past_the_job_hosts() -> None:
    """A server added to the running job (psfleet grow) has a host index past the job's
    first hosts; a worker's SetReplicas naming that layout is its own, not refused."""
    layout = Layout(("127.0.0.1:9", "127.0.0.1:1"), 2, 2, 4)
    service, server = start_server(HOST, 0, CONFIG, TableService(barrier_timeout_s=1.0),
                                   layout=layout)
    try:
        own = msg.ReplicasRequest(endpoints=list(layout.endpoints), host_index=2,
                                  replication=2, shares=4)
        assert _send(server.endpoint, "SetReplicas", own) == ("OK", "")
        other = msg.ReplicasRequest(endpoints=list(layout.endpoints), host_index=3,
                                    replication=2, shares=4)
        code, _ = _send(server.endpoint, "SetReplicas", other)
        assert code == "INVALID_ARGUMENT"
    finally:
        server.stop(grace_s=0.5)
