"""How long workers wait for the servers to be ready: resolved in one place.

Three sources, first set wins: the runner's ``cluster.server_wait_timeout_s``, the
strategy's ``DistributedStrategy.server_wait_timeout_s``, the environment variable
``PSFLEET_SERVER_WAIT_TIMEOUT_S`` (default 300 s, declared in ``psfleet.env``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from psfleet import env
from psfleet.errors import ConfigError

__all__ = ["server_wait_timeout_s"]


def server_wait_timeout_s(*configured: float | None,
                          environ: Mapping[str, str] | None = None) -> float:
    """The server wait timeout, seconds.

    Args:
        configured: explicit values in order of precedence (e.g. the runner's
            ``cluster.server_wait_timeout_s``, then the strategy's); None means unset.
        environ: the environment to read (``os.environ`` when None).

    Returns:
        The first value of ``configured`` that is not None, else
        ``PSFLEET_SERVER_WAIT_TIMEOUT_S``, else 300.

    Raises:
        ConfigError: the environment variable is not a finite number of seconds > 0.
    """
    for value in configured:
        if value is not None:
            return float(value)
    raw = env.read("PSFLEET_SERVER_WAIT_TIMEOUT_S", environ)
    try:
        seconds = float(raw)  # type: ignore[arg-type]  # declared with a default
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"PSFLEET_SERVER_WAIT_TIMEOUT_S: {raw!r} is not a number of seconds "
                          "> 0; set it to e.g. 300, or unset it")
    return seconds
