"""A server process: the table service behind gRPC, and the process's serving loop.

:func:`start_server` serves a :class:`~psfleet.ps.service.TableService` in this
process and returns at once; :func:`run_server` serves until a worker sends ``Stop``
or the process gets SIGTERM, and serves the server's Prometheus metrics beside gRPC
(``psfleet.ps.metrics_exporter``, docs/monitoring.md).
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from psfleet import env
from psfleet.ps.metrics_exporter import MetricsExporter, metrics_port_from_env
from psfleet.ps.replica.host import Layout, ReplicaHost
from psfleet.ps.service import TableService
from psfleet.ps.types import ServerLimits
from psfleet.ps.wait_budget import WaitBudget
from psfleet.rpc import RpcConfig, RunningServer, serve
from psfleet.rpc.endpoint_file import write_endpoint_file

__all__ = ["start_server", "run_server"]

logger = logging.getLogger(__name__)


def start_server(host: str, port: int, config: RpcConfig,
                 service: TableService | None = None, layout: Layout | None = None,
                 incarnation: int = 0, replication: int | None = None
                 ) -> tuple[TableService, RunningServer]:
    """Start a server in this process and return at once (tests, embedding).

    The server is a :class:`~psfleet.ps.replica.host.ReplicaHost` around ``service``
    (its own share; with replication, workers add the copies it keeps of others').
    ``layout`` and ``incarnation`` > 0: a restarted member of a replicated job, which
    holds nothing until ``ReplicaHost.rejoin`` filled it. ``replication``: the job's,
    when known at launch (1: the server refuses the replication control plane); None:
    the first ``SetReplicas`` gives it.

    Raises:
        ConfigError: the port cannot be bound.
    """
    service = service or TableService(barrier_timeout_s=config.deadline_s,
                                      wait_budget=WaitBudget.for_threads(config.server_threads))
    return service, serve(ReplicaHost(service, config, layout=layout,
                                      incarnation=incarnation, replication=replication),
                          host, port, config, service.limits.max_request_bytes)


def run_server(host: str, port: int, config: RpcConfig,
               endpoint_file: Path | None = None, preload_dir: Path | str | None = None,
               recover: tuple[str, int] | None = None,
               job_worker_num: int | None = None,
               server_index: int | None = None,
               rejoin: tuple[Layout, int] | None = None,
               replication: int | None = None) -> None:
    """Serve until a worker sends Stop or the process gets SIGTERM/SIGINT. Blocks.

    Also serves the server's metrics over HTTP at ``/metrics`` (Prometheus), on the
    port ``PSFLEET_METRICS_PORT`` gives (default 0: a free one; ``off``: none); its
    ``host:port`` is logged and written to ``endpoint_file`` after the gRPC endpoint.
    Both stop when the server stops.

    Args:
        host: address to bind.
        port: port to bind; 0 asks the OS for a free one.
        config: rpc settings.
        endpoint_file: where to write the bound ``host:port`` (and the metrics
            endpoint's) once listening (``psfleet.rpc.endpoint_file``).
        preload_dir: a save to load each table from when it is created.
        recover: ``(checkpoint_dir, server_index)``: a restarted server first
            re-creates its tables from the newest complete checkpoint there
            (:meth:`TableService.recover`), then listens.
        job_worker_num: the job's worker count, when known (requests naming another
            are refused); None: fixed by the first Barrier or sync push.
        server_index: this server's index, for the metrics; None: the one in
            ``recover``, else ``PSFLEET_SERVER_INDEX``, else unknown (-1).
        rejoin: ``(layout, incarnation)``: a server restarted in a replicated job; once
            listening it asks the others to fill it with copies of its shares
            (``ReplicaHost.rejoin``) instead of reading a checkpoint. With an added
            layout (its index past the job's servers) the server is added to the
            running job and takes its part of the shares (``ReplicaHost.join``).
        replication: the job's replication, when known at launch: 1 refuses every
            call of the replication control plane (``SetReplicas``, ``MergeMap``, ...),
            so no request can take this server's own tables from it; None: not known.

    The request limits are :class:`~psfleet.ps.types.ServerLimits`, raised through
    ``PSFLEET_SERVER_LIMITS``.

    Raises:
        ConfigError: the port (or the metrics port) cannot be bound, or
            PSFLEET_SERVER_LIMITS or PSFLEET_METRICS_PORT is malformed.
        DataError: ``recover`` names a checkpoint without this server's tables.
        FatalError: ``rejoin`` failed (no other server answered, or a sync-mode job);
            so did the join of an added server (also: its index is not the next).
    """
    limits = ServerLimits.parse(env.read("PSFLEET_SERVER_LIMITS") or "")
    metrics_port = metrics_port_from_env()
    if server_index is None:
        server_index = recover[1] if recover is not None else env.int_var(
            None, "PSFLEET_SERVER_INDEX", 0)
    service = TableService(config.deadline_s, preload_dir, limits, job_worker_num,
                           WaitBudget.for_threads(config.server_threads))
    if recover is not None:
        service.recover(*recover)
    layout, incarnation = rejoin if rejoin is not None else (None, 0)
    service, server = start_server(host, port, config, service, layout, incarnation,
                                   replication)
    exporter: MetricsExporter | None = None
    try:
        if metrics_port is not None:
            exporter = MetricsExporter.start(server.handler, server.host, metrics_port,
                                             -1 if server_index is None else server_index)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, frame: service.stop_requested.set())
        if endpoint_file is not None:
            write_endpoint_file(endpoint_file, server.host, server.port,
                                None if exporter is None else exporter.endpoint)
        if rejoin is not None and rejoin[0].added:
            server.handler.join(server.endpoint)
        elif rejoin is not None:
            server.handler.rejoin()
        while not service.stop_requested.wait(0.5):
            pass
    finally:
        server.handler.close()  # a blocked Barrier or sync push would keep the process alive
        if exporter is not None:
            exporter.close()
        server.stop(grace_s=2.0)
        stats = {tid: len(t) for tid, t in service.tables.items()}
        logger.info("server %s stopped; rows per table: %s", server.endpoint, stats)
