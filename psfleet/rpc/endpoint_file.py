"""Endpoint files: how a server bound to port 0 tells its launcher the port it got.

The launcher gives the server ``PADDLE_PORT=0`` and ``PSFLEET_ENDPOINT_FILE``. The
server binds (the OS picks a free port, so there is no pick-then-bind race), starts
listening, then writes the file to a temporary file beside the endpoint file and
renames it over the endpoint file (``os.replace``), so a reader never sees a
half-written file.

The file's first line is the gRPC endpoint ``host:port``, as it always was; a server
serving Prometheus metrics adds a second line ``metrics host:port`` (its /metrics
HTTP endpoint, docs/monitoring.md)::

    127.0.0.1:40211
    metrics 127.0.0.1:40213
"""

from __future__ import annotations

import os
from pathlib import Path

from psfleet.errors import ConfigError
from psfleet.rpc.types import parse_endpoint

__all__ = ["write_endpoint_file", "read_endpoint_file", "read_metrics_endpoint"]

METRICS_KEY = "metrics"


def write_endpoint_file(path: Path, host: str, port: int,
                        metrics_endpoint: str | None = None) -> None:
    """Atomically write ``host:port\\n`` (and ``metrics HOST:PORT\\n`` when
    ``metrics_endpoint`` is given) to ``path``; call once listening.

    Raises:
        OSError: the folder cannot be created or written.
    """
    text = f"{host}:{port}\n"
    if metrics_endpoint is not None:
        text += f"{METRICS_KEY} {metrics_endpoint}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _bound(endpoint: str, what: str) -> str:
    host, port = parse_endpoint(endpoint, what)
    if port == 0:
        raise ConfigError(f"{what}: port 0 is not a bound port")
    return f"{host}:{port}"


def read_endpoint_file(path: Path) -> str | None:
    """The gRPC ``host:port`` in ``path`` (its first line), or None when the server has
    not written it yet.

    Raises:
        ConfigError: the first line is not ``host:port`` with a port in 1..65535.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    lines = text.splitlines() or [""]
    return _bound(lines[0], f"endpoint file {str(path)!r}")


def read_metrics_endpoint(path: Path) -> str | None:
    """The metrics ``host:port`` in ``path``, or None when the file is missing or has no
    ``metrics`` line (metrics off, or a server of an older version).

    Raises:
        ConfigError: the ``metrics`` line does not hold ``host:port`` with a port in
            1..65535.
    """
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[1:]:
        key, _, value = line.strip().partition(" ")
        if key == METRICS_KEY:
            return _bound(value, f"endpoint file {str(path)!r}, line {line!r}")
    return None
