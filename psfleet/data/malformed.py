"""Rate-limited warnings about malformed input lines (one job: not flooding the log).

Every parser skips a malformed line with a warning naming ``file:line`` and why; at
most one warning per :data:`WARN_INTERVAL_S` seconds per file is logged, the next one
saying how many were suppressed in between.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

__all__ = ["WARN_INTERVAL_S", "RateLimitedWarner"]

WARN_INTERVAL_S = 5.0


class RateLimitedWarner:
    """Logs at most one malformed-line warning per ``interval_s`` per file (thread safe).

    Args:
        interval_s: seconds between two warnings about the same file.
        clock: monotonic clock (seconds), replaceable in tests.
        log: the logger warnings go to.
    """

    def __init__(self, interval_s: float = WARN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 log: logging.Logger | None = None) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._log = log or logging.getLogger(__name__)
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, int]] = {}  # source -> (last warning, suppressed)

    def warn(self, source: str, line_no: int, reason: str) -> None:
        """Warn that line ``line_no`` (1-based) of ``source`` was skipped (rate limited)."""
        now = self._clock()
        with self._lock:
            last, suppressed = self._state.get(source, (-math.inf, 0))
            if now - last < self._interval_s:
                self._state[source] = (last, suppressed + 1)
                return
            self._state[source] = (now, 0)
        if suppressed:
            self._log.warning(
                "%s:%d: skipping malformed line: %s (%d more malformed lines in %s were not "
                "logged in the last %.0f s)", source, line_no, reason, suppressed, source,
                self._interval_s)
        else:
            self._log.warning("%s:%d: skipping malformed line: %s", source, line_no, reason)
