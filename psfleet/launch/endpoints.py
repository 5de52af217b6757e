"""Endpoint files: how a server started with ``PADDLE_PORT=0`` tells the launcher its port.

The protocol (one host): the launcher gives server ``i`` the variables
``PADDLE_PORT=0`` and ``PSFLEET_ENDPOINT_FILE=<log_dir>/.endpoints/server.<i>``. The
server binds port 0 (the OS picks a free port, so there is no pick-then-bind race),
starts listening, then writes ``host:port\\n`` to a temporary file beside the endpoint
file and renames it onto the endpoint file with ``os.replace``, so the launcher never
reads a half-written file. :func:`write_endpoint_file` is the reference writer.
"""

from __future__ import annotations

import os
from pathlib import Path

from psfleet.errors import LaunchError

__all__ = ["clean_endpoint_dir", "read_endpoint", "write_endpoint_file", "parse_endpoint"]


def parse_endpoint(text: str) -> tuple[str, int]:
    """Split ``host:port`` into host and port.

    Raises:
        ValueError: ``text`` is not ``host:port`` with a port in 1..65535.
    """
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r} is not host:port with a port in 1..65535")
    return host, int(port_text)


def write_endpoint_file(path: Path, host: str, port: int) -> None:
    """Atomically write ``host:port\\n`` to ``path`` (temporary file, then ``os.replace``).

    Call once the server is listening. Blocks on file I/O only.
    """
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(f"{host}:{port}\n")
    os.replace(tmp, path)


def read_endpoint(path: Path) -> str | None:
    """Return the endpoint in ``path``, or None if the server has not written it yet.

    Raises:
        LaunchError: the file exists but does not hold ``host:port``.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        host, port = parse_endpoint(text)
    except ValueError as e:
        raise LaunchError(
            f"endpoint file {str(path)!r} holds {text!r}; a server must write "
            f"'host:port\\n' there once it listens ({e})"
        ) from None
    return f"{host}:{port}"


def clean_endpoint_dir(endpoint_dir: Path) -> None:
    """Create ``endpoint_dir`` and remove stale endpoint files a previous job left there.

    Raises:
        OSError: the directory cannot be created or a file cannot be removed.
    """
    endpoint_dir.mkdir(parents=True, exist_ok=True)
    for entry in endpoint_dir.iterdir():
        if entry.is_file() and (entry.name.startswith("server.") or ".tmp." in entry.name):
            entry.unlink(missing_ok=True)
