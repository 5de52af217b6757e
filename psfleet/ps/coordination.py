"""Coordination inside one server: named worker barriers and the push gate.

:class:`Barrier` lets ``worker_num`` workers meet by name (``fleet.barrier_worker``,
``init_worker``, checkpoints); :class:`PushGate` keeps table writes out while a
snapshot is copied, so a save holds every table as of one moment.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager

from psfleet.errors import RemoteError

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


class Barrier:
    """A reusable barrier for ``worker_num`` workers, keyed by name on server 0."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._arrived: dict[str, set[int]] = {}
        self._generation: dict[str, int] = {}
        self._closed = False

    def close(self) -> None:
        """Release every waiter with an error (the server is stopping). Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait(self, name: str, worker_index: int, worker_num: int, timeout_s: float) -> None:
        with self._cond:
            arrived = self._arrived.setdefault(name, set())
            generation = self._generation.get(name, 0)
            arrived.add(worker_index)
            if len(arrived) >= worker_num:
                self._arrived[name] = set()
                self._generation[name] = generation + 1
                self._cond.notify_all()
                return
            done = self._cond.wait_for(
                lambda: self._closed or self._generation.get(name, 0) != generation,
                timeout=timeout_s)
            if self._closed and self._generation.get(name, 0) == generation:
                raise RemoteError(f"barrier {name!r}: the server is stopping")
            if not done:
                missing = describe_missing(self._arrived.get(name, set()), worker_num)
                raise RemoteError(
                    f"barrier {name!r}: workers {missing} did not arrive within "
                    f"{timeout_s:.0f} s; check their logs (workerlog.N)"
                )


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
