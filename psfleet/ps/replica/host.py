"""A server's shares behind one endpoint: what it serves over gRPC.

:class:`ReplicaHost` holds one server's shares (``psfleet.ps.replica.members``). With
replication 1 (or before a worker said otherwise) that is only its own share, a
:class:`~psfleet.ps.service.TableService`, and every call goes to it. With replication
R > 1:

- **writes are forwarded before they are acknowledged.** A write to a share this host
  is primary of goes to every other member holding it before the worker is answered.
  Pushes that apply at once (APPLY, DELTA, ROW_DELTA) and admin writes (CreateTable,
  Load, Shrink, AgeOneDay) are applied here and forwarded under the share's order lock,
  so every copy applies them in the same order and holds the same bytes. Sync-mode
  pushes and barrier arrivals are forwarded *first*: a worker is told a round is
  applied (or a barrier crossed) only once every copy holds its contribution, so after
  a fail-over the new primary completes what the old one started. A retried push is
  applied once on every copy (push ids, ``psfleet.ps.push_ledger``).
- **reads go to the primary only** (pulls, Save, Stats); a worker's call to a host
  that does not serve the share is refused with ``MovedError`` (ABORTED), and the
  worker learns the map again.
- a member restarted in the job is filled while training goes on
  (``psfleet.ps.replica.rejoin``), and a share a dead server held is copied to a live
  one when no restarted server takes it back (``psfleet.ps.replica.refill``); a server
  leaves the job once its shares are copied to the others (``psfleet.ps.replica.drain``);
  a server added to the job takes its part of the shares (``psfleet.ps.replica.grow``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from psfleet.errors import MovedError, RemoteError, RpcError, ServerUnavailableError
from psfleet.ps.replica.grow import Growing
from psfleet.ps.replica.members import Layout
from psfleet.ps.request_checks import check_member, check_share
from psfleet.replication import Member
from psfleet.rpc import call_route
from psfleet.rpc import messages as msg

__all__ = ["Layout", "ReplicaHost"]

logger = logging.getLogger(__name__)

#: The reply a queued forwarded write gets (its sender ignores replies of forwards).
_QUEUED_REPLY: dict[str, Callable[[], Any]] = {
    "CreateTable": msg.CreateTableResponse, "PushSparse": lambda: msg.PushResponse(done=True),
    "PushDense": lambda: msg.PushResponse(done=True), "Barrier": msg.BarrierResponse,
    "Clock": msg.ClockResponse,
    "Load": msg.Empty, "Shrink": msg.ShrinkResponse, "AgeOneDay": msg.Empty}


def _summed(replies: list[msg.StatsResponse]) -> msg.StatsResponse:
    """The first of ``replies`` with each table's numbers summed over all of them."""
    first, tables = replies[0], {t.table_id: t for t in replies[0].tables}
    for reply in replies[1:]:
        for table in reply.tables:
            total = tables.get(table.table_id)
            if total is None:
                tables[table.table_id] = table
                continue
            for field in _COUNTED:
                setattr(total, field, getattr(total, field) + getattr(table, field))
    reply = msg.StatsResponse()
    reply.CopyFrom(first)
    del reply.tables[:]
    reply.tables.extend(tables[t] for t in sorted(tables))
    return reply


#: The TableStats fields a server's shares add up (every number but the id).
_COUNTED = [f.name for f in msg.TableStats.DESCRIPTOR.fields
            if f.name not in ("table_id", "name")]


class ReplicaHost(Growing):
    """Every share one server holds, behind its endpoint. Thread safe.

    One method per rpc of ``psfleet.proto``. A call is for the share its
    ``psfleet-share`` metadata names, else for the host's own; a write another host
    forwarded carries ``psfleet-from-host`` (``psfleet.rpc.call_route``). The arguments
    are :class:`~psfleet.ps.replica.members.ShareMembers`'.
    """

    def _route(self) -> tuple[int | None, bool]:
        """The share a call is for (None: nothing is replicated) and whether another
        host forwarded it."""
        route = call_route()
        if self._layout is None:
            return None, False
        with self._lock:
            assert self._map is not None
            hosts, share_num = len(self._map.hosts), self._map.share_num
        if route.share is not None:
            check_share("the call's psfleet-share metadata", route.share, self.limits,
                        share_num)
        if route.from_host is not None:
            check_member("the call's psfleet-from-host metadata", route.from_host, 0,
                         self.limits, hosts)
        return (self._me[0] if route.share is None else route.share,
                route.from_host is not None)
    def _targets(self, share: int) -> list[Member]:
        """The members a write to ``share`` is forwarded to: its other holders, and the
        members being filled with it."""
        with self._lock:
            assert self._map is not None
            return self._map.holders(share)[1:] + list(self._filling.get(share, []))

    def _forward(self, share: int, name: str, request: Any) -> None:
        """Send write ``name`` to every other member of ``share``. A holder that cannot
        be reached is declared dead (then skipped) or, when it answers health checks,
        called again (the write fails after ``config.max_retries`` such rounds); a
        member being filled that cannot be reached is dropped. Once this server was
        told to stop (the job is over: a worker's last barrier poll may still come),
        nothing is forwarded, and a forward cut short by the stop is no error."""
        for member in self._targets(share):
            if self.stop_requested.is_set():
                return
            try:
                self._forward_to(member, share, name, request)
            except RemoteError:
                if not self.stop_requested.is_set():
                    raise

    def _forward_to(self, member: Member, share: int, name: str, request: Any) -> None:
        for attempt in range(self._patience + 1):
            try:
                self._peer(member, share).call(name, request)
                return
            except RpcError as exc:  # unreachable, or its deadline passed (hung?)
                with self._lock:
                    filling = self._filling.get(share, [])
                    if member in filling:
                        filling.remove(member)
                        logger.warning("share %d: host %d, being filled, failed (%s); the "
                                       "copy is abandoned", share, member[0], exc)
                        return
                if self.declare_dead(member[0]).is_dead(member):
                    logger.warning("%s of share %d: host %d is dead; share %d goes on with "
                                   "fewer copies", name, share, member[0], share)
                    return
                if not isinstance(exc, ServerUnavailableError) or attempt == self._patience:
                    raise RemoteError(f"{name} of share {share}: its copy on host "
                                      f"{member[0]} cannot be reached but answers health "
                                      f"checks: {exc}") from None

    def _forwarded(self, share: int, name: str, request: Any) -> Any:
        """Apply a write another host forwarded (queued while the share is being filled).

        Raises:
            MovedError: the sender is dead in this host's map (a server declared dead
                that came back: its writes are refused).
            RemoteError: this host holds no copy of the share.
        """
        sender = call_route().from_host
        with self._lock:
            assert self._map is not None
            fenced = sender is not None and self._map.is_dead(self._map.latest(sender))
        if fenced:
            raise MovedError(f"host {sender} was declared dead; its forwarded {name} of share "
                             f"{share} is refused")
        with self._order[share]:
            queue = self._pending.get(share)
            if queue is not None:
                queue.append((name, request))
                return _QUEUED_REPLY[name]()
            service = self._shares.get(share)
            if service is None:
                raise RemoteError(f"this server (host {self._me[0]}) holds no copy of share "
                                  f"{share}; PSFLEET_REPLICATION and the server list must "
                                  "be the same on every process")
            return getattr(service, name)(request)

    def _write(self, name: str, request: Any, forward_first: bool = False) -> Any:
        """Run write ``name`` on its share and forward it to the share's other members:
        after applying it, under the share's order lock; or ``forward_first``, before it
        (calls that wait for other workers: sync pushes, barrier arrivals)."""
        share, forwarded = self._route()
        if share is None:
            return getattr(self.own, name)(request)
        if forwarded:
            return self._forwarded(share, name, request)
        if forward_first:
            service = self._check_primary(share)
            self._forward(share, name, request)
            return getattr(service, name)(request)
        with self._order[share]:
            service = self._check_primary(share)
            reply = getattr(service, name)(request)
            self._forward(share, name, request)
        return reply

    def _read(self, name: str, request: Any) -> Any:
        share, _ = self._route()
        service = self.own if share is None else self._check_primary(share)
        return getattr(service, name)(request)

    # -- the table rpcs of psfleet.proto --------------------------------------------------
    def CreateTable(self, request: msg.CreateTableRequest) -> Any:  # noqa: N802
        return self._write("CreateTable", request)

    def PullSparse(self, request: msg.PullSparseRequest) -> Any:  # noqa: N802
        return self._read("PullSparse", request)

    def PushSparse(self, request: msg.PushSparseRequest) -> Any:  # noqa: N802
        if request.poll:
            return self._read("PushSparse", request)
        return self._write("PushSparse", request, forward_first=request.mode == msg.SYNC)

    def PullDense(self, request: msg.PullDenseRequest) -> Any:  # noqa: N802
        return self._read("PullDense", request)

    def PushDense(self, request: msg.PushDenseRequest) -> Any:  # noqa: N802
        if request.poll:
            return self._read("PushDense", request)
        return self._write("PushDense", request, forward_first=request.mode == msg.SYNC)

    def Barrier(self, request: msg.BarrierRequest) -> Any:  # noqa: N802
        return self._write("Barrier", request, forward_first=True)

    def Clock(self, request: msg.ClockRequest) -> Any:  # noqa: N802
        return self._write("Clock", request, forward_first=True)

    def Save(self, request: msg.SaveRequest) -> Any:  # noqa: N802
        return self._read("Save", request)

    def Load(self, request: msg.LoadRequest) -> Any:  # noqa: N802
        return self._write("Load", request)

    def Stats(self, request: msg.StatsRequest) -> Any:  # noqa: N802
        """A share's statistics from its primary; with ``host_view`` (``psfleet
        status``, ``/metrics``) this server's: every table summed over the shares it
        holds, whether it is their primary or not, the shares it holds and serves, and
        the servers no longer in the job."""
        if not request.host_view or self._layout is None:
            return self._read("Stats", request)
        with self._lock:
            assert self._map is not None
            services = [self._shares[s] for s in sorted(self._shares)] or [self.own]
            held = sorted(self._shares)
            served = self._map.served_by(self._me)
            share_map = self._map
            live = share_map.live_hosts()
            departed = [h for h in share_map.hosts if h not in live]
        reply = _summed([s.Stats(request) for s in services])
        reply.uptime_s = time.monotonic() - self.own.started_s  # the process's
        reply.shares_held.extend(held)
        reply.shares_served.extend(served)
        reply.departed_hosts.extend(departed)
        reply.share_num, reply.replication = share_map.share_num, share_map.replication
        return reply

    def Shrink(self, request: msg.ShrinkRequest) -> Any:  # noqa: N802
        return self._write("Shrink", request)

    def AgeOneDay(self, request: msg.AgeOneDayRequest) -> Any:  # noqa: N802
        return self._write("AgeOneDay", request)

    def Stop(self, request: msg.StopRequest) -> msg.Empty:  # noqa: N802
        logger.info("stop requested by worker %d", request.worker_index)
        self.stop_requested.set()
        return msg.Empty()

    def close(self) -> None:
        """Fail every call waiting in any share (the server is stopping); close the
        connections to the other hosts; end the refill thread."""
        self.stop_refill()
        with self._lock:
            services = {id(s): s for s in [self.own, *self._shares.values()]}
        for service in services.values():
            service.close()
        if self._peers is not None:
            self._peers.close()
