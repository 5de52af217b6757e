"""Summing the gradients of equal keys (worker merges, server sync rounds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
import torch

from psfleet.ps.routing import RoutedKeys, keys_of

__all__ = ["merge_sparse", "sum_equal_keys"]


@overload
def merge_sparse(keys: Sequence[np.ndarray], grads: Sequence[np.ndarray]
                 ) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def merge_sparse(keys: Sequence[np.ndarray | RoutedKeys], grads: Sequence[np.ndarray]
                 ) -> tuple[np.ndarray | RoutedKeys, np.ndarray]: ...
def merge_sparse(keys: Sequence[np.ndarray | RoutedKeys], grads: Sequence[np.ndarray]
                 ) -> tuple[np.ndarray | RoutedKeys, np.ndarray]:
    """Sum gradients of equal keys across pushes.

    Args:
        keys: uint64 arrays [N_i] of distinct keys each, or routed keys
            (``RoutedKeys``; a single push keeps its routing).
        grads: float32 arrays [N_i, dim], aligned with ``keys``.

    Returns:
        (uint64[U], float32[U, dim]): distinct keys (sorted) and their summed
        gradients; a single push is returned as it is.
    """
    if len(keys) == 1:
        return keys[0], grads[0]
    return sum_equal_keys(np.concatenate([keys_of(k) for k in keys]), np.concatenate(grads))


def sum_equal_keys(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` (uint64[N], sorted on return) with the ``values``
    (float32[N, dim]) of equal keys summed: (uint64[U], float32[U, dim])."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    summed = np.zeros((uniq.size, values.shape[1]), dtype=np.float32)
    source = values if values.flags.writeable else values.copy()  # torch wants writable
    # summed[inverse[i]] += values[i], vectorised (numpy's add.at is far slower).
    torch.from_numpy(summed).index_add_(0, torch.from_numpy(inverse.astype(np.int64)),
                                        torch.from_numpy(np.ascontiguousarray(source)))
    return uniq, summed
