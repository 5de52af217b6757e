"""Global batch gradient aggregation (GBA) on a server: the AGGREGATE push mode.

GBA (Su et al. 2022, "GBA: A Tuning-free Approach to Switch between Synchronous and
Asynchronous Training for Recommendation Models", NeurIPS) keeps sync training's
global batch without its barrier: a server gathers gradients from whichever workers
push, and once they hold ``worker_num`` batches (the global batch of sync mode) the
table's rule applies their mean once. No worker waits for another, so a straggler
slows only its own share of the batches; its late gradients are decayed by their
staleness (GBA's token control).

Staleness here: the global batches a table applied since the pushing worker's last
dense pull from this server (the pull is the worker's token: the values it computes
on). Past ``max_staleness`` the gradient is scaled by ``max_staleness / staleness``,
the staleness-dependent rate of Zhang et al. 2016 ("Staleness-aware Async-SGD for
Distributed Deep Learning", IJCAI). A worker that never pulled dense values from this
server (a server without dense blocks) counts as not stale.

Each server gathers its own part of each table; every worker push reaches every
server (empty where it has no keys there), so the servers' global batches hold the
same batches. A push with ``batches == 0`` applies the partial global batch gathered
so far (a worker's flush: end of an epoch, a save), so no gradient is left unapplied.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from psfleet.ps.merge import merge_pushes
from psfleet.ps.types import PushMeta

__all__ = ["GlobalBatches", "SparseMean", "staleness_weight"]

#: A sparse global batch's update: (keys uint64[U], mean gradients float32[U, dim],
#: summed shows float32[U] or None, summed clicks float32[U] or None).
SparseMean = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


def staleness_weight(staleness: int, max_staleness: int) -> float:
    """The factor of a gradient ``staleness`` global batches old: 1.0 up to
    ``max_staleness`` (0: no limit), then ``max_staleness / staleness``."""
    if max_staleness <= 0 or staleness <= max_staleness:
        return 1.0
    return max_staleness / staleness


@dataclass
class _Gathering:
    """One table's global batch in the making."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    batches: int = 0
    version: int = 0  # global batches applied
    keys: list[np.ndarray] = field(default_factory=list)
    grads: list[np.ndarray] = field(default_factory=list)
    shows: list[np.ndarray | None] = field(default_factory=list)
    clicks: list[np.ndarray | None] = field(default_factory=list)
    dense: np.ndarray | None = None  # float32[n]: the summed dense gradients

    def take(self) -> tuple[int, list[np.ndarray], list[np.ndarray],
                            list[np.ndarray | None], list[np.ndarray | None],
                            np.ndarray | None]:
        taken = (self.batches, self.keys, self.grads, self.shows, self.clicks, self.dense)
        self.batches, self.keys, self.grads, self.shows, self.clicks = 0, [], [], [], []
        self.dense = None
        return taken


class GlobalBatches:
    """The AGGREGATE push mode of one server's tables. Thread safe: pushes to one table
    are gathered and applied one at a time (a global batch is applied inside its
    table's lock, so the rule sees global batches in order).

    Attributes:
        decayed: pushes whose gradient was decayed for staleness, since start.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[int, _Gathering] = {}
        self._tokens: dict[int, dict[int, int]] = {}  # worker -> table -> version seen
        self.decayed = 0

    def _table(self, table_id: int) -> _Gathering:
        with self._lock:
            return self._tables.setdefault(table_id, _Gathering())

    def note_pull(self, worker_index: int) -> None:
        """Record the values worker ``worker_index`` computes on from now (its dense
        pull): every table's global batches applied so far (GBA's token)."""
        with self._lock:
            self._tokens[worker_index] = {t: g.version for t, g in self._tables.items()}

    def partial(self) -> list[int]:
        """The tables holding a partial global batch now."""
        with self._lock:
            return [t for t, g in self._tables.items() if g.batches]

    def _weight(self, push: PushMeta, gathering: _Gathering) -> float:
        with self._lock:
            token = self._tokens.get(push.worker_index)
            if token is None:
                return 1.0
            weight = staleness_weight(gathering.version - token.get(push.table_id, 0),
                                      push.max_staleness)
            self.decayed += weight != 1.0
        return weight

    def push_sparse(self, push: PushMeta, keys: np.ndarray, grads: np.ndarray,
                    shows: np.ndarray | None, clicks: np.ndarray | None,
                    apply: Callable[[SparseMean], None]) -> None:
        """Add a push of gradients float32[N, dim] of keys uint64[N] (sums of
        ``push.batches`` batches; counts float32[N] or None) to the table's global
        batch; once it holds ``push.worker_num`` batches (or ``push.batches`` is 0:
        a flush) call ``apply`` with its mean. Blocks while another push of the
        table is applied."""
        gathering = self._table(push.table_id)
        with gathering.lock:
            if push.batches:
                weight = self._weight(push, gathering)
                gathering.keys.append(keys)
                gathering.grads.append(grads if weight == 1.0 else grads * np.float32(weight))
                gathering.shows.append(shows)
                gathering.clicks.append(clicks)
                gathering.batches += push.batches
                if gathering.batches < push.worker_num:
                    return
            if not gathering.batches:
                return
            batches, all_keys, all_grads, all_shows, all_clicks, _ = gathering.take()
            merged, summed, shows_sum, clicks_sum = merge_pushes(all_keys, all_grads,
                                                                 all_shows, all_clicks)
            apply((cast(np.ndarray, merged), summed / np.float32(batches), shows_sum, clicks_sum))
            gathering.version += 1

    def push_dense(self, push: PushMeta, grads: np.ndarray,
                   apply: Callable[[np.ndarray], None]) -> None:
        """:meth:`push_sparse` for a dense table: ``grads`` float32[n] (empty on a
        flush); ``apply`` gets the mean float32[n]."""
        gathering = self._table(push.table_id)
        with gathering.lock:
            if push.batches:
                weight = self._weight(push, gathering)
                scaled = grads if weight == 1.0 else grads * np.float32(weight)
                if gathering.dense is None:
                    gathering.dense = scaled.astype(np.float32, copy=True)
                else:  # in place: no new float32[n] per push
                    np.add(gathering.dense, scaled, out=gathering.dense)
                gathering.batches += push.batches
                if gathering.batches < push.worker_num:
                    return
            if not gathering.batches:
                return
            batches, *_, summed = gathering.take()
            apply(cast(np.ndarray, summed) / np.float32(batches))
            gathering.version += 1
