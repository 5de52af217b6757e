"""What a job shows on the terminal: console levels, plurals, and the filter of worker 0's output.

The children of a job write everything (INFO log records included) to their log files;
the launcher copies worker 0's log to its stdout (``process.py``'s tee). With
:class:`ConsoleFilter` as the tee's stream the log files keep the details while the
console shows only what the user asked for (``psfleet train -q`` / default / ``-v``):

- log records (``HH:MM:SS [role] LEVEL name: message``, :mod:`psfleet.logs`) below the
  console level are dropped, with their indented continuation lines;
- progress-bar output (text containing ``\\r``, as tqdm draws it) passes at once,
  except in quiet mode;
- other lines pass, except in quiet mode, where only lines starting ``psfleet:`` (the
  CLI's own result and error lines) and records at ERROR or above pass;
- after :meth:`ConsoleFilter.suppress` (the launcher got SIGINT / SIGTERM) nothing
  passes: what the children print while they stop stays in their logs.
"""

from __future__ import annotations

import logging
import re
import threading
from importlib import metadata
from typing import BinaryIO

__all__ = ["ConsoleFilter", "console_level", "plural", "version_text"]

#: A psfleet log record at the start of a line (``psfleet.logs._FORMAT``).
_RECORD = re.compile(rb"\d\d:\d\d:\d\d \[[^\]\n]*\] (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
#: A record's prefix is shorter than this; a longer undecided line is plain text.
_RECORD_PREFIX_BYTES = 80
_LEVELS = {b"DEBUG": logging.DEBUG, b"INFO": logging.INFO, b"WARNING": logging.WARNING,
           b"ERROR": logging.ERROR, b"CRITICAL": logging.CRITICAL}
_CLI_PREFIX = b"psfleet:"

# How the rest of the current line is treated once decided.
_PASS, _DROP, _BAR = "pass", "drop", "bar"


def version_text() -> str:
    """``psfleet 0.1.0``: the installed distribution's version (``--version`` of
    ``psfleet`` and ``fleetrun``); the package's ``__version__`` when not installed."""
    try:
        version = metadata.version("psfleet")
    except metadata.PackageNotFoundError:
        from psfleet import __version__ as version
    return f"psfleet {version}"


def console_level(quiet: bool, verbose: bool, detail_level: int = logging.INFO) -> int:
    """The logging level of the console for ``-q`` / default / ``-v``.

    Args:
        quiet: ``-q``: errors only (ERROR).
        verbose: ``-v``: the details (INFO, or ``detail_level`` when lower, e.g. DEBUG
            from ``PSFLEET_LOG_LEVEL``).
        detail_level: the level of the details (the log files' level).

    Returns:
        ERROR, WARNING (the default) or ``min(INFO, detail_level)``.
    """
    if quiet:
        return logging.ERROR
    if verbose:
        return min(logging.INFO, detail_level)
    return logging.WARNING


def plural(count: int, word: str) -> str:
    """``plural(1, "server")`` is ``"1 server"``; ``plural(2, "worker")`` ``"2 workers"``."""
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


class ConsoleFilter:
    """A binary stream that passes what a console at ``level`` should show to ``stream``.

    Thread safe (the tee thread writes, the launcher's thread suppresses). Lines that
    may still turn out to be a log record are held until they end or are long enough
    to tell; everything else is written at once, so a progress bar redraws live.

    Args:
        stream: the console (e.g. ``sys.stdout.buffer``); None drops everything.
        level: the console's logging level (:func:`console_level`).
    """

    def __init__(self, stream: BinaryIO | None, level: int) -> None:
        self.stream = stream
        self.level = level
        self.quiet = level >= logging.ERROR
        self._lock = threading.Lock()
        self._held = bytearray()  # the undecided start of the current line
        self._mode: str | None = None  # how the rest of the current line is treated
        self._record_kept: bool | None = None  # the last record's fate (continuations)
        self._suppressed = False
        self._at_line_start = True

    def write(self, data: bytes) -> int:
        """Filter ``data`` (any split of the child's output) to the console.

        Raises:
            OSError, ValueError: the console cannot be written (the tee stops).
        """
        with self._lock:
            if self._suppressed or self.stream is None:
                return len(data)
            out = bytearray()
            self._feed(bytes(data), out)
            if out:
                self.stream.write(bytes(out))
                self._at_line_start = out.endswith(b"\n")
        return len(data)

    def flush(self) -> None:
        """Flush the console."""
        if self.stream is not None:
            self.stream.flush()

    def suppress(self) -> None:
        """Pass nothing from now on (the job is being stopped)."""
        with self._lock:
            self._suppressed = True

    def end_line(self) -> None:
        """End the console's current line (e.g. a progress bar) if it is not ended."""
        with self._lock:
            if self.stream is not None and not self._at_line_start:
                self.stream.write(b"\n")
                self.stream.flush()
                self._at_line_start = True

    # -- the line automaton ---------------------------------------------------------

    def _feed(self, data: bytes, out: bytearray) -> None:
        while data:
            if self._mode == _BAR:
                # A bar line never ends while it redraws; a record may start on it.
                record = _RECORD.search(data)
                stop = record.start() if record is not None else len(data)
                newline = data.find(b"\n", 0, stop)
                end = newline + 1 if newline >= 0 else stop
                if not self.quiet:
                    out += data[:end]
                data = data[end:]
                if newline >= 0 or record is not None:
                    self._mode = None
                continue
            if self._mode is not None:
                newline = data.find(b"\n")
                end = newline + 1 if newline >= 0 else len(data)
                if self._mode == _PASS:
                    out += data[:end]
                data = data[end:]
                if newline >= 0:
                    self._mode = None
                continue
            newline = data.find(b"\n")
            end = newline + 1 if newline >= 0 else len(data)
            self._held += data[:end]
            data = data[end:]
            mode = self._decide(bytes(self._held), complete=newline >= 0)
            if mode is None:
                continue
            held = bytes(self._held)
            self._held.clear()
            if mode == _BAR:
                self._mode = _BAR
                data = held + data  # the bar branch looks for a record in it
                continue
            if mode == _PASS:
                out += held
            self._mode = None if newline >= 0 else mode

    def _decide(self, line: bytes, complete: bool) -> str | None:
        """How to treat the line starting with ``line``; None: not known yet."""
        record = _RECORD.match(line)
        if record is not None:
            self._record_kept = _LEVELS[record.group(1)] >= self.level
            return _PASS if self._record_kept else _DROP
        if b"\r" in line:
            self._record_kept = None
            return _BAR
        if self._record_kept is not None and line[:1] in (b" ", b"\t"):
            return _PASS if self._record_kept else _DROP  # a record's continuation
        if not complete and line[:1].isdigit() and len(line) < _RECORD_PREFIX_BYTES:
            return None  # perhaps a record whose prefix is still coming
        if (not complete and self.quiet and len(line) < len(_CLI_PREFIX)
                and _CLI_PREFIX.startswith(line)):
            return None  # perhaps the CLI's own line
        self._record_kept = None
        if self.quiet:
            return _PASS if line.startswith(_CLI_PREFIX) else _DROP
        return _PASS
