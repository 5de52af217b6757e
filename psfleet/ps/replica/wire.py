"""A :class:`~psfleet.replication.ShareMap` as a ``ShareMapMessage`` and back."""

from __future__ import annotations

from collections.abc import Iterable

from psfleet.replication import Copy, ShareMap
from psfleet.rpc import messages as msg

__all__ = ["map_to_message", "map_from_message"]


def _copies(copies: Iterable[Copy]) -> list[msg.ShareCopy]:
    return [msg.ShareCopy(share=s, host=h, incarnation=k, copy=n) for s, h, k, n in sorted(copies)]


def _facts(copies: Iterable[msg.ShareCopy]) -> frozenset[Copy]:
    return frozenset((c.share, c.host, c.incarnation, c.copy) for c in copies)


def map_to_message(share_map: ShareMap) -> msg.ShareMapMessage:
    """What ``share_map`` knows, for the wire."""
    dead, added = sorted(share_map.dead.items()), sorted(share_map.added)
    return msg.ShareMapMessage(
        dead_hosts=[h for h, _ in dead], dead_incarnations=[k for _, k in dead],
        joined=_copies(share_map.joined), released=_copies(share_map.released),
        promoted=_copies(share_map.promoted),
        leaving_hosts=[h for h, _ in sorted(share_map.leaving)],
        leaving_incarnations=[k for _, k in sorted(share_map.leaving)],
        added_hosts=[h for h, _, _ in added], added_incarnations=[k for _, k, _ in added],
        added_endpoints=[e for _, _, e in added])


def map_from_message(message: msg.ShareMapMessage, host_num: int, replication: int,
                     share_num: int) -> ShareMap:
    """The map a message describes, for a job that started with ``host_num`` hosts and
    has ``share_num`` shares."""
    return ShareMap(host_num, replication,
                    dict(zip(message.dead_hosts, message.dead_incarnations, strict=True)),
                    _facts(message.joined), _facts(message.released),
                    frozenset(zip(message.leaving_hosts, message.leaving_incarnations,
                                  strict=True)),
                    share_num,
                    frozenset(zip(message.added_hosts, message.added_incarnations,
                                  message.added_endpoints, strict=True)),
                    _facts(message.promoted))
