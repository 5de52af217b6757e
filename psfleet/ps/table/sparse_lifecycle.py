"""A sparse table's lifecycle operations and the moves between its memory and disk
tiers: the part of :class:`~psfleet.ps.table.sparse_table.SparseTable` that exists only for
tables with an active ``AccessorConfig`` (``psfleet.ps.table.lifecycle``) or a disk tier
(``psfleet.ps.table.disk_tier``). Without one, every method here is a no-op or returns what
an empty lifecycle would, and pull and push never reach it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from psfleet.errors import RemoteError
from psfleet.ps.merge import distinct_summed
from psfleet.ps.table.disk_tier import DiskRows, DiskTier
from psfleet.ps.table.lifecycle import Lifecycle, LifecycleCounts
from psfleet.ps.table.rules import Rule
from psfleet.ps.table.shard import STAT_COLUMNS, Shard
from psfleet.ps.types import SparseTableConfig

__all__ = ["LifecycleOps"]


class LifecycleOps:
    """Mixed into ``SparseTable``: statistics, shrink, aging, tier moves. Thread safe
    (each shard under its lock)."""

    config: SparseTableConfig
    dim: int
    rule: Rule
    _label: str
    _shards: list[Shard]
    _life: Lifecycle | None
    _disk: DiskTier | None

    if TYPE_CHECKING:  # SparseTable's own
        def _split(self, keys: np.ndarray) -> list[tuple[Shard, np.ndarray, np.ndarray]]: ...
        def _counts(self, keys: np.ndarray, shows: np.ndarray | None,
                    clicks: np.ndarray | None, what: str) -> np.ndarray: ...
        def _initial(self, keys: np.ndarray) -> np.ndarray: ...

    @property
    def disk_rows(self) -> int:
        """Rows on the disk tier (0 without one)."""
        return 0 if self._disk is None else len(self._disk)

    @property
    def disk_bytes(self) -> int:
        """Bytes of the disk tier's files (0 without one)."""
        return 0 if self._disk is None else self._disk.disk_bytes

    def close(self) -> None:
        """Release the disk tier (its folder is deleted); the table is unusable after."""
        if self._disk is not None:
            self._disk.close()

    def _absent(self, shard: Shard, keys: np.ndarray, create: bool,
                width: int | None = None) -> np.ndarray:
        """float32[N, width]: the first ``width`` floats (None: ``dim``, the values;
        more: and the rule state) of the rows of ``keys`` that have none in memory:
        their rows on the disk tier (when not ``create``: creating promoted them
        already), else their initial rows."""
        width = self.dim if width is None else width
        out = self._initial(keys)
        if width > self.dim:
            out = np.hstack([out, self.rule.init_state(keys.size, self.dim)])
        if self._disk is not None and not create:
            uniq, inverse = np.unique(keys, return_inverse=True)
            found, rows = self._disk.read(shard.number, uniq, take=False)
            hit = found[inverse]
            out[hit] = rows.data[np.cumsum(found)[inverse[hit]] - 1, :width]
        return out

    def _promote(self, shard: Shard, keys: np.ndarray, hashes: np.ndarray,
                 protected: np.ndarray, clock: int) -> np.ndarray:
        """Move the rows of ``keys`` (uint64[N], no row in memory, possibly repeated)
        that are on the disk tier into memory (caller holds the shard's lock);
        returns each key's row, -1 for keys not on disk. ``protected`` (int64[P]): the
        request's rows already in memory (never spilled to make room).

        Raises:
            InvalidRequestError: the request's keys do not fit in the shard's memory
                rows (``Lifecycle.make_room``).
        """
        assert self._disk is not None and self._life is not None
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        found, disk = self._disk.read(shard.number, uniq, take=False)
        out = np.full(uniq.size, -1, dtype=np.int64)
        if not disk.keys.size:
            return out[inverse]
        self._life.make_room(shard, np.ones(disk.keys.size, dtype=bool), protected)
        shard.reserve(shard.index.row_limit_after(disk.keys.size))
        rows = shard.index.insert_new(disk.keys, hashes[first][found])
        shard.data[rows] = disk.data
        self._life.init_rows(shard, rows, clock)
        if shard.stats is not None and disk.stats is not None:
            shard.stats[rows] = disk.stats
        if shard.saved is not None:
            shard.saved[rows] = disk.saved
        self._disk.discard(shard.number, disk.keys)  # in memory now: off the disk
        shard.counts[5] += int(disk.keys.size)
        out[found] = rows
        return out[inverse]

    @property
    def shards(self) -> list[Shard]:
        """The internal shards (for ``psfleet.ps.persist_delta``; hold each one's lock)."""
        return self._shards

    @property
    def disk(self) -> DiskTier | None:
        """The disk tier (for ``psfleet.ps.persist_delta``; hold the shard's lock for
        calls naming it); None: every row is in memory."""
        return self._disk

    @property
    def lifecycle(self) -> Lifecycle | None:
        """The row lifecycle (None: the table has none)."""
        return self._life

    def shrink(self) -> int:
        """Decay every row's show and click, then delete the rows whose score is below
        ``delete_threshold`` or whose unseen_days exceed ``delete_after_unseen_days``
        (Paddle's CtrCommonAccessor::Shrink). Returns the rows deleted; 0 without the
        ``ctr`` accessor. Blocks each shard in turn."""
        if self._life is None:
            return 0
        deleted = 0
        for shard in self._shards:
            with shard.lock:
                deleted += self._life.shrink(shard)
                if self._disk is not None:
                    deleted += self._life.shrink_spilled(shard, self._disk)
        return deleted

    def update_stats(self, keys: np.ndarray, shows: np.ndarray, clicks: np.ndarray) -> None:
        """Add show and click counts to the existing rows of ``keys`` without a
        gradient (GEO mode pushes parameter deltas through :meth:`add`, its counts
        here): as :meth:`push` does to the statistics; missing keys are ignored (no
        row is created). No-op without the ``ctr`` accessor.

        Args:
            keys (uint64[N]): keys; repeated keys' counts are summed.
            shows, clicks (float32[N]): counts.

        Raises:
            InvalidRequestError: a shape mismatch or the reserved key.
        """
        counts = self._counts(keys, shows, clicks, "update_stats")
        life = self._life
        if life is None or life.accessor is None:
            return
        keys, counts = distinct_summed(keys, counts)
        clock = life.tick()
        for shard, pos, hashes in self._split(keys):
            with shard.lock:
                rows = shard.index.lookup(keys[pos], hashes)
                if self._disk is not None and (rows < 0).any():  # spilled rows come back
                    missing = rows < 0
                    rows[missing] = self._promote(shard, keys[pos][missing],
                                                  hashes[missing], rows[~missing], clock)
                kept = rows >= 0
                pos, rows = pos[kept], rows[kept]
                life.push_stats(shard, rows, counts[pos, 0], counts[pos, 1])
                life.touch(shard, rows, clock)

    def age_one_day(self) -> None:
        """unseen_days += 1 for every row (a pass or day boundary); no-op without the
        ``ctr`` accessor."""
        if self._life is None:
            return
        if self._disk is None:
            for shard in self._shards:
                with shard.lock:
                    self._life.age(shard)
            return
        # With a disk tier every shard is held at once: a row spilling between its
        # shard's aging and the tier's day count would be aged twice (or not at all).
        with contextlib.ExitStack() as held:
            for shard in self._shards:
                held.enter_context(shard.lock)
            for shard in self._shards:
                self._life.age(shard)
            self._disk.age_one_day()

    def lifecycle_counts(self) -> LifecycleCounts:
        """Rows admitted, rejected, evicted, deleted, spilled and promoted on this
        server so far."""
        if self._life is None:
            return LifecycleCounts()
        return Lifecycle.counts(self._shards)

    def stats_items(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (keys uint64[n], stats float32[n, 4]) sorted by key; the columns are
        ``STAT_COLUMNS`` (show, click, unseen_days, delta_score). Empty without the
        ``ctr`` accessor."""
        if self._life is None or self._life.accessor is None:
            return np.zeros(0, dtype=np.uint64), np.zeros((0, 4), dtype=np.float32)
        return self._gather(_memory_stats, _disk_stats)

    def _gather(self, memory: Callable[[Shard, np.ndarray], np.ndarray],
                disk: Callable[[DiskRows], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(keys uint64[n], values[n, ...]) of every row of both tiers, sorted by key:
        ``memory(shard, rows)`` of each shard's rows in memory, ``disk(rows)`` of its
        rows on disk, each shard under its lock (so no row is missed or seen twice as
        it moves between the tiers)."""
        keys, values = [], []
        for shard in self._shards:
            with shard.lock:
                k, rows = shard.index.items()
                keys.append(k)
                values.append(memory(shard, rows))
                if self._disk is not None:
                    spilled = self._disk.scan(shard.number)
                    keys.append(spilled.keys)
                    values.append(disk(spilled))
        all_keys = np.concatenate(keys)
        order = np.argsort(all_keys)
        return all_keys[order], np.concatenate(values)[order]

    def load_stats(self, keys: np.ndarray, stats: np.ndarray) -> None:
        """Set the statistics (float32[N, 4], as :meth:`stats_items`) of the rows of
        distinct ``keys`` (uint64[N]) that exist (after :meth:`load`); others ignored.

        Raises:
            RemoteError: ``stats`` is not [N, 4], or the table has no ``ctr`` accessor.
        """
        if stats.shape != (keys.size, len(STAT_COLUMNS)) or self._life is None \
                or self._life.accessor is None:
            raise RemoteError(
                f"table {self._label}: statistics of shape {tuple(stats.shape)} for "
                f"{keys.size} keys; need ({keys.size}, 4) and accessor 'ctr' (this "
                f"table: {self.config.accessor.name!r})")
        for shard, pos, hashes in self._split(keys):
            with shard.lock:
                rows = shard.index.lookup(keys[pos], hashes)
                kept = rows >= 0
                assert shard.stats is not None
                shard.stats[rows[kept]] = stats[pos[kept]]
                if self._disk is not None and not kept.all():  # rows the load spilled
                    self._disk.rewrite_stats(shard.number, keys[pos[~kept]],
                                             stats[pos[~kept]])


def _memory_stats(shard: Shard, rows: np.ndarray) -> np.ndarray:
    assert shard.stats is not None  # a ctr table's shards keep them
    return shard.stats[rows]


def _disk_stats(spilled: DiskRows) -> np.ndarray:
    assert spilled.stats is not None  # a ctr table's disk tier keeps them
    return spilled.stats
