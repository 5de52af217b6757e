"""A :class:`~psfleet.replication.ShareMap` as a ``ShareMapMessage`` and back."""

from __future__ import annotations

from psfleet.replication import ShareMap
from psfleet.rpc import messages as msg

__all__ = ["map_to_message", "map_from_message"]


def map_to_message(share_map: ShareMap) -> msg.ShareMapMessage:
    """What ``share_map`` knows, for the wire."""
    dead = sorted(share_map.dead.items())
    joined, released = sorted(share_map.joined), sorted(share_map.released)
    return msg.ShareMapMessage(
        dead_hosts=[h for h, _ in dead], dead_incarnations=[k for _, k in dead],
        joined_shares=[s for s, _, _ in joined], joined_hosts=[h for _, h, _ in joined],
        joined_incarnations=[k for _, _, k in joined],
        released_shares=[s for s, _, _ in released],
        released_hosts=[h for _, h, _ in released],
        released_incarnations=[k for _, _, k in released],
        leaving_hosts=[h for h, _ in sorted(share_map.leaving)],
        leaving_incarnations=[k for _, k in sorted(share_map.leaving)])


def map_from_message(message: msg.ShareMapMessage, host_num: int,
                     replication: int) -> ShareMap:
    """The map a message describes, for a job of ``host_num`` hosts."""
    return ShareMap(host_num, replication,
                    dict(zip(message.dead_hosts, message.dead_incarnations, strict=True)),
                    frozenset(zip(message.joined_shares, message.joined_hosts,
                                  message.joined_incarnations, strict=True)),
                    frozenset(zip(message.released_shares, message.released_hosts,
                                  message.released_incarnations, strict=True)),
                    frozenset(zip(message.leaving_hosts, message.leaving_incarnations,
                                  strict=True)))
