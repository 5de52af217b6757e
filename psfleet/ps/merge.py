"""Summing the gradients of equal keys (worker merges, server sync rounds)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
import torch

from psfleet.ps.routing import RoutedKeys, keys_of

__all__ = ["merge_sparse"]


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
    all_keys = np.concatenate([keys_of(k) for k in keys])
    all_grads = np.concatenate(grads)
    uniq, inverse = np.unique(all_keys, return_inverse=True)
    summed = np.zeros((uniq.size, all_grads.shape[1]), dtype=np.float32)
    # summed[inverse[i]] += all_grads[i], vectorised (numpy's add.at is far slower).
    torch.from_numpy(summed).index_add_(0, torch.from_numpy(inverse.astype(np.int64)),
                                        torch.from_numpy(all_grads))
    return uniq, summed
