"""Endpoint files: how a server bound to port 0 tells its launcher the port it got.

The launcher gives the server ``PADDLE_PORT=0`` and ``PSFLEET_ENDPOINT_FILE``. The
server binds (the OS picks a free port, so there is no pick-then-bind race), starts
listening, then writes ``host:port\\n`` to a temporary file beside the endpoint file
and renames it over the endpoint file (``os.replace``), so a reader never sees a
half-written file.
"""

from __future__ import annotations

import os
from pathlib import Path

from psfleet.errors import ConfigError
from psfleet.rpc.types import parse_endpoint

__all__ = ["write_endpoint_file", "read_endpoint_file"]


def write_endpoint_file(path: Path, host: str, port: int) -> None:
    """Atomically write ``host:port\\n`` to ``path``; call once listening.

    Raises:
        OSError: the folder cannot be created or written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(f"{host}:{port}\n")
    os.replace(tmp, path)


def read_endpoint_file(path: Path) -> str | None:
    """The ``host:port`` in ``path``, or None when the server has not written it yet.

    Raises:
        ConfigError: the file does not hold ``host:port`` with a port in 1..65535.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    host, port = parse_endpoint(text, f"endpoint file {str(path)!r}")
    if port == 0:
        raise ConfigError(f"endpoint file {str(path)!r}: port 0 is not a bound port")
    return f"{host}:{port}"
