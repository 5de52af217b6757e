"""Connections to the job's servers, one channel per member and share.

Both sides of replication call servers about shares: a worker its shares' primaries
(``directory``), a server its shares' other holders (``members``). A member (server
index, incarnation) gets channels of its own, so a client made for a restarted server
does not inherit the reconnect backoff of one that called its dead predecessor at the
same endpoint.
"""

from __future__ import annotations

import threading

from psfleet.replication import Member
from psfleet.rpc import RpcClient, RpcConfig

__all__ = ["MemberClients"]


class MemberClients:
    """One :class:`~psfleet.rpc.RpcClient` per (member, share), made on first use.
    Thread safe.

    Args:
        endpoints: every server's ``host:port``, in server-index order.
        config: rpc settings of every call.
        from_host: the calling server's index (sent with forwarded writes); None: a
            worker.
    """

    def __init__(self, endpoints: tuple[str, ...] | list[str], config: RpcConfig,
                 from_host: int | None = None) -> None:
        self._endpoints = tuple(endpoints)
        self._config = config
        self._from_host = from_host
        self._lock = threading.Lock()
        self._clients: dict[tuple[Member, int | None], RpcClient] = {}

    def extend(self, endpoints: list[str]) -> None:
        """Take the endpoint list with the servers added to the job since (it only
        grows: the first ones are unchanged)."""
        with self._lock:
            self._endpoints = tuple(endpoints)

    def get(self, member: Member, share: int | None) -> RpcClient:
        """A connection to ``member`` for calls about ``share`` (None, or the member's
        own index: its own share)."""
        key = (member, None if share == member[0] else share)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = RpcClient(
                    self._endpoints[member[0]], self._config, key[1], self._from_host)
            return client

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
