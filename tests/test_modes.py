"""The communicators of the three modes over in-process servers, and the strategies.

Servers are started in process on 127.0.0.1 port 0 (the port the bind returns is
used); each simulated worker has its own RemoteClient with its worker index. Sync
workers block in their rounds, so they run in threads; GEO and async workers are
driven from the test's thread in a fixed order.

- sync: every step the servers apply the mean of the workers' gradients once (checked
  against numpy, sparse and dense); a missing worker makes the others fail naming it.
- geo: after ``geo_step`` steps the servers hold base + the sum of every worker's
  delta; a row first used in an interval is pulled fresh; ``flush`` pushes the
  pending delta.
- async: with two send threads merging queued steps every gradient is applied once.
- DistributedStrategy / StrategyFactory: the three strategies, and the errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pytest

from psfleet.errors import ConfigError, RemoteError
from psfleet.fleet import DistributedStrategy, StrategyFactory
from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig, TableService, start_server
from psfleet.ps.communicator import (
    AsyncCommunicator,
    AsyncConfig,
    CommunicatorSettings,
    GeoCommunicator,
    SyncCommunicator,
    make_communicator,
)
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.rpc import RpcConfig, RunningServer

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=8)
LR = 0.1
SGD = RuleConfig(name="sgd", learning_rate=LR)
DIM = 3
DENSE_SIZES = [5, 7]
DENSE_TOTAL = sum(DENSE_SIZES)
SPARSE = 0
DENSE = 1
T = TypeVar("T")


def _sparse_config(rule: RuleConfig = SGD) -> SparseTableConfig:
    return SparseTableConfig(name="emb", dim=DIM, rule=rule, initial_range=0.5, seed=3,
                             num_buckets=64, num_shards=2)


def _dense_init() -> np.ndarray:
    return np.linspace(-1.0, 1.0, DENSE_TOTAL, dtype=np.float32)


def _initial_rows(keys: np.ndarray) -> np.ndarray:
    """The rows a fresh table gives ``keys`` (the initializer is seeded by the key)."""
    return SparseTable(_sparse_config()).pull(keys, create=False)


@contextlib.contextmanager
def servers(n: int, barrier_timeout_s: float = 20.0) -> Iterator[list[str]]:
    """``n`` in-process servers; yields their endpoints; stopped on exit."""
    started: list[RunningServer] = []
    try:
        for _ in range(n):
            _, server = start_server(HOST, 0, CONFIG,
                                     TableService(barrier_timeout_s=barrier_timeout_s))
            started.append(server)
        yield [s.endpoint for s in started]
    finally:
        for server in started:
            server.stop(grace_s=0.5)


@contextlib.contextmanager
def worker_client(endpoints: list[str], worker_index: int,
                  rule: RuleConfig = SGD) -> Iterator[RemoteClient]:
    """A worker's client with the sparse table 0 and the dense table 1 created."""
    client = RemoteClient(endpoints, CONFIG, worker_index)
    try:
        client.create_sparse_table(SPARSE, _sparse_config(rule))
        client.create_dense_table(DENSE, "dense", DENSE_SIZES, rule, _dense_init())
        yield client
    finally:
        client.close()


def in_threads(*workers: Callable[[], T]) -> list[T]:
    """Run each callable in its own thread; their results (or first exception)."""
    with ThreadPoolExecutor(len(workers)) as pool:
        futures = [pool.submit(w) for w in workers]
        return [f.result() for f in futures]


# -- sync -------------------------------------------------------------------------------


def _sync_pushes(seed: int, steps: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per step: distinct keys (some shared with the other worker), grads, dense grads."""
    rng = np.random.default_rng(seed)
    pushes = []
    for _ in range(steps):
        keys = np.unique(rng.choice(np.arange(1, 13, dtype=np.uint64), size=6))
        grads = rng.normal(size=(keys.size, DIM)).astype(np.float32)
        pushes.append((keys, grads, rng.normal(size=DENSE_TOTAL).astype(np.float32)))
    return pushes


def test_sync_rounds_apply_the_mean_of_the_workers_gradients() -> None:
    steps = 3
    plans = [_sync_pushes(seed, steps) for seed in (1, 2)]
    # The oracle: one SGD step per round with the mean of both workers' gradients.
    all_keys = np.arange(1, 13, dtype=np.uint64)
    sparse = {int(k): row.astype(np.float64) for k, row in
              zip(all_keys, _initial_rows(all_keys), strict=True)}
    dense = _dense_init().astype(np.float64)
    expected_dense = []
    for step in range(steps):
        for keys, grads, _ in (plan[step] for plan in plans):
            for key, grad in zip(keys, grads, strict=True):
                sparse[int(key)] -= LR * grad / 2
        dense = dense - LR * (plans[0][step][2] + plans[1][step][2]) / 2
        expected_dense.append(dense)

    with servers(2) as endpoints:
        def worker(index: int) -> tuple[list[np.ndarray], np.ndarray]:
            with worker_client(endpoints, index) as client:
                comm = SyncCommunicator(client, worker_num=2)
                fresh = []
                for keys, grads, dense_grads in plans[index]:
                    comm.pull_sparse(SPARSE, keys)  # rows appear on first pull
                    comm.push_sparse(SPARSE, keys, grads)
                    comm.push_dense(DENSE, dense_grads)
                    comm.end_step()  # blocks until the other worker pushed this step
                    values = comm.fresh_dense(DENSE)
                    assert values is not None and comm.fresh_dense(DENSE) is None
                    fresh.append(values)
                comm.stop()
                return fresh, client.pull_sparse(SPARSE, all_keys, create=False)

        (fresh0, rows0), (fresh1, rows1) = in_threads(lambda: worker(0), lambda: worker(1))

    for step in range(steps):  # both workers see the round's result after each step
        np.testing.assert_allclose(fresh0[step], expected_dense[step], rtol=0, atol=1e-6)
        np.testing.assert_array_equal(fresh0[step], fresh1[step])
    expected_rows = np.stack([sparse[int(k)] for k in all_keys])
    np.testing.assert_allclose(rows0, expected_rows, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(rows0, rows1)
    assert not np.allclose(rows0, _initial_rows(all_keys), atol=1e-3)


def test_sync_round_with_a_missing_worker_fails_naming_it() -> None:
    with servers(2, barrier_timeout_s=1.0) as endpoints:
        def worker(index: int) -> str:
            with worker_client(endpoints, index) as client:
                comm = SyncCommunicator(client, worker_num=3)  # worker 2 never comes
                comm.push_sparse(SPARSE, np.array([1, 2], np.uint64),
                                 np.ones((2, DIM), np.float32))
                comm.push_dense(DENSE, np.ones(DENSE_TOTAL, np.float32))
                with pytest.raises(RemoteError) as caught:
                    comm.end_step()
                return str(caught.value)

        messages = in_threads(lambda: worker(0), lambda: worker(1))
    for message in messages:
        assert "workers [2] did not push" in message
        assert "sync step 0" in message


# -- geo --------------------------------------------------------------------------------


def _geo_worker(client: RemoteClient, geo_step: int) -> GeoCommunicator:
    comm = GeoCommunicator(client, geo_step)
    comm.on_sparse_table(SPARSE, _sparse_config())
    comm.on_dense_table(DENSE, SGD, client.pull_dense(DENSE))
    return comm


def _geo_step(comm: GeoCommunicator, keys: np.ndarray, grads: np.ndarray,
              dense_grads: np.ndarray) -> np.ndarray:
    rows = comm.pull_sparse(SPARSE, keys)
    comm.push_sparse(SPARSE, keys, grads)
    comm.push_dense(DENSE, dense_grads)
    comm.end_step()
    return rows


def test_geo_servers_hold_base_plus_every_workers_delta() -> None:
    geo_step = 3
    rng = np.random.default_rng(5)
    keys = [np.array([1, 2, 3], np.uint64), np.array([3, 4], np.uint64)]  # key 3 shared
    plans = [[(rng.normal(size=(k.size, DIM)).astype(np.float32),
               rng.normal(size=DENSE_TOTAL).astype(np.float32)) for _ in range(geo_step)]
             for k in keys]
    all_keys = np.array([1, 2, 3, 4], np.uint64)
    base_rows = _initial_rows(all_keys)

    with servers(2) as endpoints, worker_client(endpoints, 0) as c0, \
            worker_client(endpoints, 1) as c1:
        workers = [_geo_worker(c0, geo_step), _geo_worker(c1, geo_step)]
        for step in range(geo_step):
            for index, comm in enumerate(workers):
                _geo_step(comm, keys[index], *plans[index][step])
                if step < geo_step - 1:  # no exchange before geo_step steps
                    assert comm.syncs == 0
                    np.testing.assert_array_equal(c0.pull_dense(DENSE), _dense_init())
        assert [w.syncs for w in workers] == [1, 1]
        server_rows = c0.pull_sparse(SPARSE, all_keys, create=False)
        server_dense = c0.pull_dense(DENSE)
        # Worker 1 synced last: its fresh dense values already hold both deltas.
        np.testing.assert_array_equal(workers[1].fresh_dense(DENSE), server_dense)

    # Each worker's local SGD moved its copy by -lr * sum(grads): its delta.
    expected_rows = base_rows.astype(np.float64)
    expected_dense = _dense_init().astype(np.float64)
    for index in range(2):
        for grads, dense_grads in plans[index]:
            for key, grad in zip(keys[index], grads, strict=True):
                expected_rows[int(key) - 1] -= LR * grad
            expected_dense -= LR * dense_grads
    np.testing.assert_allclose(server_rows, expected_rows, rtol=0, atol=1e-6)
    np.testing.assert_allclose(server_dense, expected_dense, rtol=0, atol=1e-6)


def test_geo_rows_first_used_in_an_interval_are_pulled_fresh() -> None:
    key = np.array([7], np.uint64)
    grad = np.full((1, DIM), 2.0, np.float32)
    no_dense = np.zeros(DENSE_TOTAL, np.float32)
    with servers(1) as endpoints, worker_client(endpoints, 0) as c0, \
            worker_client(endpoints, 1) as c1:
        w0, w1 = _geo_worker(c0, geo_step=1), _geo_worker(c1, geo_step=1)
        initial = _geo_step(w0, key, grad, no_dense)  # interval 1 of worker 0: synced
        _geo_step(w1, key, grad, no_dense)  # worker 1 pulled after worker 0's delta
        server = c0.pull_sparse(SPARSE, key, create=False)
        np.testing.assert_allclose(server, initial - 2 * LR * grad, rtol=0, atol=1e-6)

        w0.geo_step = 10  # a long interval: pushes stay local from now on
        fresh = w0.pull_sparse(SPARSE, key)  # first use in this interval: from the servers
        np.testing.assert_array_equal(fresh, server)
        w0.push_sparse(SPARSE, key, grad)
        w0.end_step()
        local = w0.pull_sparse(SPARSE, key)  # used before in this interval: the local copy
        np.testing.assert_allclose(local, server - LR * grad, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(w0.pull_sparse(SPARSE, key, create=False), server)


def test_geo_flush_pushes_the_pending_delta() -> None:
    keys = np.array([1, 9], np.uint64)
    grads = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM)
    dense_grads = np.ones(DENSE_TOTAL, np.float32)
    with servers(2) as endpoints, worker_client(endpoints, 0) as client:
        comm = _geo_worker(client, geo_step=100)
        before = _geo_step(comm, keys, grads, dense_grads)
        np.testing.assert_array_equal(client.pull_dense(DENSE), _dense_init())
        comm.flush()
        np.testing.assert_allclose(client.pull_dense(DENSE), _dense_init() - LR * dense_grads,
                                   rtol=0, atol=1e-6)
        np.testing.assert_allclose(client.pull_sparse(SPARSE, keys, create=False),
                                   before - LR * grads, rtol=0, atol=1e-6)
        comm.flush()  # nothing pending: nothing changes
        np.testing.assert_allclose(client.pull_dense(DENSE), _dense_init() - LR * dense_grads,
                                   rtol=0, atol=1e-6)
        assert comm.syncs == 2


# -- async ------------------------------------------------------------------------------


def test_async_applies_every_gradient_exactly_once() -> None:
    steps = 60
    rng = np.random.default_rng(9)
    pool = np.arange(1, 31, dtype=np.uint64)
    counter = np.uint64(100)  # pushed with gradient 1 at every step
    config = AsyncConfig(k_steps=1, send_queue_size=4, max_merge_var_num=4,
                         thread_pool_size=2, send_wait_times=2)
    expected_rows = _initial_rows(np.append(pool, counter)).astype(np.float64)
    expected_dense = _dense_init().astype(np.float64)
    with servers(2) as endpoints, worker_client(endpoints, 0) as client:
        comm = AsyncCommunicator(client, config)
        comm.start()
        try:
            for _ in range(steps):
                keys = np.append(np.unique(rng.choice(pool, size=8)), counter)
                grads = rng.normal(size=(keys.size, DIM)).astype(np.float32)
                grads[-1] = 1.0
                dense_grads = rng.normal(size=DENSE_TOTAL).astype(np.float32)
                comm.pull_sparse(SPARSE, keys)
                comm.push_sparse(SPARSE, keys, grads)
                comm.push_dense(DENSE, dense_grads)
                comm.end_step()
                expected_rows[np.searchsorted(np.append(pool, counter), keys)] -= LR * grads
                expected_dense -= LR * dense_grads
            comm.flush()
            rows = client.pull_sparse(SPARSE, np.append(pool, counter), create=False)
            dense = client.pull_dense(DENSE)
        finally:
            comm.stop()
    assert comm.merged_steps > 0  # steps were merged, and still each applied once
    np.testing.assert_allclose(rows, expected_rows, rtol=0, atol=1e-5)
    np.testing.assert_allclose(dense, expected_dense, rtol=0, atol=1e-5)
    initial_counter = _initial_rows(np.array([counter]))[0]
    np.testing.assert_allclose(rows[-1], initial_counter - LR * steps, rtol=0, atol=1e-5)


def test_async_staleness_counts_the_workers_steps_missing_from_installed_values() -> None:
    """With k_steps 2 the dense values are pulled after every second send: installed
    right after step 2 or 4 they hold every step (staleness 0); installed after step
    5 they are step 4's, one step short (staleness 1). Values not yet installed wait
    for the next call, which gets the newest."""
    config = AsyncConfig(k_steps=2, send_queue_size=4, max_merge_var_num=1)
    installs: list[bool] = []
    with servers(1) as endpoints, worker_client(endpoints, 0) as client:
        comm = AsyncCommunicator(client, config)
        comm.start()
        try:
            for step in range(1, 6):
                comm.push_dense(DENSE, np.ones(DENSE_TOTAL, np.float32))
                comm.flush()  # the step is sent (and pulled after, every second send)
                if step in (1, 2, 5):  # not after 3 and 4: step 4's values wait
                    installs.append(comm.fresh_dense(DENSE) is not None)
        finally:
            comm.stop()
    assert installs == [False, True, True]
    assert (comm.staleness.count, comm.staleness.max, comm.staleness.mean) == (2, 1, 0.5)


# -- strategies -------------------------------------------------------------------------


def test_strategy_factory_returns_the_three_strategies() -> None:
    sync = StrategyFactory.create_sync_strategy()
    async_ = StrategyFactory.create_async_strategy()
    geo = StrategyFactory.create_geo_strategy(geo_step=7)
    assert (sync.mode, async_.mode, geo.mode) == ("sync", "async", "geo")
    assert geo.geo_step == 7
    assert StrategyFactory.create_geo_strategy().geo_step == 400
    assert DistributedStrategy().mode == "async"
    with pytest.raises(ConfigError, match="geo_step: 0"):
        StrategyFactory.create_geo_strategy(geo_step=0)
    settings = geo.communicator_settings(worker_num=3)
    assert (settings.geo_step, settings.worker_num) == (7, 3)
    with worker_free_client() as client:
        for strategy, kind in ((sync, SyncCommunicator), (async_, AsyncCommunicator),
                               (geo, GeoCommunicator)):
            comm = make_communicator(strategy.mode, client,
                                     strategy.communicator_settings(worker_num=2))
            assert type(comm) is kind


@contextlib.contextmanager
def worker_free_client() -> Iterator[RemoteClient]:
    """A client of a server that is never called (communicators are only built)."""
    client = RemoteClient(["127.0.0.1:1"], CONFIG)
    try:
        yield client
    finally:
        client.close()


def test_dc_asgd_outside_async_mode_is_rejected() -> None:
    assert DistributedStrategy(mode="async", dc_asgd=True).dc_asgd
    for mode in ("sync", "geo"):
        with pytest.raises(ValueError, match=rf"dc_asgd.*{mode!r}"):
            DistributedStrategy(mode=mode, dc_asgd=True)


def test_unknown_mode_is_rejected_listing_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"mode") as caught:
        DistributedStrategy(mode="asyc")  # type: ignore[arg-type]
    assert all(f"'{mode}'" in str(caught.value) for mode in ("sync", "async", "geo"))
    with worker_free_client() as client, pytest.raises(
            ConfigError,
            match=r"mode: 'asyc' is not one of async, collective, geo, gpubox, local, sync"):
        make_communicator("asyc", client, CommunicatorSettings())
