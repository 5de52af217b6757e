"""``psfleet grow``: add servers to a running replicated job; each takes its part of
the shares while training goes on.

Usage::

    psfleet grow RUN_FOLDER | LOG_DIR [--servers 1] [--timeout_s 600]

The job must run under fleetrun (``psfleet train`` with ``cluster.server_num`` >= 1,
or ``fleetrun``) on this machine, with ``cluster.replication`` >= 2, in an async, GEO
or pass mode. fleetrun starts each new server with the next index; it joins the job,
and moves bring it shares from the servers holding the most (docs/fault-tolerance.md,
"Grow"). For a new server to take a fair part, the job needs more shares than servers
(``cluster.shares``, ``fleetrun --shares``): with 2 servers and 6 shares, a third ends
holding 4 copies and serving 2 shares. The command returns once the shares are
evened out, and prints where each share is.

Environment: ``PSFLEET_AUTH_TOKEN`` and ``PSFLEET_TLS_*`` as for ``psfleet status``.

Exit codes: 0 the servers joined and hold their part; 1 they could not (stderr says
why: the job is not running or not replicated, fleetrun refused or did not answer, a
new server stopped answering, e.g. refused by a sync-mode job, or the moves took
longer than ``--timeout_s``); 2 a bad argument.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from psfleet.cli.commands import help_of
from psfleet.cli.status import (
    ServerTarget,
    find_servers,
    finished_run,
    job_servers,
    print_shares,
)
from psfleet.errors import ConfigError, PsfleetError
from psfleet.launch.grow import reply_path, request_servers
from psfleet.rpc import RpcClient, RpcConfig
from psfleet.rpc import messages as msg

__all__ = ["register"]

#: How long fleetrun may take to answer a request, seconds (it looks twice a second).
_REPLY_WAIT_S = 15.0
_POLL_S = 0.5
#: How long an added server that listened may not answer before the grow fails, seconds.
_SILENT_S = 10.0


def register(commands: Any) -> None:
    """Add ``grow`` to ``commands`` (the subparsers action of ``psfleet``'s parser);
    it sets ``handler``, a function of the parsed arguments returning the exit code."""
    p = commands.add_parser(
        "grow", help=help_of("grow"), description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="RUN_FOLDER | LOG_DIR",
                   help="a run folder, or the job's log folder (fleetrun --log_dir)")
    p.add_argument("--servers", type=int, default=1, help="servers to add; default 1")
    p.add_argument("--timeout_s", type=float, default=600.0,
                   help="how long the new servers may take to join and take their shares, "
                        "seconds; default 600")
    p.set_defaults(handler=_run)


def _host_views(servers: list[ServerTarget], config: RpcConfig
                ) -> dict[int, msg.StatsResponse]:
    """Each answering server's ``host_view`` Stats (the others are left out)."""
    replies = {}
    for server in servers:
        client = RpcClient(server.endpoint, config)
        try:
            replies[server.index] = client.call("Stats", msg.StatsRequest(host_view=True))
        except PsfleetError:
            pass
        finally:
            client.close()
    return replies


def _even(replies: dict[int, msg.StatsResponse], added: list[int]) -> bool:
    """The moves are done: every added server answered and holds shares, every share
    has exactly its copies on the live servers (no move half told: a new copy in, the
    giver's release not yet heard), and they hold numbers of shares within one of each
    other."""
    departed = {h for r in replies.values() for h in r.departed_hosts}
    live = {i: r for i, r in replies.items() if i not in departed}
    if not live:
        return False
    held = [len(r.shares_held) for r in live.values()]
    first = next(iter(live.values()))
    copies = [s for r in live.values() for s in r.shares_held]
    return (all(i in live and live[i].shares_held for i in added)
            and all(copies.count(s) == first.replication for s in range(first.share_num))
            and max(held) - min(held) <= 1)


def _reply(request: Path) -> dict[str, Any] | None:
    """fleetrun's answer to ``request``, or None after :data:`_REPLY_WAIT_S` (the
    request is withdrawn then)."""
    deadline = time.monotonic() + _REPLY_WAIT_S
    while time.monotonic() < deadline:
        try:
            return dict(json.loads(reply_path(request).read_text()))
        except (OSError, ValueError):
            time.sleep(_POLL_S / 5)
    request.unlink(missing_ok=True)
    return None


def _run(args: argparse.Namespace) -> int:
    try:
        if args.servers < 1:
            raise ConfigError(f"--servers: {args.servers} must be >= 1")
        if args.timeout_s <= 0:
            raise ConfigError(f"--timeout_s: {args.timeout_s} must be > 0 seconds")
        folder, servers, config = job_servers(args.target, 10.0)
        if not Path(folder).is_dir():
            raise ConfigError(f"{args.target}: psfleet grow needs the job's run folder or "
                              "log folder (fleetrun starts the new servers), not endpoints")
    except ConfigError as exc:
        print(f"psfleet grow: error: {exc}", file=sys.stderr)
        return 2
    log_dir = Path(folder)
    replies = _host_views(servers, config)
    why = ("no server of the job answered" if not replies else
           "the job is not replicated (cluster.replication 1): shares move to a new server "
           "as copies; run the job with cluster.replication 2 and cluster.shares above "
           "cluster.server_num" if not any(r.shares_held for r in replies.values()) else None)
    if why is not None:
        print(f"psfleet grow: failed: {why}", file=sys.stderr)
        if (finished := finished_run(log_dir)) is not None:
            print(f"psfleet grow: the run {finished} has finished (its metrics.json is "
                  "written), so its servers have stopped", file=sys.stderr)
        return 1
    request = request_servers(log_dir, args.servers)
    answer = _reply(request)
    if answer is None:
        print(f"psfleet grow: failed: no fleetrun took the request within "
              f"{_REPLY_WAIT_S:g} s; psfleet grow works with a job fleetrun (or psfleet "
              f"train) runs on this machine, logging to {log_dir}", file=sys.stderr)
        return 1
    if answer.get("refused"):
        print(f"psfleet grow: failed: fleetrun refused: {answer['refused']}", file=sys.stderr)
        return 1
    added = [int(i) for i in answer.get("started", [])]
    print(f"psfleet grow: fleetrun started server(s) {added}; waiting for them to join and "
          "take their part of the shares", flush=True)
    deadline = time.monotonic() + args.timeout_s
    silent: dict[int, float] = {}  # added server listening -> since when it does not answer
    while True:
        servers = find_servers(folder)
        replies = _host_views(servers, config)
        if replies and _even(replies, added):
            print_shares(servers, replies)
            print(f"psfleet grow: server(s) {added} joined the job", flush=True)
            return 0
        now = time.monotonic()
        for server in servers:
            if server.index in added and server.index not in replies:
                since = silent.setdefault(server.index, now)
                if now - since > _SILENT_S:
                    print(f"psfleet grow: failed: server {server.index} at {server.endpoint} "
                          f"does not answer; see its log {log_dir / f'serverlog.{server.index}'}"
                          " (a sync-mode job cannot grow, for one)", file=sys.stderr)
                    return 1
            else:
                silent.pop(server.index, None)
        if now > deadline:
            logs = ", ".join(str(log_dir / f"serverlog.{i}") for i in added)
            print(f"psfleet grow: failed: the shares were not evened out within "
                  f"{args.timeout_s:g} s; see the new servers' logs ({logs})", file=sys.stderr)
            if replies:
                print_shares(servers, replies)
            return 1
        time.sleep(_POLL_S)
