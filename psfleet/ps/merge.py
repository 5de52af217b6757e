"""Summing the gradients of equal keys (worker merges, server sync rounds), and with
them the show and click counts of tables with the ``ctr`` accessor."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import overload

import numpy as np

from psfleet.ps.routing import RoutedKeys, keys_of

__all__ = ["distinct_summed", "merge_pushes", "merge_sparse", "merge_sparse_counts",
           "sum_equal_keys"]


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


def merge_sparse_counts(keys: Sequence[np.ndarray | RoutedKeys], grads: Sequence[np.ndarray],
                        shows: Sequence[np.ndarray], clicks: Sequence[np.ndarray]
                        ) -> tuple[np.ndarray | RoutedKeys, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`merge_sparse` with per-key show and click counts summed alongside.

    Args:
        keys, grads: as :func:`merge_sparse` (uint64[N_i] / routed, float32[N_i, dim]).
        shows, clicks: float32[N_i] each, aligned with ``keys``.

    Returns:
        (keys uint64[U], grads float32[U, dim], shows float32[U], clicks float32[U]):
        equal keys' rows and counts summed; a single push is returned as it is.
    """
    if len(keys) == 1:
        return keys[0], grads[0], shows[0], clicks[0]
    dim = grads[0].shape[1]
    # The counts ride as two more columns, so one vectorised pass sums all three.
    widened = np.concatenate([np.concatenate([g, s[:, None], c[:, None]], axis=1)
                              for g, s, c in zip(grads, shows, clicks, strict=True)])
    merged_keys, summed = sum_equal_keys(np.concatenate([keys_of(k) for k in keys]), widened)
    return (merged_keys, np.ascontiguousarray(summed[:, :dim]),
            np.ascontiguousarray(summed[:, dim]), np.ascontiguousarray(summed[:, dim + 1]))


def merge_pushes(keys: Sequence[np.ndarray | RoutedKeys], grads: Sequence[np.ndarray],
                 shows: Sequence[np.ndarray | None], clicks: Sequence[np.ndarray | None]
                 ) -> tuple[np.ndarray | RoutedKeys, np.ndarray, np.ndarray | None,
                            np.ndarray | None]:
    """Merge pushes of one table some of which may carry counts (a communicator's
    queue): :func:`merge_sparse` when none does (counts None, no extra cost), else
    :func:`merge_sparse_counts` with zero counts for the pushes without.

    Args:
        keys, grads: as :func:`merge_sparse`.
        shows, clicks: float32[N_i] or None per push (both or neither per push).

    Returns:
        (keys, grads, shows float32[U] or None, clicks float32[U] or None).
    """
    if all(s is None for s in shows):
        merged, summed = merge_sparse(keys, grads)
        return merged, summed, None, None
    def filled(counts: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        return [np.zeros(g.shape[0], np.float32) if c is None else c
                for c, g in zip(counts, grads, strict=True)]
    return merge_sparse_counts(keys, grads, filled(shows), filled(clicks))


def sum_equal_keys(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` (uint64[N], sorted on return) with the ``values``
    (float32[N, dim]) of equal keys summed: (uint64[U], float32[U, dim]).

    The sums are added in the order of ``keys``: ``summed[inverse[i]] += values[i]``
    by the native core's ``scatter_add`` (``psfleet.ps.table._core``), or by numpy's
    ``add.at`` under ``PSFLEET_TABLE_BACKEND=numpy`` (the reference, 2-3x slower):
    the same float32 results. Neither needs torch, so a sync server never imports it."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    summed = np.zeros((uniq.size, values.shape[1]), dtype=np.float32)
    if values.dtype == np.float32 and values.ndim == 2:
        _scatter_add()(summed, inverse.astype(np.int64, copy=False).reshape(-1),
                       np.ascontiguousarray(values))
    else:
        np.add.at(summed, inverse, values)
    return uniq, summed


@functools.cache
def _scatter_add() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """The backend's ``out[index[i]] += values[i]``, chosen once per process."""
    from psfleet.ps.table.backend import scatter_add_kernel

    return scatter_add_kernel()


def distinct_summed(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``keys`` (uint64[N]) made distinct, the ``values`` (float32[N, D]) of equal keys
    summed (:func:`sum_equal_keys`). Keys that are already distinct (the usual case)
    come back as they are; checking costs one sort of the keys (about 1 ms for 10^5)."""
    if keys.size < 2:
        return keys, values
    ordered = np.sort(keys)
    if not (ordered[1:] == ordered[:-1]).any():
        return keys, values
    return sum_equal_keys(keys, values)
