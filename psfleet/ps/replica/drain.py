"""Drain: a server leaves a running replicated job without a share ever having fewer
than R copies (``psfleet drain``; ``psfleet.ps.replica``).

The server to remove is sent ``Drain``. It marks itself *leaving* in the share map and
sends the map to every live server; a leaving member still serves (it stays primary of
its shares meanwhile) but counts as no copy, so each share it holds gets a new copy on
another server at once, through the refill (``psfleet.ps.replica.refill``: the same
choice of server, the same ``CopyShare``; no ``PSFLEET_REFILL_DELAY_S`` wait, nobody
is coming back). When every share it holds has R copies without it, it takes the order
lock of each of those shares (no write of them is half forwarded), marks itself dead,
sends the map to every live server, and stops: workers calling it learn the new map
(``MovedError``) and call the shares' new primaries; its process exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import time

from psfleet.errors import InvalidRequestError, RemoteError
from psfleet.ps.replica.refill import Refilling
from psfleet.ps.replica.wire import map_to_message
from psfleet.rpc import messages as msg

__all__ = ["Draining"]

logger = logging.getLogger(__name__)

#: How often a draining server looks whether its shares have their copies, seconds.
_POLL_S = 0.1
_MAX_TIMEOUT_S = 86_400.0  # a day: the copies of a big share, with room to spare


class Draining(Refilling):
    """The drain of one server (module docstring): ``Drain``. The arguments are
    :class:`~psfleet.ps.replica.members.ShareMembers`'."""

    def Drain(self, request: msg.DrainRequest) -> msg.ShareMapMessage:  # noqa: N802
        """Copy every share this server holds to the other servers, then leave the job
        and stop. Blocks until it left. Returns the map it left.

        Raises:
            InvalidRequestError: the job is not replicated, too few servers would stay
                for its replication, or it is a sync-mode job (names why and what to
                do); nothing changed then.
            RemoteError: the copies did not complete within ``request.timeout_s``
                seconds (the server stays, leaving: a second ``Drain`` waits again).
        """
        if not 0 < request.timeout_s <= _MAX_TIMEOUT_S:  # NaN too
            raise InvalidRequestError(
                f"Drain: timeout_s {request.timeout_s!r} is not a number of seconds in "
                f"(0, {_MAX_TIMEOUT_S:g}]")
        with self._lock:
            share_map = self._map
            if share_map is None:
                raise InvalidRequestError(
                    "Drain: this server is not part of a replicated job (cluster.replication "
                    "1, or no worker connected yet): its share has no other copy to move "
                    "to. Stop the job instead, or run it with cluster.replication 2")
            staying = [h for h in share_map.live_hosts() if h != self._me[0]]
        if len(staying) < share_map.replication:
            raise InvalidRequestError(
                f"Drain: server {self._me[0]} cannot leave: {len(staying)} server(s) would "
                f"stay for {share_map.replication} copies of each share "
                f"(cluster.replication); the job needs at least {share_map.replication}")
        if self.own.has_sync_rounds():
            raise InvalidRequestError(
                "Drain: this is a sync-mode job: its shares cannot be copied while training "
                "goes on (rounds in flight are not part of a copy), so no server can leave it")
        with self._lock:
            self._merge(share_map.with_leaving(self._me))
        self._broadcast()
        logger.warning("draining: this server (host %d) leaves the job once its shares have "
                       "%d copies on the other servers", self._me[0], share_map.replication)
        deadline = time.monotonic() + request.timeout_s
        while True:
            with self._lock:
                assert self._map is not None
                held = self._map.held_by(self._me)
                waiting = [s for s in held
                           if len(self._map.staying(s)) < self._map.replication]
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise RemoteError(
                    f"Drain: shares {waiting} were not copied to other servers within "
                    f"{request.timeout_s:g} s; this server keeps serving them (still leaving). "
                    "See the servers' logs (refill), and drain again with a longer timeout")
            time.sleep(_POLL_S)
        with contextlib.ExitStack() as locks:
            for share in held:
                locks.enter_context(self._order[share])
            with self._lock:
                self._merge(self._map.with_dead([self._me]))
            self._broadcast()
        logger.warning("drained: shares %s are served by the other servers; this server "
                       "stops", held)
        self.stop_requested.set()
        with self._lock:
            return map_to_message(self._map)
