"""Which servers hold a share, and the job's replication setting.

A *share* is one server index's part of every table (docs/fault-tolerance.md). Share
``s`` of ``S`` is placed on hosts ``s, s+1, ..., s+R-1`` (mod ``S``), chained placement
as in chain replication (van Renesse and Schneider, OSDI 2004). A host is a server
index; a *member* is one process serving it, ``(host, incarnation)``, the incarnation
being its restart number (``PSFLEET_RESTART_NUM``).

:class:`ShareMap` is everything the job knows about its members, and only grows:
which incarnations of each host are dead, which members were filled with a copy of a
share while training went on (a restarted member rejoining, or a live one refilled
after a death), which of those copies were released again, and which members are
leaving (``psfleet drain``). Two maps merge by union (the highest dead incarnation per
host, the union of the other facts), so every process that has heard the same facts
routes the same way, whoever decided them. A share's holders are its live members
ordered by their host's rank in its placement (``s`` first, hosts outside the
placement last), so a member that rejoined on its own host serves its share again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from psfleet import env
from psfleet.errors import ConfigError

__all__ = ["Member", "ShareMap", "hosts_of", "check_replication",
           "refill_delay_s", "replication_from_env", "SUSPECT_RETRIES"]

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


@dataclass(frozen=True)
class ShareMap:
    """Where the shares of a job of ``host_num`` servers with ``replication`` live.

    Attributes:
        host_num: servers of the job.
        replication: hosts per share, in ``[1, host_num]``.
        dead: host -> its highest dead incarnation (every lower one is dead too).
        joined: ``(share, host, incarnation)``: a member holding a full copy of the
            share, filled from the share's primary while training went on (a restarted
            member, or a live one refilled: :meth:`refill_target`).
        released: ``(share, host, incarnation)``: a joined copy the share no longer
            needs (:meth:`excess`); it is no holder from then on.
        leaving: members being drained (``psfleet drain``): they serve until they are
            dead, but count as no copy, so their shares are refilled elsewhere first.
    """

    host_num: int
    replication: int
    dead: Mapping[int, int] = field(default_factory=dict)
    joined: frozenset[tuple[int, int, int]] = frozenset()
    released: frozenset[tuple[int, int, int]] = frozenset()
    leaving: frozenset[Member] = frozenset()

    def is_dead(self, member: Member) -> bool:
        host, incarnation = member
        return incarnation <= self.dead.get(host, -1)

    def holders(self, share: int) -> list[Member]:
        """The live members holding ``share``, primary first (empty: every copy is
        dead). Ordered by their host's rank in the share's placement, then newest
        incarnation first."""
        members = [(h, 0) for h in hosts_of(share, self.host_num, self.replication)]
        members += [(h, k) for s, h, k in self.joined if s == share]
        live = {m for m in members
                if not self.is_dead(m) and (share, *m) not in self.released}
        return sorted(live, key=lambda m: ((m[0] - share) % self.host_num, -m[1]))

    def primary(self, share: int) -> Member | None:
        """The member serving ``share`` now; None when every copy is dead."""
        holders = self.holders(share)
        return holders[0] if holders else None

    def live_hosts(self) -> list[int]:
        """The hosts whose newest member this map knows is alive, in index order."""
        return [h for h in range(self.host_num) if not self.is_dead(self.latest(h))]

    def refill_target(self, share: int) -> int | None:
        """The live host that should take a new copy of ``share``: None unless the
        share has fewer than ``replication`` holders that are not leaving, but at least
        one holder. Of the live hosts that are not leaving and hold no copy of it (nor
        one released), the one holding the fewest
        shares, then the one nearest after the share in placement order; every process
        with the same map picks the same host."""
        holders = self.holders(share)
        if not holders or len(self.staying(share)) >= self.replication:
            return None
        held = {h for h, _ in holders}
        candidates = [h for h in self.live_hosts()
                      if h not in held and self.latest(h) not in self.leaving
                      and (share, *self.latest(h)) not in self.released]
        if not candidates:
            return None
        load = {h: sum(self.latest(h) in self.holders(s) for s in range(self.host_num))
                for h in candidates}
        return min(candidates, key=lambda h: (load[h], (h - share) % self.host_num))

    def excess(self, share: int) -> list[Member]:
        """The holders of ``share`` beyond ``replication`` that are not leaving (the
        lowest ranked: copies refilled outside its placement, after its own host's
        restarted member came back)."""
        return self.staying(share)[self.replication:]

    def staying(self, share: int) -> list[Member]:
        """The holders of ``share`` that are not leaving, primary first."""
        return [m for m in self.holders(share) if m not in self.leaving]

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
        return replace(self, dead=dead)

    def with_joined(self, share: int, member: Member) -> ShareMap:
        """This map with ``member`` holding a copy of ``share``."""
        return replace(self, joined=self.joined | {(share, *member)})

    def with_released(self, share: int, members: Iterable[Member]) -> ShareMap:
        """This map with the copies of ``share`` on ``members`` released."""
        return replace(self, released=self.released | {(share, *m) for m in members})

    def with_leaving(self, member: Member) -> ShareMap:
        """This map with ``member`` being drained."""
        return replace(self, leaving=self.leaving | {member})

    def merged(self, other: ShareMap) -> ShareMap:
        """The union of what both maps know."""
        return replace(self, dead=self.with_dead(other.dead.items()).dead,
                       joined=self.joined | other.joined,
                       released=self.released | other.released,
                       leaving=self.leaving | other.leaving)

    def describe(self) -> str:
        """``dead hosts [1 (incarnations <= 0)], filled: share 1 on host 1 incarnation 1``,
        for logs."""
        dead = [f"{h} (incarnations <= {k})" for h, k in sorted(self.dead.items())]
        joined = [f"share {s} on host {h} incarnation {k}" for s, h, k in sorted(self.joined)
                  if (s, h, k) not in self.released]
        lost = self.lost()
        leaving = [f"{h} (incarnation {k})" for h, k in sorted(self.leaving)
                   if not self.is_dead((h, k))]
        return (f"dead hosts [{', '.join(dead)}]"
                + (f", leaving: {', '.join(leaving)}" if leaving else "")
                + (f", filled: {', '.join(joined)}" if joined else "")
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


def refill_delay_s(environ: Mapping[str, str] | None = None) -> int:
    """``PSFLEET_REFILL_DELAY_S``: seconds a share with a copy fewer waits for a
    restarted server before a live one takes a new copy (``psfleet.ps.replica.refill``).

    Raises:
        ConfigError: not an integer >= 0 (names the variable).
    """
    value = env.int_var(environ, "PSFLEET_REFILL_DELAY_S", 0)
    assert value is not None  # declared with a default
    return value


def replication_from_env(host_num: int, environ: Mapping[str, str] | None = None) -> int:
    """``PSFLEET_REPLICATION`` (default 1) for a job of ``host_num`` servers.

    Raises:
        ConfigError: as :func:`check_replication` (names the variable).
    """
    raw = env.read("PSFLEET_REPLICATION", environ) or "1"
    return check_replication(int(raw) if raw.isdigit() else raw, host_num,
                             "PSFLEET_REPLICATION")
