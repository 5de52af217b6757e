"""``psfleet status``: what each server of a running job holds and serves.

Usage::

    psfleet status RUN_FOLDER | LOG_DIR
    psfleet status ENDPOINT[,ENDPOINT...] [--metrics HOST:PORT[,HOST:PORT...]]
                   [--interval_s 1.0] [--timeout_s 5.0]

``RUN_FOLDER`` is a ``psfleet train`` run folder (or its model_save_path: the
``latest`` run); ``LOG_DIR`` is a job's log folder (``fleetrun --log_dir``): its
``.endpoints/server.N`` files give each server's gRPC endpoint and its metrics
endpoint. Or name the servers' gRPC endpoints ``host:port``
in server-index order, and with ``--metrics`` their metrics endpoints in the same
order (each server logs it: ``metrics of server N on http://HOST:PORT/metrics``).

For every server and table it prints one line: rows held (dense tables: floats),
memory, pulls/s and pushes/s (requests per second over ``--interval_s`` seconds, two
samples that far apart; ``--interval_s 0``: the average since the server started)
and the server's uptime. Rows and memory come from the gRPC ``Stats`` call (with
``PSFLEET_AUTH_TOKEN``, as every call); the rates and the uptime from the server's
Prometheus ``/metrics`` (docs/monitoring.md), shown ``-`` when its metrics endpoint
is not known (a server with ``PSFLEET_METRICS_PORT=off``, or endpoints given without
``--metrics``).

Environment: ``PSFLEET_AUTH_TOKEN`` (the job's token; with a folder, a token the
launcher generated is read from it, as is its self-signed certificate).

Exit codes: 0 every server answered; 1 a server did not answer its Stats call within
``--timeout_s`` (stderr names it; the servers that answered are still printed);
2 a bad argument (a malformed endpoint, a folder without endpoint files).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from psfleet.errors import ConfigError, PsfleetError
from psfleet.launch.security import job_client_config
from psfleet.rpc import RpcClient, RpcConfig, parse_endpoint
from psfleet.rpc import messages as msg
from psfleet.rpc.endpoint_file import read_endpoint_file, read_metrics_endpoint

__all__ = ["add_arguments", "run", "ServerTarget", "find_servers"]


@dataclass(frozen=True)
class ServerTarget:
    """One server to ask: its index, gRPC endpoint and metrics endpoint (None: unknown)."""

    index: int
    endpoint: str
    metrics: str | None = None


@dataclass(frozen=True)
class _Sample:
    """One server at one moment: its Stats, its scraped counters, when (monotonic s)."""

    stats: msg.StatsResponse
    counters: dict[tuple[str, str], float] | None  # (metric, table_id) -> value
    at_s: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``psfleet status``'s arguments to ``parser``."""
    parser.add_argument("target", metavar="LOG_DIR | ENDPOINT[,ENDPOINT...]",
                        help="a job's log folder, or the servers' host:port in index order")
    parser.add_argument("--metrics", metavar="HOST:PORT[,...]",
                        help="the servers' metrics endpoints, in the order of ENDPOINTs")
    parser.add_argument("--interval_s", type=float, default=1.0,
                        help="seconds between the two samples the rates come from "
                             "(0: averages since each server started); default 1")
    parser.add_argument("--timeout_s", type=float, default=5.0,
                        help="how long a server may take to answer, seconds; default 5")


def _endpoints(text: str, what: str) -> list[str]:
    """``host:port`` entries of a comma list. Raises ConfigError naming a bad one."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    for entry in entries:
        parse_endpoint(entry, what)
    return entries


def _log_folder(target: str) -> str:
    """The log folder ``target`` names: a run folder's ``log/``, a model_save_path's
    ``latest/log``, or ``target`` itself."""
    for folder in (Path(target) / "log", Path(target) / "latest" / "log"):
        if folder.is_dir():
            return str(folder)
    return target


def find_servers(target: str, metrics: str | None = None) -> list[ServerTarget]:
    """The servers ``target`` names: a job's log folder or a comma list of endpoints.

    Raises:
        ConfigError: ``target`` is neither a folder with ``.endpoints/server.N`` files
            nor a list of ``host:port``; ``--metrics`` is malformed, given with a
            folder, or does not name one endpoint per server.
    """
    folder = Path(target)
    if folder.is_dir():
        if metrics is not None:
            raise ConfigError("--metrics: give it with ENDPOINTs only; a LOG_DIR's endpoint "
                              "files name the metrics endpoints")
        endpoint_dir = folder / ".endpoints" if (folder / ".endpoints").is_dir() else folder
        files = {int(p.name.split(".", 1)[1]): p for p in endpoint_dir.glob("server.*")
                 if p.name.split(".", 1)[1].isdigit()}
        servers = [ServerTarget(i, endpoint, read_metrics_endpoint(files[i]))
                   for i in sorted(files)
                   if (endpoint := read_endpoint_file(files[i])) is not None]
        if not servers:
            raise ConfigError(
                f"{target!r}: no endpoint files (.endpoints/server.N) there. Give a job's "
                "log folder (fleetrun --log_dir, <model_save_path>/log for psfleet train) "
                "whose servers have started, or the servers' host:port")
        return servers
    if ":" not in target:
        raise ConfigError(f"{target!r} is neither a folder nor host:port[,host:port...]")
    endpoints = _endpoints(target, "ENDPOINT")
    metric_list: list[str | None] = [None] * len(endpoints)
    if metrics is not None:
        metric_list = list(_endpoints(metrics, "--metrics"))
        if len(metric_list) != len(endpoints):
            raise ConfigError(f"--metrics: {len(metric_list)} endpoints for "
                              f"{len(endpoints)} servers; give one per server, in order")
    return [ServerTarget(i, e, m)
            for i, (e, m) in enumerate(zip(endpoints, metric_list, strict=True))]


def _scrape(metrics: str, timeout_s: float) -> dict[tuple[str, str], float]:
    """The ``psfleet_*`` samples of ``http://METRICS/metrics``: (name, table_id) -> value.

    Raises:
        OSError: the endpoint does not answer. ValueError: it is not Prometheus text.
    """
    host, port = parse_endpoint(metrics, "--metrics")
    host = f"[{host}]" if ":" in host else host
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as reply:
        text = reply.read().decode("utf-8")
    return {(s.name, s.labels.get("table_id", "")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name.startswith("psfleet_")}


def _sample(server: ServerTarget, client: RpcClient, timeout_s: float,
            warnings: list[str]) -> _Sample:
    """Ask ``server`` now. Raises what ``RpcClient.call`` raises (Stats); a metrics
    endpoint that does not answer adds to ``warnings`` instead."""
    stats = client.call("Stats", msg.StatsRequest())
    counters = None
    if server.metrics is not None:
        try:
            counters = _scrape(server.metrics, timeout_s)
        except (OSError, ValueError) as exc:
            warnings.append(f"server {server.index} ({server.endpoint}): metrics endpoint "
                            f"{server.metrics} did not answer ({exc}); rates shown as -")
    return _Sample(stats, counters, time.monotonic())


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


def _rate(name: str, table_id: str, first: _Sample, last: _Sample) -> str:
    """Requests per second of counter ``name`` between two samples (one sample: the
    average since the server started)."""
    if last.counters is None or first.counters is None:
        return "-"
    key = (name, table_id)
    if first is last:
        uptime = last.counters.get(("psfleet_server_uptime_seconds", ""), 0.0)
        return f"{last.counters.get(key, 0.0) / uptime:.1f}" if uptime > 0 else "-"
    elapsed = last.at_s - first.at_s
    delta = last.counters.get(key, 0.0) - first.counters.get(key, 0.0)
    return f"{delta / elapsed:.1f}" if elapsed > 0 else "-"


def _rows(server: ServerTarget, first: _Sample, last: _Sample) -> list[list[str]]:
    uptime = "-"
    if last.counters is not None and ("psfleet_server_uptime_seconds", "") in last.counters:
        uptime = _duration(last.counters[("psfleet_server_uptime_seconds", "")])
    lines = []
    for table in sorted(last.stats.tables, key=lambda t: t.table_id):
        tid = str(table.table_id)
        lines.append([str(server.index), server.endpoint, tid, table.name, str(table.rows),
                      _human_bytes(table.memory_bytes),
                      _rate("psfleet_table_pulls_total", tid, first, last),
                      _rate("psfleet_table_pushes_total", tid, first, last), uptime])
    return lines or [[str(server.index), server.endpoint, "-", "(no tables)", "0", "0 B",
                      "-", "-", uptime]]


_HEADER = ["server", "endpoint", "table_id", "table", "rows", "memory", "pulls/s",
           "pushes/s", "uptime"]


def _print_table(lines: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in [_HEADER, *lines]) for i in range(len(_HEADER))]
    for row in [_HEADER, *lines]:
        print("  ".join(cell.ljust(w) if i in (1, 3) else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip())


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
        target = _log_folder(args.target)
        servers = find_servers(target, args.metrics)
        config = dataclasses.replace(RpcConfig.from_env(), deadline_s=args.timeout_s,
                                     max_retries=0)
        if Path(target).is_dir():  # the job's own token and certificate (same user)
            config = job_client_config(Path(target), config)
    except ConfigError as exc:
        print(f"psfleet status: error: {exc}", file=sys.stderr)
        return 2
    clients = {s.index: RpcClient(s.endpoint, config) for s in servers}
    warnings: list[str] = []
    failed: dict[int, str] = {}
    try:
        first: dict[int, _Sample] = {}
        for server in servers:
            try:
                first[server.index] = _sample(server, clients[server.index], args.timeout_s,
                                              warnings)
            except PsfleetError as exc:
                failed[server.index] = str(exc)
        last = dict(first)
        if args.interval_s > 0 and first:
            time.sleep(args.interval_s)
            for server in servers:
                if server.index in first:
                    try:
                        last[server.index] = _sample(server, clients[server.index],
                                                     args.timeout_s, warnings)
                    except PsfleetError as exc:
                        failed[server.index] = str(exc)
    finally:
        for client in clients.values():
            client.close()
    lines = [row for s in servers if s.index in last and s.index not in failed
             for row in _rows(s, first[s.index], last[s.index])]
    if lines:
        _print_table(lines)
    for warning in dict.fromkeys(warnings):
        print(f"psfleet status: warning: {warning}", file=sys.stderr)
    for server in servers:
        if server.index in failed:
            print(f"psfleet status: error: server {server.index} at {server.endpoint}: "
                  f"{failed[server.index]}", file=sys.stderr)
    return 1 if failed else 0
