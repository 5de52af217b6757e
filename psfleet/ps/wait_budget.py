"""How long a handler may wait inside a call (barriers, sync rounds): a long poll.

gRPC Python's sync server runs each call on one of ``server_threads`` handler threads
and cannot park a call without its thread. So a call that waits for other workers (a
Barrier, a sync-mode push) is a *long poll*: it registers its arrival idempotently,
waits at most ``max_wait_s`` seconds, and only while fewer than ``slots`` calls
already wait; otherwise it answers "pending" at once and the client calls again
(``psfleet.ps.client``). A server therefore never has more than ``slots`` threads
blocked, whatever the worker count, and the rest answer health checks, pulls and
pushes. (ps-lite and Paddle's brpc servers park such calls without a thread; this is
the same contract on a thread-per-call server.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from psfleet.errors import ConfigError

__all__ = ["WaitBudget", "poll_until_done", "DEFAULT_WAIT_SLOTS", "DEFAULT_MAX_WAIT_S"]

#: Waiting calls allowed at once: half of ``RpcConfig.server_threads``' default (32).
DEFAULT_WAIT_SLOTS = 16
#: The longest one call waits before answering "pending", seconds.
DEFAULT_MAX_WAIT_S = 0.5


class WaitBudget:
    """Caps how many handler threads wait at once, and for how long. Thread safe.

    Args:
        slots: calls that may wait at once (e.g. half of the server's handler
            threads); 0: no call waits (every wait answers at once).
        max_wait_s: the longest one call waits, seconds.

    Raises:
        ConfigError: ``slots`` < 0 or ``max_wait_s`` < 0.
    """

    def __init__(self, slots: int = DEFAULT_WAIT_SLOTS,
                 max_wait_s: float = DEFAULT_MAX_WAIT_S) -> None:
        if slots < 0 or max_wait_s < 0:
            raise ConfigError(f"WaitBudget: slots={slots!r}, max_wait_s={max_wait_s!r}; "
                              "both must be >= 0")
        self.slots = slots
        self.max_wait_s = max_wait_s
        self._lock = threading.Lock()
        self._waiting = 0

    @classmethod
    def for_threads(cls, server_threads: int) -> WaitBudget:
        """The budget of a server with ``server_threads`` handler threads: half of
        them may wait (at least one), so the other half always serve."""
        return cls(slots=max(1, server_threads // 2))

    @property
    def waiting(self) -> int:
        """Calls waiting now."""
        return self._waiting

    def wait_for(self, cond: threading.Condition, predicate: Callable[[], bool]) -> bool:
        """``cond.wait_for(predicate)`` for at most ``max_wait_s``, if a slot is free.

        The caller holds ``cond``. Without a free slot this returns ``predicate()`` at
        once (the call then answers "pending").

        Returns:
            The predicate's value when the wait ended.
        """
        with self._lock:
            if self._waiting >= self.slots:
                return predicate()
            self._waiting += 1
        try:
            return cond.wait_for(predicate, timeout=self.max_wait_s)
        finally:
            with self._lock:
                self._waiting -= 1


def poll_until_done(call: Callable[[], bool], backoff_initial_s: float = 0.005,
                    backoff_max_s: float = 0.2) -> None:
    """The client side of a long poll: ``call()`` until it returns True. Blocks.

    A call that came back "pending" after waiting on the server is repeated at once;
    one that came back at once (the server had no free wait slot) is repeated after a
    backoff that doubles from ``backoff_initial_s`` to ``backoff_max_s`` seconds, so
    1,000 waiting workers cost a server a few hundred cheap calls per second, not a
    busy loop. The server ends the wait with an error (a timeout naming the missing
    workers, or its shutdown), which ``call`` raises.
    """
    backoff = backoff_initial_s
    while True:
        started = time.monotonic()
        if call():
            return
        if time.monotonic() - started >= 0.05:  # the server waited: ask again at once
            backoff = backoff_initial_s
            continue
        time.sleep(backoff)
        backoff = min(backoff * 2, backoff_max_s)
