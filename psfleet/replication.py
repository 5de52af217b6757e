"""Which hosts hold a share, and the job's replication setting.

Share ``s`` of ``S`` lives on hosts ``s, s+1, ..., s+R-1`` (mod ``S``); the first of
them not declared dead is its primary, the other live ones its backups (chained
placement, as in chain replication: van Renesse and Schneider, OSDI 2004). The map is
a pure function of the dead set, and that set only grows, so every worker and server
that knows the same dead hosts routes the same way without a map version to agree on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from psfleet import env
from psfleet.errors import ConfigError

__all__ = ["hosts_of", "lost_shares", "replication_from_env"]


def hosts_of(share: int, host_num: int, replication: int, dead: Iterable[int] = ()) -> list[int]:
    """The live hosts holding ``share``, primary first (empty: every copy is dead).

    Args:
        share: the share (server index), in ``[0, host_num)``.
        host_num: servers of the job.
        replication: hosts per share, in ``[1, host_num]``.
        dead: hosts declared dead.
    """
    gone = set(dead)
    return [h for h in ((share + i) % host_num for i in range(replication)) if h not in gone]


def lost_shares(host_num: int, replication: int, dead: Iterable[int]) -> list[int]:
    """The shares every copy of which is on a dead host (their rows are gone)."""
    gone = set(dead)
    return [s for s in range(host_num) if not hosts_of(s, host_num, replication, gone)]


def replication_from_env(host_num: int, environ: Mapping[str, str] | None = None) -> int:
    """``PSFLEET_REPLICATION`` (default 1) for a job of ``host_num`` servers.

    Raises:
        ConfigError: not an integer, < 1, or more than the servers (names the variable
            and the server count).
    """
    raw = env.read("PSFLEET_REPLICATION", environ) or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"PSFLEET_REPLICATION: {raw!r} is not an integer >= 1 (hosts per "
                          "share; 2 keeps every share on two servers)")
    replication = int(raw)
    if host_num and replication > host_num:
        raise ConfigError(f"PSFLEET_REPLICATION={replication}: more copies than the job's "
                          f"{host_num} server(s); use at most {host_num} or add servers")
    return replication
