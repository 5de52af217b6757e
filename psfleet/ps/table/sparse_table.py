"""The sparse table: uint64 key -> row of ``dim`` float32 plus optimizer state.

A table is split into internal shards by bits of the key's hash that neither its
bucket (so its share, ``bucket % shares``) nor its hash-index slot uses
(:func:`shard_of_hashes`), each with its own lock, hash index and row matrix, so
handler threads working on different keys do not serialise on one lock. Rows live in
one float32 matrix per shard, ``[capacity, dim + state_width]``: values first, rule
state after, so a pull is one gather and a push one gather, update and scatter.
Every operation is vectorised over the batch; there is no Python loop per key.

A table whose ``config.accessor`` is active also has a row lifecycle
(``psfleet.ps.table.lifecycle``): CTR statistics beside the rows, admission of new ids, a
row cap with eviction, ``shrink`` and ``age_one_day`` (``psfleet.ps.table.sparse_lifecycle``),
and optionally a disk tier that rows beyond a memory budget spill to
(``psfleet.ps.table.disk_tier``). Without one, pull and push run exactly the code they ran
before lifecycles existed (one ``is None`` test more).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from psfleet.errors import InvalidRequestError, RemoteError, clip_text
from psfleet.ps.hashing import init_rows, mix64
from psfleet.ps.table.backend import make_backend
from psfleet.ps.table.disk_tier import DiskTier
from psfleet.ps.table.lifecycle import Lifecycle, LifecycleCounts
from psfleet.ps.table.rules import make_rule
from psfleet.ps.table.shard import Shard
from psfleet.ps.table.sparse_lifecycle import LifecycleOps
from psfleet.ps.types import RESERVED_KEY, SparseTableConfig

__all__ = ["SparseTable", "LifecycleCounts", "shard_of_hashes"]

#: The hash bits a key's internal shard comes from: bits 16 and up. A key's bucket is
#: ``mix64 % num_buckets`` and its share ``bucket % shares`` (``ps.routing``), which
#: use the low bits (at most 4,096 shares: 12 bits); the hash index's slot uses the top
#: bits. With the bucket's bits (``bucket % num_shards``, before issue 41) a server
#: holding share s of S saw only the buckets ``s mod S`` and, with S and the shard count
#: sharing a factor, used only 8 / gcd(8, S) of its 8 shards and kept that part of its
#: ``max_rows``.
SHARD_SHIFT = 16


def shard_of_hashes(hashes: np.ndarray, num_shards: int) -> np.ndarray:
    """int64[N]: the internal shard of keys whose ``mix64`` is ``hashes`` (uint64[N]):
    ``(hash >> 16) % num_shards``, independent of the key's share and of the server
    count (so a checkpoint loads into any server count: each key is re-sharded on
    load)."""
    return ((hashes >> np.uint64(SHARD_SHIFT)) % np.uint64(num_shards)).astype(np.int64)


class SparseTable(LifecycleOps):
    """A sparse table's shards on one server. Thread safe.

    Args:
        config: dim, rule, initializer, bucket and shard counts, accessor.
        backend: ``numpy`` or ``native`` (None: ``PSFLEET_TABLE_BACKEND``,
            ``psfleet.ps.table.backend``); the results are the same bit for bit.

    Raises:
        ConfigError: an unknown backend, or ``native`` without the built core.
    """

    def __init__(self, config: SparseTableConfig, backend: str | None = None) -> None:
        self.config = config
        self._label = clip_text(repr(config.name))  # the name as error messages quote it
        self.dim = config.dim
        self.rule = make_rule(config.rule)
        self.state_width = self.rule.state_width(config.dim)
        width = self.dim + self.state_width
        accessor = config.accessor
        self._disk = DiskTier(width, accessor.name == "ctr", accessor.disk_dir, config.name,
                              config.num_buckets, config.num_shards) if accessor.tiered else None
        life = Lifecycle(accessor, config.num_shards, self._disk,
                         self.memory_rows(config)) if accessor.active else None
        self._life = life
        # The kernels (PSFLEET_TABLE_BACKEND): the numpy reference, or the native core
        # for rows already present in tables without a lifecycle (psfleet.ps.table.native).
        self.backend = make_backend(backend)
        kind = self.backend.shard_type
        self._shards = [kind(width) if life is None else life.make_shard(width, i, kind)
                        for i in range(config.num_shards)]
        self._native = None if life is not None else self.backend.kernels(
            self._shards, self.dim, self.rule, self._label, self._shard_rule())

    def __len__(self) -> int:
        return sum(len(s.index) for s in self._shards) + self.disk_rows

    @staticmethod
    def row_memory_bytes(config: SparseTableConfig) -> int:
        """Bytes one row takes in a full memory tier: its floats (values and rule
        state), the lifecycle's arrays (statistics and the saved flag with the ``ctr``
        accessor, the LRU stamp) and its index entry (key, and 4-byte slots at a load
        of at most a quarter, ``psfleet.ps.table.hash_index``)."""
        accessor = config.accessor
        floats = config.dim + make_rule(config.rule).state_width(config.dim)
        lifecycle = (17 if accessor.name == "ctr" else 0) + (8 if accessor.eviction == "lru"
                                                             else 0)
        return 4 * floats + lifecycle + 8 + 16

    @classmethod
    def memory_rows(cls, config: SparseTableConfig) -> int | None:
        """Rows per server the memory tier holds: ``accessor.memory_rows``, or
        ``memory_budget_bytes`` over :meth:`row_memory_bytes`; None: no disk tier."""
        accessor = config.accessor
        if accessor.memory_budget_bytes is None:
            return accessor.memory_rows
        return max(1, accessor.memory_budget_bytes // cls.row_memory_bytes(config))

    @property
    def memory_bytes(self) -> int:
        """Bytes held by row matrices and hash indexes (the memory tier)."""
        return sum(s.memory_bytes for s in self._shards)

    def shard_of(self, keys: np.ndarray) -> np.ndarray:
        """int64[N]: the internal shard of each of ``keys`` (uint64[N])."""
        return shard_of_hashes(mix64(keys), len(self._shards))

    def _shard_rule(self) -> tuple[int, int]:
        """(shift, buckets): a key's shard is ``((mix64(key) >> shift) % buckets) %
        num_shards`` (buckets 0: no bucket step), as :func:`shard_of_hashes` computes
        it; the native kernels take these two numbers."""
        return SHARD_SHIFT, 0

    def _split(self, keys: np.ndarray) -> list[tuple[Shard, np.ndarray, np.ndarray]]:
        """(shard, positions in ``keys``, their hashes) for every shard that has keys.

        ``mix64`` runs once per key here: the shard and the hash index's slot both
        come from it.
        """
        if keys.size and (keys == np.uint64(RESERVED_KEY)).any():
            raise InvalidRequestError(f"table {self._label}: key 2^64-1 is reserved")
        hashes = mix64(keys)
        if len(self._shards) == 1:
            return [(self._shards[0], np.arange(keys.size), hashes)]
        shard_ids = shard_of_hashes(hashes, len(self._shards))
        # A stable sort of small integers is a radix sort in numpy: O(N).
        small = np.uint8 if len(self._shards) <= 256 else np.uint16
        order = np.argsort(shard_ids.astype(small), kind="stable")
        bounds = np.searchsorted(shard_ids[order], np.arange(len(self._shards) + 1))
        parts = [order[bounds[i]:bounds[i + 1]] for i in range(len(self._shards))]
        return [(self._shards[i], pos, hashes[pos]) for i, pos in enumerate(parts) if pos.size]

    def pull(self, keys: np.ndarray, create: bool = True,
             with_state: bool = False) -> np.ndarray:
        """Values of the rows of ``keys`` (``with_state``: and their rule state).

        Args:
            keys (uint64[N]): keys; duplicates allowed.
            create: insert missing rows with their initial values (training); when
                False, missing rows read as their initial values and are not stored.
                With a lifecycle, only keys the admission policy admits are inserted
                (the others read as their initial values), a full shard evicts first,
                and every row read is stamped for LRU.
            with_state: also return each row's rule state (pass mode's worker cache
                applies the rule itself).

        Returns:
            float32[N, dim] (``with_state``: float32[N, dim + state_width]): a new array.

        Raises:
            RemoteError: a key equals the reserved 2^64-1.
        """
        width = self.dim + self.state_width if with_state else self.dim
        present = None if self._native is None else self._native.pull(keys, width)
        if present is None:
            return self._pull(keys, create, width)
        out, missing = present
        if missing.size:  # absent rows: the reference creates (or reads) them
            out[missing] = self._pull(keys[missing], create, width)
        return out

    def _pull(self, keys: np.ndarray, create: bool, width: int) -> np.ndarray:
        """:meth:`pull` by the numpy reference: float32[N, width]."""
        out = np.empty((keys.size, width), dtype=np.float32)
        life = self._life
        clock = 0 if life is None else life.tick()
        for shard, pos, hashes in self._split(keys):
            k = keys[pos]
            with shard.lock:
                rows = self._rows(shard, k, hashes, create, clock)
                missing = rows < 0
                if missing.any():  # not creating, or not admitted
                    out[pos[missing]] = self._absent(shard, k[missing], create, width)
                    pos, rows = pos[~missing], rows[~missing]
                out[pos] = np.take(shard.data, rows, axis=0)[:, :width]
                if life is not None:
                    life.touch(shard, rows, clock)
        return out

    def _rows(self, shard: Shard, keys: np.ndarray, hashes: np.ndarray,
              create: bool, clock: int = 0, use_admission: bool = True,
              scores: np.ndarray | None = None) -> np.ndarray:
        """Row numbers of ``keys`` in ``shard`` (caller holds its lock); missing keys
        get new rows when ``create`` (and admitted; ``scores`` float32[N]: a push's
        admission scores), else -1."""
        rows = shard.index.lookup(keys, hashes)
        missing = rows < 0
        if create and missing.any() and self._disk is not None:
            rows[missing] = self._promote(shard, keys[missing], hashes[missing],
                                          rows[~missing], clock)
            missing = rows < 0
        if create and missing.any():
            rows[missing] = self._insert(shard, keys[missing], hashes[missing],
                                         rows[~missing], clock, use_admission,
                                         None if scores is None else scores[missing])
        return rows

    def _counts(self, keys: np.ndarray, shows: np.ndarray | None,
                clicks: np.ndarray | None, what: str) -> np.ndarray:
        """float32[N, 2]: ``shows`` and ``clicks`` (float32[N] each, None: zeros)."""
        counts = np.zeros((keys.size, 2), dtype=np.float32)
        for col, (name, given) in enumerate((("shows", shows), ("clicks", clicks))):
            if given is not None:
                if np.shape(given) != (keys.size,):
                    raise InvalidRequestError(
                        f"table {self._label}: {what} of {keys.size} keys with {name} "
                        f"of shape {tuple(np.shape(given))}, expected ({keys.size},)")
                counts[:, col] = given
        return counts

    def _check_shape(self, keys: np.ndarray, values: np.ndarray, what: str,
                     width: int | None = None) -> None:
        width = self.dim if width is None else width
        if values.shape != (keys.size, width):
            raise InvalidRequestError(
                f"table {self._label}: push of {keys.size} keys with {what} of "
                f"shape {tuple(values.shape)}, expected ({keys.size}, {width})"
            )

    def _apply(self, keys: np.ndarray, values: np.ndarray,
               op: Callable[[np.ndarray, np.ndarray, np.ndarray], None], kind: str,
               use_admission: bool = True) -> None:
        """:meth:`_update`, the present rows first in one native call where the backend
        has one (``kind``: "rule", "add", "assign" or "set", what ``op`` does)."""
        left = None if self._native is None else self._native.update(keys, values, kind)
        if left is None:
            self._update(keys, values, op, use_admission=use_admission)
        elif left.size:
            self._update(keys[left], values[left], op, use_admission=use_admission)

    def _update(self, keys: np.ndarray, values: np.ndarray,
                op: Callable[[np.ndarray, np.ndarray, np.ndarray], None],
                counts: np.ndarray | None = None, use_admission: bool = True,
                scores: np.ndarray | None = None) -> None:
        """``op(w, state, v)`` in place on the rows of distinct ``keys``, creating them
        (with a lifecycle: those admitted; the others' ``values`` are dropped).
        ``counts`` (float32[N, 2]): shows and clicks for the CTR statistics;
        ``scores`` (float32[N]): a push's admission scores (show_click_score). A load
        (``use_admission`` False) marks its rows as in the base/delta chain."""
        life = self._life
        if life is None:
            for shard, pos, hashes in self._split(keys):
                with shard.lock:
                    rows = self._rows(shard, keys[pos], hashes, create=True)
                    block = np.take(shard.data, rows, axis=0)  # [M, dim + state]
                    op(block[:, : self.dim], block[:, self.dim:], values[pos])
                    shard.data[rows] = block
            return
        clock = life.tick()
        for shard, pos, hashes in self._split(keys):
            with shard.lock:
                rows = self._rows(shard, keys[pos], hashes, True, clock, use_admission,
                                  None if scores is None else scores[pos])
                kept = rows >= 0
                if not kept.all():
                    pos, rows = pos[kept], rows[kept]
                block = np.take(shard.data, rows, axis=0)  # [M, dim + state]
                op(block[:, : self.dim], block[:, self.dim:], values[pos])
                shard.data[rows] = block
                life.touch(shard, rows, clock)
                if counts is not None:
                    life.push_stats(shard, rows, counts[pos, 0], counts[pos, 1])
                if not use_admission and shard.saved is not None:
                    shard.saved[rows] = True

    def push(self, keys: np.ndarray, grads: np.ndarray, shows: np.ndarray | None = None,
             clicks: np.ndarray | None = None) -> None:
        """Apply the rule to the rows of ``keys`` with gradients ``grads``.

        Args:
            keys (uint64[N]): keys; a key given twice gets the sum of its gradients
                (one rule step, as the worker's merge and Paddle's push merge do).
            grads (float32[N, dim]): their gradients.
            shows, clicks (float32[N]): per-key show and click counts for the CTR
                accessor (summed over repeated keys; None: zeros). With the ``ctr``
                accessor every pushed row also gets unseen_days = 0 and delta_score
                += the counts' score. Ignored by the ``none`` accessor.

        Missing rows are created first (a push may follow a pull that another
        server restart lost), if admitted (``AccessorConfig.admission``); the
        gradients of keys not admitted are dropped.

        Raises:
            InvalidRequestError: a shape mismatch or the reserved key.
        """
        self._check_shape(keys, grads, "gradients")
        if self._life is None or self._life.accessor is None:
            self._apply(*self.backend.merge(keys, grads), self.rule.update, "rule")
            return
        counts = self._counts(keys, shows, clicks, "push")
        life = self._life
        assert life.accessor is not None  # checked above
        if life.config.admission != "show_click_score":
            merged_keys, merged = self.backend.merge(keys, np.hstack([grads, counts]))
            self._update(merged_keys, np.ascontiguousarray(merged[:, : self.dim]),
                         self.rule.update, counts=merged[:, self.dim: self.dim + 2])
            return
        # Admission score per occurrence: the counts' score, or show 1 without counts.
        ones = np.ones(keys.size, np.float32)
        score = (life.accessor.score(counts[:, 0], counts[:, 1]) if shows is not None
                 else life.accessor.score(ones, ones * 0))
        merged_keys, merged = self.backend.merge(keys, np.hstack([grads, counts,
                                                               score[:, None]]))
        self._update(merged_keys, np.ascontiguousarray(merged[:, : self.dim]),
                     self.rule.update, counts=merged[:, self.dim: self.dim + 2],
                     scores=np.ascontiguousarray(merged[:, self.dim + 2]))

    def add(self, keys: np.ndarray, deltas: np.ndarray, with_state: bool = False) -> None:
        """Add ``deltas`` (float32[N, dim]) to the values of ``keys``; no rule.

        GEO mode: a worker's change of its local rows since the last sync. Pass mode
        (``with_state``): deltas are float32[N, dim + state_width], a worker's change
        of the values and the rule state over a pass. Missing rows are created
        (initial values) first; a key given twice gets both deltas.

        Raises:
            InvalidRequestError: a shape mismatch or the reserved key.
        """
        width = self.dim + self.state_width if with_state else self.dim
        self._check_shape(keys, deltas, "deltas", width)

        def add_values(w: np.ndarray, state: np.ndarray, d: np.ndarray) -> None:
            w += d[:, : self.dim]
            if with_state:
                state += d[:, self.dim:]

        self._apply(*self.backend.merge(keys, deltas), add_values, "add")

    def assign(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Set the values of distinct ``keys`` (float32[N, dim]); rule state is kept.

        A worker's local copy (GEO mode) takes the server's fresh values this way.
        """
        self._check_shape(keys, values, "values")

        def set_values(w: np.ndarray, state: np.ndarray, v: np.ndarray) -> None:
            w[...] = v

        self._apply(keys, values, set_values, "assign")

    def load(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Set whole rows, values and rule state, of distinct ``keys`` (a saved table).

        Args:
            keys (uint64[N]): the keys.
            rows (float32[N, dim + state_width]): as :meth:`items` returns them.

        Raises:
            RemoteError: the row width differs (another dim or rule).
        """
        width = self.dim + self.state_width
        if rows.shape != (keys.size, width):
            raise RemoteError(
                f"table {self._label}: saved rows have shape {tuple(rows.shape)}, this "
                f"table needs ({keys.size}, {width}) (dim {self.dim}, rule "
                f"{self.config.rule.name!r}); load into a model with the saved config")

        def set_rows(w: np.ndarray, state: np.ndarray, r: np.ndarray) -> None:
            w[...] = r[:, : self.dim]
            state[...] = r[:, self.dim:]

        # With a disk tier, a chunk at a time: each must fit in the memory tier.
        step = keys.size if self._life is None or self._disk is None else \
            max(1, min(cap or 1 for cap in self._life.caps) // 2)
        for start in range(0, keys.size, max(step, 1)):
            self._apply(keys[start:start + step], rows[start:start + step], set_rows, "set",
                        use_admission=False)

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """bool[N]: which of ``keys`` (uint64[N]) have a row."""
        out = np.zeros(keys.size, dtype=bool)
        for shard, pos, hashes in self._split(keys):
            with shard.lock:
                out[pos] = shard.index.lookup(keys[pos], hashes) >= 0
                if self._disk is not None and not out[pos].all():
                    absent = pos[~out[pos]]
                    uniq, inverse = np.unique(keys[absent], return_inverse=True)
                    out[absent] = self._disk.read(shard.number, uniq, take=False)[0][inverse]
        return out

    def _initial(self, keys: np.ndarray) -> np.ndarray:
        c = self.config
        return init_rows(keys, self.dim, c.initializer, c.initial_range, c.seed)

    def _insert(self, shard: Shard, keys: np.ndarray, hashes: np.ndarray,
                protected: np.ndarray, clock: int, use_admission: bool,
                scores: np.ndarray | None = None) -> np.ndarray:
        """Create rows for absent keys (possibly repeated); return each key's row (-1:
        not admitted). ``protected`` (int64[P]): the request's rows already present.

        Everything large is allocated before the index changes (initial values, rule
        state, the grown row matrix; the index's own growth is undone on failure), so
        a MemoryError leaves the shard as it was (with a lifecycle: except for rows
        evicted to make room).
        """
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        life = self._life
        if life is None:
            new, new_hashes = uniq, hashes[first]
        else:
            ok = life.admit_new(shard, uniq, hashes[first], protected, use_admission,
                                None if scores is None else scores[first])
            new, new_hashes = uniq[ok], hashes[first][ok]
        initial = self._initial(new)  # [U, dim]
        state = self.rule.init_state(new.size, self.dim)  # [U, state_width]
        shard.reserve(shard.index.row_limit_after(new.size))
        rows = shard.index.insert_new(new, new_hashes)
        shard.data[rows, : self.dim] = initial
        shard.data[rows, self.dim:] = state
        if life is None:
            return rows[inverse]
        life.init_rows(shard, rows, clock)
        out = np.full(uniq.size, -1, dtype=np.int64)
        out[ok] = rows
        return out[inverse]

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (keys uint64[n], rows float32[n, dim + state_width]), sorted by key."""
        return self._gather(lambda shard, rows: shard.data[rows], lambda spilled: spilled.data)
