"""The two ways a worker reaches its tables: :class:`RemoteClient` (servers over gRPC,
replicated or not) and :class:`LocalClient` (a :class:`~psfleet.ps.service.TableService`
in this process). Both are a :class:`~psfleet.ps.client.TableClient` over transports
(``psfleet.ps.transport``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from psfleet.ps.client import TableClient
from psfleet.ps.handles import wait_all
from psfleet.ps.replica.directory import ShareDirectory, ShareTransport
from psfleet.ps.rpc_transport import RpcTransport
from psfleet.ps.service import TableService
from psfleet.ps.transport import InProcessTransport, Transport
from psfleet.replication import (
    check_replication,
    check_shares,
    replication_from_env,
    shares_from_env,
)
from psfleet.rpc import RpcClient, RpcConfig, wait_servers_ready
from psfleet.rpc import messages as msg

__all__ = ["RemoteClient", "LocalClient"]

logger = logging.getLogger(__name__)


class RemoteClient(TableClient):
    """Tables on servers reached over gRPC.

    With ``replication`` R > 1 each share lives on R servers and its calls follow it
    to the next one when the server serving it dies (``psfleet.ps.replica``,
    docs/fault-tolerance.md); there may be more shares than servers (``shares``), so
    that a server added to the running job can take some.

    Args:
        endpoints: server endpoints ``host:port`` in server-index order.
        config: rpc settings.
        worker_index: this worker's index, sent with pushes and dense pulls.
        incarnation: this worker process's restart number (see :class:`TableClient`).
        replication: servers per share; None: ``PSFLEET_REPLICATION`` (default 1).
        shares: shares of the tables; None: ``PSFLEET_SHARES`` (default: one per
            server).

    Raises:
        ConfigError: a replication below 1 or above the server count; more shares
            than servers without replication, or fewer shares than servers.
    """

    def __init__(self, endpoints: Sequence[str], config: RpcConfig,
                 worker_index: int = 0, incarnation: int = 0,
                 replication: int | None = None, shares: int | None = None) -> None:
        endpoints = list(endpoints)
        self.replication = (replication_from_env(len(endpoints)) if replication is None
                            else check_replication(replication, len(endpoints), "replication"))
        share_num = (shares_from_env(len(endpoints), self.replication) if shares is None
                     else check_shares(shares, len(endpoints), self.replication, "shares"))
        self._directory: ShareDirectory | None = None
        transports: list[Transport]
        if self.replication > 1:
            self._directory = ShareDirectory(endpoints, config, self.replication, share_num)
            transports = [ShareTransport(self._directory, s) for s in range(share_num)]
            self._rpc = [self._directory.client(h) for h in range(len(endpoints))]
        else:
            self._rpc = [RpcClient(e, config) for e in endpoints]
            transports = [RpcTransport(c) for c in self._rpc]
        super().__init__(transports, worker_index, incarnation)

    def wait_ready(self, timeout_s: float) -> None:
        """Block until every server is serving (see ``rpc.wait_servers_ready``); with
        replication, until every server answered or is known dead, and tell them the
        layout.

        Raises:
            ServerNotReadyError: some servers were not ready within ``timeout_s`` seconds.
        """
        if self._directory is not None:
            self._directory.connect(timeout_s)
        else:
            wait_servers_ready(self._rpc, timeout_s)

    def stop_servers(self, worker_index: int) -> None:
        """Tell every server to stop serving; with replication, every live one in the
        share map (learned afresh: it names servers added to the job, and a server
        that serves no share is stopped too).

        Raises:
            RpcError: a live server could not be reached.
        """
        if self._directory is None:
            super().stop_servers(worker_index)
            return
        self._directory.refresh()
        hosts = self._directory.map.live_hosts()
        request = msg.StopRequest(worker_index=worker_index)
        wait_all([self._directory.client(h).start("Stop", request) for h in hosts])
        logger.info("told servers %s to stop", [self._directory.endpoints[h] for h in hosts])

    def close(self) -> None:
        super().close()
        if self._directory is not None:
            self._directory.close()


class LocalClient(TableClient):
    """Tables in this process: one :class:`TableService` called directly.

    Single-machine training (``server_num: 0``) and collective mode (every rank
    holds every table) use it; requests go through the same service code as a
    server's, so rules, dense slicing and DC-ASGD behave exactly as on one server.

    Args:
        service: the in-process tables (a new, empty service when None).
        worker_index: this worker's index.
    """

    def __init__(self, service: TableService | None = None, worker_index: int = 0) -> None:
        self.service = service or TableService()
        super().__init__([InProcessTransport(self.service)], worker_index)
