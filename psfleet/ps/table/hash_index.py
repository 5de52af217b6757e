"""A vectorised open-addressing hash index: uint64 key -> row number.

Two arrays: ``row_keys`` (uint64, one entry per row: the key the row holds, or
RESERVED_KEY for a row freed by :meth:`HashIndex.remove`) and a power-of-two slot
array of int32 row numbers (-1: empty), probed linearly from a key's home slot and
kept at most a quarter full. A slot is 4 bytes, so the low load costs 16-32 bytes a
row, less than 12-byte (key, row) slots at the usual load of a half (24-48 bytes), and
most lookups end at the home slot: a probe reads the slot's row, then that row's key.
The sparse table's lifecycle (eviction, shrink, delta saves) reads ``row_keys`` too.

Lookups and inserts process a whole batch of keys per numpy operation: each round
examines a window of 8 slots of every still-pending key and resolves hits and empties
in it, so the number of Python-level rounds is the longest probe sequence / 8, not
the number of keys.

Removal (:meth:`HashIndex.remove`) leaves no tombstones: it empties the removed
keys' slots, then takes the rows of the rest of each affected cluster (the occupied
slots after a removed one, up to the next empty slot) out and places them again,
which restores the invariant lookups rely on (no key sits after an empty slot of its
probe sequence); a tail key already in its home slot stays, since it cannot move
closer. This is the batch form of Knuth's deletion for linear probing (TAOCP 6.4,
Algorithm R). Tombstones would make a removal one store, but every tombstone
lengthens probes until a rebuild re-places all live keys. Removed rows go on a free
list that the next inserts take first, so the caller's row matrix never needs more
rows than the most keys ever held at once.

Not thread safe: the sparse table holds a lock per shard around it.
"""

from __future__ import annotations

import numpy as np

from psfleet.ps.hashing import mix64
from psfleet.ps.types import RESERVED_KEY

__all__ = ["HashIndex", "row_capacity"]

_EMPTY = -1  # a slot holding no row
_MAX_LOAD = 0.25
_GROWTH = 1.5
_WINDOW = 8  # slots examined per key per round
_WINDOW_OFFSETS = np.arange(_WINDOW, dtype=np.int64)[None, :]
_GROW_CHUNK = 1 << 15  # rows re-placed per step of a rehash
#: Row numbers are int32 in the slots: a shard holds fewer rows than this.
_MAX_ROWS = np.iinfo(np.int32).max


def row_capacity(current: int, needed: int, cap: int | None) -> int:
    """Rows a per-row array grows to when it must hold ``needed`` (> ``current``):
    1.5x (at least 1,024), or with a row ``cap`` the cap at once, so that a capped
    shard never holds an old and a new copy of its rows together."""
    if cap is not None:
        return max(needed, cap)
    return max(needed, int(current * _GROWTH), 1024)


class HashIndex:
    """Maps uint64 keys to row numbers: 0..len-1 in order of insertion until a
    :meth:`remove`, after which inserts reuse the freed rows first.

    Args:
        capacity: initial number of slots (rounded up to a power of two, >= 16).
        max_rows: the most rows the caller will hold (a capped shard): ``row_keys``
            is allocated for them at the first insert instead of growing by copies.
    """

    def __init__(self, capacity: int = 1024, max_rows: int | None = None) -> None:
        bits = max(4, int(np.ceil(np.log2(max(capacity, 16)))))
        self._alloc(bits)
        self._max_rows = max_rows
        self.row_keys = np.zeros(0, dtype=np.uint64)
        self._size = 0
        self._row_limit = 0  # rows 0.._row_limit-1 have been handed out
        self._free = np.zeros(0, dtype=np.int64)  # removed rows, reused last-in first

    def _alloc(self, bits: int) -> None:
        self._bits = bits
        self._shift = np.uint64(64 - bits)
        self._mask = np.int64((1 << bits) - 1)
        self._slots = np.full(1 << bits, _EMPTY, dtype=np.int32)

    def __len__(self) -> int:
        return self._size

    @property
    def memory_bytes(self) -> int:
        """Bytes of the slots, the keys of the rows handed out and the free list."""
        return int(self._slots.nbytes + 8 * self._row_limit + self._free.nbytes)

    @property
    def row_limit(self) -> int:
        """One more than the largest row number handed out (0 when none was)."""
        return self._row_limit

    def row_limit_after(self, m: int) -> int:
        """:attr:`row_limit` after inserting ``m`` more keys (free rows go first)."""
        return self._row_limit + max(0, m - self._free.size)

    def _home(self, hashes: np.ndarray) -> np.ndarray:
        # Top bits of the mix: independent of the low bits that pick bucket and shard.
        return (hashes >> self._shift).astype(np.int64)

    def lookup(self, keys: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """Row numbers of ``keys`` (uint64[N]); -1 where a key is absent. int64[N].

        Args:
            hashes (uint64[N]): ``mix64(keys)`` when the caller has it already (the
                sparse table computes it once per request for shard and slot).
        """
        return self._probe(keys, mix64(keys) if hashes is None else hashes)[1]

    def _probe(self, keys: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slot, row) of each key (uint64[N]); -1 and -1 where absent. int64[N] each."""
        slots_out = np.full(keys.shape[0], -1, dtype=np.int64)
        rows_out = np.full(keys.shape[0], -1, dtype=np.int64)
        if not self._size:
            return slots_out, rows_out
        pos = self._home(hashes)
        # First round: one slot per key (most keys sit in their home slot).
        rows = self._slots[pos]
        hit = (rows >= 0) & (self.row_keys[rows] == keys)  # row -1 reads the last key
        slots_out[hit] = pos[hit]
        rows_out[hit] = rows[hit]
        more = ~hit & (rows >= 0)
        pending = np.flatnonzero(more)
        pos = (pos[more] + 1) & self._mask
        # The rest: the next _WINDOW slots of each key at once. No key follows an empty
        # slot in its probe sequence, so the first hit-or-empty slot in a window decides.
        while pending.size:
            slots = (pos[:, None] + _WINDOW_OFFSETS) & self._mask  # [P, W]
            rows = self._slots[slots]
            empty = rows < 0
            hit = ~empty & (self.row_keys[rows] == keys[pending][:, None])
            stop = hit | empty
            first = stop.argmax(axis=1)  # [P]
            at = np.arange(pending.size)
            found = hit[at, first]
            slots_out[pending[found]] = slots[found, first[found]]
            rows_out[pending[found]] = rows[found, first[found]]
            more = ~stop[at, first]
            pending = pending[more]
            pos = (pos[more] + _WINDOW) & self._mask
        return slots_out, rows_out

    def insert_new(self, keys: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """Insert keys known to be absent and unique; return their new row numbers.

        Args:
            keys (uint64[M]): absent, distinct keys, none equal to RESERVED_KEY.
            hashes (uint64[M]): ``mix64(keys)``, when the caller has it.

        Returns:
            int64[M]: the keys' rows, in the order of ``keys``: rows freed by
            :meth:`remove` first (the last freed first), then new rows from
            :attr:`row_limit` up; ``len(self) .. len(self)+M-1`` when nothing was
            ever removed.

        Raises:
            MemoryError: more than 2^31 - 1 rows, or memory ran out (the index is
                left as it was).
        """
        m = keys.shape[0]
        reused = min(m, self._free.size)
        limit = self._row_limit + m - reused
        if limit > _MAX_ROWS:
            raise MemoryError(f"a hash index holds at most {_MAX_ROWS:,} rows (int32 row "
                              "numbers); use more shards or servers")
        fresh = np.arange(self._row_limit, limit, dtype=np.int64)
        rows = np.concatenate([self._free[self._free.size - reused:][::-1], fresh]) \
            if reused else fresh
        if limit > self.row_keys.size:
            self._reserve_rows(limit)
        if (self._size + m) > _MAX_LOAD * (1 << self._bits):
            self._grow(self._size + m)
        self.row_keys[rows] = keys
        self._place(rows, mix64(keys) if hashes is None else hashes)
        self._size += m
        self._row_limit = limit
        if reused:
            self._free = self._free[: self._free.size - reused].copy()
        return rows

    def _reserve_rows(self, rows: int) -> None:
        capacity = row_capacity(self.row_keys.size, rows, self._max_rows)
        grown = np.zeros(capacity, dtype=np.uint64)  # past row_limit: never read
        grown[: self._row_limit] = self.row_keys[: self._row_limit]
        self.row_keys = grown

    def remove(self, keys: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """Remove ``keys``; their rows go on the free list for later inserts.

        Args:
            keys (uint64[N]): keys to remove; absent keys and repeats are ignored.
            hashes (uint64[N]): ``mix64(keys)``, when the caller has it.

        Returns:
            int64[N]: the row each key had, -1 where it was absent (a repeated key
            reports its row once, then -1).

        Vectorised: one numpy pass per probe window, then the cluster tails of the
        removed slots are placed again (see the module docstring); keys
        already in their home slot stay.
        """
        slots, rows = self._probe(keys, mix64(keys) if hashes is None else hashes)
        found = np.flatnonzero(slots >= 0)
        _, first = np.unique(slots[found], return_index=True)
        found = found[first]  # one entry per removed slot
        out = np.full(keys.shape[0], -1, dtype=np.int64)
        out[found] = rows[found]
        self._remove_slots(slots[found])
        return out

    def remove_rows(self, rows: np.ndarray) -> None:
        """Remove the keys of ``rows`` (int64[N], distinct, each holding a key): as
        :meth:`remove` of ``row_keys[rows]``, without its checks for absent and
        repeated keys (eviction and shrink pick rows)."""
        keys = self.row_keys[rows]
        self._remove_slots(self._probe(keys, mix64(keys))[0])

    def _remove_slots(self, freed: np.ndarray) -> None:
        """Empty the distinct occupied ``freed`` slots (int64[F]) and re-place the rest
        of their clusters; their rows go on the free list."""
        if not freed.size:
            return
        rows = self._slots[freed].astype(np.int64)
        self._slots[freed] = _EMPTY
        self.row_keys[rows] = np.uint64(RESERVED_KEY)
        # The rest of each cluster after a removed slot, up to the next empty slot:
        # first the next slot alone (at a load of a quarter it is mostly empty), then
        # _WINDOW slots of every tail still open per round.
        pos = (freed + 1) & self._mask
        pos = pos[self._slots[pos] >= 0]
        tails = [pos]
        pos = (pos + 1) & self._mask
        while pos.size:
            slots = (pos[:, None] + _WINDOW_OFFSETS) & self._mask  # [P, W]
            taken = self._slots[slots] >= 0
            run = np.where(taken.all(axis=1), _WINDOW, (~taken).argmax(axis=1))
            tails.append(slots[run[:, None] > _WINDOW_OFFSETS])
            pos = (pos[run == _WINDOW] + _WINDOW) & self._mask
        moved = np.concatenate(tails)
        moved_rows = self._slots[moved].astype(np.int64)
        move_hashes = mix64(self.row_keys[moved_rows])
        # A key in its home slot cannot move closer: it stays (most of them).
        away = self._home(move_hashes) != moved
        if away.any():
            self._slots[moved[away]] = _EMPTY
            self._place(moved_rows[away], move_hashes[away])
        self._free = np.concatenate([self._free, rows])
        self._size -= freed.size

    def _place(self, rows: np.ndarray, hashes: np.ndarray) -> None:
        """Put ``rows`` (int64[M], keys absent) into the first empty slot of each one's
        probe sequence (from ``hashes``, uint64[M])."""
        pending = np.arange(rows.shape[0])
        pos = self._home(hashes)
        while pending.size:
            slots = (pos[:, None] + _WINDOW_OFFSETS) & self._mask  # [P, W]
            empty = self._slots[slots] < 0
            first = empty.argmax(axis=1)
            cand = np.flatnonzero(empty[np.arange(pending.size), first])
            # Rows naming the same free slot: each writes -2 - its number into the slot;
            # the one that stays there claims it. One scatter and one gather instead of
            # a sort per round.
            chosen = slots[cand, first[cand]]
            self._slots[chosen] = -2 - cand
            claimed = self._slots[chosen] == -2 - cand
            won, won_slots = cand[claimed], chosen[claimed]
            self._slots[won_slots] = rows[pending[won]]
            # A row whose window was full goes on after it; one that lost its slot to
            # another goes on after that slot (every slot before it is taken).
            nxt = pos + _WINDOW
            nxt[cand] = chosen + 1
            left = np.ones(pending.size, dtype=bool)
            left[won] = False
            pending = pending[left]
            pos = nxt[left] & self._mask

    def _grow(self, needed: int) -> None:
        rows = self._slots[self._slots >= 0].astype(np.int64)
        bits = self._bits
        while needed > _MAX_LOAD * (1 << bits):
            bits += 1
        saved = (self._bits, self._shift, self._mask, self._slots)
        try:
            self._alloc(bits)
            # In chunks: a rehash's [rows, window] temporaries stay a few MiB, not
            # several times the new slot array (a capped shard's peak memory).
            for start in range(0, rows.size, _GROW_CHUNK):
                part = rows[start:start + _GROW_CHUNK]
                self._place(part, mix64(self.row_keys[part]))
        except MemoryError:  # the index stays as it was (the request fails whole)
            self._bits, self._shift, self._mask, self._slots = saved
            raise

    def live_mask(self) -> np.ndarray:
        """bool[row_limit]: which rows hold a key (a new array)."""
        return self.row_keys[: self._row_limit] != np.uint64(RESERVED_KEY)

    def live_rows(self) -> np.ndarray:
        """int64[n]: the rows holding a key, ascending."""
        return np.flatnonzero(self.live_mask())

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (keys uint64[n], rows int64[n]) held, ordered by row."""
        rows = self.live_rows()
        return self.row_keys[rows], rows
