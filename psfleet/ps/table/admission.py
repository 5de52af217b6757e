"""Admission of new ids: which never-seen keys get a row.

A key without a row that a pull (``create=True``) or push names is a *sighting*. The
policy decides, per sighting, whether the key gets a row now; a key not admitted
reads its initializer values (not stored) and its gradient is dropped.

- ``none``: every sighting admits.
- ``probability`` (Paddle's ProbabilityEntry): admitted when
  ``u(key, admission_seed) < admit_probability``, u a uniform in [0, 1) derived from
  SplitMix64 of the key and seed. Unlike Paddle, which draws again at every sighting,
  the decision is a pure function of (key, seed): the same keys are admitted whatever
  the arrival order, the number of servers or a restart, so runs repeat exactly. A
  rejected key stays rejected; ``admit_probability`` is the fraction of the id space
  kept.
- ``count_filter`` (Paddle's CountFilterEntry): admitted at its ``admit_count``-th
  sighting (each request counts a key once). Pending counts live in a fixed
  direct-mapped table per shard (``pending_slots`` in all, split over the shards):
  slot = a hash of the key; a sighting of a key whose slot holds another key takes
  the slot and starts at 1. Memory is bounded by construction (16 bytes a slot);
  the price of the bound is that under heavy churn a rare id may lose its count to a
  colliding id, i.e. it is admitted later, never earlier. Within one request, keys
  sharing a slot are processed in ascending key order.
- ``show_click_score``: admitted once the score of the shows and clicks pushed for it
  (``(show - click) * nonclk_coeff + click * click_coeff``, Paddle's ShowClickScore,
  float32) summed over its pushes reaches ``admit_score``. The pending sums live in
  the same slot table as count_filter's (a float32 score per slot, same slot rule:
  a colliding key takes the slot and starts from its own push). Only pushes count:
  a push with shows and clicks adds their score; a push without them counts each
  occurrence of a key as show 1, click 0 (Paddle counts every feasign instance as
  one show). Pulls and GEO deltas add nothing and leave the slots alone, so with
  ``admit_score`` > 0 they never admit. The push that reaches the score is applied
  (gradient and counts) to the new row; the earlier pushes' gradients were dropped.
"""

from __future__ import annotations

import numpy as np

from psfleet.ps.hashing import mix64
from psfleet.ps.table.shard import Shard
from psfleet.ps.types import RESERVED_KEY, AccessorConfig

__all__ = ["admit", "probability_u", "pending_slot", "shard_pending_slots",
           "uses_pending_slots"]

_PROBABILITY_SALT = 0xD6E8FEB86659FD93
_SLOT_SALT = np.uint64(0xA0761D6478BD642F)


def probability_u(keys: np.ndarray, seed: int) -> np.ndarray:
    """float64[N] in [0, 1): the admission draw of ``keys`` (uint64[N]) for ``seed``."""
    salt = np.uint64((seed * _PROBABILITY_SALT + 1) % 2**64)
    with np.errstate(over="ignore"):
        bits = mix64(mix64(keys) ^ salt)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def pending_slot(hashes: np.ndarray, slots: int) -> np.ndarray:
    """int64[N]: the count-filter slot of keys with ``hashes`` = mix64(keys)."""
    return (mix64(hashes ^ _SLOT_SALT) % np.uint64(slots)).astype(np.int64)


def uses_pending_slots(config: AccessorConfig) -> bool:
    """Whether the policy keeps pending ids (count_filter, show_click_score)."""
    return config.admission in ("count_filter", "show_click_score")


def shard_pending_slots(config: AccessorConfig, num_shards: int) -> int:
    """Pending slots of each shard (0 unless the policy keeps pending ids)."""
    if not uses_pending_slots(config):
        return 0
    return -(-config.pending_slots // num_shards)


def admit(config: AccessorConfig, shard: Shard, keys: np.ndarray,
          hashes: np.ndarray, scores: np.ndarray | None = None) -> np.ndarray:
    """Which sighted keys get a row now; updates ``shard``'s pending counts.

    Args:
        config: the table's accessor config.
        shard: the keys' shard (its lock held).
        keys (uint64[M]): distinct keys without a row, ascending.
        hashes (uint64[M]): mix64(keys).
        scores (float32[M]): show_click_score: each key's pushed score in this
            request; None: not a push (a pull or a GEO delta).

    Returns:
        bool[M]: admitted.
    """
    if config.admission == "none":
        return np.ones(keys.size, dtype=bool)
    if config.admission == "probability":
        return probability_u(keys, config.admission_seed) < config.admit_probability
    if config.admission == "show_click_score":
        if scores is None:
            return np.full(keys.size, config.admit_score <= 0, dtype=bool)
        return _pending_filter(np.float32(config.admit_score), shard.pending_scores, shard,
                               keys, hashes, scores.astype(np.float32, copy=False))
    return _pending_filter(config.admit_count, shard.pending_counts, shard, keys, hashes,
                           np.ones(keys.size, dtype=np.int64))


def _pending_filter(needed: int | np.float32, sums: np.ndarray, shard: Shard,
                    keys: np.ndarray, hashes: np.ndarray, adds: np.ndarray) -> np.ndarray:
    """Add ``adds`` (int64 or float32[M]) to the keys' pending sums (``sums``, one per
    slot, same dtype); admitted where a sum reaches ``needed``."""
    slots = pending_slot(hashes, shard.pending_keys.size)
    order = np.argsort(slots, kind="stable")  # keys ascending within a slot
    s, k = slots[order], keys[order]
    first = np.ones(s.size, dtype=bool)
    first[1:] = s[1:] != s[:-1]
    last = np.ones(s.size, dtype=bool)
    last[:-1] = first[1:]
    # Only a slot's first key of the request can find itself there already.
    held = first & (shard.pending_keys[s] == k)
    a = adds[order]
    counts = np.where(held, sums[s] + a, a)
    admitted = counts >= needed
    # The last key of each slot is what the slot holds afterwards (nothing once admitted).
    w = np.flatnonzero(last)
    shard.pending_keys[s[w]] = np.where(admitted[w], np.uint64(RESERVED_KEY), k[w])
    sums[s[w]] = np.where(admitted[w], 0, counts[w])
    out = np.empty(keys.size, dtype=bool)
    out[order] = admitted
    return out
