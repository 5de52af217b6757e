"""Summing the gradients of equal keys (worker merges, server sync rounds)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["merge_sparse"]


def merge_sparse(keys: list[np.ndarray], grads: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sum gradients of equal keys across pushes.

    Args:
        keys: uint64 arrays [N_i].
        grads: float32 arrays [N_i, dim], aligned with ``keys``.

    Returns:
        (uint64[U], float32[U, dim]): distinct keys (sorted) and their summed gradients.
    """
    if len(keys) == 1:
        return keys[0], grads[0]
    all_keys = np.concatenate(keys)
    all_grads = np.concatenate(grads)
    uniq, inverse = np.unique(all_keys, return_inverse=True)
    summed = np.zeros((uniq.size, all_grads.shape[1]), dtype=np.float32)
    # summed[inverse[i]] += all_grads[i], vectorised (numpy's add.at is far slower).
    torch.from_numpy(summed).index_add_(0, torch.from_numpy(inverse.astype(np.int64)),
                                        torch.from_numpy(all_grads))
    return uniq, summed
