"""Tests of the transport (psfleet.rpc) and the server / RemoteClient over real gRPC.

Every server is started in process on 127.0.0.1 port 0 (the port the bind returns is
used) and stopped in a ``finally``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from psfleet.errors import ConfigError, RemoteError, RpcError, ServerNotReadyError
from psfleet.ps import (
    LocalClient,
    RemoteClient,
    RuleConfig,
    SparseTableConfig,
    TableService,
    start_server,
)
from psfleet.ps.client import TableClient
from psfleet.rpc import RpcClient, RpcConfig, RunningServer, codec, wait_servers_ready
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=8)


@contextlib.contextmanager
def servers(n: int, config: RpcConfig = CONFIG,
            barrier_timeout_s: float = 20.0) -> Iterator[list[RunningServer]]:
    """``n`` in-process servers on ports chosen by the OS; stopped on exit."""
    started: list[RunningServer] = []
    try:
        for _ in range(n):
            _, server = start_server(HOST, 0, config,
                                     TableService(barrier_timeout_s=barrier_timeout_s))
            assert server.port > 0
            started.append(server)
        yield started
    finally:
        for server in started:
            server.stop(grace_s=0.5)


@contextlib.contextmanager
def remote(running: list[RunningServer], config: RpcConfig = CONFIG) -> Iterator[RemoteClient]:
    client = RemoteClient([s.endpoint for s in running], config)
    try:
        yield client
    finally:
        client.close()


def _sparse_config(rule: RuleConfig, dim: int = 8) -> SparseTableConfig:
    return SparseTableConfig(name="emb", dim=dim, rule=rule, initial_range=0.3, seed=11,
                             num_buckets=256, num_shards=4)


DENSE_SIZES = [4, 6, 3, 10, 2]


def _exercise(client: TableClient, rule: RuleConfig, seed: int = 0) -> list[np.ndarray]:
    """Create tables, pull and push a fixed random sequence; return everything read."""
    rng = np.random.default_rng(seed)
    dense_init = rng.normal(size=sum(DENSE_SIZES)).astype(np.float32)
    client.create_sparse_table(0, _sparse_config(rule))
    client.create_dense_table(1, "dense", DENSE_SIZES, rule, dense_init)
    pool = np.concatenate([rng.integers(0, 2**64 - 1, size=300, dtype=np.uint64),
                           np.array([0, 1, 2**63, 2**64 - 2], np.uint64)])
    seen: list[np.ndarray] = [client.pull_dense(1)]
    for _ in range(6):
        batch = rng.choice(pool, size=200)  # with duplicates
        seen.append(client.pull_sparse(0, batch))
        keys = np.unique(batch)
        grads = rng.normal(size=(keys.size, 8)).astype(np.float32)
        client.push_sparse(0, keys, grads)
        client.push_dense(1, rng.normal(size=sum(DENSE_SIZES)).astype(np.float32))
        seen.append(client.pull_dense(1))
    seen.append(client.pull_sparse(0, pool))
    seen.append(client.pull_sparse(0, rng.integers(0, 2**64 - 1, size=50, dtype=np.uint64),
                                   create=False))
    return seen


def _assert_identical(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype == np.float32
        assert x.shape == y.shape
        assert np.array_equal(x, y)


@pytest.mark.parametrize("rule_name", ["sgd", "adam"])
def test_remote_client_equals_local_client(rule_name: str) -> None:
    rule = RuleConfig(name=rule_name, learning_rate=0.05)
    local = _exercise(LocalClient(), rule)
    with servers(1) as running, remote(running) as client:
        over_grpc = _exercise(client, rule)
    _assert_identical(over_grpc, local)
    assert not np.array_equal(local[0], local[-3])  # the pushes changed the dense values


@pytest.mark.parametrize("rule_name", ["sgd", "adam"])
def test_three_servers_equal_one_server(rule_name: str) -> None:
    rule = RuleConfig(name=rule_name, learning_rate=0.05)
    with servers(1) as running, remote(running) as client:
        one = _exercise(client, rule, seed=4)
    with servers(3) as running, remote(running) as client:
        three = _exercise(client, rule, seed=4)
        rows = [sum(t.rows for t in s.tables if t.table_id == 0) for s in client.stats()]
    _assert_identical(three, one)
    assert all(r > 50 for r in rows), rows  # every server holds part of the table


def test_create_table_twice_with_another_config_is_a_config_error() -> None:
    with servers(2) as running, remote(running) as client:
        config = _sparse_config(RuleConfig(name="adam"))
        client.create_sparse_table(3, config)
        client.create_sparse_table(3, config)  # same config: a no-op
        other = config.model_copy(update={"dim": 16})
        with pytest.raises(ConfigError, match=r"table 3 \('emb'\) exists with another "
                                              r"config: dim: 8 here, 16 sent\. Every"):
            client.create_sparse_table(3, other)
        rpc = RpcClient(running[0].endpoint, CONFIG)
        try:
            reply = rpc.call("CreateTable", msg.CreateTableRequest(
                table_id=3, config_json=config.model_dump_json(), server_num=1))
        finally:
            rpc.close()
        assert reply.created is False


def test_create_table_with_invalid_config_names_the_field() -> None:
    with servers(1) as running:
        rpc = RpcClient(running[0].endpoint, CONFIG)
        try:
            with pytest.raises(ConfigError, match=r"(?s)table 5: invalid config.*sparse\.dim"):
                rpc.call("CreateTable", msg.CreateTableRequest(
                    table_id=5, config_json='{"kind": "sparse", "name": "e", "dim": 0}'))
        finally:
            rpc.close()


def test_pull_from_unknown_table_is_a_remote_error_saying_what_to_do() -> None:
    with servers(1) as running:
        rpc = RpcClient(running[0].endpoint, CONFIG)
        try:
            request = msg.PullSparseRequest(table_id=7, keys=codec.keys_to_bytes(
                np.array([1, 2], np.uint64)), create=True)
            with pytest.raises(RemoteError) as info:
                rpc.call("PullSparse", request)
            text = str(info.value)
            assert "no table 7" in text and "init_worker" in text
            assert "PullSparse" in text and running[0].endpoint in text
            with pytest.raises(RemoteError, match="no table 7"):
                rpc.call("PullDense", msg.PullDenseRequest(table_id=7))
        finally:
            rpc.close()


def test_server_side_errors_reach_the_client() -> None:
    with servers(1) as running, remote(running) as client:
        client.create_sparse_table(0, _sparse_config(RuleConfig(name="sgd")))
        with pytest.raises(RemoteError, match="reserved"):
            client.pull_sparse(0, np.array([2**64 - 1], np.uint64))
        rpc = RpcClient(running[0].endpoint, CONFIG)
        try:  # 2 keys, gradients for 3 rows of dim 8
            with pytest.raises(RemoteError, match=r"expected \(2, 8\)"):
                rpc.call("PushSparse", msg.PushSparseRequest(
                    table_id=0, keys=codec.keys_to_bytes(np.array([1, 2], np.uint64)),
                    grads=codec.floats_to_bytes(np.zeros((3, 8), np.float32))))
        finally:
            rpc.close()


def test_auth_token_is_checked() -> None:
    secured = RpcConfig(deadline_s=10.0, max_retries=0, auth_token="s3cret")
    with servers(1, config=secured) as running:
        endpoint = running[0].endpoint
        for token in (None, "wrong"):
            rpc = RpcClient(endpoint, RpcConfig(deadline_s=10.0, max_retries=0,
                                                auth_token=token))
            try:
                with pytest.raises(ConfigError, match="PSFLEET_AUTH_TOKEN"):
                    rpc.call("Stats", msg.StatsRequest())
            finally:
                rpc.close()
        with remote(running, secured) as client:
            client.create_sparse_table(0, _sparse_config(RuleConfig(name="sgd")))
            assert client.pull_sparse(0, np.array([5], np.uint64)).shape == (1, 8)
            assert client.stats()[0].tables[0].rows == 1


def test_binding_a_port_in_use_is_a_config_error_naming_the_port() -> None:
    with servers(1) as running:
        port = running[0].port
        second: RunningServer | None = None
        try:
            with pytest.raises(ConfigError, match=rf"{HOST}:{port}\b"):
                _, second = start_server(HOST, port, CONFIG)
        finally:
            if second is not None:
                second.stop(grace_s=0)


@contextlib.contextmanager
def closed_port() -> Iterator[str]:
    """An endpoint whose port is bound but not listening: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((HOST, 0))
        yield f"{HOST}:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_call_to_a_closed_port_fails_naming_endpoint_and_method() -> None:
    config = RpcConfig(deadline_s=5.0, max_retries=1, backoff_initial_s=0.01)
    with closed_port() as endpoint:
        rpc = RpcClient(endpoint, config)
        try:
            with pytest.raises(RpcError) as info:
                rpc.call("PullDense", msg.PullDenseRequest(table_id=0))
        finally:
            rpc.close()
    assert endpoint in str(info.value) and "PullDense" in str(info.value)
    assert "unavailable" in str(info.value)


def test_wait_servers_ready_times_out_listing_endpoints(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # fleet.init() may have stopped psfleet's logs from reaching the root logger.
    monkeypatch.setattr(logging.getLogger("psfleet"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="psfleet.rpc.client")
    with servers(1) as running, closed_port() as endpoint:
        clients = [RpcClient(running[0].endpoint, CONFIG), RpcClient(endpoint, CONFIG)]
        try:
            with pytest.raises(ServerNotReadyError) as info:
                wait_servers_ready(clients, timeout_s=1.0, retry_interval_s=0.1)
            wait_servers_ready(clients[:1], timeout_s=1.0, retry_interval_s=0.1)  # ready one
        finally:
            for c in clients:
                c.close()
    assert endpoint in str(info.value)
    assert running[0].endpoint not in str(info.value)
    assert "server not ready, wait" in caplog.text
    assert "not ready endpoints" in caplog.text and endpoint in caplog.text


def test_barrier_releases_all_workers() -> None:
    with servers(1) as running, remote(running) as client:
        done: list[int] = []
        errors: list[BaseException] = []

        def worker(index: int) -> None:
            try:
                for name in ("first", "second"):  # the barrier is reusable
                    client.barrier(name, index, 2)
                done.append(index)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=15)
        assert not errors
        assert sorted(done) == [0, 1]


def test_barrier_timeout_names_the_missing_worker() -> None:
    with servers(1, barrier_timeout_s=0.3) as running, remote(running) as client:
        with pytest.raises(RemoteError, match=r"barrier 'sync'.*workers \[1, 2\] did not"):
            client.barrier("sync", 0, 3)
        with pytest.raises(ConfigError, match="worker_index 3 >= worker_num 3"):
            client.barrier("sync", 3, 3)


def test_stats_report_rows_per_table_and_server() -> None:
    with servers(2) as running, remote(running) as client:
        client.create_sparse_table(0, _sparse_config(RuleConfig(name="sgd")))
        client.create_dense_table(1, "dense", DENSE_SIZES, RuleConfig(name="sgd"),
                                  np.zeros(sum(DENSE_SIZES), np.float32))
        keys = np.arange(1000, dtype=np.uint64)
        client.pull_sparse(0, keys)
        client.pull_sparse(0, keys[:10])  # already there
        client.pull_sparse(0, keys + np.uint64(5000), create=False)  # not stored
        stats = client.stats()
        by_id = [{t.table_id: t for t in s.tables} for s in stats]
        assert sum(s[0].rows for s in by_id) == 1000
        assert all(s[0].rows > 0 and s[0].name == "emb" and s[0].memory_bytes > 0
                   for s in by_id)
        assert [s[1].rows for s in by_id] == [4 + 3 + 2, 6 + 10]  # blocks dealt round-robin


def test_codec_round_trips_uint64_keys_and_int64_views() -> None:
    keys = np.array([0, 1, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1], np.uint64)
    buf = codec.keys_to_bytes(keys)
    assert len(buf) == 8 * keys.size
    assert buf[:16] == b"\x00" * 8 + b"\x01" + b"\x00" * 7  # little-endian
    decoded = codec.keys_from_bytes(buf)
    assert decoded.dtype == np.uint64 and decoded.tolist() == keys.tolist()
    # int64 ids carrying the same bits (SparseEmbedding's input) encode identically.
    as_int64 = keys.view(np.int64)
    assert as_int64[4] < 0
    assert codec.keys_to_bytes(as_int64) == buf
    assert np.array_equal(codec.keys_from_bytes(buf).view(np.int64), as_int64)
    # Non-contiguous input.
    assert codec.keys_from_bytes(codec.keys_to_bytes(keys[::2])).tolist() == keys[::2].tolist()
    assert codec.keys_from_bytes(b"").size == 0
    with pytest.raises(RemoteError, match="multiple of 8"):
        codec.keys_from_bytes(b"\x00" * 12)


def test_codec_round_trips_float_rows() -> None:
    values = np.arange(24, dtype=np.float32).reshape(6, 4) / 7
    buf = codec.floats_to_bytes(values[:, ::2])  # non-contiguous
    assert np.array_equal(codec.floats_from_bytes(buf, 2), values[:, ::2])
    assert np.array_equal(codec.floats_from_bytes(codec.floats_to_bytes(values)),
                          values.reshape(-1))
    assert codec.floats_to_bytes(np.array([1.0], np.float32)) == b"\x00\x00\x80\x3f"
    with pytest.raises(RemoteError, match="float32 rows of 4"):
        codec.floats_from_bytes(b"\x00" * 24, 4)
