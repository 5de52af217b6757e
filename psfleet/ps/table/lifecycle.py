"""A sparse table's row lifecycle: admission, the row cap and eviction, shrink, aging.

Used by ``SparseTable`` when its ``AccessorConfig.active`` (otherwise the table takes
its plain path and none of this runs). Every function works on one shard whose lock
the caller holds, vectorised over the request's keys.

Inserting ``M`` new keys into a shard holding ``L`` rows with cap ``C``:

1. admission (``psfleet.ps.table.admission``) keeps ``A <= M`` of them (ascending key);
2. if ``L + A > C``: rows of this request's keys already in the shard are protected
   (never evicted by the request that uses them); if even evicting every other row
   leaves no room, the largest admitted keys beyond the room are rejected; then
   ``min(evictable, L + A - C + floor(C * evict_batch_fraction))`` rows are evicted
   by the policy (``psfleet.ps.table.eviction``);
3. the admitted keys get rows (initializer values, fresh rule state, zero statistics).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from psfleet.errors import InvalidRequestError
from psfleet.ps.table.accessor import CtrAccessor
from psfleet.ps.table.admission import admit, shard_pending_slots
from psfleet.ps.table.disk_tier import DiskTier
from psfleet.ps.table.eviction import select_victims
from psfleet.ps.table.shard import UNSEEN_DAYS, Shard
from psfleet.ps.types import AccessorConfig

__all__ = ["LifecycleCounts", "Lifecycle", "shard_caps"]


@dataclass(frozen=True)
class LifecycleCounts:
    """Rows a table's lifecycle moved since it was created (one server).

    Attributes:
        admitted: new keys given a row.
        rejected: sightings of new keys not given a row (admission or a full shard).
        evicted: rows removed to stay under ``max_rows``.
        deleted: rows removed by ``shrink``.
        spilled: rows moved from memory to the disk tier (``memory_rows``).
        promoted: rows moved from the disk tier back to memory.
    """

    admitted: int = 0
    rejected: int = 0
    evicted: int = 0
    deleted: int = 0
    spilled: int = 0
    promoted: int = 0


def shard_caps(max_rows: int | None, num_shards: int) -> list[int | None]:
    """Cap of each shard: ``max_rows // num_shards``, one more for the first
    ``max_rows % num_shards`` shards (so they sum to ``max_rows``)."""
    if max_rows is None:
        return [None] * num_shards
    base, extra = divmod(max_rows, num_shards)
    return [base + (1 if i < extra else 0) for i in range(num_shards)]


class Lifecycle:
    """The lifecycle rules of one table and its counters.

    Args:
        config: the table's accessor config (active).
        num_shards: the table's internal shards.
        disk: the table's disk tier (``config.tiered``): a full shard spills rows
            there instead of dropping them.
        memory_rows: with ``disk``, the rows per server kept in memory.
    """

    def __init__(self, config: AccessorConfig, num_shards: int,
                 disk: DiskTier | None = None, memory_rows: int | None = None) -> None:
        self.config = config
        self.accessor = CtrAccessor(config) if config.name == "ctr" else None
        self.disk = disk
        capped = config.max_rows is not None or disk is not None
        self.lru = capped and config.eviction == "lru"
        self.caps = shard_caps(config.max_rows if disk is None else memory_rows, num_shards)
        self.pending_slots = shard_pending_slots(config, num_shards)
        self._clock = itertools.count(1)

    def make_shard(self, width: int, index: int, shard_type: type[Shard] = Shard) -> Shard:
        """Shard ``index`` of the table with the arrays this lifecycle needs
        (``shard_type``: the backend's shard class)."""
        return shard_type(width, stats=self.accessor is not None,
                     last_access=self.lru, cap=self.caps[index],
                     pending_slots=self.pending_slots,
                     pending_scores=self.config.admission == "show_click_score",
                     number=index)

    def tick(self) -> int:
        """The table clock for one pull or push (thread safe: itertools.count)."""
        return next(self._clock)

    @staticmethod
    def counts(shards: list[Shard]) -> LifecycleCounts:
        """The counters summed over ``shards`` (each shard's under its lock)."""
        total = [0] * len(LifecycleCounts.__dataclass_fields__)
        for shard in shards:
            with shard.lock:
                total = [a + b for a, b in zip(total, shard.counts, strict=True)]
        return LifecycleCounts(*total)

    def touch(self, shard: Shard, rows: np.ndarray, clock: int) -> None:
        """Stamp ``rows`` (int64[n], in use) as used at ``clock`` (LRU)."""
        if shard.last_access is not None:
            shard.last_access[rows] = clock

    def admit_new(self, shard: Shard, keys: np.ndarray, hashes: np.ndarray,
                  protected: np.ndarray, use_admission: bool = True,
                  scores: np.ndarray | None = None) -> np.ndarray:
        """Decide and make room for new keys; evicts as needed.

        Args:
            shard: the shard (lock held).
            keys (uint64[M]): distinct keys without a row, ascending.
            hashes (uint64[M]): mix64(keys).
            protected (int64[P]): rows of this request (not evicted).
            use_admission: False for a load (restored rows skip admission, not the cap).
            scores (float32[M]): each key's pushed show/click score (show_click_score
                admission); None: not a push.

        Returns:
            bool[M]: the keys to insert (room for them has been made).
        """
        ok = admit(self.config, shard, keys, hashes, scores) if use_admission else \
            np.ones(keys.size, dtype=bool)
        self.make_room(shard, ok, protected)
        shard.counts[0] += int(ok.sum())
        shard.counts[1] += int(ok.size - ok.sum())
        return ok

    def make_room(self, shard: Shard, ok: np.ndarray, protected: np.ndarray) -> None:
        """Evict (or with a disk tier, spill) rows of a capped shard so that the keys
        marked in ``ok`` (bool[M], changed in place) fit; with no room even after
        evicting every row but ``protected`` (int64[P]), the last marked keys are
        unmarked (a table with a disk tier raises instead: see below).

        Raises:
            InvalidRequestError: with a disk tier, one request has more keys in the
                shard than its memory rows hold (names the numbers and the setting).
        """
        cap = shard.cap
        if cap is None:
            return
        new = int(ok.sum())
        live = len(shard.index)
        over = live + new - cap
        if over <= 0:
            return
        evictable = live - np.unique(protected).size
        if over > evictable:  # no room even after evicting all the others
            if self.disk is not None:  # the rows exist: they must be in memory to serve
                needed = new + live - evictable
                raise InvalidRequestError(
                    f"one request has {needed:,} keys in a table shard holding {cap:,} "
                    "rows in memory; raise accessor.memory_rows (or memory_budget_bytes) "
                    f"to at least {needed * len(self.caps):,} rows per server, or send "
                    "smaller batches")
            admitted = np.flatnonzero(ok)
            ok[admitted[new - (over - evictable):]] = False
            over = evictable
        slack = int(cap * self.config.evict_batch_fraction)
        self._evict(shard, protected, min(evictable, over + slack))

    def _evict(self, shard: Shard, protected: np.ndarray, n: int) -> None:
        if n <= 0:
            return
        mask = shard.index.live_mask()
        mask[protected] = False
        candidates = np.flatnonzero(mask)
        if self.config.eviction == "lru":
            assert shard.last_access is not None
            priority = shard.last_access[candidates]
        else:
            assert self.accessor is not None and shard.stats is not None
            priority = self.accessor.row_score(shard.stats[candidates])
        victims = select_victims(priority, candidates, shard.row_keys, n)
        if self.disk is None:
            shard.free_rows(victims)
            shard.counts[2] += int(victims.size)
            return
        saved = shard.saved[victims] if shard.saved is not None else \
            np.zeros(victims.size, dtype=bool)
        self.disk.spill(shard.number, shard.row_keys[victims], shard.data[victims],
                        None if shard.stats is None else shard.stats[victims], saved)
        if shard.saved is not None:
            shard.saved[victims] = False  # still in the chain, on disk: no tombstone
        shard.free_rows(victims)
        shard.counts[4] += int(victims.size)

    def init_rows(self, shard: Shard, rows: np.ndarray, clock: int) -> None:
        """Lifecycle arrays of new ``rows`` (int64[M])."""
        if shard.stats is not None:
            shard.stats[rows] = 0
        if shard.saved is not None:
            shard.saved[rows] = False
        self.touch(shard, rows, clock)

    def push_stats(self, shard: Shard, rows: np.ndarray, shows: np.ndarray | None,
                   clicks: np.ndarray | None) -> None:
        """Add a push's counts (float32[n] each, None: zeros) to ``rows`` (distinct)."""
        if self.accessor is None or shard.stats is None:
            return
        zeros = np.zeros(rows.size, dtype=np.float32)
        block = shard.stats[rows]
        self.accessor.update(block, zeros if shows is None else shows,
                             zeros if clicks is None else clicks)
        shard.stats[rows] = block

    def shrink(self, shard: Shard) -> int:
        """Decay and delete (``CtrAccessor.decay_and_select``); rows deleted."""
        if self.accessor is None or shard.stats is None:
            return 0
        live = shard.live_rows()
        block = shard.stats[live]
        doomed = live[self.accessor.decay_and_select(block)]
        shard.stats[live] = block
        shard.free_rows(doomed)
        shard.counts[3] += int(doomed.size)
        return int(doomed.size)

    def shrink_spilled(self, shard: Shard, disk: DiskTier) -> int:
        """:meth:`shrink` of the shard's rows on the disk tier (one scan and rewrite of
        them); rows deleted."""
        if self.accessor is None:
            return 0
        spilled = disk.scan(shard.number)
        if not spilled.keys.size:
            return 0
        assert spilled.stats is not None
        doomed = self.accessor.decay_and_select(spilled.stats)
        kept = ~doomed
        disk.discard(shard.number, spilled.keys)
        disk.spill(shard.number, spilled.keys[kept], spilled.data[kept],
                   spilled.stats[kept], spilled.saved[kept])
        shard.add_tombstones(spilled.keys[doomed & spilled.saved])
        shard.counts[3] += int(doomed.sum())
        return int(doomed.sum())

    def age(self, shard: Shard) -> None:
        """unseen_days += 1 for every row of ``shard``."""
        if shard.stats is not None:
            shard.stats[: shard.index.row_limit, UNSEEN_DAYS] += 1
