"""The worker's side of replication: which host serves each share, and calls that
follow a share to its next host when the one serving it dies.

:class:`ShareDirectory` knows the job's hosts, the replication and the dead hosts it
has heard of; :class:`ShareTransport` is the transport of one share
(``psfleet.ps.transport.Transport``): each call goes to the share's primary, and a
call that fails because the host cannot be reached (``RpcError``: unavailable
through every retry, or its deadline passed) is reported (``Failover`` on the
lowest-numbered other live host, which decides, ``psfleet.ps.replica.host``) and,
when the host is declared dead, issued again, unchanged, to the share's next host. A
write carries its push id, so one that reached the dead host and its backup is not
applied twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from psfleet.errors import FatalError, RpcError, ServerNotReadyError
from psfleet.ps.rpc_transport import RpcTransport
from psfleet.ps.transport import Pending
from psfleet.ps.types import PushMeta
from psfleet.replication import hosts_of, lost_shares
from psfleet.rpc import RpcClient, RpcConfig
from psfleet.rpc import messages as msg

__all__ = ["ShareDirectory", "ShareTransport"]

logger = logging.getLogger(__name__)


class ShareDirectory:
    """The job's hosts as this worker knows them. Thread safe.

    Args:
        endpoints: every server's ``host:port``, in server-index order (share ``i`` is
            server ``i``'s part of the tables).
        config: rpc settings of every call.
        replication: hosts per share (``PSFLEET_REPLICATION``), >= 2.
    """

    def __init__(self, endpoints: list[str], config: RpcConfig, replication: int) -> None:
        self.endpoints = list(endpoints)
        self.replication = replication
        self._config = config
        self._lock = threading.Lock()
        self._dead: set[int] = set()
        self._clients: dict[tuple[int, int | None], RpcClient] = {}

    @property
    def dead(self) -> set[int]:
        """The hosts declared dead so far (a copy)."""
        with self._lock:
            return set(self._dead)

    def client(self, host: int, share: int | None = None) -> RpcClient:
        """A connection to ``host`` for calls about ``share`` (None: its own)."""
        key = (host, None if share == host else share)
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                found = self._clients[key] = RpcClient(self.endpoints[host], self._config,
                                                       key[1])
            return found

    def primary(self, share: int) -> int:
        """The host serving ``share`` now.

        Raises:
            FatalError: every host of the share is dead (its rows are lost: resume
                from the newest checkpoint).
        """
        with self._lock:
            live = hosts_of(share, len(self.endpoints), self.replication, self._dead)
            dead = sorted(self._dead)
        if not live:
            raise FatalError(
                f"share {share} is lost: every server holding it ({self.replication} with "
                f"PSFLEET_REPLICATION) is dead (dead servers {dead}); resume the job from "
                "its newest checkpoint")
        return live[0]

    def transport(self, share: int) -> tuple[int, RpcTransport]:
        """The host serving ``share`` and a transport to it."""
        host = self.primary(share)
        return host, RpcTransport(self.client(host, share))

    def merge(self, hosts: Any) -> None:
        """Add dead hosts a server told of."""
        with self._lock:
            new = set(hosts) - self._dead
            self._dead |= new
        if new:
            lost = lost_shares(len(self.endpoints), self.replication, self.dead)
            logger.warning("servers %s are dead (failed over); dead so far: %s%s",
                           sorted(new), sorted(self.dead),
                           f"; shares {lost} have no copy left" if lost else "")

    def connect(self, timeout_s: float, retry_interval_s: float = 1.0) -> None:
        """Tell every live server the layout (``SetReplicas``) and learn the dead ones;
        waits until every server answers or is known dead. Blocks.

        Raises:
            ServerNotReadyError: some servers neither answered nor are known dead within
                ``timeout_s`` seconds (names them).
            InvalidRequestError: a server has another layout (names both).
        """
        deadline = time.monotonic() + timeout_s
        told: set[int] = set()
        while True:
            for host in range(len(self.endpoints)):
                if host in told or host in self.dead:
                    continue
                client = self.client(host)
                if not client.is_serving():
                    continue
                reply = client.call("SetReplicas", msg.ReplicasRequest(
                    endpoints=self.endpoints, host_index=host, replication=self.replication,
                    dead=sorted(self.dead)))
                self.merge(reply.hosts)
                told.add(host)
            waiting = [self.endpoints[h] for h in range(len(self.endpoints))
                       if h not in told and h not in self.dead]
            if not waiting:
                return
            if time.monotonic() + retry_interval_s > deadline:
                raise ServerNotReadyError(
                    f"servers not ready after {timeout_s:.0f} s: {waiting}. Check that they "
                    "were started and their logs (serverlog.N); raise "
                    "PSFLEET_SERVER_WAIT_TIMEOUT_S if they start slowly")
            time.sleep(retry_interval_s)

    def report(self, host: int) -> bool:
        """Report ``host`` unreachable to the lowest-numbered other live server, which
        decides. Blocks. Returns True when ``host`` is (now) declared dead.

        Raises:
            RpcError: no other server could be reached.
        """
        tried: list[int] = []
        while True:
            with self._lock:
                if host in self._dead:
                    return True
                candidates = [h for h in range(len(self.endpoints))
                              if h != host and h not in self._dead and h not in tried]
            if not candidates:
                raise RpcError(f"server {self.endpoints[host]} is unreachable and no other "
                               "server answered to fail it over (tried "
                               f"{[self.endpoints[h] for h in tried]})")
            judge = candidates[0]
            try:
                reply = self.client(judge).call("Failover", msg.FailoverRequest(
                    host=host, dead=sorted(self.dead)))
            except RpcError:
                tried.append(judge)
                continue
            self.merge(reply.hosts)
            return host in reply.hosts

    def close(self) -> None:
        """Close every connection."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


class _Rerouted:
    """A call of one share that moves to the share's next host when its host dies."""

    def __init__(self, directory: ShareDirectory, share: int,
                 issue: Callable[[RpcTransport], Pending]) -> None:
        self._directory = directory
        self._share = share
        self._issue = issue
        self._host, transport = directory.transport(share)
        self._pending = issue(transport)

    def result(self) -> Any:
        while True:
            try:
                return self._pending.result()
            except RpcError as exc:
                failed = self._host
                if not self._directory.report(failed):
                    raise
                self._host, transport = self._directory.transport(self._share)
                logger.warning("share %d: server %s is dead (%s); calling server %s",
                               self._share, self._directory.endpoints[failed], exc,
                               self._directory.endpoints[self._host])
                self._pending = self._issue(transport)


class ShareTransport:
    """The transport of share ``share`` (``psfleet.ps.transport.Transport``): calls
    go to its primary and follow it through fail-overs.

    Args:
        directory: the job's hosts.
        share: the share (server index).
    """

    def __init__(self, directory: ShareDirectory, share: int) -> None:
        self._directory = directory
        self.share = share
        self.endpoint = directory.endpoints[share]

    def _call(self, issue: Callable[[RpcTransport], Pending]) -> _Rerouted:
        return _Rerouted(self._directory, self.share, issue)

    def start(self, method: str, request: Any) -> _Rerouted:
        return self._call(lambda t: t.start(method, request))

    def start_pull_sparse(self, table_id: int, keys: np.ndarray, create: bool,
                          dim: int, with_state: bool = False) -> _Rerouted:
        return self._call(lambda t: t.start_pull_sparse(table_id, keys, create, dim,
                                                        with_state))

    def start_push_sparse(self, push: PushMeta, keys: np.ndarray, values: np.ndarray,
                          shows: np.ndarray | None = None,
                          clicks: np.ndarray | None = None) -> _Rerouted:
        return self._call(lambda t: t.start_push_sparse(push, keys, values, shows, clicks))

    def start_pull_dense(self, table_id: int, worker_index: int) -> _Rerouted:
        return self._call(lambda t: t.start_pull_dense(table_id, worker_index))

    def start_push_dense(self, push: PushMeta, values: np.ndarray) -> _Rerouted:
        return self._call(lambda t: t.start_push_dense(push, values))

    def close(self) -> None:
        """Connections are the directory's (:meth:`ShareDirectory.close`)."""
