"""Rejoin: a restarted server of a replicated job is filled with copies of its shares
while training goes on, and the job is back to R copies (``psfleet.ps.replica``).

A server restarted in a replicated job (``PSFLEET_RESTART_NUM`` > 0) holds nothing at
first and asks a live host to declare its older processes dead (``Rejoin``; the first
that answers). It then takes back the shares its last process held when it died
(``ShareMap.held_when_dead``: its placement's shares, unless moves or refills changed
them): for each, it asks the share's primary to copy it (``CopyShare``): a snapshot
under the share's order lock, so it is an exact cut of the writes; every write after it
is forwarded to the new member, which queues them until the copy is loaded
(``ReceiveShare``, in parts of at most ``PSFLEET_COPY_CHUNK_BYTES``) and then applies
them in order. The primary then adds the member to the map, still under the order
lock, and sends the map to every live host. A member on its own host ranks first among
a share's holders, so it serves its share again from then on. A sync-mode share is not
copied (rounds in flight are not part of a copy): the restarted server fails, and the
share keeps its other copies.
"""

from __future__ import annotations

import logging

from psfleet.errors import FatalError, InvalidRequestError, MovedError, RemoteError, RpcError
from psfleet.ps.replica.copy import (
    join_parts,
    share_files,
    split_parts,
    tables_from_files,
)
from psfleet.ps.replica.members import ShareMembers
from psfleet.ps.replica.wire import map_to_message
from psfleet.ps.request_checks import check_member, check_share
from psfleet.replication import Member, Move
from psfleet.rpc import messages as msg

__all__ = ["Rejoining"]

logger = logging.getLogger(__name__)


class Rejoining(ShareMembers):
    """The rejoin protocol of one server (module docstring): as the restarted member
    (:meth:`rejoin`, ``ReceiveShare``), as the host deciding (``Rejoin``) and as a
    share's primary (``CopyShare``)."""

    def rejoin(self) -> None:
        """Have this restarted member filled with copies of the shares its host's last
        process held (module docstring): asks the live hosts in index order to declare
        that process dead (the first that answers), then each share's primary for a
        copy. Blocks until every copy is in.

        Raises:
            FatalError: no other host answered, a share's primary failed during its
                copy, or the copy was refused (a sync-mode job; names the reason).
        """
        assert self._layout is not None and self._me[1] > 0
        request = msg.RejoinRequest(host=self._me[0], incarnation=self._me[1])
        for judge in range(len(self._layout.endpoints)):
            if judge == self._me[0]:
                continue
            try:
                reply = self._peer(judge, None).call("Rejoin", request)
            except (RpcError, MovedError):  # down, or a share moved meanwhile: the next
                continue
            except RemoteError as exc:
                raise FatalError(f"host {self._me[0]} incarnation {self._me[1]} cannot "
                                 f"rejoin: {exc}") from None
            with self._lock:
                self._merge_message(reply)
                assert self._map is not None
                shares = self._map.held_when_dead(self._me[0])
                for share in shares:
                    self._pending[share] = []
            for share in shares:
                self._take(share)
            with self._lock:
                missing = sorted(self._pending)
            logger.info("rejoined: holds shares %s%s", sorted(self._shares),
                        f"; shares {missing} had no live copy to fill from" if missing else "")
            return
        raise FatalError(f"host {self._me[0]} incarnation {self._me[1]} cannot rejoin: no "
                         "other server could fill it (they are down, or the job ended)")

    def _take(self, share: int) -> None:
        """Have ``share``'s primary copy it to this restarted member (blocks); a share
        with no live copy stays pending (its rows are lost).

        Raises:
            FatalError: the primary failed meanwhile, or refused the copy.
        """
        with self._lock:
            assert self._map is not None
            primary = self._map.primary(share)
        if primary is None:
            logger.error("share %d has no live copy to fill host %d from", share, self._me[0])
            return
        try:
            reply = self._peer(primary, None).call("CopyShare", msg.CopyShareRequest(
                share=share, host=self._me[0], incarnation=self._me[1]))
        except (RpcError, MovedError, RemoteError) as exc:
            raise FatalError(f"host {self._me[0]} incarnation {self._me[1]} cannot rejoin: "
                             f"the copy of share {share} from host {primary[0]} failed: "
                             f"{exc}") from None
        with self._lock:
            self._merge_message(reply)

    def Rejoin(self, request: msg.RejoinRequest) -> msg.ShareMapMessage:  # noqa: N802
        """Declare the older processes of the restarted member ``(host, incarnation)``
        dead and tell every live host. Returns the map, from which the member takes
        back its shares (:meth:`rejoin`)."""
        self.require_replicated("Rejoin")
        member = (request.host, request.incarnation)
        if request.incarnation < 1:
            raise InvalidRequestError(
                f"Rejoin of host {request.host}: incarnation {request.incarnation}; a "
                "restarted member has incarnation >= 1 (PSFLEET_RESTART_NUM), whose older "
                "processes are declared dead")
        with self._lock:
            if self._map is None or self._layout is None:
                raise RemoteError("Rejoin: this server has no replicated layout yet")
            check_member("Rejoin", *member, self.limits, len(self._map.hosts))
            self._merge(self._map.with_dead([(member[0], member[1] - 1)]))
        self._broadcast()
        with self._lock:
            return map_to_message(self._map)

    def CopyShare(self, request: msg.CopyShareRequest) -> msg.ShareMapMessage:  # noqa: N802
        """Copy share ``request.share`` (this host must be its primary) to the member
        ``(host, incarnation)`` and add it to the map; with ``move``, in place of the
        replaced member's copy, which is released (``promote``: the new copy serves the
        share). Returns the map.

        Raises:
            InvalidRequestError: the share, host or replaced host is not one of the job.
        """
        self.require_replicated("CopyShare")
        with self._lock:
            if self._map is None:
                raise RemoteError("CopyShare: this server has no replicated layout yet")
            hosts, share_num = len(self._map.hosts), self._map.share_num
        check_share("CopyShare", request.share, self.limits, share_num)
        check_member("CopyShare", request.host, request.incarnation, self.limits, hosts)
        if request.move:
            check_member("CopyShare: replaced", request.replaced_host,
                         request.replaced_incarnation, self.limits, hosts)
        move = (Move(request.share, request.host, (request.replaced_host,
                                                   request.replaced_incarnation),
                     request.promote) if request.move else None)
        self._copy_share(request.share, (request.host, request.incarnation), move)
        with self._lock:
            assert self._map is not None
            return map_to_message(self._map)

    def _copy_share(self, share: int, member: Member, move: Move | None = None) -> None:
        """The copy of ``share`` to ``member`` (module docstring, rejoin); with
        ``move``, the replaced member's copy is released once it is in.

        Raises:
            MovedError: this host is not the share's primary.
            RemoteError: a sync-mode share (rounds in flight are not in a copy), or a
                move whose replaced member no longer holds the share.
        """
        with self._order[share]:
            service = self._check_primary(share)
            if service.has_sync_rounds():
                raise RemoteError(
                    f"share {share} belongs to a sync-mode job: its copy cannot be made while "
                    "training goes on (rounds in flight are not part of a copy), so a "
                    "restarted server does not rejoin; the share keeps its other copies")
            with self._lock:
                assert self._map is not None
                if move is not None and move.replaced not in self._map.staying(share):
                    raise RemoteError(f"share {share}: the move to host {member[0]} replaces "
                                      f"host {move.replaced[0]}, which no longer holds it")
                number = self._map.next_copy(share, member)
            snapshot, index, applied = service.copy_snapshot()
            self._filling.setdefault(share, []).append(member)
        try:
            files = share_files(snapshot, index, share)
            del snapshot
            peer = self._peer(member, share)
            for part_number, (part, last) in enumerate(split_parts(files,
                                                                   self._copy_chunk_bytes)):
                peer.call("ReceiveShare", msg.ReceiveShareRequest(
                    share=share, incarnation=member[1], files=part, more=not last,
                    part=part_number, copy=number,
                    applied=[msg.PushId(client_id=c, seq=q) for c, q in applied]
                    if last else [],
                    # taken now, not with the snapshot: a barrier arrival forwarded to
                    # no copy of the share yet is in it (later ones are forwarded here)
                    coordination=service.coordination_state() if last else ""))
        except BaseException:
            with self._order[share]:
                if member in self._filling[share]:
                    self._filling[share].remove(member)
            raise
        with self._order[share]:  # no write of the share is in flight meanwhile
            if member not in self._filling[share]:  # its forwarding failed meanwhile
                raise RemoteError(f"share {share}: host {member[0]} failed while it was "
                                  "being filled")
            self._filling[share].remove(member)
            with self._lock:
                assert self._map is not None
                joined = self._map.with_joined(share, member, move is not None and move.promote,
                                               number)
                released = [move.replaced] if move is not None else joined.excess(share)
                self._merge(joined.with_released(share, released))
            self._broadcast()
        logger.warning("copied share %d (%d bytes in %d messages) to host %d incarnation %d%s",
                       share, sum(len(f.data) for f in files), part_number + 1, *member,
                       f" in place of host {move.replaced[0]}" if move is not None else "")

    def ReceiveShare(self, request: msg.ReceiveShareRequest) -> msg.Empty:  # noqa: N802
        """Take a part of the copy of ``request.share``; at the last part
        (``more`` false) load the whole copy into this restarted member, then apply the
        writes forwarded since the copy was taken, in order."""
        self.require_replicated("ReceiveShare")
        share = request.share
        with self._lock:
            if request.incarnation != self._me[1] or share not in self._pending:
                raise RemoteError(f"ReceiveShare of share {share} for incarnation "
                                  f"{request.incarnation}: this member (incarnation "
                                  f"{self._me[1]}) is not waiting for it")
            assert self._map is not None
            share_num = self._map.share_num
            if request.part == 0:  # a copy starts (afresh, after a failed one)
                self._receiving[share] = (0, [])
            expected, parts = self._receiving.get(share, (0, []))
            if request.part == expected - 1:  # a retried call: that part is already here
                return msg.Empty()
            if request.part != expected:
                raise RemoteError(f"ReceiveShare of share {share}: part {request.part} came "
                                  f"where part {expected} was due; the copy is refused")
            parts.extend(request.files)
            if request.more:
                self._receiving[share] = (expected + 1, parts)
                return msg.Empty()
            del self._receiving[share]
        tables, index, loaded = tables_from_files(join_parts(parts), share, share_num)
        # This host's own share goes into the process's own service (its /metrics and
        # psfleet status report that one); it serves once the map makes it primary.
        service = self.own if share == self._me[0] else self._copy_service()
        service.wait_budget.slots = 0
        service.adopt(tables, index, [(p.client_id, p.seq) for p in request.applied])
        service.adopt_coordination(request.coordination)
        with self._order[share]:
            queued = self._pending[share]
            for name, forwarded in queued:
                getattr(service, name)(forwarded)
            with self._lock:
                del self._pending[share]
                self._shares[share] = service
                self._copies[share] = request.copy
        logger.warning("filled share %d: %s rows/elements per table, then %d writes forwarded "
                       "meanwhile", share, loaded, len(queued))
        return msg.Empty()
