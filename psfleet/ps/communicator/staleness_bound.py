"""A worker's side of bounded staleness (SSP): wait before a step that would run too
far ahead of the slowest worker.

The async communicator counts the steps the servers acknowledged (its clock) and
reports them to server 0 after each send; before each step the training loop asks
:meth:`StalenessBound.before_step`, which waits (a long poll, ``psfleet.ps.clocks``)
only when the slowest clock it last heard of is too far behind. A worker about to wait
for the others (a flush at the end of an epoch or of its data, a barrier, its stop)
*parks*: it holds no one back until its next step.

Source: Ho et al. 2013, "More Effective Distributed ML via a Stale Synchronous
Parallel Parameter Server" (NIPS).
"""

from __future__ import annotations

import threading
import time

from psfleet.ps.client import TableClient
from psfleet.ps.wait_budget import poll_until_done

__all__ = ["StalenessBound"]


class StalenessBound:
    """One worker's clock and its waits. Thread safe: the send thread reports the
    clock (never changing the parked state), the training thread waits and parks.

    Args:
        client: the tables (server 0 keeps the clocks).
        worker_num: workers of the job.
        bound: the staleness bound ``s`` in steps (>= 0): step ``t`` waits until every
            worker's steps up to ``t - 1 - s`` are applied.
    """

    def __init__(self, client: TableClient, worker_num: int, bound: int) -> None:
        self.client = client
        self.worker_num = worker_num
        self.bound = bound
        self._acked = 0
        self._lock = threading.Lock()
        self._parked = False  # the training thread's view
        self._slowest = 0
        #: steps that asked server 0 (the clocks last heard of were too far behind),
        #: and the seconds they waited in all
        self.waits = 0
        self.waited_s = 0.0

    @property
    def clock(self) -> int:
        """This worker's steps the servers acknowledged."""
        with self._lock:
            return self._acked

    def start(self) -> None:
        """Tell server 0 this worker trains from now on (before its first step): a
        worker not heard from holds no one back. Blocks for one call.

        Raises:
            RpcError, RemoteError: server 0 could not be reached or refused.
        """
        self._report(False, 0)

    def acknowledged(self, steps: int) -> None:
        """The servers acknowledged ``steps`` more steps of this worker (the send
        thread, after a send): report the clock.

        Raises:
            RpcError, RemoteError: server 0 could not be reached or refused.
        """
        with self._lock:
            self._acked += steps
        self._report(None, 0)

    def before_step(self, step: int) -> None:
        """Block until every worker's clock reached ``step - 1 - bound`` (``step``: the
        1-based number of the step about to be computed). Unparks this worker.

        Raises:
            RemoteError: the slowest workers did not get there within server 0's
                barrier timeout (names them), or server 0 is stopping.
        """
        need = step - 1 - self.bound
        if not self._parked and (need <= 0 or self._slowest >= need):
            return
        started = time.monotonic()
        parked, self._parked = self._parked, False
        if not self._report(False if parked else None, max(need, 0)):
            poll_until_done(lambda: self._report(None, need))
        if need > 0:
            self.waits += 1
            self.waited_s += time.monotonic() - started

    def park(self) -> None:
        """This worker holds no one back until its next step (it is about to wait for
        the others). Blocks for one call to server 0."""
        self._parked = True
        self._report(True, 0)

    def _report(self, parked: bool | None, need: int) -> bool:
        done, slowest = self.client.clock(self.worker_num, self.clock, parked, need)
        self._slowest = slowest
        return done

    def __str__(self) -> str:
        return (f"bounded staleness {self.bound}: {self.waits} steps asked server 0, "
                f"waiting {self.waited_s:.1f} s in all")
