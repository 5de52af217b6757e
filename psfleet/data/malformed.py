"""Rate-limited warnings about malformed input lines (one job: not flooding the log).

Every parser skips a malformed line with a warning naming ``file:line`` and why; at
most one warning per :data:`WARN_INTERVAL_S` seconds per file is logged, the next one
saying how many were suppressed in between.

:func:`first_malformed` lets the caller of a parser learn the first malformed line it
met (every warning passes through here, logged or not), for the job's malformed-line
limit (:class:`~psfleet.data.dataset_base.DatasetBase` ``max_malformed_fraction``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from psfleet.errors import DataError

__all__ = ["WARN_INTERVAL_S", "MalformedRecord", "RateLimitedWarner", "first_malformed"]

WARN_INTERVAL_S = 5.0

_local = threading.local()


class MalformedRecord:
    """The first malformed line seen inside a :func:`first_malformed` block.

    Attributes:
        source: file name, or None when no line was malformed.
        line_no: 1-based line number.
        reason: why the line was skipped.
    """

    def __init__(self) -> None:
        self.source: str | None = None
        self.line_no = 0
        self.reason = ""

    def note(self, source: str, line_no: int, reason: str) -> None:
        """Keep (source, line_no, reason) if it is the first (lowest line) of its file."""
        if self.source is None or (source == self.source and line_no < self.line_no):
            self.source, self.line_no, self.reason = source, line_no, reason

    def __str__(self) -> str:
        return f"{self.source}:{self.line_no} {self.reason}" if self.source else "none"


@contextmanager
def first_malformed() -> Iterator[MalformedRecord]:
    """Record the first malformed line warned about in this thread inside the block
    (parsers warn through :class:`RateLimitedWarner`). Not nestable across threads:
    each parse thread opens its own block."""
    record = MalformedRecord()
    previous = getattr(_local, "record", None)
    _local.record = record
    try:
        yield record
    finally:
        _local.record = previous


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
        record = getattr(_local, "record", None)
        if record is not None:
            record.note(source, line_no, reason)
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

    def report(self, source: str, bad: Sequence[tuple[int, str]], strict: bool,
               what: str = "line") -> None:
        """Warn about each skipped ``(line_no, reason)`` of ``source`` (rate limited), or
        with ``strict`` raise on the first.

        Raises:
            DataError: ``strict`` and ``bad`` is not empty (names ``source:line``, the
                reason and what to do).
        """
        if bad and strict:
            line_no, reason = bad[0]
            raise DataError(f"{source}:{line_no}: malformed {what}: {reason}. Fix or remove "
                            "the line, or set strict: false to skip malformed lines")
        for line_no, reason in bad:
            self.warn(source, line_no, reason)
