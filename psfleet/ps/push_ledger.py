"""At-most-once pushes: a server applies each (client, sequence) push once.

A worker's push can reach a server twice: the server applied it, the response was
lost (connection dropped, server restarting its listener), and the client retried on
UNAVAILABLE. Every push carries a ``PushId`` (random client id per client instance,
sequence number growing by one per push); the ledger remembers the recent ids of
each client and runs a push's update only the first time its id is seen. A second
arrival while the first is still being applied (a sync round waiting for the other
workers) waits for it and returns its outcome. An update that failed is forgotten,
so a retry applies it.

The admin calls that must not run twice either (a Shrink decays once, an AgeOneDay
ages once, a delta Save resets delta_score once) use the same ledger through
:meth:`PushLedger.call_once`, which also hands a duplicate the first call's result.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["PushLedger"]

_T = TypeVar("_T")


class _Entry:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.failed = False
        self.result: Any = None


class PushLedger:
    """The ids of recently applied pushes, per client. Thread safe.

    Args:
        window: pushes remembered per client. A client retries only its pushes in
            flight (a few per send thread), so any window above that suffices; older
            ids are forgotten first.
    """

    def __init__(self, window: int = 4096) -> None:
        self._window = window
        self._lock = threading.Lock()
        self._clients: dict[int, OrderedDict[int, _Entry]] = {}

    def applied(self) -> list[tuple[int, int]]:
        """The ``(client_id, seq)`` of every remembered push that was applied."""
        with self._lock:
            return [(client, seq) for client, seen in self._clients.items()
                    for seq, entry in seen.items() if entry.done.is_set() and not entry.failed]

    def mark_applied(self, pushes: list[tuple[int, int]]) -> None:
        """Remember ``pushes`` as applied (a copy of a ledger: :meth:`applied`), so that
        their retries are not applied again."""
        with self._lock:
            for client, seq in pushes:
                entry = _Entry()
                entry.done.set()
                seen = self._clients.setdefault(client, OrderedDict())
                seen[seq] = entry
                while len(seen) > self._window:
                    seen.popitem(last=False)

    def run_once(self, client_id: int, seq: int, apply: Callable[[], None]) -> bool:
        """Call ``apply()`` unless push ``(client_id, seq)`` was applied already.

        Blocks while another arrival of the same push is being applied, then returns
        as that one did. ``client_id`` 0 (a push without id) is always applied.

        Returns:
            True when this call applied the push, False when it was a duplicate.

        Raises:
            Whatever ``apply`` raises (the push is then forgotten, so a retry applies it).
        """
        return self.call_once(client_id, seq, apply)[1]

    def call_once(self, client_id: int, seq: int, call: Callable[[], _T]) -> tuple[_T, bool]:
        """``call()`` once per ``(client_id, seq)``; a duplicate gets the first result.

        Returns:
            (the result, True when this arrival ran ``call``).

        Raises:
            Whatever ``call`` raises (the id is then forgotten, so a retry runs it).
        """
        if client_id == 0:
            return call(), True
        while True:
            with self._lock:
                seen = self._clients.setdefault(client_id, OrderedDict())
                other = seen.get(seq)
                if other is None:
                    mine = seen[seq] = _Entry()
                    while len(seen) > self._window:
                        seen.popitem(last=False)
            if other is None:
                break
            other.done.wait()
            if not other.failed:
                return other.result, False
        try:
            mine.result = call()
        except BaseException:
            mine.failed = True
            with self._lock:
                self._clients[client_id].pop(seq, None)
            raise
        finally:
            mine.done.set()
        return mine.result, True
