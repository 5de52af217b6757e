"""Grow: a server added to a running replicated job takes its part of the shares while
training goes on (``psfleet grow``; ``psfleet.ps.replica``).

The added server (host ``N``: the next index after the job's servers) asks a server of
the job to add it (``Join``). Its endpoint goes into the share map, which every server
learns at once and every worker at its next map change. Then the shares are evened out
by moves, one at a time (:meth:`~psfleet.replication.ShareMap.rebalance_move`, a
function of the map alone, so every server agrees without a message): the host holding
the fewest shares takes one from the host holding the most, through the copy of rejoin
(``CopyShare``: a snapshot under the share's order lock, later writes forwarded), in
place of the giver's copy, which is released once the new copy is in. The new copy
serves the share (it is *promoted*) when the giver served it and the taker serves
fewer than its part. With ``S`` shares (``PSFLEET_SHARES``), ``R`` copies and ``H``
servers, each server ends holding about ``S * R / H`` copies and serving about
``S / H`` shares, so shares must outnumber the servers for an added one to serve
any: a job that may grow starts with more shares than servers. A sync-mode job is not
grown (rounds in flight are not part of a copy).
"""

from __future__ import annotations

import logging

from psfleet.errors import FatalError, InvalidRequestError, MovedError, RemoteError, RpcError
from psfleet.ps.replica.drain import Draining
from psfleet.ps.replica.wire import map_to_message
from psfleet.ps.request_checks import check_endpoint, check_member
from psfleet.rpc import messages as msg

__all__ = ["Growing"]

logger = logging.getLogger(__name__)


class Growing(Draining):
    """The growth of a job at one server (module docstring): as the added server
    (:meth:`join`), as the server adding it (``Join``) and as a host taking shares in
    moves. The arguments are :class:`~psfleet.ps.replica.members.ShareMembers`'."""

    def join(self, endpoint: str) -> None:
        """Have this added server (its layout's index past the job's servers) added to
        the job at ``endpoint``; the moves that bring it shares follow. Blocks until
        it is in the map.

        Raises:
            FatalError: no server of the job answered, or one refused (a sync-mode
                job, another server added with this index; names the reason).
        """
        assert self._layout is not None and self._layout.added
        request = msg.JoinRequest(host=self._me[0], endpoint=endpoint,
                                  incarnation=self._me[1])
        for judge in range(len(self._layout.endpoints)):
            try:
                reply = self._peer(judge, None).call("Join", request)
            except (RpcError, MovedError):  # down, or not serving yet: the next
                continue
            except RemoteError as exc:
                raise FatalError(f"server {self._me[0]} cannot join the job: {exc}") from None
            with self._lock:
                self._merge_message(reply)
            logger.warning("joined the job as host %d at %s; shares come to it by moves",
                           self._me[0], endpoint)
            return
        raise FatalError(f"server {self._me[0]} cannot join the job: no server of "
                         f"{list(self._layout.endpoints)} answered (the job ended, or the "
                         "list is not the job's)")

    def Join(self, request: msg.JoinRequest) -> msg.ShareMapMessage:  # noqa: N802
        """Add the server ``request.host`` at ``request.endpoint`` to the job and tell
        every live host. Returns the map.

        Raises:
            InvalidRequestError: a sync-mode job, or ``request.host`` is not the next
                index after the job's hosts (nor an added host coming back).
            RemoteError: this server has no replicated layout yet.
        """
        self.require_replicated("Join")
        check_endpoint("Join", request.endpoint, self.limits)
        check_member("Join", request.host, request.incarnation, self.limits)
        with self._lock:
            share_map = self._map
            if share_map is None:
                raise RemoteError("Join: this server has no replicated layout yet (no "
                                  "worker connected); add the server once training started")
            known = {h: e for h, _, e in share_map.added}
        if self.own.has_sync_rounds():
            raise InvalidRequestError(
                "Join: this is a sync-mode job: its shares cannot be copied while training "
                "goes on (rounds in flight are not part of a copy), so no server can be added")
        host = request.host
        if host != len(share_map.hosts) and known.get(host) != request.endpoint:
            raise InvalidRequestError(
                f"Join: server {host} at {request.endpoint} cannot be added: the next server "
                f"of this job is {len(share_map.hosts)} (it has {len(share_map.hosts)})")
        with self._lock:
            assert self._map is not None
            grown = self._map.with_added(host, request.endpoint, request.incarnation)
            if request.incarnation > 0:
                grown = grown.with_dead([(host, request.incarnation - 1)])
            self._merge(grown)
        self._broadcast()
        logger.warning("server %d at %s joined the job", host, request.endpoint)
        with self._lock:
            assert self._map is not None
            return map_to_message(self._map)

    def _rebalance(self) -> bool:
        """Take every share the map's moves give this server, one after the other.
        False when one failed for a passing reason (to be tried again)."""
        while True:
            with self._lock:
                assert self._map is not None
                move = self._map.rebalance_move()
                if move is None or move.host != self._me[0] or move.share in self._pending:
                    return True
                primary = self._map.primary(move.share)
                if primary is None:
                    return True
                self._pending[move.share] = []
            if self.own.has_sync_rounds():
                with self._lock:
                    self._pending.pop(move.share, None)
                return True
            logger.warning("share %d moves to this server (host %d) from host %d%s",
                           move.share, self._me[0], move.replaced[0],
                           ", which served it" if move.promote else "")
            try:
                reply = self._peer(primary, None).call("CopyShare", msg.CopyShareRequest(
                    share=move.share, host=self._me[0], incarnation=self._me[1], move=True,
                    replaced_host=move.replaced[0], replaced_incarnation=move.replaced[1],
                    promote=move.promote))
            except (RpcError, MovedError, RemoteError) as exc:  # the map changed meanwhile
                logger.warning("move of share %d failed (%s); trying again", move.share, exc)
                return False
            finally:
                with self._lock:
                    if move.share not in self._shares:
                        self._pending.pop(move.share, None)
            with self._lock:
                self._merge_message(reply)
