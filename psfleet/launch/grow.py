"""Servers added to a running local job on request (``psfleet grow``).

``psfleet grow`` and fleetrun talk through files in the job's log folder, because
fleetrun calls no gRPC: the command writes ``.control/grow-<id>.request`` (the number
of servers wanted), fleetrun takes it at its next poll, starts the servers and writes
``.control/grow-<id>.reply`` (JSON: the indices started, or why it refused). Each
server started so gets the next index, the job's servers' endpoints and port 0, and
joins the job by itself (``psfleet.ps.replica.grow``); its endpoint file appears as
for the first servers.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from psfleet.launch.cluster import JobLayout
from psfleet.launch.endpoints import read_endpoint
from psfleet.launch.process import ChildProcess
from psfleet.launch.specs import server_spec
from psfleet.launch.types import LaunchConfig, ProcessSpec

__all__ = ["CONTROL_DIR", "Growth", "GrowRequest", "request_servers", "take_requests",
           "reply_path", "clean_control_dir"]

logger = logging.getLogger(__name__)

#: Where the control files live, under the job's log folder.
CONTROL_DIR = ".control"

#: How often fleetrun looks for requests, seconds.
_CONTROL_INTERVAL_S = 0.5


class GrowRequest:
    """One ``psfleet grow`` request fleetrun took: its reply file and the servers
    wanted."""

    def __init__(self, reply: Path, count: int) -> None:
        self.reply = reply
        self.count = count

    def answer(self, started: list[int], refused: str | None = None) -> None:
        """Write the reply (atomically): the server indices started, or the refusal."""
        tmp = self.reply.with_name(self.reply.name + f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps({"started": started, "refused": refused}))
        tmp.replace(self.reply)


def reply_path(request: Path) -> Path:
    """The reply file of ``request``."""
    return request.with_suffix(".reply")


def request_servers(log_dir: Path, count: int) -> Path:
    """Ask the fleetrun of the job logging to ``log_dir`` for ``count`` more servers;
    returns the request file (its reply: :func:`reply_path`).

    Raises:
        OSError: the control folder cannot be written.
    """
    folder = log_dir / CONTROL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    request = folder / f"grow-{uuid.uuid4().hex[:12]}.request"
    tmp = folder / f".{request.name}.tmp"
    tmp.write_text(str(count))
    tmp.replace(request)
    return request


def take_requests(log_dir: Path) -> list[GrowRequest]:
    """The requests waiting in ``log_dir``'s control folder, removed from it (a
    malformed one is answered with a refusal at once)."""
    folder = log_dir / CONTROL_DIR
    if not folder.is_dir():
        return []
    taken = []
    for request in sorted(folder.glob("grow-*.request")):
        try:
            text = request.read_text().strip()
            request.unlink()
        except OSError:  # the command gave up and removed it meanwhile
            continue
        taken.append(GrowRequest(reply_path(request), int(text) if text.isdigit() else 0))
    return taken


def clean_control_dir(log_dir: Path) -> None:
    """Remove requests and replies a previous job left in ``log_dir``.

    Raises:
        OSError: a file cannot be removed.
    """
    folder = log_dir / CONTROL_DIR
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.is_file():
                entry.unlink(missing_ok=True)


class Growth:
    """fleetrun's side of ``psfleet grow`` for one job: takes the requests, starts the
    servers, and learns their endpoints.

    Args:
        config: the job.
        layout: its layout (the first servers).
        environ: what the children inherit (``os.environ`` when None).
    """

    def __init__(self, config: LaunchConfig, layout: JobLayout,
                 environ: Mapping[str, str] | None) -> None:
        self._config = config
        self._layout = layout
        self._environ = environ
        self._joining: dict[int, ChildProcess] = {}  # started, not listening yet
        self._next_look = 0.0

    def refusal(self, count: int) -> str | None:
        """Why this job cannot take ``count`` more servers (None: it can)."""
        if count < 1:
            return "the request names no server count >= 1"
        if (self._config.replication or 1) < 2:
            return ("the job is not replicated (--replication 1): shares move to a new "
                    "server as copies; start the job with --replication 2 and --shares "
                    "above the server count")
        if self._layout.endpoints_known:
            return ("the job's servers have fixed endpoints (--servers or --start_port): "
                    "start a server with PSFLEET_SERVER_INDEX past them and the job's "
                    "PADDLE_PSERVERS_IP_PORT_LIST instead (docs/fault-tolerance.md, grow)")
        return None

    def poll(self, servers: list[ChildProcess], endpoints: dict[int, str],
             start: Callable[[ProcessSpec], ChildProcess]) -> list[tuple[ChildProcess, str]]:
        """Start the servers requested since the last look (appended to ``servers``,
        each with the next index, through ``start``), and return the added servers
        that listen since the last call, with their endpoints (also put in
        ``endpoints``: index -> endpoint)."""
        listening = []
        for index, child in list(self._joining.items()):
            endpoint = read_endpoint(self._config.endpoint_file(index))
            if endpoint is not None:
                del self._joining[index]
                endpoints[index] = endpoint
                listening.append((child, endpoint))
                logger.info("%s listens on %s and joins the job", child.name, endpoint)
        now = time.monotonic()
        if now < self._next_look:
            return listening
        self._next_look = now + _CONTROL_INTERVAL_S
        for request in take_requests(self._config.log_dir):
            refused = self.refusal(request.count)
            if refused is not None:
                logger.error("fleetrun: psfleet grow asked for %d server(s): refused: %s",
                             request.count, refused)
                request.answer([], refused)
                continue
            first = [endpoints[i] for i in range(len(self._layout.servers))]
            started = []
            for _ in range(request.count):
                index = len(servers)
                child = start(server_spec(self._config, index, self._environ,
                                          layout=self._layout, added_to=first))
                servers.append(child)
                self._joining[index] = child
                started.append(index)
            logger.warning("fleetrun: psfleet grow: started server(s) %s; each joins the "
                           "job and takes its part of the shares", started)
            request.answer(started)
        return listening
