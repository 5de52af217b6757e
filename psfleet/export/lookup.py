"""Offline lookup of a sparse table's rows: sorted keys, binary search, vectorised.

A stored key returns its trained row exactly; any other key returns the row the
training table would have created for it (the key-seeded initializer,
:func:`psfleet.ps.hashing.init_rows`), so offline scores equal the in-training
evaluation's, which pulls without creating rows.
"""

from __future__ import annotations

import numpy as np

from psfleet.errors import DataError
from psfleet.ps.hashing import init_rows
from psfleet.ps.types import Initializer

__all__ = ["SparseLookup"]


class SparseLookup:
    """Rows of one exported sparse table. Read-only and thread safe.

    Args:
        keys (uint64[n]): stored keys, strictly ascending.
        values (float32[n, dim]): their rows.
        initializer, initial_range, seed: the table's initializer settings.
        name: the table's name (for error messages).

    Raises:
        DataError: the arrays have the wrong dtype or shape, or the keys are not
            strictly ascending.
    """

    def __init__(self, keys: np.ndarray, values: np.ndarray, initializer: Initializer,
                 initial_range: float, seed: int, name: str = "table") -> None:
        if keys.dtype != np.uint64 or keys.ndim != 1:
            raise DataError(f"table {name!r}: keys must be uint64[n], got {keys.dtype} "
                            f"{keys.shape}")
        if values.dtype != np.float32 or values.ndim != 2 or values.shape[0] != keys.size:
            raise DataError(f"table {name!r}: values must be float32[{keys.size}, dim], got "
                            f"{values.dtype} {values.shape}")
        if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            raise DataError(f"table {name!r}: keys are not strictly ascending; the export "
                            "is damaged, export it again")
        self.name = name
        self.keys = keys
        self.values = values
        self.dim = int(values.shape[1])
        self.initializer = initializer
        self.initial_range = initial_range
        self.seed = seed

    def __len__(self) -> int:
        return int(self.keys.size)

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """bool[N]: which of ``keys`` (uint64[N]) are stored."""
        return self._find(keys)[1]

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.keys.size == 0:
            return np.zeros(keys.size, np.int64), np.zeros(keys.size, bool)
        pos = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        return pos, self.keys[pos] == keys

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Rows of ``keys``: stored rows, or the initializer's for unseen keys.

        Binary search over the sorted keys: O(N log n), no Python loop per key.

        Args:
            keys (uint64[N]): any keys, duplicates allowed.

        Returns:
            float32[N, dim]: a new array.
        """
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        pos, found = self._find(keys)
        out = np.empty((keys.size, self.dim), dtype=np.float32)
        out[found] = self.values[pos[found]]
        if not found.all():
            missing = ~found
            out[missing] = init_rows(keys[missing], self.dim, self.initializer,
                                     self.initial_range, self.seed)
        return out
