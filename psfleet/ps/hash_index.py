"""A vectorised open-addressing hash index: uint64 key -> row number.

Linear probing over a power-of-two slot array, kept at most half full; a slot is a
uint64 key and an int32 row number (12 bytes). Lookups and
inserts process a whole batch of keys per numpy operation: each round compares every
still-pending key with its current slot, resolves hits and empties, and advances the
rest by one slot, so the number of Python-level rounds is the longest probe sequence
(10-25 at load <= 0.5 for 10^5 keys), not the number of keys. Lookups, after a first
round on the home slots, examine a window of 8 slots per key per round, which cuts
those rounds about eightfold.

Removal (:meth:`HashIndex.remove`) leaves no tombstones: it empties the removed
keys' slots, then takes the keys of the rest of each affected cluster (the occupied
slots after a removed one, up to the next empty slot) out and places them again, which
restores the invariant lookups rely on (no key sits after an empty slot of its probe
sequence); a tail key already in its home slot stays, since it cannot move closer.
This is the batch form of Knuth's deletion for linear probing (TAOCP 6.4, Algorithm
R). Measured at 250,000 keys in 2^19 slots, churned 4096 keys a batch: a removal
costs about 0.4 us a key against 0.16 us for an insert, and lookups after 10^6
removals are as fast as in a fresh index. Tombstones would make a removal one store,
but every tombstone lengthens probes until a rebuild re-places all live keys, and at
this load the headroom under the 0.5 bound is ~12,000 slots: a rebuild (~40 ms)
every ~12,000 removals is ~3.5 us a removal. Removed rows go on a free list that the
next inserts take first, so the caller's row matrix never needs more rows than the
most keys ever held at once.

Not thread safe: the sparse table holds a lock per shard around it.
"""

from __future__ import annotations

import numpy as np

from psfleet.ps.hashing import mix64
from psfleet.ps.types import RESERVED_KEY

__all__ = ["HashIndex"]

_EMPTY = np.uint64(RESERVED_KEY)
_MAX_LOAD = 0.5
_WINDOW = 8  # slots a lookup examines per key per round after the first
_WINDOW_OFFSETS = np.arange(_WINDOW, dtype=np.int64)[None, :]
#: Row numbers are stored as int32 (12 bytes a slot with the key, not 16): a shard holds
#: fewer rows than this.
_MAX_ROWS = np.iinfo(np.int32).max


class HashIndex:
    """Maps uint64 keys to row numbers: 0..len-1 in order of insertion until a
    :meth:`remove`, after which inserts reuse the freed rows first.

    Args:
        capacity: initial number of slots (rounded up to a power of two, >= 16).
    """

    def __init__(self, capacity: int = 1024) -> None:
        bits = max(4, int(np.ceil(np.log2(max(capacity, 16)))))
        self._alloc(bits)
        self._size = 0
        self._row_limit = 0  # rows 0.._row_limit-1 have been handed out
        self._free = np.zeros(0, dtype=np.int64)  # removed rows, reused last-in first

    def _alloc(self, bits: int) -> None:
        self._bits = bits
        self._shift = np.uint64(64 - bits)
        self._mask = np.int64((1 << bits) - 1)
        self._keys = np.full(1 << bits, _EMPTY, dtype=np.uint64)
        self._rows = np.zeros(1 << bits, dtype=np.int32)

    def __len__(self) -> int:
        return self._size

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the slot arrays and the free list."""
        return int(self._keys.nbytes + self._rows.nbytes + self._free.nbytes)

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
        n = keys.shape[0]
        out = np.full(n, -1, dtype=np.int64)
        pos = self._home(mix64(keys) if hashes is None else hashes)
        # First round: one slot per key (most keys sit in their home slot).
        slot_keys = self._keys[pos]
        hit = slot_keys == keys
        out[hit] = self._rows[pos[hit]]
        more = ~(hit | (slot_keys == _EMPTY))
        pending = np.flatnonzero(more)
        pos = (pos[more] + 1) & self._mask
        # The rest: the next _WINDOW slots of each key at once, so the number of rounds
        # is the longest probe sequence / _WINDOW. No key follows an empty slot in its
        # probe sequence, so the first hit-or-empty slot in a window decides.
        while pending.size:
            slots = (pos[:, None] + _WINDOW_OFFSETS) & self._mask  # [P, W]
            slot_keys = self._keys[slots]
            hit = slot_keys == keys[pending][:, None]
            stop = hit | (slot_keys == _EMPTY)
            first = stop.argmax(axis=1)  # [P]
            decided = stop[np.arange(pending.size), first]
            found = decided & hit[np.arange(pending.size), first]
            out[pending[found]] = self._rows[slots[found, first[found]]]
            more = ~decided
            pending = pending[more]
            pos = (pos[more] + _WINDOW) & self._mask
        return out

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
        """
        m = keys.shape[0]
        reused = min(m, self._free.size)
        if self._row_limit + m - reused > _MAX_ROWS:
            raise MemoryError(f"a hash index holds at most {_MAX_ROWS:,} rows (int32 row "
                              "numbers); use more shards or servers")
        fresh = np.arange(self._row_limit, self._row_limit + m - reused, dtype=np.int64)
        rows = np.concatenate([self._free[self._free.size - reused:][::-1], fresh]) \
            if reused else fresh
        if (self._size + m) > _MAX_LOAD * (1 << self._bits):
            self._grow(self._size + m)
        self._place(keys, rows, mix64(keys) if hashes is None else hashes)
        self._size += m
        self._row_limit += m - reused
        if reused:
            self._free = self._free[: self._free.size - reused].copy()
        return rows

    def _find_slots(self, keys: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Slot of each key (uint64[N]); -1 where absent. int64[N]."""
        out = np.full(keys.shape[0], -1, dtype=np.int64)
        pending = np.arange(keys.shape[0])
        pos = self._home(hashes)
        while pending.size:
            slot_keys = self._keys[pos]
            hit = slot_keys == keys[pending]
            out[pending[hit]] = pos[hit]
            more = ~(hit | (slot_keys == _EMPTY))
            pending = pending[more]
            pos = (pos[more] + 1) & self._mask
        return out

    def remove(self, keys: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """Remove ``keys``; their rows go on the free list for later inserts.

        Args:
            keys (uint64[N]): keys to remove; absent keys and repeats are ignored.
            hashes (uint64[N]): ``mix64(keys)``, when the caller has it.

        Returns:
            int64[N]: the row each key had, -1 where it was absent (a repeated key
            reports its row once, then -1).

        Vectorised: one numpy pass per probe step, then the cluster tails of the
        removed slots are placed again (see the module docstring); keys
        already in their home slot stay.
        """
        hashes = mix64(keys) if hashes is None else hashes
        slots = self._find_slots(keys, hashes)
        found = np.flatnonzero(slots >= 0)
        _, first = np.unique(slots[found], return_index=True)
        found = found[first]  # one entry per removed slot
        out = np.full(keys.shape[0], -1, dtype=np.int64)
        if not found.size:
            return out
        freed = slots[found]
        out[found] = self._rows[freed]
        self._keys[freed] = _EMPTY
        # The rest of each cluster after a removed slot, up to the next empty slot.
        tails = []
        pos = (freed + 1) & self._mask
        while pos.size:
            pos = pos[self._keys[pos] != _EMPTY]
            tails.append(pos)
            pos = (pos + 1) & self._mask
        moved = np.concatenate(tails)
        # A key in its home slot cannot move closer: it stays (about half of them).
        moved = moved[self._home(mix64(self._keys[moved])) != moved]
        if moved.size:
            move_keys, move_rows = self._keys[moved], self._rows[moved]
            self._keys[moved] = _EMPTY
            self._place(move_keys, move_rows, mix64(move_keys))
        self._free = np.concatenate([self._free, out[found]])
        self._size -= found.size
        return out

    def _place(self, keys: np.ndarray, rows: np.ndarray, hashes: np.ndarray) -> None:
        pending = np.arange(keys.shape[0])
        pos = self._home(hashes)
        while pending.size:
            cand = np.flatnonzero(self._keys[pos] == _EMPTY)
            # Keys naming the same free slot: each writes its number into the slot's
            # (unused) row field; the one that stays there claims the slot. One
            # scatter and one gather instead of a sort per round.
            slots = pos[cand]
            self._rows[slots] = cand
            won = cand[self._rows[slots] == cand]
            self._keys[pos[won]] = keys[pending[won]]
            self._rows[pos[won]] = rows[pending[won]]
            lost = np.ones(pending.size, dtype=bool)
            lost[won] = False
            pending = pending[lost]
            pos = (pos[lost] + 1) & self._mask

    def _grow(self, needed: int) -> None:
        live = self._keys != _EMPTY
        old_keys, old_rows = self._keys[live], self._rows[live]
        bits = self._bits
        while needed > _MAX_LOAD * (1 << bits):
            bits += 1
        saved = (self._bits, self._shift, self._mask, self._keys, self._rows)
        try:
            self._alloc(bits)
            self._place(old_keys, old_rows, mix64(old_keys))
        except MemoryError:  # the index stays as it was (the request fails whole)
            self._bits, self._shift, self._mask, self._keys, self._rows = saved
            raise

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All (keys uint64[n], rows int64[n]) held, ordered by row."""
        live = self._keys != _EMPTY
        keys, rows = self._keys[live], self._rows[live].astype(np.int64)
        order = np.argsort(rows, kind="stable")
        return keys[order], rows[order]
