"""The launcher's side of the endpoint-file protocol (see ``psfleet.rpc.endpoint_file``).

Server ``i`` gets ``PADDLE_PORT=0`` and ``PSFLEET_ENDPOINT_FILE=<log_dir>/.endpoints/
server.<i>``; the launcher polls for the files and builds the workers' server list.
"""

from __future__ import annotations

from pathlib import Path

from psfleet.errors import ConfigError, LaunchError
from psfleet.rpc.endpoint_file import read_endpoint_file

__all__ = ["clean_endpoint_dir", "read_endpoint"]


def read_endpoint(path: Path) -> str | None:
    """Return the endpoint in ``path``, or None if the server has not written it yet.

    Raises:
        LaunchError: the file exists but does not hold ``host:port``.
    """
    try:
        return read_endpoint_file(path)
    except ConfigError as e:
        raise LaunchError(
            f"{e}; a server must write 'host:port\\n' there once it listens"
        ) from None


def clean_endpoint_dir(endpoint_dir: Path) -> None:
    """Create ``endpoint_dir`` and remove stale endpoint files a previous job left there.

    Raises:
        OSError: the directory cannot be created or a file cannot be removed.
    """
    endpoint_dir.mkdir(parents=True, exist_ok=True)
    for entry in endpoint_dir.iterdir():
        if entry.is_file() and (entry.name.startswith("server.") or ".tmp." in entry.name):
            entry.unlink(missing_ok=True)
