"""Eviction: the rows a full shard gives up, chosen in one vectorised batch.

Policies (``AccessorConfig.eviction``):

- ``lowest_score``: the rows with the lowest CTR score (``psfleet.ps.table.accessor``), as
  Paddle's shrink ranks rows;
- ``lru``: the rows least recently pulled or pushed, by the table clock stamped on a
  row at each pull and push (``Shard.last_access``), as TorchRec's and HugeCTR's
  LRU-evicting embedding caches.

Ties are broken by ascending key, so the choice is a pure function of the rows'
keys and priorities (a reference model can repeat it). Cost: one pass over the
shard's rows (argpartition, O(rows)) per eviction batch; the shard evicts
``evict_batch_fraction`` of its cap beyond what an insert needs, so that pass runs
once per that many inserts.
"""

from __future__ import annotations

import numpy as np

__all__ = ["select_victims"]


def select_victims(priority: np.ndarray, candidates: np.ndarray, keys: np.ndarray,
                   n: int) -> np.ndarray:
    """The ``n`` candidates of lowest (priority, key).

    Args:
        priority (float32 or int64[C]): each candidate's priority (lower goes first).
        candidates (int64[C]): row numbers.
        keys (uint64[R]): the key of every row (indexed by row number; breaks ties).
        n: rows wanted, 0 <= n.

    Returns:
        int64[min(n, C)]: rows, in no particular order.
    """
    if n <= 0:
        return candidates[:0]
    if n >= candidates.size:
        return candidates
    threshold = priority[np.argpartition(priority, n - 1)[n - 1]]
    below = np.flatnonzero(priority < threshold)
    ties = np.flatnonzero(priority == threshold)
    need = n - below.size
    if need < ties.size:  # the smallest keys among the ties, O(ties) not a sort
        tie_keys = keys[candidates[ties]]
        ties = ties[np.argpartition(tie_keys, need - 1)[:need]]
    return candidates[np.concatenate([below, ties])]
