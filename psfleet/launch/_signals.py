"""Catch SIGINT / SIGTERM sent to the launcher so it can forward them and clean up."""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

__all__ = ["SignalCatcher", "FORWARDED_SIGNALS"]

#: Signals the launcher forwards to every child before stopping the job.
FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)


class SignalCatcher:
    """Context manager that records SIGINT / SIGTERM instead of dying on them.

    The handlers only set attributes (no logging, no locks); the launcher's loop reads
    them. Handlers are installed only in the main thread (Python allows no other) and
    the previous handlers are restored on exit.

    Attributes:
        signum: the first signal received, or None.
        repeated: a second signal arrived (the user insists; skip grace periods).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.repeated = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        else:
            self.repeated = True

    def __enter__(self) -> SignalCatcher:
        if threading.current_thread() is threading.main_thread():
            for sig in FORWARDED_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
