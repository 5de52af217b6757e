"""The worker's side of replication: which host serves each share, and calls that
follow a share to its next host when the one serving it dies.

:class:`ShareDirectory` knows the job's hosts, the replication and the share map it has
heard of; :class:`ShareTransport` is the transport of one share
(``psfleet.ps.transport.Transport``): each call goes to the share's primary. A call
that fails because the host cannot be reached (``RpcError``: unavailable through its
quick retries, or its deadline passed) is reported (``Failover`` on the lowest-numbered
other live host, which decides, ``psfleet.ps.replica.members``) and, when the host is declared
dead, issued again, unchanged, to the share's next host; one refused because the host
no longer serves the share (``MovedError``: a restarted server took it back) is issued
again once the map is learned. A write carries its push id, so one that reached the
old primary and its copies is not applied twice.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from psfleet.errors import (
    FatalError,
    MovedError,
    RpcError,
    ServerNotReadyError,
    ServerUnavailableError,
)
from psfleet.ps.replica.peers import MemberClients
from psfleet.ps.replica.wire import map_from_message, map_to_message
from psfleet.ps.rpc_transport import RpcTransport
from psfleet.ps.transport import Pending
from psfleet.ps.types import PushMeta
from psfleet.replication import SUSPECT_RETRIES, ShareMap
from psfleet.rpc import RpcClient, RpcConfig
from psfleet.rpc import messages as msg

__all__ = ["ShareDirectory", "ShareTransport"]

logger = logging.getLogger(__name__)


class ShareDirectory:
    """The job's hosts as this worker knows them (a :class:`ShareMap`). Thread safe.

    A call that cannot reach its server is reported after
    :data:`~psfleet.replication.SUSPECT_RETRIES` retries (about 0.6 s), not
    ``config.max_retries``: the server deciding probes the suspect, and a live one is
    called again (up to ``config.max_retries`` times), so a dead server costs the
    workers about a second and a slow one nothing.

    Args:
        endpoints: the job's servers' ``host:port``, in server-index order (servers
            added to the running job are learned from the map).
        config: rpc settings of every call.
        replication: hosts per share (``PSFLEET_REPLICATION``), >= 2.
        shares: shares of the tables (``PSFLEET_SHARES``; 0: one per server).
    """

    def __init__(self, endpoints: list[str], config: RpcConfig, replication: int,
                 shares: int = 0) -> None:
        self._first = list(endpoints)
        self.endpoints = list(endpoints)
        self.replication = replication
        self.shares = shares or len(endpoints)
        #: how many times a call is sent again to a server that was reported but lives
        self.patience = config.max_retries
        self._config = dataclasses.replace(config, max_retries=min(config.max_retries,
                                                                   SUSPECT_RETRIES))
        self._lock = threading.Lock()
        self._map = ShareMap(len(endpoints), replication, share_num=self.shares)
        self._clients = MemberClients(self.endpoints, self._config)

    @property
    def map(self) -> ShareMap:
        """What this worker knows of the shares' members."""
        with self._lock:
            return self._map

    def client(self, host: int, share: int | None = None) -> RpcClient:
        """A connection to ``host`` (its newest member in the map) for calls about
        ``share`` (None: its own). A new member of a host (a restarted server) gets a
        new channel: the old one may still be backing off from the dead one."""
        return self._clients.get(self.map.latest(host), share)

    def primary(self, share: int) -> int:
        """The host serving ``share`` now.

        Raises:
            FatalError: every copy of the share is dead (its rows are lost: resume from
                the newest checkpoint).
        """
        share_map = self.map
        primary = share_map.primary(share)
        if primary is None:
            raise FatalError(
                f"share {share} is lost: every server holding it ({self.replication} with "
                f"PSFLEET_REPLICATION) is dead ({share_map.describe()}); resume the job from "
                "its newest checkpoint")
        return primary[0]

    def transport(self, share: int) -> tuple[int, RpcTransport]:
        """The host serving ``share`` and a transport to it."""
        host = self.primary(share)
        return host, RpcTransport(self.client(host, share))

    def merge(self, message: msg.ShareMapMessage) -> None:
        """Merge the map a server sent."""
        with self._lock:
            old = self._map
            self._map = old.merged(map_from_message(message, len(self._first),
                                                    self.replication, self.shares))
            changed = self._map != old
            if self._map.added != old.added:
                self.endpoints = self._map.endpoints(self._first)
                self._clients.extend(self.endpoints)
        if changed:
            logger.warning("share map: %s", self._map.describe())

    def _live_hosts(self, skip: int | None = None) -> list[int]:
        return [h for h in self.map.live_hosts() if h != skip]

    def connect(self, timeout_s: float, retry_interval_s: float = 1.0) -> None:
        """Tell every live server the layout (``SetReplicas``) and learn the map; waits
        until every server answered or is known dead. Blocks.

        Raises:
            ServerNotReadyError: some servers neither answered nor are known dead within
                ``timeout_s`` seconds (names them).
            InvalidRequestError: a server has another layout (names both).
        """
        deadline = time.monotonic() + timeout_s
        told: set[int] = set()
        while True:
            for host in self._live_hosts():
                if host in told:
                    continue
                client = self.client(host)
                if not client.is_serving():
                    continue
                self.merge(client.call("SetReplicas", msg.ReplicasRequest(
                    endpoints=self._first, host_index=host, replication=self.replication,
                    shares=self.shares, map=map_to_message(self.map))))
                told.add(host)
            waiting = [self.endpoints[h] for h in self._live_hosts() if h not in told]
            if not waiting:
                return
            if time.monotonic() + retry_interval_s > deadline:
                raise ServerNotReadyError(
                    f"servers not ready after {timeout_s:.0f} s: {waiting}. Check that they "
                    "were started and their logs (serverlog.N); raise "
                    "PSFLEET_SERVER_WAIT_TIMEOUT_S if they start slowly")
            time.sleep(retry_interval_s)

    def _ask(self, method: str, request: Any, skip: int | None = None) -> None:
        """Send ``request`` to the lowest-numbered live server (other than ``skip``)
        that answers, and merge the map it returns.

        Raises:
            RpcError: no server answered.
        """
        tried: list[int] = []
        while True:
            candidates = [h for h in self._live_hosts(skip) if h not in tried]
            if not candidates:
                raise RpcError(f"{method}: no server answered (tried "
                               f"{[self.endpoints[h] for h in tried]})")
            try:
                self.merge(self.client(candidates[0]).call(method, request))
                return
            except RpcError:
                tried.append(candidates[0])

    def report(self, host: int) -> bool:
        """Report ``host`` unreachable to the lowest-numbered other live server, which
        decides. Blocks. Returns True when ``host`` is (now) dead in the map.

        Raises:
            RpcError: no other server could be reached.
        """
        share_map = self.map
        if share_map.is_dead(share_map.latest(host)):
            return True
        self._ask("Failover", msg.FailoverRequest(host=host, map=map_to_message(share_map)),
                  skip=host)
        share_map = self.map
        return share_map.is_dead(share_map.latest(host))

    def refresh(self) -> None:
        """Learn the map from the lowest-numbered live server (after a ``MovedError``).

        Raises:
            RpcError: no server could be reached.
        """
        self._ask("MergeMap", map_to_message(self.map))

    def close(self) -> None:
        """Close every connection."""
        self._clients.close()


class _Rerouted:
    """A call of one share that follows the share to its next host: when its host dies
    (``RpcError``: the call is reported, and sent again to the new primary, or, when it
    was unreachable but the server is found alive, to the same server) or no longer
    serves the share (``MovedError``: the map is learned again).

    Args:
        directory: the job's hosts.
        share: the share the call is for.
        issue: sends the call on a transport.
        moves: how many ``MovedError`` in a row are followed before the last is raised
            (a map change takes a moment to reach every server).
    """

    def __init__(self, directory: ShareDirectory, share: int,
                 issue: Callable[[RpcTransport], Pending], moves: int = 50) -> None:
        self._directory = directory
        self._share = share
        self._issue = issue
        self._moves = moves
        self._host, transport = directory.transport(share)
        self._pending = issue(transport)

    def _again(self) -> None:
        self._host, transport = self._directory.transport(self._share)
        self._pending = self._issue(transport)

    def result(self) -> Any:
        moves = alive = 0
        while True:
            if self._directory.primary(self._share) != self._host:
                self._again()  # the map changed since the call was issued
            try:
                return self._pending.result()
            except RpcError as exc:  # unreachable, or its deadline passed (hung?)
                failed = self._host
                if not self._directory.report(failed):
                    alive += 1
                    if not isinstance(exc, ServerUnavailableError) or \
                            alive > self._directory.patience:
                        raise
                    self._again()  # it answers its health check: call it again
                    continue
                logger.warning("share %d: server %s is dead (%s); calling server %s",
                               self._share, self._directory.endpoints[failed], exc,
                               self._directory.endpoints[self._directory.primary(self._share)])
                self._again()
            except MovedError:
                moves += 1
                if moves > self._moves:
                    raise
                before = self._host
                self._directory.refresh()
                if self._directory.primary(self._share) == before:
                    time.sleep(0.1)  # the servers have not all heard yet
                self._again()


class ShareTransport:
    """The transport of share ``share`` (``psfleet.ps.transport.Transport``): calls
    go to its primary and follow it through fail-overs.

    Args:
        directory: the job's hosts.
        share: the share.
    """

    def __init__(self, directory: ShareDirectory, share: int) -> None:
        self._directory = directory
        self.share = share
        # where the share was placed first (its primary's when the job started)
        self.endpoint = directory.endpoints[share % len(directory.endpoints)]

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
