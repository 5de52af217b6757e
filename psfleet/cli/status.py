"""``psfleet status``: what each server of a running job holds and serves.

Usage::

    psfleet status RUN_FOLDER | LOG_DIR
    psfleet status ENDPOINT[,ENDPOINT...] [--interval_s 1.0] [--timeout_s 5.0]

``RUN_FOLDER`` is a ``psfleet train`` run folder (or its model_save_path: the
``latest`` run); ``LOG_DIR`` is a job's log folder (``fleetrun --log_dir``): its
``.endpoints/server.N`` files give each server's gRPC endpoint. Or name the servers'
gRPC endpoints ``host:port`` in server-index order.

For every server and table it prints one line: rows held (dense tables: floats),
memory, pulls/s and pushes/s (requests per second over ``--interval_s`` seconds, two
samples that far apart; ``--interval_s 0``: the average since the server started)
and the server's uptime, all from the gRPC ``Stats`` call (with
``PSFLEET_AUTH_TOKEN``, as every call). The same numbers are on each server's
Prometheus ``/metrics`` (docs/monitoring.md). The numbers are of everything the server
holds: in a replicated job (``cluster.replication`` >= 2), summed over every share it
holds a copy of. There a second table gives, per server, the shares it holds a copy of
and those it serves as their primary: after a fail-over, a refill, a drain or a grow,
where each share is (docs/fault-tolerance.md). A server that left such a job (drained,
or dead and not restarted) is named as such, and is no error.

Environment: ``PSFLEET_AUTH_TOKEN`` (the job's token; with a folder, a token the
launcher generated is read from it, as is its self-signed certificate).

Exit codes: 0 every server answered (or left the job); 1 a server did not answer its
Stats call within ``--timeout_s`` (stderr names it; the servers that answered are
still printed); 2 a bad argument (a malformed endpoint, a folder without endpoint
files).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psfleet.cli.commands import help_of
from psfleet.errors import ConfigError, PsfleetError
from psfleet.launch.security import job_client_config
from psfleet.rpc import RpcClient, RpcConfig, parse_endpoint
from psfleet.rpc import messages as msg
from psfleet.rpc.endpoint_file import read_endpoint_file

__all__ = ["register", "run", "ServerTarget", "find_servers", "finished_run",
           "job_servers", "print_shares"]


@dataclass(frozen=True)
class ServerTarget:
    """One server to ask: its index and gRPC endpoint."""

    index: int
    endpoint: str


def register(commands: Any) -> None:
    """Add ``status`` to ``commands`` (the subparsers action of ``psfleet``'s parser);
    it sets ``handler``, a function of the parsed arguments returning the exit code."""
    parser = commands.add_parser("status", help=help_of("status"), description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", metavar="LOG_DIR | ENDPOINT[,ENDPOINT...]",
                        help="a job's log folder, or the servers' host:port in index order")
    parser.add_argument("--interval_s", type=float, default=1.0,
                        help="seconds between the two samples the rates come from "
                             "(0: averages since each server started); default 1")
    parser.add_argument("--timeout_s", type=float, default=5.0,
                        help="how long a server may take to answer, seconds; default 5")
    parser.set_defaults(handler=run)


def _endpoints(text: str, what: str) -> list[str]:
    """``host:port`` entries of a comma list. Raises ConfigError naming a bad one."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    for entry in entries:
        parse_endpoint(entry, what)
    return entries


def job_servers(target: str, deadline_s: float) -> tuple[str, list[ServerTarget], RpcConfig]:
    """The log folder (or endpoint list) ``target`` names, its servers, and how to call
    them: calls of at most ``deadline_s`` seconds, not retried, with the job's token and
    certificate when ``target`` is a folder (the same user's), else
    ``PSFLEET_AUTH_TOKEN`` and ``PSFLEET_TLS_*``.

    Raises:
        ConfigError: as :func:`find_servers`.
    """
    folder = _log_folder(target)
    servers = find_servers(folder)
    config = dataclasses.replace(RpcConfig.from_env(), deadline_s=deadline_s, max_retries=0)
    if Path(folder).is_dir():
        config = job_client_config(Path(folder), config)
    return folder, servers, config


def _log_folder(target: str) -> str:
    """The log folder ``target`` names: a run folder's ``log/``, a model_save_path's
    ``latest/log``, or ``target`` itself."""
    for folder in (Path(target) / "log", Path(target) / "latest" / "log"):
        if folder.is_dir():
            return str(folder)
    return target


def find_servers(target: str) -> list[ServerTarget]:
    """The servers ``target`` names: a job's log folder or a comma list of endpoints.

    Raises:
        ConfigError: ``target`` is neither a folder with ``.endpoints/server.N`` files
            nor a list of ``host:port``.
    """
    folder = Path(target)
    if folder.is_dir():
        endpoint_dir = folder / ".endpoints" if (folder / ".endpoints").is_dir() else folder
        files = {int(p.name.split(".", 1)[1]): p for p in endpoint_dir.glob("server.*")
                 if p.name.split(".", 1)[1].isdigit()}
        servers = [ServerTarget(i, endpoint) for i in sorted(files)
                   if (endpoint := read_endpoint_file(files[i])) is not None]
        if not servers:
            raise ConfigError(
                f"{target!r}: no endpoint files (.endpoints/server.N) there. Give a job's "
                "log folder (fleetrun --log_dir, <model_save_path>/log for psfleet train) "
                "whose servers have started, or the servers' host:port")
        return servers
    if ":" not in target:
        raise ConfigError(f"{target!r} is neither a folder nor host:port[,host:port...]")
    return [ServerTarget(i, e) for i, e in enumerate(_endpoints(target, "ENDPOINT"))]


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return (f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600
            else f"{s // 60}m{s % 60:02d}s")


def _rate(name: str, table_id: int, first: msg.StatsResponse,
          last: msg.StatsResponse) -> str:
    """Requests per second of the count ``name`` (``pulls``, ``pushes``) of a table
    between two samples (one sample, or a restart between them: since the start)."""
    def count(sample: msg.StatsResponse) -> int:
        return next((getattr(t, name) for t in sample.tables if t.table_id == table_id), 0)

    since_start = first is last or first.uptime_s > last.uptime_s
    seconds = last.uptime_s - (0.0 if since_start else first.uptime_s)
    delta = count(last) - (0 if since_start else count(first))
    return f"{delta / seconds:.1f}" if seconds > 0 else "-"


def _rows(server: ServerTarget, first: msg.StatsResponse,
          last: msg.StatsResponse) -> list[list[str]]:
    uptime = _duration(last.uptime_s)
    lines = []
    for table in sorted(last.tables, key=lambda t: t.table_id):
        tiered = bool(table.disk_rows or table.disk_bytes)
        lines.append([str(server.index), server.endpoint, str(table.table_id), table.name,
                      str(table.rows), _human_bytes(table.memory_bytes),
                      str(table.disk_rows) if tiered else "-",
                      _human_bytes(table.disk_bytes) if tiered else "-",
                      _rate("pulls", table.table_id, first, last),
                      _rate("pushes", table.table_id, first, last), uptime])
    return lines or [[str(server.index), server.endpoint, "-", "(no tables)", "0", "0 B",
                      "-", "-", "-", "-", uptime]]


#: ``rows`` counts both tiers; ``memory`` is the memory tier's bytes, ``disk_rows`` and
#: ``disk`` the disk tier's rows and bytes ("-": no disk tier; docs/tiered-storage.md).
_HEADER = ["server", "endpoint", "table_id", "table", "rows", "memory", "disk_rows",
           "disk", "pulls/s", "pushes/s", "uptime"]


def _print_table(header: list[str], lines: list[list[str]], left: tuple[int, ...]) -> None:
    """Columns aligned right, except those in ``left``."""
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    for row in [header, *lines]:
        print("  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip())


def print_shares(servers: list[ServerTarget], replies: dict[int, msg.StatsResponse]) -> None:
    """Print, per server of a replicated job that answered (``replies``: index -> its
    ``host_view`` Stats), the shares it holds a copy of and those it serves (is the
    primary of)."""
    def names(shares: Iterable[int]) -> str:
        return ",".join(str(s) for s in shares) or "-"

    rows = [[str(s.index), s.endpoint, names(replies[s.index].shares_held),
             names(replies[s.index].shares_served)] for s in servers if s.index in replies]
    _print_table(["server", "endpoint", "holds shares", "serves shares"], rows, (1, 2, 3))


def _check(args: argparse.Namespace) -> None:
    if args.interval_s < 0:
        raise ConfigError(f"--interval_s: {args.interval_s} must be >= 0 seconds")
    if args.timeout_s <= 0:
        raise ConfigError(f"--timeout_s: {args.timeout_s} must be > 0 seconds")


def run(args: argparse.Namespace) -> int:
    """Print the status of the servers ``args.target`` names; returns the exit code
    (the module docstring gives them). Blocks about ``args.interval_s`` seconds (plus
    ``args.timeout_s`` per server that does not answer)."""
    try:
        _check(args)
        target, servers, config = job_servers(args.target, args.timeout_s)
    except ConfigError as exc:
        print(f"psfleet status: error: {exc}", file=sys.stderr)
        return 2
    clients = {s.index: RpcClient(s.endpoint, config) for s in servers}
    failed: dict[int, str] = {}

    def sample(into: dict[int, msg.StatsResponse], among: list[ServerTarget]) -> None:
        for server in among:
            try:
                into[server.index] = clients[server.index].call(
                    "Stats", msg.StatsRequest(host_view=True))
            except PsfleetError as exc:
                failed[server.index] = str(exc)

    first: dict[int, msg.StatsResponse] = {}
    try:
        sample(first, servers)
        last = dict(first)
        if args.interval_s > 0 and first:
            time.sleep(args.interval_s)
            sample(last, [s for s in servers if s.index in first])
    finally:
        for client in clients.values():
            client.close()
    lines = [row for s in servers if s.index in last and s.index not in failed
             for row in _rows(s, first[s.index], last[s.index])]
    if lines:
        _print_table(_HEADER, lines, (1, 3))
    if any(reply.shares_held for reply in last.values()):
        print()
        print_shares([s for s in servers if s.index not in failed], last)
    departed = {h for reply in last.values() for h in reply.departed_hosts}
    for server in servers:
        if server.index in failed and server.index in departed:
            print(f"server {server.index} at {server.endpoint} is no longer in the job "
                  "(drained, or dead and not restarted): the others serve its shares")
            del failed[server.index]
        elif server.index in failed:
            print(f"psfleet status: error: server {server.index} at {server.endpoint}: "
                  f"{failed[server.index]}", file=sys.stderr)
    if failed and (finished := finished_run(Path(target))) is not None:
        print(f"psfleet status: the run {finished} has finished (its metrics.json is "
              "written), so its servers have stopped", file=sys.stderr)
    return 1 if failed else 0


def finished_run(log_folder: Path) -> Path | None:
    """The run folder of ``log_folder`` when its run has finished: metrics.json exists
    and names no interrupt; else None."""
    run_dir = log_folder.parent if log_folder.name == "log" else log_folder
    try:
        metrics = json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    return run_dir if metrics.get("interrupted") is None else None
