"""Coordination inside one server: named worker barriers and the push gate.

:class:`Barrier` lets ``worker_num`` workers meet by name (``fleet.barrier_worker``,
``init_worker``, checkpoints); :class:`PushGate` keeps table writes out while a
snapshot is copied, so a save holds every table as of one moment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from psfleet.errors import RemoteError
from psfleet.ps.wait_budget import WaitBudget

__all__ = ["Barrier", "PushGate", "describe_missing"]


def describe_missing(arrived: Collection[int], worker_num: int, limit: int = 16) -> str:
    """The workers of ``0 .. worker_num-1`` not in ``arrived``, as text: ``[1, 2]``, or
    the first ``limit`` of them and how many more.

    Works in O(len(arrived) + limit) time and memory, whatever ``worker_num`` is (never
    builds ``range(worker_num)``).
    """
    count = worker_num - len(arrived)
    first: list[int] = []
    index = 0
    while len(first) < min(limit, count) and index < worker_num:
        if index not in arrived:
            first.append(index)
        index += 1
    more = f" and {count - len(first)} more" if count > len(first) else ""
    return f"{first}{more}"


class _Arrival:
    """One worker's latest arrival at one barrier name."""

    __slots__ = ("incarnation", "seq", "generation", "started_s", "answered")

    def __init__(self, incarnation: int, seq: int, generation: int, started_s: float,
                 answered: bool = False) -> None:
        self.incarnation = incarnation
        self.seq = seq
        self.generation = generation
        self.started_s = started_s
        self.answered = answered  # the worker was told this crossing is done


class _Named:
    """One barrier name: its generation (crossings completed) and the arrivals."""

    def __init__(self) -> None:
        self.generation = 0
        self.count = 0  # arrivals in the current generation
        self.arrivals: dict[int, _Arrival] = {}

    def arrived(self) -> set[int]:
        return {w for w, a in self.arrivals.items() if a.generation == self.generation}


class Barrier:
    """A reusable barrier for ``worker_num`` workers, keyed by name on server 0.

    Waiting holds no handler thread for long: :meth:`arrive` is one step of a long
    poll (``psfleet.ps.wait_budget``). A worker's arrival is keyed by ``(worker index,
    incarnation, seq)``: ``incarnation`` is its restart number (``PSFLEET_RESTART_NUM``)
    and ``seq`` numbers its arrivals at this name (1, 2, ...), so a repeated call (a
    poll, or a retry after a lost reply) is the same arrival. A newer incarnation's
    arrival withdraws the older one's (a worker killed while waiting counts once, as
    its restarted self), and a call of an older incarnation is refused. A restarted
    worker whose dead predecessor's arrival completed a crossing it never heard of
    takes that crossing (its peers went on counting on it) instead of waiting for a
    new one: this ends the wait-on-each-other deadlock of issue 15, finding 4.

    The timeout counts from this arrival or from the latest sign of training of a
    worker that has not arrived (``progress``: its last push or pull), whichever is
    later: a worker still training (slower, or starved of CPU) is waited for, and
    only workers that neither arrive nor push nor pull for the timeout fail the
    barrier. (Worker 0's evaluation and export come after the last barrier:
    ``fleet.stop_worker(finish)``.)

    Args:
        budget: how many calls may wait at once, and how long.
        progress: ``progress(arrived, worker_num)``: the ``time.monotonic()`` of the
            latest push or pull of a worker below ``worker_num`` not in ``arrived``
            (None: none); None: the timeout counts from the arrival only.
    """

    def __init__(self, budget: WaitBudget | None = None,
                 progress: Callable[[Collection[int], int], float | None] | None = None
                 ) -> None:
        self._cond = threading.Condition()
        self._names: dict[str, _Named] = {}
        self._budget = budget or WaitBudget()
        self._closed = False
        self._progress = progress

    def close(self) -> None:
        """Release every waiter with an error (the server is stopping). Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def state(self) -> dict[str, Any]:
        """Every name's crossings and arrivals, JSON-ready (a share's copy carries them,
        ``psfleet.ps.replica``: a worker told nothing yet of a crossing learns it from
        the share's next primary)."""
        with self._cond:
            return {name: {"generation": n.generation, "count": n.count, "arrivals": [
                [w, a.incarnation, a.seq, a.generation, a.answered]
                for w, a in n.arrivals.items()]} for name, n in self._names.items()}

    def adopt_state(self, state: dict[str, Any]) -> None:
        """Take :meth:`state` of another copy as this barrier's (the arrivals' waits
        count from now)."""
        now = time.monotonic()
        with self._cond:
            self._names = {}
            for name, entry in state.items():
                named = self._names[name] = _Named()
                named.generation, named.count = int(entry["generation"]), int(entry["count"])
                named.arrivals = {int(w): _Arrival(int(k), int(q), int(g), now, bool(done))
                                  for w, k, q, g, done in entry["arrivals"]}
            self._cond.notify_all()

    def arrive(self, name: str, worker_index: int, worker_num: int, timeout_s: float,
               incarnation: int = 0, seq: int = 0) -> bool:
        """Register (or re-check) an arrival at barrier ``name`` and wait a little.

        Idempotent per ``(worker_index, incarnation, seq)``; ``seq`` 0 (no number) is
        a new arrival every call. Blocks at most the budget's ``max_wait_s``.

        Returns:
            True when every worker arrived (the crossing is done), False when the
            caller must call again (same arguments).

        Raises:
            RemoteError: the other workers did not arrive within ``timeout_s`` of
                this arrival (names them; every waiter of the crossing names the same
                workers, so the arrival stays), the server is
                stopping, or ``incarnation`` is older than one of this worker that
                arrived since (FAILED_PRECONDITION; names both).
        """
        with self._cond:
            named = self._names.setdefault(name, _Named())
            mine = named.arrivals.get(worker_index)
            if self._closed:
                if (mine is not None and seq != 0 and (incarnation, seq) == (
                        mine.incarnation, mine.seq) and mine.generation != named.generation):
                    # Its crossing was done before the server stopped (a worker that
                    # went on stopped it): only the answer had not reached this one.
                    mine.answered = True
                    return True
                raise RemoteError(f"barrier {name!r}: the server is stopping")
            if mine is not None and incarnation < mine.incarnation:
                raise RemoteError(self._stale(name, worker_index, incarnation, mine))
            if (mine is None or incarnation > mine.incarnation or seq == 0
                    or seq > mine.seq):
                took = self._register(named, worker_index, worker_num, incarnation, seq)
                if took is not None:
                    return took
                mine = named.arrivals[worker_index]
            elif seq < mine.seq:  # a late copy of an arrival this worker has left behind
                return True
            generation = mine.generation
            current = mine

            def ended() -> bool:
                return (self._closed or named.generation != generation
                        or named.arrivals.get(worker_index) is not current)

            if not ended():
                self._budget.wait_for(self._cond, ended)
            newer = named.arrivals[worker_index]
            if newer is not current:
                raise RemoteError(self._stale(name, worker_index, incarnation, newer))
            if named.generation != generation:
                current.answered = True
                return True
            if self._closed:
                raise RemoteError(f"barrier {name!r}: the server is stopping")
            now = time.monotonic()
            if now - current.started_s > timeout_s:
                arrived = named.arrived()
                last = (self._progress(arrived, worker_num) if self._progress is not None
                        else None)
                if last is None or now - last > timeout_s:
                    missing = describe_missing(arrived, worker_num)
                    raise RemoteError(
                        f"barrier {name!r}: workers {missing} did not arrive within "
                        f"{timeout_s:.0f} s, nor push or pull for as long; check their "
                        "logs (workerlog.N)")
            return False

    def _register(self, named: _Named, worker_index: int, worker_num: int,
                  incarnation: int, seq: int) -> bool | None:
        """Record a new arrival (the caller holds the lock). True: the crossing is
        done; None: the caller waits."""
        old = named.arrivals.get(worker_index)
        now = time.monotonic()
        if old is not None and old.generation == named.generation:
            named.count -= 1  # withdrawn: replaced by this arrival
            self._cond.notify_all()  # its waiter (if any) fails
        if (old is not None and incarnation > old.incarnation and not old.answered
                and old.generation < named.generation):
            # The dead predecessor's arrival completed a crossing nobody told it of:
            # the others went on counting on it, so this incarnation takes it.
            named.arrivals[worker_index] = _Arrival(incarnation, seq, old.generation, now,
                                                    answered=True)
            return True
        arrival = _Arrival(incarnation, seq or (old.seq + 1 if old else 1),
                           named.generation, now)
        named.arrivals[worker_index] = arrival
        named.count += 1
        if named.count >= worker_num:
            named.generation += 1
            self._cond.notify_all()
            named.count = 0
            arrival.answered = True
            return True
        return None

    @staticmethod
    def _stale(name: str, worker_index: int, incarnation: int, newer: _Arrival) -> str:
        return (f"barrier {name!r}: worker {worker_index} incarnation {incarnation} was "
                f"replaced by its incarnation {newer.incarnation} (a restarted copy of this "
                "worker, PSFLEET_RESTART_NUM); this process is stale and must exit")


class PushGate:
    """Keeps table writes out while a snapshot is copied.

    Every push (apply, delta, or a sync round's mean) runs inside :meth:`write`; a
    save runs its copy inside :meth:`closed`, which waits for the writes in progress
    to finish and holds new ones back until the copy is done. So a snapshot holds
    every table's values and rule state as of one moment of this server (no push half
    applied, no table copied before and another after a push).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if self._active == 0:
                    self._cond.notify_all()

    @contextmanager
    def closed(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)  # one snapshot at a time
            self._closed = True
            self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()
