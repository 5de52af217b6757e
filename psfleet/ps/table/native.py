"""The native backend of the sparse table: the C++ core (``psfleet.ps.table._core``,
sources in ``_native/``) over the same numpy arrays as the reference.

Rows, rule state, statistics, keys and slots stay the numpy arrays of
:class:`~psfleet.ps.table.shard.Shard` and :class:`~psfleet.ps.table.hash_index.HashIndex`,
so saves, the disk tier and stats read them unchanged. What differs:

- :class:`NativeShard`'s ``lock`` is a native mutex (``_core.ShardCore``), which the
  table-level kernels take without the GIL; its arrays are rebound to the core each
  time Python replaces one (always under that lock).
- :class:`NativeHashIndex` probes and places with native kernels, round for round as
  the numpy code does, so slots, rows handed out and the free list's order are the
  reference's exactly (its removal is the reference's numpy code, placing through them).
- :class:`NativeKernels` does a pull or an update of rows already present in one native
  call over all shards (GIL released, shards on a small pool of threads, each shard
  under its mutex in turn, so it never waits on a lock while holding another). What it
  leaves (absent keys, rows whose rule it cannot reproduce bit for bit) goes through
  the numpy reference, which creates rows, runs admission and initializers.

Kept on numpy, by the reference code: inserts' bookkeeping (free list, growth), key-seeded
initializers (numpy's float64 log1p differs from libm's here, so Box-Muller would not
match bit for bit), duplicate-key sums, the lifecycle (statistics, admission, eviction,
shrink) and the disk tier.
"""

from __future__ import annotations

import os

import numpy as np

import psfleet.ps.table._core as _core
from psfleet.errors import InvalidRequestError
from psfleet.ps.merge import sum_equal_keys
from psfleet.ps.table.hash_index import HashIndex
from psfleet.ps.table.rules import Rule
from psfleet.ps.table.shard import Shard

__all__ = ["NativeHashIndex", "NativeShard", "NativeKernels", "adam_factors",
           "distinct_summed", "scatter_add"]

#: ``out[index[i]] += values[i]`` in the order of ``index`` (``psfleet.ps.merge``'s sums
#: of equal keys): numpy's ``add.at``, bit for bit, natively with the GIL released.
scatter_add = _core.scatter_add

#: Op codes of ``_core.table_update`` (rules.hpp's Op).
OPS = {"sgd": 0, "adagrad": 1, "adam": 2, "add": 3, "assign": 4, "set": 5}
#: Step counts an Adam factor table covers at most (8 bytes each).
_ADAM_TABLE_MAX = 1 << 20
_NO_FACTORS = np.zeros((0, 2), dtype=np.float32)


class NativeHashIndex(HashIndex):
    """:class:`HashIndex` whose probes and placements run natively (same results, same
    slot layout). ``core``: the shard's ``_core.ShardCore``, kept bound to ``_slots``
    and ``row_keys``; None for an index of its own."""

    def __init__(self, capacity: int = 1024, max_rows: int | None = None,
                 core: _core.ShardCore | None = None) -> None:
        self._core = core
        super().__init__(capacity, max_rows)

    @property  # type: ignore[override]
    def _slots(self) -> np.ndarray:
        return self._slot_array

    @_slots.setter
    def _slots(self, slots: np.ndarray) -> None:
        self._slot_array = slots
        if self._core is not None:
            self._core.bind_slots(slots)

    @property  # type: ignore[override]
    def row_keys(self) -> np.ndarray:
        return self._row_key_array

    @row_keys.setter
    def row_keys(self, keys: np.ndarray) -> None:
        self._row_key_array = keys
        if self._core is not None:
            self._core.bind_row_keys(keys)

    def _probe(self, keys: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self._size:
            return super()._probe(keys, hashes)
        return _core.probe(self._slots, self.row_keys,
                           np.ascontiguousarray(keys, dtype=np.uint64),
                           np.ascontiguousarray(hashes, dtype=np.uint64))

    def _place(self, rows: np.ndarray, hashes: np.ndarray) -> None:
        _core.place(self._slots, np.ascontiguousarray(rows, dtype=np.int64),
                    np.ascontiguousarray(hashes, dtype=np.uint64))


class NativeShard(Shard):
    """:class:`Shard` with a native lock and index (same arguments). ``lock`` is a
    ``_core.ShardCore``: a context manager as ``threading.Lock`` is (acquire, release,
    locked), blocking with the GIL released; the native kernels take it too."""

    def __init__(self, width: int, **kwargs: object) -> None:
        self.core = _core.ShardCore()
        super().__init__(width, **kwargs)  # type: ignore[arg-type]
        self.index = NativeHashIndex(max_rows=self.cap, core=self.core)
        self.lock = self.core

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, data: np.ndarray) -> None:
        self._data = data
        self.core.bind_data(data)


def distinct_summed(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``psfleet.ps.merge.distinct_summed`` with the check for repeated keys native
    (one pass through a hash set instead of numpy's sort): distinct ``keys``
    (uint64[N]) come back as they are with their ``values`` (float32[N, D]); with a
    repeat, :func:`~psfleet.ps.merge.sum_equal_keys` sums them (the same bits)."""
    if keys.size < 2:
        return keys, values
    if keys.dtype == np.uint64 and keys.ndim == 1:
        repeated = _core.has_duplicates(np.ascontiguousarray(keys))
    else:
        ordered = np.sort(keys)
        repeated = bool((ordered[1:] == ordered[:-1]).any())
    return sum_equal_keys(keys, values) if repeated else (keys, values)


def adam_factors(rule: Rule) -> tuple[np.ndarray, bool]:
    """Adam's per-step bias corrections, computed by numpy exactly as ``AdamRule.update``
    does (its float64 ``beta ** t`` is numpy's own pow, not libm's):
    float32[T, 2] with [t - 1] = (lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t)), and whether
    both are constant past T (``1 - beta^t`` rounds to 1 in float64)."""
    c = rule.config
    steps = np.arange(1, _ADAM_TABLE_MAX + 1, dtype=np.float64)[:, None]  # [T, 1]
    pow1, pow2 = 1.0 - c.beta1 ** steps, 1.0 - c.beta2 ** steps
    step_size = (c.learning_rate / pow1).astype(np.float32)
    inv_sqrt_bc2 = (1.0 / np.sqrt(pow2)).astype(np.float32)
    factors = np.ascontiguousarray(np.hstack([step_size, inv_sqrt_bc2]))
    varying = np.flatnonzero((pow1[:, 0] != 1.0) | (pow2[:, 0] != 1.0))
    constant_from = int(varying[-1]) + 2 if varying.size else 1  # first constant t
    if constant_from <= _ADAM_TABLE_MAX:
        return factors[:constant_from].copy(), True
    return factors, False


class NativeKernels:
    """A table's native calls for rows already present (tables without a lifecycle).

    Args:
        shards: the table's shards (:class:`NativeShard`), in shard order.
        dim: values per row; rule: the table's rule; label: the table's name as errors
            quote it; shard_rule: (shift, buckets) of ``SparseTable._shard_rule``.
        threads: pool threads per call (0: min(CPU cores, shards)).

    Thread safe: each shard is worked on under its lock.
    """

    def __init__(self, shards: list[Shard], dim: int, rule: Rule, label: str,
                 shard_rule: tuple[int, int], threads: int = 0) -> None:
        self._cores = [s.core for s in shards if isinstance(s, NativeShard)]
        if len(self._cores) != len(shards):
            raise TypeError("NativeKernels needs NativeShard shards")
        self._dim = dim
        self._rule = rule
        self._label = label
        self._shift, self._buckets = shard_rule
        self.threads = threads or min(os.cpu_count() or 1, len(shards))
        self._params = _rule_params(rule)
        self._factors: tuple[np.ndarray, bool] | None = None

    def pull(self, keys: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(float32[N, width] rows, int64[M] positions of absent keys) for uint64[N]
        ``keys``: the first ``width`` floats of each present key's row; None where the
        keys are not uint64 (the caller runs the reference).

        Raises:
            InvalidRequestError: the reserved key, or arrays the core refuses.
        """
        if keys.dtype != np.uint64 or keys.ndim != 1:
            return None
        out = np.empty((keys.size, width), dtype=np.float32)
        try:
            missing = _core.table_pull(self._cores, np.ascontiguousarray(keys), out,
                                       self._shift, self._buckets, self.threads,
                                       self._label)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        return out, missing

    def update(self, keys: np.ndarray, values: np.ndarray, kind: str) -> np.ndarray | None:
        """Apply ``kind`` ("rule": the table's rule with gradients; "add", "assign",
        "set": deltas, values, whole rows) in place to the present rows of ``keys``
        (uint64[N]) with ``values`` (float32[N, W]); returns int64[M], the positions
        left for the reference (absent keys; Adam rows whose step count the factor
        table does not cover); None where dtypes are not the wire's (the caller runs
        the reference on everything).

        Raises:
            InvalidRequestError: the reserved key, or arrays the core refuses.
        """
        if keys.dtype != np.uint64 or values.dtype != np.float32 or keys.ndim != 1:
            return None
        name = self._rule.name if kind == "rule" else kind
        factors, complete = _NO_FACTORS, False
        if name == "adam":
            if self._factors is None:
                self._factors = adam_factors(self._rule)
            factors, complete = self._factors
        try:
            return _core.table_update(self._cores, np.ascontiguousarray(keys),
                                      np.ascontiguousarray(values), OPS[name], self._dim,
                                      self._params, factors, complete, self._shift,
                                      self._buckets, self.threads, self._label)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None


def _rule_params(rule: Rule) -> dict[str, float]:
    """The rule's constants as ``rules.py`` rounds them (float32 values)."""
    c = rule.config
    f32 = np.float32
    return {"lr": float(f32(c.learning_rate)), "eps": float(f32(c.epsilon)),
            "b1": float(f32(c.beta1)), "b2": float(f32(c.beta2)),
            "one_minus_b1": float(1 - f32(c.beta1)), "one_minus_b2": float(1 - f32(c.beta2))}
