"""Bounded staleness (SSP, ``a_sync_configs.bounded_staleness``) over in-process servers
on 127.0.0.1 with real gRPC.

- Server 0's clocks: a worker waits until every worker's clock reached what it needs;
  one not heard from, or parked, holds no one back; a restarted worker
  (newer incarnation) continues its predecessor's clock, an older one is refused; a
  wait past the barrier timeout names the workers behind.
- Two async communicators in threads, worker 1 slowed down: with bound ``s`` worker 0
  never starts a step more than ``s`` steps ahead of worker 1's applied steps, and
  every gradient is applied once; with a flush (parked) worker 0 finishes although
  worker 1 has not.
- The setting's errors name the field; other modes refuse it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from test_modes import (
    DENSE,
    DENSE_TOTAL,
    DIM,
    LR,
    SPARSE,
    _dense_init,
    _initial_rows,
    servers,
    worker_client,
)

from psfleet.errors import RemoteError
from psfleet.ps.communicator import (
    AsyncCommunicator,
    AsyncConfig,
    CommunicatorSettings,
    make_communicator,
)
from psfleet.ps.communicator.types import check_async_only

pytestmark = pytest.mark.service


def test_a_worker_waits_for_the_slowest_clock_and_parked_workers_hold_no_one_back() -> None:
    with servers(1, barrier_timeout_s=30.0) as endpoints, \
            worker_client(endpoints, 0) as c0, worker_client(endpoints, 1) as c1:
        assert c0.clock(2, steps=5) == (True, 5)  # worker 1 not heard from: not counted
        assert c1.clock(2, steps=3) == (True, 3)
        assert c0.clock(2, steps=5, need=4) == (False, 3)  # waits (then answers pending)
        assert c0.clock(2, steps=5, need=3) == (True, 3)
        assert c0.clock(2, steps=5, need=4)[0] is False
        assert c1.clock(2, steps=3, parked=True) == (True, 5)  # only worker 0 counts
        assert c0.clock(2, steps=5, need=4) == (True, 5)
        assert c0.clock(2, steps=5, parked=True, need=9) == (True, 9)  # all parked

        # A waiter is answered as soon as the slowest clock gets there.
        answered: list[tuple[bool, int]] = []
        waiter = threading.Thread(target=lambda: answered.append(
            c0.clock(2, steps=6, parked=False, need=4)))
        assert c1.clock(2, steps=3, parked=False) == (True, 3)  # unparked again, at 3
        waiter.start()
        time.sleep(0.1)
        assert not answered
        c1.clock(2, steps=4)  # the parked state is kept
        waiter.join()
        assert answered == [(True, 4)]


def test_a_restarted_worker_continues_its_clock_and_a_stale_one_is_refused() -> None:
    with servers(1, barrier_timeout_s=30.0) as endpoints, \
            worker_client(endpoints, 0) as c0, worker_client(endpoints, 1) as c1:
        c0.clock(2, steps=10)
        c1.clock(2, steps=8)
        c1.incarnation = 1  # its restarted self: counts from 0 again
        assert c1.clock(2, steps=2) == (True, 10)  # 8 + 2
        c1.incarnation = 0
        with pytest.raises(RemoteError, match="replaced by its incarnation 1"):
            c1.clock(2, steps=9)


def test_a_wait_past_the_barrier_timeout_names_the_workers_behind() -> None:
    with servers(1, barrier_timeout_s=0.3) as endpoints, \
            worker_client(endpoints, 0) as c0, worker_client(endpoints, 1) as c1, \
            worker_client(endpoints, 2) as c2:
        c1.clock(3, steps=1)
        c2.clock(3, steps=0)
        deadline = time.monotonic() + 5
        with pytest.raises(RemoteError, match=r"workers \[1, 2\] did not reach step 2"):
            while time.monotonic() < deadline:
                c0.clock(3, steps=4, need=2)


def _run_two_workers(bound: int, steps: tuple[int, int], slow_s: float,
                     flush_first: bool = False) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Worker 0 and worker 1 (slowed by ``slow_s`` per step) in threads, each pushing
    gradient 1 on one counter key and every dense value per step. Returns how far
    worker 0 is ahead of worker 1's applied steps at the start of each of its steps,
    the counter row and the dense values at the end."""
    counter = np.array([100], np.uint64)
    config = AsyncConfig(bounded_staleness=bound, max_merge_var_num=1)
    settings = CommunicatorSettings(async_config=config, worker_num=2)
    leads: list[int] = []
    with servers(1, barrier_timeout_s=30.0) as endpoints, \
            worker_client(endpoints, 0) as c0, worker_client(endpoints, 1) as c1:
        comms = [make_communicator("async", c, settings) for c in (c0, c1)]
        for comm in comms:
            comm.on_sparse_table(SPARSE, None)  # type: ignore[arg-type]
            comm.on_dense_table(DENSE, None, _dense_init())  # type: ignore[arg-type]
            assert isinstance(comm, AsyncCommunicator)
            comm.start()

        def work(worker: int) -> None:
            comm = comms[worker]
            for step in range(steps[worker]):
                if worker == 0:
                    leads.append(step - comms[1].bound.clock)  # type: ignore[union-attr]
                else:
                    time.sleep(slow_s)
                comm.pull_sparse(SPARSE, counter)
                comm.push_sparse(SPARSE, counter, np.ones((1, DIM), np.float32))
                comm.push_dense(DENSE, np.ones(DENSE_TOTAL, np.float32))
                comm.end_step()
            if worker == 0 and flush_first:
                comm.flush()  # parked: worker 1 may go on alone

        threads = [threading.Thread(target=work, args=(w,)) for w in (0, 1)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
        finally:
            for comm in comms:
                comm.stop()
        row = c0.pull_sparse(SPARSE, counter, create=False)[0]
        dense = c0.pull_dense(DENSE)
    return leads, row, dense


@pytest.mark.parametrize("bound", [0, 2])
def test_a_worker_never_runs_more_than_the_bound_ahead(bound: int) -> None:
    """Worker 0 would finish its 12 steps while the slowed worker 1 does two; with the
    bound it starts step t only when worker 1 has applied t - 1 - bound steps. Every
    gradient is applied once: the counter row and the dense values move by LR per step
    of either worker."""
    leads, row, dense = _run_two_workers(bound, (12, 12), slow_s=0.05)
    assert max(leads) <= bound, leads
    assert max(leads) >= bound  # it did run ahead as far as allowed
    np.testing.assert_allclose(row, _initial_rows(np.array([100], np.uint64))[0] - LR * 24,
                               rtol=0, atol=1e-5)
    np.testing.assert_allclose(dense, _dense_init() - LR * 24, rtol=0, atol=1e-5)


def test_a_parked_worker_lets_the_others_finish_without_it() -> None:
    """Worker 0 does 3 steps and flushes (end of its data); worker 1 does 9: it is not
    held back by worker 0's clock (3) and finishes."""
    leads, row, _ = _run_two_workers(0, (3, 9), slow_s=0.0, flush_first=True)
    assert len(leads) == 3
    np.testing.assert_allclose(row, _initial_rows(np.array([100], np.uint64))[0] - LR * 12,
                               rtol=0, atol=1e-5)


def test_bounded_staleness_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="a_sync_configs.bounded_staleness: -1"):
        AsyncConfig(bounded_staleness=-1)
    with pytest.raises(ValueError, match="bounded_staleness: bounds how far async mode's"):
        check_async_only("geo", AsyncConfig(bounded_staleness=0))
    check_async_only("async", AsyncConfig(bounded_staleness=0))
