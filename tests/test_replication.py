"""Replicated shares and fail-over over real gRPC on 127.0.0.1 (issue 20).

Three in-process servers with replication 2: share ``s`` lives on servers ``s`` and
``s+1``. The copies hold the same bytes after concurrent async pushes of two workers
(values and Adam state: one order of writes on both); a stopped server's shares are
served by their copies with nothing lost, server 0 included (the one barriers,
bounded staleness's clocks and fail-over reports go to first); a share whose every
copy is dead is named; a server refuses a second, different layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from psfleet.errors import ConfigError, FatalError, InvalidRequestError
from psfleet.launch.types import LaunchConfig
from psfleet.ps import RemoteClient, TableService, start_server
from psfleet.ps.replica.copy import chunk_bytes, join_parts, split_parts
from psfleet.ps.replica.host import Layout, ReplicaHost
from psfleet.ps.types import PushMode, RuleConfig, SparseTableConfig
from psfleet.replication import ShareMap, hosts_of, refill_delay_s, replication_from_env
from psfleet.rpc import RpcClient, RpcConfig, RunningServer
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05)
SPARSE, DENSE = 1, 2
SHAPES = [(12, 5), (5,)]
DENSE_SIZE = 65


@contextlib.contextmanager
def servers(count: int = 3, config: RpcConfig = CONFIG
            ) -> Iterator[list[tuple[TableService, RunningServer]]]:
    started = [start_server(HOST, 0, config) for _ in range(count)]
    try:
        yield started
    finally:
        for _, running in started:
            running.handler.close()
            running.stop(grace_s=0.1)


def _client(started: list[tuple[TableService, RunningServer]], worker: int,
            shares: int | None = None) -> RemoteClient:
    """A worker of the servers ``started`` (replication 2; ``shares``: one per server
    when None) that created the sparse and dense tables."""
    client = RemoteClient([r.endpoint for _, r in started], CONFIG, worker, replication=2,
                          shares=shares)
    client.wait_ready(10.0)
    client.create_sparse_table(SPARSE, SparseTableConfig(
        name="emb", dim=8, rule=RuleConfig(name="adam", learning_rate=0.01)))
    client.create_dense_table(DENSE, "dense", SHAPES, RuleConfig(name="adam",
                                                                 learning_rate=0.01),
                              np.zeros(DENSE_SIZE, np.float32))
    return client


def _train(client: RemoteClient, keys: np.ndarray, steps: int, seed: int,
           mode: PushMode = PushMode.APPLY) -> None:
    """``steps`` pushes of random gradients (AGGREGATE: global batches of 2)."""
    rng = np.random.default_rng(seed)
    workers = 2 if mode == PushMode.AGGREGATE else 1
    for _ in range(steps):
        batch = np.unique(rng.choice(keys, 300))
        client.pull_sparse(SPARSE, batch)
        client.push_sparse(SPARSE, batch, rng.standard_normal((batch.size, 8),
                                                              dtype=np.float32),
                           mode, worker_num=workers)
        client.push_dense(DENSE, rng.standard_normal(DENSE_SIZE, dtype=np.float32), mode,
                          worker_num=workers)


def _copy(started: list[tuple[TableService, RunningServer]], share: int) -> TableService:
    """Share ``share``'s copy on the next server."""
    host = started[(share + 1) % len(started)][1].handler
    assert isinstance(host, ReplicaHost)
    return host._shares[share]


KEYS = np.arange(1, 4001, dtype=np.uint64) * np.uint64(7919)


@pytest.mark.parametrize("mode", [PushMode.APPLY, PushMode.AGGREGATE],
                         ids=["async", "global_batch"])
def test_copies_hold_the_same_bytes_after_concurrent_async_pushes(mode: PushMode) -> None:
    """Also with global batch aggregation: a copy gathers the same pushes in the
    same order, so it applies the same global batches (25 pushes each: the last
    global batch is partial until the flush)."""
    with servers() as started:
        clients = [_client(started, w) for w in range(2)]
        threads = [threading.Thread(target=_train, args=(c, KEYS, 25, w, mode))
                   for w, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if mode == PushMode.AGGREGATE:
            clients[0].start_apply_global_batches([SPARSE, DENSE], 2).result()
        for share, (own, _) in enumerate(started):
            copy = _copy(started, share)
            keys, rows = own.tables[SPARSE].items()  # type: ignore[union-attr]
            copy_keys, copy_rows = copy.tables[SPARSE].items()  # type: ignore[union-attr]
            assert keys.size > 500
            np.testing.assert_array_equal(copy_keys, keys)
            np.testing.assert_array_equal(copy_rows, rows)  # values and Adam state
            for a, b in zip(own.tables[DENSE].state(), copy.tables[DENSE].state(),  # type: ignore[union-attr]
                            strict=True):
                np.testing.assert_array_equal(a, b)
        for c in clients:
            c.close()


def test_a_dead_server_0_fails_over_with_nothing_lost() -> None:
    with servers() as started:
        clients = [_client(started, w) for w in range(2)]
        _train(clients[0], KEYS, 10, 0)
        rows = clients[0].pull_sparse(SPARSE, KEYS, create=False)
        dense = clients[0].pull_dense(DENSE)
        clients[0].clock(2, steps=5)  # bounded staleness's clocks (on share 0)
        clients[1].clock(2, steps=3, parked=True)
        started[0][1].stop(grace_s=0.1)  # barriers and fail-over reports go to it first

        np.testing.assert_array_equal(clients[1].pull_sparse(SPARSE, KEYS, create=False), rows)
        np.testing.assert_array_equal(clients[1].pull_dense(DENSE), dense)
        assert clients[1]._directory is not None
        assert clients[1]._directory.map.dead == {0: 0}
        # Both workers cross a barrier of the dead server's share on its copy.
        crossed = []
        other = threading.Thread(target=lambda: crossed.append(
            clients[0].barrier("after", 0, 2)))
        other.start()
        clients[1].barrier("after", 1, 2)
        other.join(10.0)
        assert crossed == [None]
        # The clocks were forwarded to the copy: worker 1 is still parked there.
        assert clients[0].clock(2, steps=5, need=5) == (True, 5)
        assert clients[1].clock(2, steps=3, parked=False) == (True, 3)
        # Writes after the fail-over land once, on the share's new primary.
        grads = np.ones((KEYS.size, 8), np.float32)
        clients[0].push_sparse(SPARSE, KEYS, grads, mode=PushMode.DELTA)
        np.testing.assert_allclose(clients[1].pull_sparse(SPARSE, KEYS, create=False),
                                   rows + 1.0, rtol=0, atol=1e-6)
        host_1 = started[1][1].handler
        assert isinstance(host_1, ReplicaHost) and host_1._shares[0].wait_budget.slots > 0
        for c in clients:
            c.close()


def _assert_copies_equal(primary: TableService, copy: TableService) -> None:
    keys, rows = primary.tables[SPARSE].items()  # type: ignore[union-attr]
    copy_keys, copy_rows = copy.tables[SPARSE].items()  # type: ignore[union-attr]
    assert keys.size > 500
    np.testing.assert_array_equal(copy_keys, keys)
    np.testing.assert_array_equal(copy_rows, rows)
    for a, b in zip(primary.tables[DENSE].state(), copy.tables[DENSE].state(),  # type: ignore[union-attr]
                    strict=True):
        np.testing.assert_array_equal(a, b)


def _restarted(endpoints: list[str], config: RpcConfig) -> tuple[RunningServer, ReplicaHost]:
    """A new process of server 1 on its endpoint (incarnation 1), not filled yet."""
    port = int(endpoints[1].rpartition(":")[2])
    _, running = start_server(HOST, port, config, layout=Layout(tuple(endpoints), 1, 2),
                              incarnation=1)
    assert isinstance(running.handler, ReplicaHost)
    return running, running.handler


def test_a_restarted_server_rejoins_while_training_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Server 1 dies; a new process on its endpoint (incarnation 1) is filled with
    copies of shares 1 and 0 while a worker keeps pushing, serves share 1 again, and
    every copy holds the same bytes as its primary. The servers take messages of at
    most 64 KiB, less than a share's copy (about 140 KB), which travels in parts of
    4 KiB (``PSFLEET_COPY_CHUNK_BYTES``): each file is cut and joined again."""
    monkeypatch.setenv("PSFLEET_COPY_CHUNK_BYTES", "4096")
    small = dataclasses.replace(CONFIG, max_message_bytes=64 << 10)
    with servers(config=small) as started:
        endpoints = [r.endpoint for _, r in started]
        client = _client(started, 0)
        _train(client, KEYS, 10, 0)
        started[1][1].stop(grace_s=0.1)
        _train(client, KEYS, 3, 1)  # fails share 1 over to server 2
        running, rejoined = _restarted(endpoints, small)
        try:
            # A push applied by share 1's primary (server 2) before the rejoin...
            share_1 = KEYS[client.route(SPARSE, KEYS).positions[1]][:50]
            retried = msg.PushSparseRequest(
                table_id=SPARSE, keys=share_1.astype("<u8").tobytes(),
                grads=np.ones((50, 8), "<f4").tobytes(), mode=msg.DELTA, worker_index=0,
                push_id=msg.PushId(client_id=12345, seq=1))
            RpcClient(endpoints[2], CONFIG, share=1).call("PushSparse", retried)
            training = threading.Thread(target=_train, args=(client, KEYS, 15, 2))
            training.start()
            rejoined.rejoin()
            training.join()
            _train(client, KEYS, 5, 3)  # share 1 moves back to server 1
            # ... and retried at its new primary (server 1) is not applied again.
            before = client.pull_sparse(SPARSE, share_1, create=False)
            RpcClient(endpoints[1], CONFIG).call("PushSparse", retried)
            np.testing.assert_array_equal(client.pull_sparse(SPARSE, share_1, create=False),
                                          before)
            host_0, host_2 = (started[i][1].handler for i in (0, 2))
            assert isinstance(host_0, ReplicaHost) and isinstance(host_2, ReplicaHost)
            _assert_copies_equal(rejoined._shares[1], host_2._shares[1])
            _assert_copies_equal(host_0._shares[0], rejoined._shares[0])
            assert rejoined._shares[1].wait_budget.slots > 0  # it serves share 1
            assert rejoined._shares[1] is rejoined.own  # its /metrics report share 1
            assert host_2._shares[1].wait_budget.slots == 0
            assert client._directory is not None
            assert client._directory.primary(1) == 1
            assert rejoined._shares[1].counters.snapshot()[SPARSE].pushes > 0
        finally:
            client.close()
            running.handler.close()
            running.stop(grace_s=0.1)


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:g} s"
        time.sleep(0.05)


def _hosts(started: list[tuple[TableService, RunningServer]]) -> list[ReplicaHost]:
    hosts = [r.handler for _, r in started]
    assert all(isinstance(h, ReplicaHost) for h in hosts)
    return hosts  # type: ignore[return-value]


def test_a_second_dead_server_loses_nothing_once_the_first_ones_shares_are_refilled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Server 1 dies and is not restarted: shares 0 and 1 are left with one copy each.
    While a worker keeps pushing, the live servers take new copies (share 0 on server
    2, share 1 on server 0: the map decides, the same on both), holding the same bytes
    as the primaries. Then server 2 dies too, and server 0 serves every share with
    nothing lost."""
    monkeypatch.setenv("PSFLEET_REFILL_DELAY_S", "0")
    with servers() as started:
        client = _client(started, 0)
        _train(client, KEYS, 10, 0)
        host_0, _, host_2 = _hosts(started)
        started[1][1].stop(grace_s=0.1)
        _train(client, KEYS, 3, 1)  # fails shares 0 and 1 over
        training = threading.Thread(target=_train, args=(client, KEYS, 20, 2))
        training.start()
        _wait_for(lambda: sorted(host_0._shares) == sorted(host_2._shares) == [0, 1, 2],
                  "the refill of shares 0 and 1")
        training.join()
        assert client._directory is not None
        client._directory.refresh()
        assert client._directory.map.joined == {(0, 2, 0, 0), (1, 0, 0, 0)}
        for share in range(3):
            _assert_copies_equal(host_0._shares[share], host_2._shares[share])
        rows = client.pull_sparse(SPARSE, KEYS, create=False)
        dense = client.pull_dense(DENSE)

        started[2][1].stop(grace_s=0.1)
        np.testing.assert_array_equal(client.pull_sparse(SPARSE, KEYS, create=False), rows)
        np.testing.assert_array_equal(client.pull_dense(DENSE), dense)
        assert [client._directory.primary(s) for s in range(3)] == [0, 0, 0]
        client.push_sparse(SPARSE, KEYS, np.ones((KEYS.size, 8), np.float32),
                           mode=PushMode.DELTA)
        np.testing.assert_allclose(client.pull_sparse(SPARSE, KEYS, create=False),
                                   rows + 1.0, rtol=0, atol=1e-6)
        client.close()


def test_a_refilled_copy_is_released_when_the_dead_server_rejoins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Server 1 dies, shares 0 and 1 are refilled on servers 2 and 0; then server 1 is
    restarted and rejoins: each share is back on its own two servers, and the refilled
    copies are released (dropped from the map and from memory)."""
    monkeypatch.setenv("PSFLEET_REFILL_DELAY_S", "0")
    with servers() as started:
        endpoints = [r.endpoint for _, r in started]
        client = _client(started, 0)
        _train(client, KEYS, 5, 0)
        host_0, _, host_2 = _hosts(started)
        started[1][1].stop(grace_s=0.1)
        _train(client, KEYS, 3, 1)
        _wait_for(lambda: sorted(host_0._shares) == sorted(host_2._shares) == [0, 1, 2],
                  "the refill of shares 0 and 1")
        running, rejoined = _restarted(endpoints, CONFIG)
        try:
            rejoined.rejoin()
            _wait_for(lambda: sorted(host_0._shares) == [0, 2] and
                      sorted(host_2._shares) == [1, 2], "the release of the refilled copies")
            _train(client, KEYS, 3, 2)
            assert sorted(rejoined._shares) == [0, 1]
            share_map = rejoined._map
            assert share_map is not None
            assert [share_map.holders(s) for s in range(3)] == [
                [(0, 0), (1, 1)], [(1, 1), (2, 0)], [(2, 0), (0, 0)]]
            assert share_map.released == {(0, 2, 0, 0), (1, 0, 0, 0)}
            _assert_copies_equal(rejoined._shares[1], host_2._shares[1])
            _assert_copies_equal(host_0._shares[0], rejoined._shares[0])
        finally:
            client.close()
            running.handler.close()
            running.stop(grace_s=0.1)


def test_a_copy_is_cut_into_parts_within_the_limit_and_joined_again() -> None:
    rng = np.random.default_rng(0)
    files = [msg.SharedFile(path=f"server-1/f{i}", data=rng.bytes(size))
             for i, size in enumerate((0, 5000, 1, 4096, 12000))]
    parts = list(split_parts(files, 4096))
    assert [last for _, last in parts] == [False] * (len(parts) - 1) + [True]
    sizes = [sum(len(piece.data) for piece in part) for part, _ in parts]
    assert sizes[:-1] == [4096] * (len(parts) - 1) and sizes[-1] <= 4096
    assert sum(sizes) == 21097 and len(parts) == 21097 // 4096 + 1
    joined = join_parts([piece for part, _ in parts for piece in part])
    assert [(f.path, f.data) for f in joined] == [(f.path, f.data) for f in files]
    assert list(split_parts([], 4096)) == [([], True)]  # one (empty, last) part
    exact = list(split_parts([msg.SharedFile(path="a", data=b"x" * 8192)], 4096))
    assert [len(p) for p, _ in exact] == [1, 1, 0]  # the last part holds nothing


def test_a_bad_copy_chunk_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("1000", "1073741824", "64MB"):
        monkeypatch.setenv("PSFLEET_COPY_CHUNK_BYTES", bad)
        with pytest.raises(ConfigError, match="PSFLEET_COPY_CHUNK_BYTES"):
            chunk_bytes()
    monkeypatch.delenv("PSFLEET_COPY_CHUNK_BYTES")
    assert chunk_bytes() == 64 << 20


def test_a_share_with_every_copy_dead_is_named() -> None:
    with servers() as started:
        client = _client(started, 0)
        started[1][1].stop(grace_s=0.1)
        started[2][1].stop(grace_s=0.1)
        with pytest.raises(FatalError, match=r"share 1 is lost: every server holding it"):
            client.pull_sparse(SPARSE, KEYS)
        client.close()


def test_a_second_different_layout_is_refused() -> None:
    with servers(2) as started:
        endpoints = [r.endpoint for _, r in started]
        rpc = RpcClient(endpoints[0], CONFIG)
        rpc.call("SetReplicas", msg.ReplicasRequest(endpoints=endpoints, host_index=0,
                                                    replication=2))
        with pytest.raises(InvalidRequestError, match="every worker must have the same"):
            rpc.call("SetReplicas", msg.ReplicasRequest(endpoints=endpoints, host_index=0,
                                                        replication=1))
        with pytest.raises(InvalidRequestError, match="replication must be in"):
            rpc.call("SetReplicas", msg.ReplicasRequest(endpoints=endpoints, host_index=0,
                                                        replication=3))
        rpc.close()


def test_placement_and_settings() -> None:
    assert [hosts_of(s, 3, 2) for s in range(3)] == [[0, 1], [1, 2], [2, 0]]
    # Host 1 dies; restarted as incarnation 1 and filled with shares 0 and 1, it ranks
    # first for its own share again and second for share 0.
    dead = ShareMap(3, 2).with_dead([(1, 0)])
    assert dead.holders(1) == [(2, 0)] and dead.holders(0) == [(0, 0)] and dead.lost() == []
    back = dead.with_joined(1, (1, 1)).with_joined(0, (1, 1))
    assert back.holders(1) == [(1, 1), (2, 0)] and back.holders(0) == [(0, 0), (1, 1)]
    assert back.merged(ShareMap(3, 2).with_dead([(2, 0)])).holders(1) == [(1, 1)]
    assert dead.with_dead([(2, 0)]).lost() == [1]
    # Refill: a share with a copy fewer goes to the live host holding the fewest
    # shares, then the nearest after it in placement order; never to a host holding
    # it; a share with every copy, or none, is not refilled.
    assert [dead.refill_target(s) for s in range(3)] == [2, 0, None]
    four = ShareMap(4, 2).with_dead([(1, 0)])
    assert [four.refill_target(s) for s in range(4)] == [2, 3, None, None]
    assert four.with_joined(0, (3, 0)).refill_target(1) == 0  # host 3 holds 3 now
    assert dead.with_dead([(2, 0)]).refill_target(1) is None  # lost
    refilled = dead.with_joined(0, (2, 0)).with_joined(1, (0, 0))
    assert [refilled.refill_target(s) for s in range(3)] == [None] * 3
    assert refilled.holders(1) == [(2, 0), (0, 0)]  # outside the placement: last
    # Host 1 rejoins: the refilled copies are the excess, and released.
    full = refilled.with_joined(1, (1, 1)).with_joined(0, (1, 1))
    assert full.excess(1) == [(0, 0)] and full.excess(0) == [(2, 0)]
    released = full.with_released(1, [(0, 0)]).with_released(0, [(2, 0)])
    assert [released.holders(s) for s in range(3)] == [[(0, 0), (1, 1)], [(1, 1), (2, 0)],
                                                       [(2, 0), (0, 0)]]
    # A host whose copy was released takes a new one (copy number 1) when needed again.
    again = released.with_dead([(1, 1)])
    assert again.refill_target(1) == 0
    assert again.with_joined(1, (0, 0)).holders(1) == [(2, 0), (0, 0)]
    assert (1, 0, 0, 1) in again.with_joined(1, (0, 0)).joined
    assert ShareMap(3, 2).merged(released) == released
    assert replication_from_env(3, {}) == 1
    assert refill_delay_s({}) == 10 and refill_delay_s({"PSFLEET_REFILL_DELAY_S": "0"}) == 0
    for bad in ("x", "-1"):
        with pytest.raises(ConfigError, match="PSFLEET_REFILL_DELAY_S"):
            refill_delay_s({"PSFLEET_REFILL_DELAY_S": bad})
    with pytest.raises(ConfigError, match="PSFLEET_REPLICATION: 4 copies of each share "
                       "need at least 4 servers; the job has 3"):
        replication_from_env(3, {"PSFLEET_REPLICATION": "4"})
    with pytest.raises(ConfigError, match="PSFLEET_REPLICATION: 'two'"):
        replication_from_env(3, {"PSFLEET_REPLICATION": "two"})
    with pytest.raises(ConfigError, match="--replication: 3 copies"):
        LaunchConfig(command=("train.py",), server_num=2, replication=3)
    assert LaunchConfig(command=("train.py",), server_num=2, replication=2).replication == 2


def test_a_server_told_to_stop_forwards_nothing() -> None:
    """The job is over once a server is told to stop; a worker's last barrier poll is
    answered from its own copy, without a forward that the stop could cut short."""
    with servers(2) as started:
        client = _client(started, 0)
        host_0, host_1 = _hosts(started)
        client.barrier("before", 0, 1)
        assert "before" in host_1._shares[0]._barrier.state()  # forwarded to the copy
        host_0.stop_requested.set()
        client.barrier("last", 0, 1)
        assert "last" not in host_1._shares[0]._barrier.state()
        client.close()
