"""Sync rounds as long polls (issue 15, findings 3 and 4), over real gRPC on 127.0.0.1.

A sync-mode push used to hold a handler thread until every worker's push of the step
arrived, so 32 waiting workers stopped a server. Now a push waits at most
``WaitBudget.max_wait_s`` and the worker polls: 32 workers finish a round on a server
with 8 handler threads, exactly (the mean of their gradients, applied once), and the
health check answers meanwhile. Membership is by (worker, incarnation) as at barriers:
a restarted worker's push replaces its dead predecessor's, and a retried push (same
push id) counts once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from psfleet.errors import RemoteError
from psfleet.ps import RemoteClient, RuleConfig, TableService, start_server
from psfleet.ps.types import PushMode
from psfleet.ps.wait_budget import WaitBudget
from psfleet.rpc import RpcClient, RpcConfig, RunningServer, codec
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=8)
LR = 0.5
SIZE = 6
DENSE = 1


@contextlib.contextmanager
def server(budget: WaitBudget) -> Iterator[RunningServer]:
    """One in-process server (8 handler threads) whose waits use ``budget``."""
    _, running = start_server(HOST, 0, CONFIG, TableService(barrier_timeout_s=20.0,
                                                            wait_budget=budget))
    try:
        yield running
    finally:
        running.stop(grace_s=0.5)


def _init() -> np.ndarray:
    return np.arange(SIZE, dtype=np.float32) / 10


def _grads(worker: int, step: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * step + worker)
    return rng.standard_normal(SIZE).astype(np.float32)


def _create(client: RemoteClient) -> None:
    client.create_dense_table(DENSE, "dense", [SIZE], RuleConfig(name="sgd", learning_rate=LR),
                              _init())


def test_32_workers_finish_sync_rounds_on_8_threads_exactly() -> None:
    workers, steps = 32, 2
    with server(WaitBudget(slots=4, max_wait_s=0.5)) as running:
        health = RpcClient(running.endpoint, CONFIG)
        clients = [RemoteClient([running.endpoint], CONFIG, worker_index=i)
                   for i in range(workers)]
        errors: list[BaseException] = []
        last_may_go = threading.Event()
        done_steps: list[int] = []

        def worker(index: int) -> None:
            try:
                for step in range(steps):
                    if index == workers - 1 and step == 0:
                        last_may_go.wait(30)
                    clients[index].push_dense(DENSE, _grads(index, step), PushMode.SYNC,
                                              step, workers)
                    done_steps.append(step)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        try:
            for c in clients:
                _create(c)
            threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
            for t in threads:
                t.start()
            time.sleep(1.5)  # 31 workers poll round 0 now
            started = time.monotonic()
            serving = health.is_serving(timeout_s=5.0)
            health_s = time.monotonic() - started
            assert done_steps == []  # no push returned before its round was applied
            last_may_go.set()
            for t in threads:
                t.join(timeout=60)
            values = clients[0].pull_dense(DENSE)
        finally:
            last_may_go.set()
            for c in clients:
                c.close()
            health.close()
    assert not errors, errors[:3]
    assert serving and health_s < 1.0, health_s
    assert sorted(done_steps) == [0] * workers + [1] * workers
    expected = _init()
    for step in range(steps):  # SGD on the mean gradient of each round, once per round
        mean = np.add.reduce([_grads(w, step) for w in range(workers)], dtype=np.float32)
        expected = expected - np.float32(LR) * (mean / np.float32(workers))
    np.testing.assert_allclose(values, expected, rtol=0, atol=1e-6)


def _push(rpc: RpcClient, worker: int, incarnation: int, grads: np.ndarray | None,
          client_id: int, seq: int = 1, poll: bool = False) -> bool:
    """One PushDense call of step 0 (a round of 2 workers): True when applied."""
    reply = rpc.call("PushDense", msg.PushDenseRequest(
        table_id=DENSE, grads=b"" if grads is None else codec.floats_to_bytes(grads),
        worker_index=worker, step=0, mode=msg.SYNC, worker_num=2, poll=poll,
        incarnation=incarnation, push_id=msg.PushId(client_id=client_id, seq=seq)))
    return bool(reply.done)


def test_a_restarted_workers_push_replaces_its_dead_predecessors() -> None:
    with server(WaitBudget(slots=4, max_wait_s=0.05)) as running:
        client = RemoteClient([running.endpoint], CONFIG)
        rpc = RpcClient(running.endpoint, CONFIG)
        try:
            _create(client)
            dead, restarted, other = _grads(1, 7), _grads(1, 8), _grads(0, 0)
            assert not _push(rpc, 1, 0, dead, client_id=11)  # then it is killed
            assert not _push(rpc, 1, 1, restarted, client_id=12)  # its restart
            with pytest.raises(RemoteError, match=r"worker 1 incarnation 0 was replaced by "
                                                  r"its incarnation 1"):
                _push(rpc, 1, 0, None, client_id=11, poll=True)
            # a retry of worker 0's push (same id) is the same push, not a second one
            assert _push(rpc, 0, 0, other, client_id=13)
            assert _push(rpc, 0, 0, other, client_id=13)
            assert _push(rpc, 1, 1, None, client_id=12, poll=True)
            values = client.pull_dense(DENSE)
        finally:
            rpc.close()
            client.close()
    mean = np.add.reduce([other, restarted], dtype=np.float32) / np.float32(2)
    np.testing.assert_allclose(values, _init() - np.float32(LR) * mean, rtol=0, atol=1e-6)


def test_a_second_push_of_one_step_is_refused() -> None:
    with server(WaitBudget(slots=4, max_wait_s=0.05)) as running:
        client = RemoteClient([running.endpoint], CONFIG)
        rpc = RpcClient(running.endpoint, CONFIG)
        try:
            _create(client)
            assert not _push(rpc, 0, 0, _grads(0, 0), client_id=21, seq=1)
            with pytest.raises(RemoteError, match="worker 0 pushed twice in one sync step"):
                _push(rpc, 0, 0, _grads(0, 0), client_id=21, seq=2)
            with pytest.raises(RemoteError, match="has no push of worker 1 to wait for"):
                _push(rpc, 1, 0, None, client_id=22, poll=True)
        finally:
            rpc.close()
            client.close()


def test_a_restarted_worker_takes_a_round_its_predecessor_completed_unheard() -> None:
    """Worker 1 pushed step 0 and died waiting; worker 0's push applied the round. The
    restarted worker 1's push of step 0 is answered "applied" and changes nothing (its
    step's gradient is in already): no second round that worker 0 never joins."""
    with server(WaitBudget(slots=4, max_wait_s=0.05)) as running:
        client = RemoteClient([running.endpoint], CONFIG)
        rpc = RpcClient(running.endpoint, CONFIG)
        try:
            _create(client)
            dead, other = _grads(1, 0), _grads(0, 0)
            assert not _push(rpc, 1, 0, dead, client_id=31)  # then it is killed
            assert _push(rpc, 0, 0, other, client_id=32)
            assert _push(rpc, 1, 1, _grads(1, 9), client_id=33)  # the restart: done
            values = client.pull_dense(DENSE)
        finally:
            rpc.close()
            client.close()
    mean = np.add.reduce([other, dead], dtype=np.float32) / np.float32(2)
    np.testing.assert_allclose(values, _init() - np.float32(LR) * mean, rtol=0, atol=1e-6)


def test_a_step_run_again_by_restarted_workers_is_a_new_round() -> None:
    """Both workers were told step 0 was applied; restarted (incarnation 1, servers
    kept) they run step 0 again: a second round, applied once more."""
    with server(WaitBudget(slots=4, max_wait_s=0.05)) as running:
        client = RemoteClient([running.endpoint], CONFIG)
        rpc = RpcClient(running.endpoint, CONFIG)
        try:
            _create(client)
            assert not _push(rpc, 0, 0, _grads(0, 0), client_id=41)
            assert _push(rpc, 1, 0, _grads(1, 0), client_id=42)
            assert _push(rpc, 0, 0, None, client_id=41, poll=True)
            assert not _push(rpc, 0, 1, _grads(0, 1), client_id=43)
            assert _push(rpc, 1, 1, _grads(1, 1), client_id=44)
            values = client.pull_dense(DENSE)
        finally:
            rpc.close()
            client.close()
    expected = _init()
    for step in (0, 1):
        mean = np.add.reduce([_grads(0, step), _grads(1, step)], dtype=np.float32)
        expected = expected - np.float32(LR) * (mean / np.float32(2))
    np.testing.assert_allclose(values, expected, rtol=0, atol=1e-6)
