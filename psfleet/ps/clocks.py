"""Workers' clocks for bounded staleness (SSP): how far the slowest worker has come.

Stale Synchronous Parallel (Ho et al. 2013, "More Effective Distributed ML via a Stale
Synchronous Parallel Parameter Server", NIPS): a worker about to compute step ``t``
waits until every worker's steps up to ``t - 1 - s`` are applied on the servers, ``s``
being the staleness bound (``a_sync_configs.bounded_staleness``). With ``s = 0`` every
step reads every worker's earlier steps, as sync mode does, while each gradient is
still applied as it arrives.

A worker's *clock* is the number of its steps the servers acknowledged (its send thread
knows it). :class:`WorkerClocks` lives on server 0 (share 0's primary in a replicated
job) and keeps each worker's clock; a worker reports it with every send and asks, as a
long poll (``psfleet.ps.wait_budget``), until the slowest clock reaches what it needs.

- A worker not heard from holds no one back: each reports when its communicator
  starts, before its first step. After share 0 moved to a server that did not see
  every report (a rejoined server 0 taking its share back), that server knows each
  worker again from its next report, and one parked at a barrier meanwhile blocks no
  one.
- A *parked* worker (it flushed: the end of an epoch or of its data, a save, its stop)
  holds no one back until it reports again, so a worker waiting at a barrier or done
  with its shard never blocks the others.
- A restarted worker (a newer incarnation, ``PSFLEET_RESTART_NUM``) continues its
  predecessor's clock: its own count starts from 0 again, and the others must not wait
  for it to redo steps its predecessor made.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from psfleet.errors import RemoteError
from psfleet.ps.wait_budget import WaitBudget

__all__ = ["WorkerClocks"]


@dataclass
class _Clock:
    """One worker's clock: ``base`` (its predecessors' steps) plus its own ``steps``."""

    incarnation: int
    base: int
    steps: int
    parked: bool

    @property
    def value(self) -> int:
        return self.base + self.steps


class WorkerClocks:
    """The clock of every worker of the job, on server 0. Thread safe.

    Args:
        budget: how many calls may wait at once, and how long each waits.
    """

    def __init__(self, budget: WaitBudget | None = None) -> None:
        self._cond = threading.Condition()
        self._clocks: dict[int, _Clock] = {}
        self._budget = budget or WaitBudget()
        self._waiting_since: dict[int, tuple[int, float]] = {}  # worker -> (need, since)
        self._closed = False

    def close(self) -> None:
        """Release every waiter (the server is stopping). Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def state(self) -> list[list[int]]:
        """Every worker's clock, JSON-ready: ``[worker, incarnation, base, steps,
        parked]`` (a share's copy carries them, ``psfleet.ps.replica``)."""
        with self._cond:
            return [[w, c.incarnation, c.base, c.steps, int(c.parked)]
                    for w, c in self._clocks.items()]

    def adopt_state(self, state: list[list[int]]) -> None:
        """Take :meth:`state` of another copy as these clocks."""
        with self._cond:
            self._clocks = {int(w): _Clock(int(k), int(b), int(s), bool(p))
                            for w, k, b, s, p in state}
            self._waiting_since = {}
            self._cond.notify_all()

    def _slowest(self, worker_num: int) -> int | None:
        """The lowest clock of the workers heard from and not parked; None: none."""
        clocks = [c.value for w, c in self._clocks.items() if w < worker_num and not c.parked]
        return min(clocks) if clocks else None

    def tick(self, worker_index: int, worker_num: int, incarnation: int, steps: int,
             parked: bool | None, need: int, timeout_s: float) -> tuple[bool, int]:
        """Record worker ``worker_index``'s clock and wait a little until the slowest
        clock reaches ``need``.

        Args:
            worker_index: the calling worker, in ``[0, worker_num)``.
            worker_num: workers of the job.
            incarnation: the caller's restart number; a newer one continues the clock of
                the older, an older one than recorded is refused.
            steps: steps of the caller acknowledged by the servers (its own count since
                it started).
            parked: True: the caller holds no one back from now on; False: it does
                again; None: as it was (a worker first heard of is not parked).
            need: the slowest clock the caller waits for (0: it only reports).
            timeout_s: how long one ``need`` may wait in all before the call fails,
                seconds.

        Returns:
            ``(done, slowest)``: done when the slowest clock reached ``need`` (False:
            call again); the slowest clock of the workers heard from and not parked
            (``need`` when there is none).

        Raises:
            RemoteError: the slowest workers did not reach ``need`` within
                ``timeout_s`` (names them), the server is stopping, or ``incarnation``
                is older than one recorded for this worker.
        """
        with self._cond:
            self._record(worker_index, incarnation, steps, parked)

            def reached() -> bool:
                slowest = self._slowest(worker_num)
                return self._closed or slowest is None or slowest >= need

            if need and not reached():
                self._budget.wait_for(self._cond, reached)
            if self._closed:
                raise RemoteError("bounded staleness: the server is stopping")
            slowest = self._slowest(worker_num)
            if slowest is None:  # every worker parked
                slowest = need
            if slowest >= need:
                self._waiting_since.pop(worker_index, None)
                return True, slowest
            waited, since = self._waiting_since.setdefault(worker_index,
                                                            (need, time.monotonic()))
            if waited != need:
                self._waiting_since[worker_index] = (need, time.monotonic())
            elif time.monotonic() - since > timeout_s:
                behind = sorted(w for w, c in self._clocks.items()
                                if w < worker_num and not c.parked and c.value < need)
                raise RemoteError(
                    f"bounded staleness: workers {behind[:16]} did not reach step {need} "
                    f"within {timeout_s:.0f} s while worker {worker_index} waited for them; "
                    "check their logs (workerlog.N)")
            return False, slowest

    def _record(self, worker_index: int, incarnation: int, steps: int,
                parked: bool | None) -> None:
        clock = self._clocks.get(worker_index)
        if clock is None:
            self._clocks[worker_index] = _Clock(incarnation, 0, steps, bool(parked))
        elif incarnation < clock.incarnation:
            raise RemoteError(
                f"bounded staleness: worker {worker_index} incarnation {incarnation} was "
                f"replaced by its incarnation {clock.incarnation} (a restarted copy of this "
                "worker, PSFLEET_RESTART_NUM); this process is stale and must exit")
        elif incarnation > clock.incarnation:
            self._clocks[worker_index] = _Clock(incarnation, clock.value, steps, bool(parked))
        else:
            clock.steps = max(clock.steps, steps)
            if parked is not None:
                clock.parked = parked
        self._cond.notify_all()
