"""Barriers as long polls (issue 15, findings 3 and 4), over real gRPC on 127.0.0.1.

- Finding 3: 32 blocked Barrier calls held all 32 handler threads, so a server (its
  health check included) stopped answering and 33 workers could not pass a barrier.
  Now a Barrier call waits at most ``WaitBudget.max_wait_s`` and only while a wait slot
  is free: 64 workers pass a barrier on a server with 8 threads, and the health check
  answers while they wait.
- Finding 4: a worker killed while waiting stayed counted as arrived. Now membership
  is by (worker, incarnation): a restarted worker's arrival replaces its dead
  predecessor's, whose calls are refused, and a crossing the predecessor completed
  without hearing of it is taken by the restarted worker (no wait-on-each-other).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from psfleet.errors import RemoteError
from psfleet.ps import RemoteClient, TableService, start_server
from psfleet.ps.coordination import Barrier
from psfleet.ps.wait_budget import WaitBudget
from psfleet.rpc import RpcClient, RpcConfig, RunningServer
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=8)


@contextlib.contextmanager
def server(budget: WaitBudget, timeout_s: float = 20.0) -> Iterator[RunningServer]:
    """One in-process server (8 handler threads) whose waits use ``budget``."""
    _, running = start_server(HOST, 0, CONFIG, TableService(barrier_timeout_s=timeout_s,
                                                            wait_budget=budget))
    try:
        yield running
    finally:
        running.stop(grace_s=0.5)


@contextlib.contextmanager
def rpc(running: RunningServer) -> Iterator[RpcClient]:
    client = RpcClient(running.endpoint, CONFIG)
    try:
        yield client
    finally:
        client.close()


def _arrive(client: RpcClient, worker: int, worker_num: int, incarnation: int,
            seq: int = 1, name: str = "ckpt") -> bool:
    """One Barrier call (one step of the long poll): True when the crossing is done."""
    reply = client.call("Barrier", msg.BarrierRequest(
        name=name, worker_index=worker, worker_num=worker_num, incarnation=incarnation,
        seq=seq))
    return bool(reply.done)


def test_64_workers_pass_a_barrier_on_8_threads_and_health_answers_meanwhile() -> None:
    workers = 64
    with server(WaitBudget(slots=4, max_wait_s=0.5)) as running, rpc(running) as health:
        client = RemoteClient([running.endpoint], CONFIG)
        passed: list[tuple[str, int]] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        last_may_go = threading.Event()

        def worker(index: int) -> None:
            try:
                for name in ("first", "second"):  # reusable, by name
                    if index == workers - 1 and name == "first":
                        last_may_go.wait(30)
                    client.barrier(name, index, workers)
                    with lock:
                        passed.append((name, index))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
        try:
            for t in threads:
                t.start()
            time.sleep(1.5)  # 63 workers are polling the barrier now
            started = time.monotonic()
            serving = health.is_serving(timeout_s=5.0)
            health_s = time.monotonic() - started
            assert passed == []  # nobody passed without worker 63
            last_may_go.set()
        finally:
            last_may_go.set()
            for t in threads:
                t.join(timeout=60)
            client.close()
        assert not errors, errors[:3]
        assert serving and health_s < 1.0, health_s
        assert sorted(i for n, i in passed if n == "first") == list(range(workers))
        assert sorted(i for n, i in passed if n == "second") == list(range(workers))
        # every "first" was passed before any "second": a crossing is one generation
        assert {n for n, _ in passed[:workers]} == {"first"}


def test_a_restarted_worker_replaces_its_dead_arrival_and_counts_once() -> None:
    with server(WaitBudget(slots=4, max_wait_s=0.05)) as running, rpc(running) as client:
        assert not _arrive(client, 1, 3, incarnation=0)  # then it is killed
        assert not _arrive(client, 1, 3, incarnation=1)  # its restart arrives
        with pytest.raises(RemoteError, match=r"worker 1 incarnation 0 was replaced by its "
                                              r"incarnation 1"):
            _arrive(client, 1, 3, incarnation=0)  # the old incarnation is refused
        # worker 1 counts once: with worker 0 that is 2 of 3, not done
        assert not _arrive(client, 0, 3, incarnation=0)
        assert not _arrive(client, 1, 3, incarnation=1)
        assert _arrive(client, 2, 3, incarnation=0)  # the third worker completes it
        assert _arrive(client, 0, 3, incarnation=0)  # the others learn it on their poll
        assert _arrive(client, 1, 3, incarnation=1)


def test_a_crossing_done_before_the_server_stopped_is_still_answered_done() -> None:
    """Worker 0 completes stop_worker and stops the servers while worker 1 is between
    two polls: worker 1's next poll must learn its crossing was done, not fail."""
    barrier = Barrier(WaitBudget(slots=4, max_wait_s=0.05))
    assert not barrier.arrive("stop_worker", 1, 2, 20.0, seq=1)  # its poll ends undone
    assert barrier.arrive("stop_worker", 0, 2, 20.0, seq=1)  # worker 0 completes it
    barrier.close()  # worker 0 went on and stopped the server
    assert barrier.arrive("stop_worker", 1, 2, 20.0, seq=1)
    with pytest.raises(RemoteError, match="the server is stopping"):
        barrier.arrive("stop_worker", 1, 2, 20.0, seq=2)  # a new crossing is refused
    with pytest.raises(RemoteError, match="the server is stopping"):
        barrier.arrive("other", 0, 2, 20.0, seq=1)


def test_a_restarted_worker_completes_a_barrier_with_worker_0() -> None:
    with server(WaitBudget(slots=4, max_wait_s=0.05)) as running, rpc(running) as client:
        assert not _arrive(client, 1, 2, incarnation=0)
        assert not _arrive(client, 1, 2, incarnation=1)
        assert _arrive(client, 0, 2, incarnation=0)
        assert _arrive(client, 1, 2, incarnation=1)
        # the next crossing needs both again (the old arrival left nothing behind)
        assert not _arrive(client, 0, 2, incarnation=0, seq=2)
        assert _arrive(client, 1, 2, incarnation=1, seq=2)


def test_no_wait_on_each_other_after_a_worker_died_inside_a_crossing() -> None:
    """The finding-4 deadlock: worker 1 arrives at checkpoint.begin and dies; worker 0
    arrives, the crossing completes (counting the dead arrival) and worker 0 waits at
    checkpoint.end; the restarted worker 1 reaches checkpoint.begin again. It takes
    the crossing its predecessor completed and meets worker 0 at checkpoint.end."""
    with server(WaitBudget(slots=4, max_wait_s=0.2)) as running, rpc(running) as raw:
        assert not _arrive(raw, 1, 2, incarnation=0, name="checkpoint.begin")  # dies
        worker0 = RemoteClient([running.endpoint], CONFIG, worker_index=0)
        restarted = RemoteClient([running.endpoint], CONFIG, worker_index=1, incarnation=1)
        ended: list[str] = []

        def run_worker0() -> None:
            worker0.barrier("checkpoint.begin", 0, 2)
            worker0.barrier("checkpoint.end", 0, 2)
            ended.append("worker 0")

        thread = threading.Thread(target=run_worker0)
        try:
            thread.start()
            started = time.monotonic()
            restarted.barrier("checkpoint.begin", 1, 2)
            restarted.barrier("checkpoint.end", 1, 2)
            thread.join(timeout=10)
            assert ended == ["worker 0"] and time.monotonic() - started < 5.0
        finally:
            thread.join(timeout=10)
            worker0.close()
            restarted.close()


def test_a_barrier_timeout_names_the_same_missing_worker_to_every_waiter() -> None:
    with server(WaitBudget(slots=4, max_wait_s=0.05), timeout_s=0.3) as running:
        remote = RemoteClient([running.endpoint], CONFIG)
        errors: list[str] = []

        def worker(index: int) -> None:
            with pytest.raises(RemoteError) as caught:
                remote.barrier("b", index, 3)
            errors.append(str(caught.value))

        threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
        try:
            for t in threads:
                t.start()
        finally:
            for t in threads:
                t.join(timeout=10)
            remote.close()
        assert len(errors) == 2
        for text in errors:
            assert "barrier 'b': workers [2] did not arrive within 0 s" in text


def test_wait_budget_lets_only_its_slots_wait() -> None:
    budget = WaitBudget(slots=1, max_wait_s=0.3)
    cond = threading.Condition()
    inside = threading.Event()

    def hold_the_slot() -> None:
        with cond:
            inside.set()
            budget.wait_for(cond, lambda: False)

    thread = threading.Thread(target=hold_the_slot)
    thread.start()
    try:
        inside.wait(5)
        time.sleep(0.02)
        started = time.monotonic()
        with cond:
            assert budget.wait_for(cond, lambda: False) is False
        assert time.monotonic() - started < 0.1  # no slot: answered at once
    finally:
        thread.join(timeout=5)
    started = time.monotonic()
    with cond:
        assert budget.wait_for(cond, lambda: False) is False
    assert 0.25 < time.monotonic() - started < 1.0  # a free slot: waited max_wait_s
