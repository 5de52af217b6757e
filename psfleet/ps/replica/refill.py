"""Refill: a share left with fewer than R copies by a dead server gets a new copy on a
live server, so the job is back to R copies without a restart (``psfleet.ps.replica``).

When the share map changes, every server waits ``PSFLEET_REFILL_DELAY_S`` (a restarted
server rejoins meanwhile, which brings its shares back by itself), then looks at every
share that has fewer than R holders but at least one. The live server that should take
a new copy is a function of the map alone (:meth:`~psfleet.replication.ShareMap.
refill_target`: the fewest shares, then placement order), so every server agrees
without a message; the chosen one asks the share's primary to copy the share to it
(``CopyShare``, the mechanism of rejoin, ``psfleet.ps.replica.rejoin``): a snapshot
under the share's order lock, every later write forwarded, the member added to the map.

So with R = 2 and three servers, the job survives a second dead server once the first
one's shares are refilled (seconds per share at a million rows). A copy that is no
longer needed, because the share's own host came back (rejoin), is released by the
primary (``ShareMap.excess``) and its memory freed. A sync-mode share is not copied
(rounds in flight are not part of a copy): it stays with its remaining copies.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from psfleet.errors import MovedError, RemoteError, RpcError
from psfleet.ps.replica.rejoin import Rejoining
from psfleet.replication import refill_delay_s
from psfleet.rpc import messages as msg

__all__ = ["Refilling"]

logger = logging.getLogger(__name__)

#: How long a refill that failed for a passing reason (the primary died meanwhile)
#: waits before the next try, seconds (a map change wakes it sooner).
_RETRY_S = 1.0


class Refilling(Rejoining):
    """The refill of one server (module docstring): a thread, started at the first
    change of the map, that takes a new copy of each share the map says this server
    should take. The arguments are :class:`~psfleet.ps.replica.members.ShareMembers`'.

    Raises:
        ConfigError: ``PSFLEET_REFILL_DELAY_S`` is malformed (at construction).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._refill_delay_s = refill_delay_s()
        self._refill_wake = threading.Event()
        self._refill_stop = threading.Event()
        self._refill_thread: threading.Thread | None = None
        self._refused: set[int] = set()  # shares whose primary refused a copy (sync mode)
        super().__init__(*args, **kwargs)

    def _map_changed(self) -> None:
        if self._refill_thread is None:
            self._refill_thread = threading.Thread(target=self._refill_loop,
                                                   name="share-refill", daemon=True)
            self._refill_thread.start()
        self._refill_wake.set()

    def stop_refill(self) -> None:
        """End the refill thread (a copy in flight ends with the server)."""
        self._refill_stop.set()
        self._refill_wake.set()

    def _refill_loop(self) -> None:
        while not self._refill_stop.is_set():
            self._refill_wake.wait()
            self._refill_wake.clear()
            if self._refill_stop.is_set():
                return
            # nobody to wait for: a leaving server's shares, and moves to an added one
            drained = self._refill_round(draining_only=True) and self._rebalance()
            if self._refill_stop.wait(self._refill_delay_s):
                return
            if not (self._refill_round() and drained) and \
                    not self._refill_stop.wait(_RETRY_S):
                self._refill_wake.set()

    def _rebalance(self) -> bool:
        """Take the shares moves give this server (``psfleet.ps.replica.grow``). False
        when one failed for a passing reason."""
        return True

    def _refill_round(self, draining_only: bool = False) -> bool:
        """Take a copy of every share the map says this server should take
        (``draining_only``: of the shares a leaving server holds,
        ``psfleet.ps.replica.drain``). False when one failed for a passing reason (to be
        tried again)."""
        with self._lock:
            share_map = self._map
            assert share_map is not None
            wanted = [s for s in share_map.shares
                      if share_map.refill_target(s) == self._me[0] and s not in self._shares
                      and s not in self._pending and s not in self._refused
                      and (not draining_only
                           or len(share_map.staying(s)) < len(share_map.holders(s)))]
        if wanted and self.own.has_sync_rounds():
            logger.warning("shares %s have a copy fewer, but this is a sync-mode job: rounds "
                           "in flight are not part of a copy, so they are not refilled", wanted)
            self._refused.update(wanted)
            return True
        return all([self._refill(share) for share in wanted])

    def _refill(self, share: int) -> bool:
        """Have the primary of ``share`` copy it to this member. False when the copy
        failed for a passing reason."""
        with self._lock:
            assert self._map is not None
            primary = self._map.primary(share)
            if primary is None:  # lost meanwhile
                return True
            self._pending[share] = []
            left, replication = len(self._map.staying(share)), self._map.replication
        logger.warning("share %d has %d of its %d copies left; this server (host %d) takes "
                       "a new one from host %d", share, left, replication, self._me[0],
                       primary[0])
        try:
            reply = self._peer(primary, None).call("CopyShare", msg.CopyShareRequest(
                share=share, host=self._me[0], incarnation=self._me[1]))
        except (RpcError, MovedError) as exc:  # the primary died or changed meanwhile
            logger.warning("refill of share %d from host %d failed (%s); trying again",
                           share, primary[0], exc)
            return False
        except RemoteError as exc:  # refused for good (a sync-mode share)
            logger.warning("refill of share %d refused: %s", share, exc)
            self._refused.add(share)
            return True
        finally:
            with self._lock:
                if share not in self._shares:
                    self._pending.pop(share, None)
        with self._lock:
            self._merge_message(reply)
        return True
