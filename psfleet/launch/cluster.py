"""Which servers and workers of a job run on this node: the job's :class:`JobLayout`.

A one-host job (``--server_num`` / ``--worker_num``) runs everything on 127.0.0.1;
its servers bind port 0 and report the port in an endpoint file, or bind
``--start_port + i``. A multi-node job lists every server's ``IP:PORT`` and every
worker's IP (``--servers`` / ``--workers``, the same lists on every node); each node
runs the entries whose host is one of its addresses (``--node_ip``, else detected,
see :mod:`psfleet.launch.hosts`), with the global indices of the lists.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from psfleet.errors import ConfigError
from psfleet.launch.hosts import host_matches, local_addresses
from psfleet.launch.types import LOCAL_HOST, LaunchConfig

__all__ = ["ServerSlot", "WorkerSlot", "JobLayout", "plan_job"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSlot:
    """One server of the job.

    Attributes:
        index: global server index (``PSFLEET_SERVER_INDEX``).
        host: the address it binds (``POD_IP``).
        port: the port it binds (``PADDLE_PORT``); 0: a free port, reported in its
            endpoint file.
    """

    index: int
    host: str
    port: int

    @property
    def endpoint(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class WorkerSlot:
    """One worker of the job: global index (``PADDLE_TRAINER_ID``) and host (``POD_IP``)."""

    index: int
    host: str


@dataclass(frozen=True)
class JobLayout:
    """Every server and worker of the job, and the ones this node starts.

    Attributes:
        servers: every server, in index order.
        workers: every worker, in index order.
        local_servers: indices of the servers this node starts, ascending.
        local_workers: indices of the workers this node starts, ascending.
        node_addresses: the addresses that identified this node.
    """

    servers: tuple[ServerSlot, ...]
    workers: tuple[WorkerSlot, ...]
    local_servers: tuple[int, ...]
    local_workers: tuple[int, ...]
    node_addresses: tuple[str, ...]

    @property
    def endpoints_known(self) -> bool:
        """Whether every server's port is fixed in advance (no endpoint files)."""
        return all(s.port != 0 for s in self.servers)

    @property
    def server_endpoints(self) -> tuple[str, ...]:
        """Every server's ``host:port`` in index order (port 0 where not known yet)."""
        return tuple(s.endpoint for s in self.servers)

    @property
    def worker_hosts(self) -> tuple[str, ...]:
        """Every worker's host in index order (``PADDLE_TRAINER_IPS``)."""
        return tuple(w.host for w in self.workers)

    def describe_node(self) -> str:
        """``server(s) 0 and worker(s) 0, 2`` or ``no process``: what this node runs."""
        parts = []
        if self.local_servers:
            parts.append("server(s) " + ", ".join(map(str, self.local_servers)))
        if self.local_workers:
            parts.append("worker(s) " + ", ".join(map(str, self.local_workers)))
        return " and ".join(parts) or "no process"


def plan_job(config: LaunchConfig, node_addresses: Collection[str] | None = None) -> JobLayout:
    """The layout of ``config``'s job and this node's part of it.

    Args:
        config: the validated launch configuration.
        node_addresses: this node's addresses; when None, ``config.node_ips`` or, if
            that is empty, the addresses detected with :func:`local_addresses`.
            Ignored by a one-host job.

    Raises:
        ConfigError: a multi-node job none of whose entries is on this node (names the
            node's addresses and both lists).
    """
    if not config.is_multi_node:
        first = config.start_port
        servers = tuple(
            ServerSlot(i, LOCAL_HOST, 0 if first is None else first + i)
            for i in range(config.server_num)
        )
        workers = tuple(WorkerSlot(k, LOCAL_HOST) for k in range(config.worker_num))
        return JobLayout(servers, workers, tuple(range(len(servers))),
                         tuple(range(len(workers))), (LOCAL_HOST,))
    if node_addresses is None:
        node_addresses = config.node_ips or sorted(local_addresses())
        if config.node_ips and not any(host_matches(ip, local_addresses())
                                       for ip in config.node_ips):
            logger.warning("--node_ip %s is not one of this host's addresses; servers may "
                           "fail to bind it", ",".join(config.node_ips))
    addresses = tuple(node_addresses)
    servers = tuple(
        ServerSlot(i, host, int(port))
        for i, (host, _, port) in enumerate(e.rpartition(":") for e in config.servers)
    )
    workers = tuple(WorkerSlot(k, host) for k, host in enumerate(config.workers))
    hosts = {s.host for s in servers} | {w.host for w in workers}
    here = {host for host in hosts if host_matches(host, addresses)}
    layout = JobLayout(
        servers, workers,
        tuple(s.index for s in servers if s.host in here),
        tuple(w.index for w in workers if w.host in here),
        addresses,
    )
    if not layout.local_servers and not layout.local_workers:
        raise ConfigError(
            f"no server or worker of the job is on this node: its addresses are "
            f"{', '.join(addresses) or '(none found)'}, but --servers is "
            f"{','.join(config.servers)} and --workers is {','.join(config.workers)}. "
            "Run fleetrun on each node listed, or give --node_ip with this node's IP as "
            "it appears in the lists"
        )
    return layout
