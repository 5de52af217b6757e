"""Logging for psfleet processes: one format with the role prefix, set up once.

Library modules only create loggers (``logging.getLogger(__name__)``). The process's
entry point (``fleet.init``, the CLI, the launcher) calls :func:`setup_logging`, which
adds a handler to the ``psfleet`` logger unless the application configured logging
itself (the root logger has handlers), and :func:`set_role` to prefix every line
with ``[server:1]`` / ``[worker:0]``. Within :func:`quiet` (``psfleet.train(...,
quiet=True)``) only warnings and errors pass, whatever ``PSFLEET_LOG_LEVEL`` says.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from psfleet import env

__all__ = ["quiet", "setup_logging", "set_role"]

_ROLE = {"prefix": "-"}
_QUIET = {"depth": 0}
_FORMAT = "%(asctime)s [%(psfleet_role)s] %(levelname)s %(name)s: %(message)s"


class _RoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.psfleet_role = _ROLE["prefix"]
        return True


def setup_logging(level: str | None = None) -> None:
    """Send psfleet's logs to stderr with the role prefix. Idempotent.

    Args:
        level: a logging level name; ``PSFLEET_LOG_LEVEL`` (default INFO) when None.
    """
    logger = logging.getLogger("psfleet")
    logger.setLevel((level or env.read("PSFLEET_LOG_LEVEL") or "INFO").upper())
    if _QUIET["depth"]:
        logger.setLevel(max(logger.level, logging.WARNING))
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RoleFilter())
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    logger.propagate = False


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Within: psfleet's log records below WARNING are dropped (also after a
    :func:`setup_logging` inside, as ``fleet.init`` calls it), and what else is written
    to ``sys.stderr`` (the progress bar, Python warnings) is discarded; psfleet's own
    handler keeps the real stderr, so warnings and errors still show. Not thread safe:
    ``sys.stderr`` is the process's. A local job's processes still log in full to their
    log files.
    """
    setup_logging()
    logger = logging.getLogger("psfleet")
    previous = logger.level
    _QUIET["depth"] += 1
    logger.setLevel(max(previous, logging.WARNING))
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
            yield
    finally:
        _QUIET["depth"] -= 1
        logger.setLevel(previous)


def set_role(prefix: str) -> None:
    """Prefix every later psfleet log line with ``[prefix]``, e.g. ``worker:0``."""
    _ROLE["prefix"] = prefix
