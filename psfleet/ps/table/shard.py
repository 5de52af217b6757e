"""One internal shard of a sparse table: a lock, a hash index and row arrays.

Rows live in one float32 matrix ``data`` [capacity, dim + state_width] (values, then
rule state). A table with a lifecycle (``AccessorConfig.active``) keeps, beside it and
indexed by the same row numbers, the arrays it needs, each allocated only when used
(the key of each row is the hash index's ``row_keys``: eviction, shrink and saves pick
rows, then read their keys there):

- ``stats`` float32[capacity, 4]: show, click, unseen_days, delta_score (the CTR
  accessor; ``psfleet.ps.table.accessor``);
- ``last_access`` int64[capacity]: the table clock of the row's last pull or push
  (LRU eviction);
- ``saved`` bool[capacity] (``ctr`` tables): the row's key is in the base/delta chain
  (written by the last base save or a delta since, or loaded from a save). Removing
  such a row (shrink, eviction) appends its key to the shard's tombstones
  (``psfleet.ps.persist_delta``), so their number never exceeds the rows saved.

They are parallel arrays rather than extra columns of ``data`` so that a pull or push
of the table without a lifecycle moves exactly the bytes it did before, and a shrink
or eviction scans a few contiguous arrays instead of every row's full width.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from psfleet.ps.table.hash_index import HashIndex, row_capacity
from psfleet.ps.types import RESERVED_KEY

__all__ = ["Shard", "STAT_COLUMNS", "SHOW", "CLICK", "UNSEEN_DAYS", "DELTA_SCORE"]

#: Columns of ``Shard.stats``.
STAT_COLUMNS = ("show", "click", "unseen_days", "delta_score")
SHOW, CLICK, UNSEEN_DAYS, DELTA_SCORE = range(4)


class Shard:
    """One lock, one hash index, the row arrays. Callers hold ``lock``.

    Args:
        width: floats per row of ``data`` (dim + state_width).
        stats, last_access: allocate those arrays (see the module docstring);
            ``stats`` also allocates ``saved`` and the tombstones.
        cap: most rows this shard may hold (None: no cap).
        pending_slots: slots of the admission's pending table (0: none).
        pending_scores: the pending table keeps a float32 score per slot
            (show_click_score admission) besides the int64 count.
        number: the shard's index in its table (its rows' key range on the disk tier).
    """

    def __init__(self, width: int, *, stats: bool = False,
                 last_access: bool = False, cap: int | None = None,
                 pending_slots: int = 0, pending_scores: bool = False,
                 number: int = 0) -> None:
        self.number = number
        # A context manager as threading.Lock (the native backend's is a native mutex).
        self.lock: AbstractContextManager[Any] = threading.Lock()
        self.index = HashIndex(max_rows=cap)
        self.data = np.zeros((0, width), dtype=np.float32)
        self.stats = np.zeros((0, 4), dtype=np.float32) if stats else None
        self.last_access = np.zeros(0, dtype=np.int64) if last_access else None
        self.cap = cap
        # LifecycleCounts: admitted, rejected, evicted, deleted, spilled, promoted
        self.counts = [0, 0, 0, 0, 0, 0]
        # The count filter's pending ids (psfleet.ps.table.admission), fixed size.
        self.pending_keys = np.full(pending_slots, RESERVED_KEY, dtype=np.uint64)
        self.pending_counts = np.zeros(pending_slots, dtype=np.int64)
        self.pending_scores = np.zeros(pending_slots if pending_scores else 0, np.float32)
        self.saved = np.zeros(0, dtype=bool) if stats else None
        # Keys removed since the last base/delta save while in the chain: the first
        # ``tomb_count`` entries of a buffer grown by doubling (uint64).
        self.tombs = np.zeros(0, dtype=np.uint64)
        self.tomb_count = 0

    @property
    def memory_bytes(self) -> int:
        """Bytes of the row arrays' rows handed out (``index.row_limit`` of them; the
        zero-filled capacity past them is address space the OS commits only when a
        row is written), the pending table and the hash index."""
        arrays = [a for a in (self.data, self.stats, self.last_access, self.saved)
                  if a is not None]
        row_bytes = sum(a.itemsize * int(np.prod(a.shape[1:])) for a in arrays)
        return int(self.index.row_limit * row_bytes + self.pending_keys.nbytes
                   + self.pending_counts.nbytes + self.pending_scores.nbytes
                   + self.tombs.nbytes + self.index.memory_bytes)

    def reserve(self, rows: int) -> None:
        """Grow the row arrays to at least ``rows`` rows (``hash_index.row_capacity``:
        a capped shard to its cap at once, so its peak memory stays the cap's). The arrays
        are zero-filled (``np.zeros``: pages the OS commits on first write), so
        untouched capacity costs no resident memory."""
        if rows <= self.data.shape[0]:
            return
        capacity = row_capacity(self.data.shape[0], rows, self.cap)
        used = self.index.row_limit
        try:
            grown = np.zeros((capacity, self.data.shape[1]), dtype=np.float32)
            extra: dict[str, np.ndarray] = {}
            if self.stats is not None:
                extra["stats"] = np.zeros((capacity, 4), dtype=np.float32)
            if self.last_access is not None:
                extra["last_access"] = np.zeros(capacity, dtype=np.int64)
            if self.saved is not None:
                extra["saved"] = np.zeros(capacity, dtype=bool)
        except MemoryError:
            if self.cap is None:
                raise
            raise MemoryError(f"a shard's cap of {self.cap:,} rows (max_rows / the table's "
                              "shards) did not fit in this server's address space; lower "
                              "max_rows to what its memory holds") from None
        grown[:used] = self.data[:used]
        for name, array in extra.items():  # everything allocated before anything changes
            array[:used] = getattr(self, name)[:used]
        self.data = grown
        for name, array in extra.items():
            setattr(self, name, array)

    @property
    def row_keys(self) -> np.ndarray:
        """uint64[>= row_limit]: the key of each row below ``index.row_limit``,
        RESERVED_KEY for a free one (the hash index's array; do not write it)."""
        return self.index.row_keys

    def live_rows(self) -> np.ndarray:
        """int64[n]: the rows in use, ascending."""
        return self.index.live_rows()

    def free_rows(self, rows: np.ndarray) -> None:
        """Remove the keys of ``rows`` (int64[n], distinct, in use) from the shard; the
        keys of rows marked ``saved`` become tombstones."""
        if self.saved is not None:
            self.add_tombstones(self.row_keys[rows[self.saved[rows]]])
            self.saved[rows] = False
        self.index.remove_rows(rows)

    def mark_saved(self, live: np.ndarray, chosen: np.ndarray, base: bool) -> None:
        """A base or delta save's bookkeeping (caller holds the lock; a shard with
        statistics): ``chosen`` (int64[C], the rows the save writes, among ``live``
        int64[L]) join the base/delta chain with delta_score 0; a ``base`` save first
        takes every live row out of the chain and zeroes its delta_score."""
        assert self.stats is not None and self.saved is not None  # a ctr table's shard
        if base:
            self.stats[live, DELTA_SCORE] = 0
            self.saved[live] = False
        else:
            self.stats[chosen, DELTA_SCORE] = 0
        self.saved[chosen] = True

    def add_tombstones(self, keys: np.ndarray) -> None:
        """Append ``keys`` (uint64[n]) to the tombstones (the buffer doubles when full)."""
        end = self.tomb_count + keys.size
        if end > self.tombs.size:
            grown = np.zeros(max(end, 2 * self.tombs.size, 256), dtype=np.uint64)
            grown[: self.tomb_count] = self.tombs[: self.tomb_count]
            self.tombs = grown
        self.tombs[self.tomb_count:end] = keys
        self.tomb_count = end

    def take_tombstones(self, clear: bool) -> np.ndarray:
        """uint64[t]: the distinct tombstones, ascending; emptied when ``clear``."""
        out = np.unique(self.tombs[: self.tomb_count])
        if clear:
            self.tombs = np.zeros(0, dtype=np.uint64)
            self.tomb_count = 0
        return out
