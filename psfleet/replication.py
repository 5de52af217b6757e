"""Which servers hold a share, and the job's replication setting.

A *share* is one server index's part of every table (docs/fault-tolerance.md). Share
``s`` of ``S`` is placed on hosts ``s, s+1, ..., s+R-1`` (mod ``S``), chained placement
as in chain replication (van Renesse and Schneider, OSDI 2004). A host is a server
index; a *member* is one process serving it, ``(host, incarnation)``, the incarnation
being its restart number (``PSFLEET_RESTART_NUM``).

:class:`ShareMap` is everything the job knows about its members, and only grows:
which incarnations of each host are dead, and which restarted members were filled with
a copy of a share (rejoined). Two maps merge by union (the highest dead incarnation
per host, the union of the joins), so every process that has heard the same facts
routes the same way, whoever decided them. A share's holders are its live members
ordered by their host's rank in its placement (``s`` first), so a member that
rejoined on its own host serves its share again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from psfleet import env
from psfleet.errors import ConfigError

__all__ = ["Member", "ShareMap", "hosts_of", "lost_shares", "check_replication",
           "replication_from_env", "SUSPECT_RETRIES"]

#: One process serving a host: (host index, incarnation).
Member = tuple[int, int]

#: In a replicated job, retries of a call that cannot reach its server before the
#: server is reported (backoff 0.2 s then 0.4 s); a reported server that answers its
#: health check is called again, up to ``PSFLEET_RPC_MAX_RETRIES`` times.
SUSPECT_RETRIES = 2


def hosts_of(share: int, host_num: int, replication: int) -> list[int]:
    """The hosts ``share`` is placed on, primary first: ``share, share+1, ...`` (mod
    ``host_num``), ``replication`` of them."""
    return [(share + i) % host_num for i in range(replication)]


def lost_shares(host_num: int, replication: int, down: Iterable[int]) -> list[int]:
    """The shares every host of which has no process up (``down``): a launcher's view,
    which knows processes, not which copies a restarted server was filled with."""
    gone = set(down)
    return [s for s in range(host_num) if set(hosts_of(s, host_num, replication)) <= gone]


@dataclass(frozen=True)
class ShareMap:
    """Where the shares of a job of ``host_num`` servers with ``replication`` live.

    Attributes:
        host_num: servers of the job.
        replication: hosts per share, in ``[1, host_num]``.
        dead: host -> its highest dead incarnation (every lower one is dead too).
        joined: ``(share, host, incarnation)``: a restarted member holding a full copy
            of the share (filled from the share's primary while training went on).
    """

    host_num: int
    replication: int
    dead: Mapping[int, int] = field(default_factory=dict)
    joined: frozenset[tuple[int, int, int]] = frozenset()

    def is_dead(self, member: Member) -> bool:
        host, incarnation = member
        return incarnation <= self.dead.get(host, -1)

    def holders(self, share: int) -> list[Member]:
        """The live members holding ``share``, primary first (empty: every copy is
        dead). Ordered by their host's rank in the share's placement, then newest
        incarnation first."""
        members = [(h, 0) for h in hosts_of(share, self.host_num, self.replication)]
        members += [(h, k) for s, h, k in self.joined if s == share]
        live = {m for m in members if not self.is_dead(m)}
        return sorted(live, key=lambda m: ((m[0] - share) % self.host_num, -m[1]))

    def primary(self, share: int) -> Member | None:
        """The member serving ``share`` now; None when every copy is dead."""
        holders = self.holders(share)
        return holders[0] if holders else None

    def lost(self) -> list[int]:
        """The shares every copy of which is dead (their rows are gone)."""
        return [s for s in range(self.host_num) if not self.holders(s)]

    def latest(self, host: int) -> Member:
        """The newest member of ``host`` this map knows (dead or alive)."""
        incarnations = [k for _, h, k in self.joined if h == host]
        return host, max([0, *incarnations])

    def with_dead(self, members: Iterable[Member]) -> ShareMap:
        """This map with ``members`` (and every older incarnation of their hosts) dead."""
        dead = dict(self.dead)
        for host, incarnation in members:
            dead[host] = max(dead.get(host, -1), incarnation)
        return ShareMap(self.host_num, self.replication, dead, self.joined)

    def with_joined(self, share: int, member: Member) -> ShareMap:
        """This map with ``member`` holding a copy of ``share``."""
        return ShareMap(self.host_num, self.replication, self.dead,
                        self.joined | {(share, *member)})

    def merged(self, other: ShareMap) -> ShareMap:
        """The union of what both maps know."""
        dead = self.with_dead(other.dead.items()).dead
        return ShareMap(self.host_num, self.replication, dead, self.joined | other.joined)

    def describe(self) -> str:
        """``dead hosts [1 (incarnations <= 0)], rejoined: share 1 on host 1 incarnation 1``,
        for logs."""
        dead = [f"{h} (incarnations <= {k})" for h, k in sorted(self.dead.items())]
        joined = [f"share {s} on host {h} incarnation {k}" for s, h, k in sorted(self.joined)]
        lost = self.lost()
        return (f"dead hosts [{', '.join(dead)}]"
                + (f", rejoined: {', '.join(joined)}" if joined else "")
                + (f"; shares {lost} have no copy left" if lost else ""))


def check_replication(value: object, host_num: int, name: str) -> int:
    """``value`` as a replication for a job of ``host_num`` servers (0: not known yet).

    Raises:
        ConfigError: not an integer >= 1, or more copies than servers (names ``name``,
            e.g. ``--replication``, and the server count).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: {value!r} is not an integer >= 1 (servers holding each "
                          "share; 2 keeps every share on two servers)")
    if host_num and value > host_num:
        raise ConfigError(f"{name}: {value} copies of each share need at least {value} "
                          f"servers; the job has {host_num}. Use at most {host_num}, or add "
                          "servers")
    return value


def replication_from_env(host_num: int, environ: Mapping[str, str] | None = None) -> int:
    """``PSFLEET_REPLICATION`` (default 1) for a job of ``host_num`` servers.

    Raises:
        ConfigError: as :func:`check_replication` (names the variable).
    """
    raw = env.read("PSFLEET_REPLICATION", environ) or "1"
    return check_replication(int(raw) if raw.isdigit() else raw, host_num,
                             "PSFLEET_REPLICATION")
