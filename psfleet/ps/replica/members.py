"""One server's place among the members of a replicated job: the share map it knows
and the fail-overs it decides (``psfleet.ps.replica``).

:class:`ShareMembers` keeps the job's layout (``SetReplicas``, sent by every worker
when it connects; a restarted server knows it from its environment), the shares this
server holds (its own, and a copy of each share ``psfleet.replication.hosts_of``
places on it), and the :class:`~psfleet.replication.ShareMap`, merged with every map
another process sends (``MergeMap``: a union, it only grows).

**Fail-over.** A host that cannot reach another, or a worker that cannot reach a
primary (``Failover``), makes the host handling the report decide: it probes the
host's health and, if it does not answer, marks its newest member dead and sends the
map to every live host before answering. A copy whose member becomes primary serves
at once: its sync rounds and barriers wait normally from then on (a copy that is not
primary never waits, so forwarded sync pushes and barrier arrivals answer at once).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from typing import Any

from psfleet.errors import InvalidRequestError, MovedError, RemoteError
from psfleet.ps.replica.copy import chunk_bytes
from psfleet.ps.replica.peers import MemberClients
from psfleet.ps.replica.wire import map_from_message, map_to_message
from psfleet.ps.request_checks import (
    check_endpoints,
    check_map_message,
    check_member,
)
from psfleet.ps.service import TableService
from psfleet.ps.wait_budget import WaitBudget
from psfleet.replication import SUSPECT_RETRIES, Member, ShareMap, hosts_of
from psfleet.rpc import RpcClient, RpcConfig
from psfleet.rpc import messages as msg

__all__ = ["Layout", "ShareMembers"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layout:
    """A replicated job as one host sees it: the endpoints of the servers it started
    with (server-index order), this host's index (at or past their count: a server
    added to the running job), the hosts per share, and the shares (0: one per
    endpoint)."""

    endpoints: tuple[str, ...]
    index: int
    replication: int
    shares: int = 0

    @property
    def share_num(self) -> int:
        """Shares of the tables."""
        return self.shares or len(self.endpoints)

    @property
    def added(self) -> bool:
        """This host was added to the running job (``psfleet.ps.replica.grow``): its
        index is past the job's servers (a server told no endpoints is not)."""
        return bool(self.endpoints) and self.index >= len(self.endpoints)


class ShareMembers:
    """One server's place among the job's members: its layout, the share map, its
    shares, the decisions of fail-overs, and its connections to the others. Thread
    safe. The base of :class:`~psfleet.ps.replica.host.ReplicaHost` (its arguments).

    Args:
        own: this server's own share (its tables when nothing is replicated).
        config: how this host calls the others (token, TLS, deadline; a call that
            cannot reach its server is retried ``SUSPECT_RETRIES`` times, then the
            server is probed, and called again while it lives, up to
            ``config.max_retries`` times).
        probe_timeout_s: how long a host reported dead gets to answer a health check
            before it is declared dead, seconds.
        layout: the job's layout when known at start (a restarted member: from
            ``PADDLE_PSERVERS_IP_PORT_LIST``); else the first ``SetReplicas`` gives it.
        incarnation: this process's restart number; > 0 with ``layout``: a restarted
            member, which holds nothing until :meth:`rejoin` filled it.
        replication: the job's replication when the server is told it at launch
            (``PSFLEET_REPLICATION``): 1 refuses every call of the replication control
            plane (FAILED_PRECONDITION), so no request can give an unreplicated server
            a layout in which it no longer serves its own tables; None: not known (the
            first ``SetReplicas`` gives the layout).
    """

    def __init__(self, own: TableService, config: RpcConfig, probe_timeout_s: float = 2.0,
                 layout: Layout | None = None, incarnation: int = 0,
                 replication: int | None = None) -> None:
        self.own = own
        self.limits = own.limits
        self._replicated = replication is None or replication > 1
        self.stop_requested = own.stop_requested
        self._patience = config.max_retries
        self._config = dataclasses.replace(config, max_retries=min(config.max_retries,
                                                                   SUSPECT_RETRIES))
        self._probe_timeout_s = probe_timeout_s
        self._wait_slots = own.wait_budget.slots
        self._lock = threading.Lock()  # the map, the shares, the peers
        self._decide = threading.Lock()  # one fail-over decision at a time
        self._layout: Layout | None = None
        self._me: Member = (-1, incarnation)
        self._map: ShareMap | None = None
        self._shares: dict[int, TableService] = {}
        # share -> the number of the copy held (absent: 0, the placement's copy)
        self._copies: dict[int, int] = {}
        self._pending: dict[int, list[tuple[str, Any]]] = {}  # share -> queued forwards
        self._filling: dict[int, list[Member]] = {}  # share -> members being copied to
        self._copy_chunk_bytes = 0  # PSFLEET_COPY_CHUNK_BYTES, read with the layout
        # share -> (the next part due, the pieces so far) of the copy being received
        self._receiving: dict[int, tuple[int, list[msg.SharedFile]]] = {}
        self._order: dict[int, threading.Lock] = {}
        self._peers: MemberClients | None = None  # with the layout
        if layout is not None:
            with self._lock:
                self._configure(layout)

    # -- layout and map -------------------------------------------------------------------
    def _configure(self, layout: Layout) -> None:
        """Take the job's layout (the caller holds ``_lock``)."""
        num = len(layout.endpoints)
        self._copy_chunk_bytes = chunk_bytes()  # a bad setting fails the server's start
        self._layout, self._me = layout, (layout.index, self._me[1])
        self._peers = MemberClients(layout.endpoints, self._config, layout.index)
        self._map = ShareMap(num, layout.replication, share_num=layout.share_num)
        if self._me[1] > 0:  # a restarted member: nothing until it is filled
            self._map = self._map.with_dead([(layout.index, self._me[1] - 1)])
        for share in self._map.shares:
            self._order[share] = threading.Lock()
            if self._me[1] > 0 or layout.index not in hosts_of(share, num,
                                                               layout.replication):
                continue  # a restarted member: nothing until it is filled (rejoin)
            service = self.own if share == layout.index else self._copy_service()
            if self._map.primary(share) == self._me:
                service.wait_budget.slots = self._wait_slots
            self._shares[share] = service
        logger.info("host %d of %d (incarnation %d), replication %d, %d shares: %s",
                    layout.index, num, self._me[1], layout.replication, layout.share_num,
                    "added to the running job, holds nothing yet" if layout.added else
                    "restarted, holds nothing until it rejoined" if self._me[1] > 0 else
                    f"holds {sorted(self._shares)}")

    def SetReplicas(self, request: msg.ReplicasRequest) -> msg.ShareMapMessage:  # noqa: N802
        """Take the job's layout (the first call) or check it (later ones), and merge
        the caller's map. Returns this host's map.

        Raises:
            InvalidRequestError: a replication outside ``[1, hosts]``, a host index
                outside the list, or a layout other than the one set first.
        """
        self.require_replicated("SetReplicas")
        limits = self.limits
        # Every count is checked before any work per endpoint or share, and before the
        # lock: the layout's work (a service per share held) runs under it.
        check_endpoints("SetReplicas", request.endpoints, limits)
        if request.shares > limits.max_shares:
            raise InvalidRequestError(
                f"SetReplicas: {request.shares} shares is above {limits.max_shares}, the "
                "most this server accepts (ServerLimits.max_shares; PSFLEET_SHARES, "
                "fleetrun --shares and cluster.shares have the same bound)")
        check_map_message("SetReplicas", request.map, limits)
        layout = Layout(tuple(request.endpoints), request.host_index, request.replication,
                        request.shares)
        hosts = len(layout.endpoints)
        with self._lock:
            known = self._layout == layout  # an added host's own index is past the hosts
        if not known and (not 1 <= layout.replication <= hosts or layout.index >= hosts
                          or layout.share_num < hosts
                          or (layout.share_num != hosts and layout.replication < 2)):
            raise InvalidRequestError(
                f"SetReplicas: replication {layout.replication} with {hosts} hosts, "
                f"{layout.share_num} shares and host index {layout.index}; replication must "
                "be in [1, hosts] (PSFLEET_REPLICATION), the host index below the hosts, and "
                "the shares at least the hosts (PSFLEET_SHARES), more only with replication "
                ">= 2")
        with self._lock:
            if self._layout is None:
                self._configure(layout)
            elif self._layout != layout:
                raise InvalidRequestError(
                    f"SetReplicas: host {layout.index} of {list(layout.endpoints)} with "
                    f"replication {layout.replication} and {layout.share_num} shares, but this "
                    f"server is host {self._layout.index} of {list(self._layout.endpoints)} "
                    f"with replication {self._layout.replication} and "
                    f"{self._layout.share_num} shares; every worker must have the same "
                    "PADDLE_PSERVERS_IP_PORT_LIST, PSFLEET_REPLICATION and PSFLEET_SHARES")
            return self._merge_message(request.map)

    def require_replicated(self, method: str) -> None:
        """Refuse a call of the replication control plane on a server launched without
        replication.

        Raises:
            RemoteError: this server was started with replication 1 (FAILED_PRECONDITION).
        """
        if not self._replicated:
            raise RemoteError(
                f"{method}: this server was started without replication "
                "(PSFLEET_REPLICATION=1): its tables are its own and it takes no layout or "
                "share map; start the job with fleetrun --replication 2 to replicate it")

    def _merge_message(self, message: msg.ShareMapMessage) -> msg.ShareMapMessage:
        """Merge a map from the wire, checked by the caller (:func:`check_map_message`,
        outside the lock); return this host's (the caller holds ``_lock``)."""
        assert self._map is not None
        self._merge(map_from_message(message, self._map.host_num, self._map.replication,
                                     self._map.share_num))
        return map_to_message(self._map)

    def _merge(self, other: ShareMap) -> None:
        """Merge ``other`` into the map and let each copy wait (serve) or not as this
        member now is its primary or not (the caller holds ``_lock``)."""
        assert self._map is not None
        old = self._map
        merged = old.merged(other)
        if merged == old:
            return
        self._map = merged
        if merged.added != old.added:
            assert self._layout is not None and self._peers is not None
            self._peers.extend(merged.endpoints(self._layout.endpoints))
        for share, service in self._shares.items():
            primary = merged.primary(share) == self._me
            if primary and service.wait_budget.slots == 0:
                logger.warning("this server (host %d) now serves share %d", self._me[0], share)
            elif not primary and service.wait_budget.slots > 0:
                logger.info("share %d is now served by %s; this copy follows it", share,
                            merged.primary(share))
            service.wait_budget.slots = self._wait_slots if primary else 0
        for share in [s for s in self._shares
                      if (s, *self._me, self._copies.get(s, 0)) in merged.released]:
            service = self._shares.pop(share)  # a copy no longer needed: memory freed
            self._copies.pop(share, None)
            if service is self.own:
                service.drop_tables()
            logger.warning("this server's copy of share %d was released (the share has "
                           "%d copies without it)", share, merged.replication)
        logger.warning("share map: %s (replication %d)", merged.describe(), merged.replication)
        self._map_changed()

    def _map_changed(self) -> None:
        """Called after every change of the map, with ``_lock`` held (subclasses act on
        it; ``psfleet.ps.replica.refill``)."""

    def MergeMap(self, request: msg.ShareMapMessage) -> msg.ShareMapMessage:  # noqa: N802
        """Merge another host's map (a union: it only grows); returns this host's."""
        self.require_replicated("MergeMap")
        check_map_message("MergeMap", request, self.limits)
        with self._lock:
            if self._map is None:
                return request
            return self._merge_message(request)

    def Failover(self, request: msg.FailoverRequest) -> msg.ShareMapMessage:  # noqa: N802
        """Declare ``request.host`` dead if it does not answer a health check, and tell
        every live host; returns the map (``request.host`` live in it when it answered)."""
        self.require_replicated("Failover")
        check_map_message("Failover", request.map, self.limits)
        with self._lock:
            if self._map is None:
                raise RemoteError("Failover: this server has no replicated layout "
                                  "(no worker sent SetReplicas)")
            check_member("Failover", request.host, 0, self.limits, len(self._map.hosts))
            self._merge_message(request.map)
        self.declare_dead(request.host)
        with self._lock:
            return map_to_message(self._map)

    def declare_dead(self, host: int) -> ShareMap:
        """Decide whether ``host`` is dead: when it answers no health check within
        ``probe_timeout_s``, mark its newest member dead and send the map to every
        live host (one that does not answer is left to its own callers). Returns the
        map."""
        with self._decide:
            with self._lock:
                assert self._map is not None
                member = self._map.latest(host)
                if host == self._me[0] or self._map.is_dead(member):
                    return self._map
            if self._peer(host, None).is_serving(timeout_s=self._probe_timeout_s):
                logger.warning("host %d was reported unreachable but answers its health "
                               "check; not failing it over", host)
                with self._lock:
                    return self._map
            with self._lock:
                self._merge(self._map.with_dead([member]))
            self._broadcast()
            with self._lock:
                return self._map

    def _broadcast(self) -> None:
        """Send the map to every other live host."""
        with self._lock:
            assert self._map is not None
            message = map_to_message(self._map)
            others = [h for h in self._map.live_hosts() if h != self._me[0]]
        for other in others:
            try:
                self._peer(other, None).call("MergeMap", message)
            except Exception as exc:  # noqa: BLE001 - its callers will report it
                logger.warning("could not send the share map to host %d: %s", other, exc)

    def _copy_service(self) -> TableService:
        """An empty service for a copy of another share: it never waits (forwarded sync
        pushes and barrier arrivals answer at once) until it becomes primary."""
        own = self.own
        return TableService(own.barrier_timeout_s, own.preload_dir, own.limits,
                            wait_budget=WaitBudget(0, own.wait_budget.max_wait_s))

    def _peer(self, host: int | Member, share: int | None) -> RpcClient:
        """A connection to ``host`` (its newest member this host knows, or the member
        given) for calls about ``share`` (None: the host's own). A new member of a host
        gets a new channel: the old one may still be backing off from the dead one."""
        with self._lock:
            assert self._peers is not None and self._map is not None
            member = self._map.latest(host) if isinstance(host, int) else host
        return self._peers.get(member, share)
    def _check_primary(self, share: int) -> TableService:
        """The service of ``share`` when this member is its primary.

        Raises:
            MovedError: it is not (the share failed over, or a restarted member took it
                back): the caller learns the map again.
        """
        with self._lock:
            assert self._map is not None
            primary = self._map.primary(share)
            service = self._shares.get(share)
        if primary != self._me or service is None:
            where = ("no live copy" if primary is None
                     else f"host {primary[0]} (incarnation {primary[1]})")
            raise MovedError(f"share {share} is served by {where}, not by this server "
                             f"(host {self._me[0]} incarnation {self._me[1]})")
        return service
