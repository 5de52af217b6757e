"""``psfleet drain``: remove a server from a running replicated job, nothing lost.

Usage::

    psfleet drain RUN_FOLDER | LOG_DIR | ENDPOINT[,ENDPOINT...] --server N [--timeout_s 600]

The job must have ``cluster.replication`` >= 2, run in an async, GEO or pass mode, and
keep at least that many servers. Server ``N`` has every share it holds copied to the
other servers while training goes on (each share keeps its copies throughout), then
leaves the job and stops; its process exits 0, and the workers call the shares' new
primaries (docs/fault-tolerance.md, "Drain"). The targets are as for ``psfleet
status`` (a run folder, a log folder, or the servers' ``host:port`` in index order).

Environment: ``PSFLEET_AUTH_TOKEN`` and ``PSFLEET_TLS_*`` as for ``psfleet status``.

Exit codes: 0 the server left; 1 it could not (stderr says why: the job is not
replicated, too few servers would stay, a sync-mode job, the copies took longer than
``--timeout_s``, or the server did not answer); 2 a bad argument.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from psfleet.cli.commands import help_of
from psfleet.cli.status import finished_run, job_servers
from psfleet.errors import ConfigError, PsfleetError
from psfleet.rpc import RpcClient
from psfleet.rpc import messages as msg

__all__ = ["register"]

#: Seconds the call may take beyond ``--timeout_s`` (the leave itself, the reply).
_REPLY_S = 30.0


def register(commands: Any) -> None:
    """Add ``drain`` to ``commands`` (the subparsers action of ``psfleet``'s parser);
    it sets ``handler``, a function of the parsed arguments returning the exit code."""
    p = commands.add_parser(
        "drain", help=help_of("drain"),
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="RUN_FOLDER | LOG_DIR | ENDPOINT[,ENDPOINT...]",
                   help="a run folder, a job's log folder, or the servers' host:port in "
                        "index order")
    p.add_argument("--server", type=int, required=True, help="the index of the server to "
                   "remove")
    p.add_argument("--timeout_s", type=float, default=600.0,
                   help="how long copying its shares may take, seconds; default 600")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.timeout_s <= 0:
            raise ConfigError(f"--timeout_s: {args.timeout_s} must be > 0 seconds")
        target, servers, config = job_servers(args.target, args.timeout_s + _REPLY_S)
        server = next((s for s in servers if s.index == args.server), None)
        if server is None:
            raise ConfigError(f"--server: {args.server} is not a server of "
                              f"{args.target}; its servers are {[s.index for s in servers]}")
    except ConfigError as exc:
        print(f"psfleet drain: error: {exc}", file=sys.stderr)
        return 2
    print(f"psfleet drain: asking server {server.index} at {server.endpoint} to leave the "
          "job once its shares are copied to the other servers", flush=True)
    client = RpcClient(server.endpoint, config)
    try:
        client.call("Drain", msg.DrainRequest(timeout_s=args.timeout_s))
    except PsfleetError as exc:
        print(f"psfleet drain: failed: server {server.index} at {server.endpoint}: {exc}",
              file=sys.stderr)
        if (finished := finished_run(Path(target))) is not None:
            print(f"psfleet drain: the run {finished} has finished (its metrics.json is "
                  "written), so its servers have stopped", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"psfleet drain: server {server.index} left the job; the other servers serve "
          "its shares", flush=True)
    return 0
