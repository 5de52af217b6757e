"""Which servers hold a share, and the job's replication setting.

A *share* is one part of every table (docs/fault-tolerance.md): the keys of its virtual
buckets and its dense blocks. A job has ``S`` shares (``PSFLEET_SHARES``, by default
one per server) on its ``N`` first servers; share ``s`` is placed on hosts ``s, s+1,
..., s+R-1`` (mod ``N``), chained placement as in chain replication (van Renesse and
Schneider, OSDI 2004). A host is a server index; a *member* is one process serving it,
``(host, incarnation)``, the incarnation being its restart number
(``PSFLEET_RESTART_NUM``).

:class:`ShareMap` is everything the job knows about its members, and only grows:
which incarnations of each host are dead, which members were filled with a copy of a
share while training went on (a restarted member rejoining, a live one refilled after
a death, a host taking a share in a move), which of those copies were released again,
which members are leaving (``psfleet drain``), and which servers were added to the
running job. Two maps merge by union (the highest dead incarnation per host, the union
of the other facts), so every process that has heard the same facts routes the same
way, whoever decided them. A share's holders are its live members ordered by their
host's rank in its placement (``s`` first, hosts outside the placement last, a copy
promoted by a move before all), so a member that rejoined on its own host serves its
share again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from psfleet import env
from psfleet.errors import ConfigError

__all__ = ["Member", "Copy", "Move", "ShareMap", "hosts_of", "check_replication",
           "check_shares", "shares_from_env", "refill_delay_s", "replication_from_env",
           "SUSPECT_RETRIES", "MAX_SHARES"]

#: One process serving a host: (host index, incarnation).
Member = tuple[int, int]

#: In a replicated job, retries of a call that cannot reach its server before the
#: server is reported (backoff 0.2 s then 0.4 s); a reported server that answers its
#: health check is called again, up to ``PSFLEET_RPC_MAX_RETRIES`` times.
SUSPECT_RETRIES = 2

#: The most shares a job may have (``fleetrun --shares``, ``PSFLEET_SHARES``,
#: ``cluster.shares``, and what a server accepts in ``SetReplicas``:
#: ``ServerLimits.max_shares``). A server builds a service per share it holds, under
#: its lock (about 0.7 ms each here); each share is also one more call per step.
MAX_SHARES = 1024


def hosts_of(share: int, host_num: int, replication: int) -> list[int]:
    """The hosts ``share`` is placed on, primary first: ``share, share+1, ...`` (mod
    ``host_num``, the hosts the job started with), ``replication`` of them."""
    return [(share + i) % host_num for i in range(replication)]


#: A copy of a share on a member: (share, host, incarnation, copy number). The
#: placement's copies are number 0 (incarnation 0 on a placed host); each copy a member
#: takes later (rejoin, refill, a move) is numbered one more than its last of that share,
#: so a member can hold a share again after its copy was released.
Copy = tuple[int, int, int, int]


@dataclass(frozen=True)
class Move:
    """One step of :meth:`ShareMap.rebalance_move`: ``host`` takes a copy of ``share``
    in place of ``replaced``'s (released once the copy is in), and serves the share
    when ``promote`` (``replaced`` served it)."""

    share: int
    host: int
    replaced: Member
    promote: bool


@dataclass(frozen=True)
class ShareMap:
    """Where the shares of a job with ``replication`` copies of each share live.

    Attributes:
        host_num: servers the job started with (the placement's hosts).
        replication: hosts per share, in ``[1, host_num]``.
        dead: host -> its highest dead incarnation (every lower one is dead too).
        joined: copies filled from the share's primary while training went on (a
            restarted member, a live one refilled, :meth:`refill_target`, or a host
            taking a share in a move, :meth:`rebalance_move`).
        released: copies the share no longer needs (:meth:`excess`, or the replaced
            copy of a move); their member holds the share no more.
        leaving: members being drained (``psfleet drain``): they serve until they are
            dead, but count as no copy, so their shares are refilled elsewhere first.
        share_num: shares of the tables (``PSFLEET_SHARES``; 0: ``host_num``), fixed
            for the job; more shares than servers let a server added later take some.
        added: ``(host, incarnation, endpoint)`` of each process of a server added to
            the running job (hosts ``host_num, host_num+1, ...``;
            ``psfleet.ps.replica.grow``).
        promoted: copies that rank first among their share's holders (a move's copy
            that took over serving the share).
    """

    host_num: int
    replication: int
    dead: Mapping[int, int] = field(default_factory=dict)
    joined: frozenset[Copy] = frozenset()
    released: frozenset[Copy] = frozenset()
    leaving: frozenset[Member] = frozenset()
    share_num: int = 0
    added: frozenset[tuple[int, int, str]] = frozenset()
    promoted: frozenset[Copy] = frozenset()

    def __post_init__(self) -> None:
        if not self.share_num:
            object.__setattr__(self, "share_num", self.host_num)

    @property
    def shares(self) -> range:
        """Every share index."""
        return range(self.share_num)

    @property
    def hosts(self) -> range:
        """Every host index: the job's first servers, then the ones added."""
        return range(self.host_num + len({h for h, _, _ in self.added}))

    def endpoints(self, first: Iterable[str]) -> list[str]:
        """Every host's endpoint: ``first`` (the job's first servers'), then the added
        (each its newest process's)."""
        newest = {h: e for h, _, e in sorted(self.added)}
        return [*first, *(newest[h] for h in sorted(newest))]

    def is_dead(self, member: Member) -> bool:
        host, incarnation = member
        return incarnation <= self.dead.get(host, -1)

    def copy_of(self, share: int, member: Member) -> int | None:
        """The number of ``member``'s newest copy of ``share`` (0: its placement copy);
        None: it never had one. Released or not."""
        numbers = [n for s, h, k, n in self.joined if (s, h, k) == (share, *member)]
        if member[1] == 0 and member[0] in hosts_of(share, self.host_num, self.replication):
            numbers.append(0)
        return max(numbers) if numbers else None

    def holds(self, member: Member, share: int) -> bool:
        """Whether ``member`` (alive) holds a copy of ``share`` not released."""
        number = self.copy_of(share, member)
        return (number is not None and not self.is_dead(member)
                and (share, *member, number) not in self.released)

    def holders(self, share: int) -> list[Member]:
        """The live members holding ``share``, primary first (empty: every copy is
        dead). A promoted copy first, then by their host's rank in the share's
        placement (hosts outside it after, nearest first), newest incarnation first.
        Computed once per map (every call of a worker asks for its share's primary)."""
        return list(self._holders[share])

    @cached_property
    def _holders(self) -> list[list[Member]]:
        """:meth:`holders` of every share (the map never changes: a new map is made)."""
        return [self._rank_holders(s) for s in self.shares]

    def _rank_holders(self, share: int) -> list[Member]:
        placed = hosts_of(share, self.host_num, self.replication)
        members = {(h, 0) for h in placed} | {(h, k) for s, h, k, _ in self.joined
                                              if s == share}
        count = len(self.hosts)

        def rank(member: Member) -> tuple[int, int, int]:
            host = member[0]
            first = (share, *member, self.copy_of(share, member)) in self.promoted
            where = (placed.index(host) if host in placed
                     else len(placed) + (host - share) % count)
            return (0 if first else 1, where, -member[1])

        return sorted((m for m in members if self.holds(m, share)), key=rank)

    def primary(self, share: int) -> Member | None:
        """The member serving ``share`` now; None when every copy is dead."""
        holders = self._holders[share]
        return holders[0] if holders else None

    def live_hosts(self) -> list[int]:
        """The hosts whose newest member this map knows is alive, in index order."""
        return [h for h in self.hosts if not self.is_dead(self.latest(h))]

    def held_by(self, member: Member) -> list[int]:
        """The shares ``member`` holds, in index order."""
        return [s for s in self.shares if self.holds(member, s)]

    def held_when_dead(self, host: int) -> list[int]:
        """The shares the newest dead process of ``host`` that held any held when it
        died, in index order: what the host's next process takes back when it rejoins
        (its placement's shares unless moves or refills changed them; empty: none of
        its processes held any)."""
        for incarnation in range(self.dead.get(host, -1), -1, -1):
            member = (host, incarnation)
            held = [s for s in self.shares if (n := self.copy_of(s, member)) is not None
                    and (s, *member, n) not in self.released]
            if held:
                return held
        return []

    def served_by(self, member: Member) -> list[int]:
        """The shares ``member`` serves (is primary of), in index order."""
        return [s for s in self.shares if self.primary(s) == member]

    def _staying_hosts(self) -> list[int]:
        return [h for h in self.live_hosts() if self.latest(h) not in self.leaving]

    def refill_target(self, share: int) -> int | None:
        """The live host that should take a new copy of ``share``: None unless the
        share has fewer than ``replication`` holders that are not leaving, but at least
        one holder. Of the live hosts that are not leaving and hold no copy of it, the
        one holding the fewest shares, then the one nearest after the share in
        placement order; every process with the same map picks the same host."""
        holders = self.holders(share)
        if not holders or len(self.staying(share)) >= self.replication:
            return None
        held = {h for h, _ in holders}
        candidates = [h for h in self._staying_hosts() if h not in held]
        if not candidates:
            return None
        count = len(self.hosts)
        return min(candidates, key=lambda h: (len(self.held_by(self.latest(h))),
                                              (h - share) % count))

    def rebalance_move(self) -> Move | None:
        """The next move that evens out the shares held per host (after a server was
        added), or None: none while a share has fewer than ``replication`` copies not
        leaving (the refill comes first), or while the hosts that are not leaving
        hold shares within one of each other.

        The host holding the fewest takes a share from the one holding the most (ties:
        the lower index), in place of its copy: one it serves while the taker serves
        fewer than ``share_num // hosts``, else one it does not serve (the share's
        lowest index). Every process with the same map computes the same move.
        """
        hosts = self._staying_hosts()
        if len(hosts) < 2 or any(len(self.staying(s)) < self.replication for s in self.shares):
            return None
        held = {h: self.held_by(self.latest(h)) for h in hosts}
        low = min(hosts, key=lambda h: (len(held[h]), h))
        high = max(hosts, key=lambda h: (len(held[h]), -h))
        if len(held[high]) - len(held[low]) < 2:
            return None
        taker, giver = self.latest(low), self.latest(high)
        serve = len(self.served_by(taker)) < self.share_num // len(hosts)
        options = [s for s in held[high] if s not in held[low]]
        preferred = [s for s in options if (self.primary(s) == giver) == serve]
        share = (preferred or options)[0]
        return Move(share, low, giver, self.primary(share) == giver)

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
        return [s for s in self.shares if not self.holders(s)]

    def latest(self, host: int) -> Member:
        """The newest member of ``host`` this map knows (dead or alive)."""
        incarnations = [k for _, h, k, _ in self.joined if h == host]
        incarnations += [k for h, k, _ in self.added if h == host]
        return host, max([0, *incarnations])

    def with_dead(self, members: Iterable[Member]) -> ShareMap:
        """This map with ``members`` (and every older incarnation of their hosts) dead."""
        dead = dict(self.dead)
        for host, incarnation in members:
            dead[host] = max(dead.get(host, -1), incarnation)
        return replace(self, dead=dead)

    def next_copy(self, share: int, member: Member) -> int:
        """The number the next copy of ``share`` on ``member`` gets."""
        last = self.copy_of(share, member)
        return 0 if last is None else last + 1

    def with_joined(self, share: int, member: Member, promote: bool = False,
                    number: int | None = None) -> ShareMap:
        """This map with ``member`` holding copy ``number`` of ``share`` (None:
        :meth:`next_copy`; ``promote``: the copy ranks first, it serves the share)."""
        copy = (share, *member, self.next_copy(share, member) if number is None else number)
        return replace(self, joined=self.joined | {copy},
                       promoted=self.promoted | ({copy} if promote else set()))

    def with_released(self, share: int, members: Iterable[Member]) -> ShareMap:
        """This map with the copies of ``share`` on ``members`` released."""
        copies = {(share, *m, self.copy_of(share, m)) for m in members
                  if self.copy_of(share, m) is not None}
        return replace(self, released=self.released | copies)  # type: ignore[operator]

    def with_leaving(self, member: Member) -> ShareMap:
        """This map with ``member`` being drained."""
        return replace(self, leaving=self.leaving | {member})

    def with_added(self, host: int, endpoint: str, incarnation: int = 0) -> ShareMap:
        """This map with process ``incarnation`` of server ``host``, at ``endpoint``,
        added to the job."""
        return replace(self, added=self.added | {(host, incarnation, endpoint)})

    def merged(self, other: ShareMap) -> ShareMap:
        """The union of what both maps know."""
        return replace(self, dead=self.with_dead(other.dead.items()).dead,
                       joined=self.joined | other.joined,
                       released=self.released | other.released,
                       leaving=self.leaving | other.leaving,
                       added=self.added | other.added,
                       promoted=self.promoted | other.promoted)

    def describe(self) -> str:
        """``dead hosts [1 (incarnations <= 0)], filled: share 1 on host 1 incarnation 1``,
        for logs."""
        dead = [f"{h} (incarnations <= {k})" for h, k in sorted(self.dead.items())]
        joined = [f"share {s} on host {h} incarnation {k}"
                  + (" (serving)" if (s, h, k, n) in self.promoted else "")
                  for s, h, k, n in sorted(self.joined)
                  if (s, h, k, n) not in self.released and self.copy_of(s, (h, k)) == n]
        lost = self.lost()
        leaving = [f"{h} (incarnation {k})" for h, k in sorted(self.leaving)
                   if not self.is_dead((h, k))]
        added = [f"{h} ({e})" for h, e in enumerate(self.endpoints([]), self.host_num)]
        return (f"dead hosts [{', '.join(dead)}]"
                + (f", added: {', '.join(added)}" if added else "")
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


def check_shares(value: object, host_num: int, replication: int, name: str) -> int:
    """``value`` as the share count of a job of ``host_num`` servers with
    ``replication`` copies (0 or None: one share per server).

    Raises:
        ConfigError: not an integer, above :data:`MAX_SHARES`, fewer shares than
            servers, or more shares than servers without replication (names ``name``,
            e.g. ``--shares``, and what to do).
    """
    if value is None or value == 0:
        return host_num
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: {value!r} is not an integer >= 1 (shares the tables are "
                          "cut into; unset: one per server)")
    if value > MAX_SHARES:
        raise ConfigError(f"{name}: {value} shares is above {MAX_SHARES}, the most a server "
                          "accepts (each share is one more call per step and table); use "
                          "a few per server")
    if host_num and value < host_num:
        raise ConfigError(f"{name}: {value} shares for {host_num} servers; every server "
                          f"serves at least one share, so use at least {host_num} (or unset "
                          "it: one per server)")
    if host_num and value != host_num and replication < 2:
        raise ConfigError(f"{name}: {value} shares for {host_num} servers needs replication "
                          ">= 2 (shares move between servers as copies); set "
                          "cluster.replication: 2 (fleetrun --replication 2), or unset it")
    return value


def shares_from_env(host_num: int, replication: int,
                    environ: Mapping[str, str] | None = None) -> int:
    """``PSFLEET_SHARES`` (default: one per server) for a job of ``host_num`` servers.

    Raises:
        ConfigError: as :func:`check_shares` (names the variable).
    """
    raw = (env.read("PSFLEET_SHARES", environ) or "").strip()
    return check_shares(int(raw) if raw.isdigit() else (raw or None), host_num, replication,
                        "PSFLEET_SHARES")


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
