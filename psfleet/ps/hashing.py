"""Key mixing and the key-seeded row initializer.

``mix64`` is the finaliser of SplitMix64 (Steele, Lea & Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014; the constants of Java's
SplittableRandom). It is a bijection on uint64 whose output bits all depend on every
input bit, so ``mix64(key) % num_buckets`` spreads even sequential keys evenly and
the top bits can index a hash table independently of the bucket.
"""

from __future__ import annotations

import numpy as np

from psfleet.ps.types import Initializer

__all__ = ["mix64", "init_rows"]

_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31, _S40 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(40)


def mix64(keys: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser of each key.

    Args:
        keys (uint64[...]): keys; not modified.

    Returns:
        uint64[...]: mixed values, same shape.
    """
    z = keys.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> _S30
        z *= _C1
        z ^= z >> _S27
        z *= _C2
        z ^= z >> _S31
    return z


def _uniform01(keys: np.ndarray, dim: int, seed: int, stream: int) -> np.ndarray:
    """float64[N, dim] in [0, 1), a pure function of (key, column, seed, stream)."""
    with np.errstate(over="ignore"):
        base = mix64(keys ^ np.uint64((seed * 2 + stream) * 0x632BE59BD9B4E019 % 2**64))
        cols = (np.arange(1, dim + 1, dtype=np.uint64) * _GOLDEN)[None, :]
        bits = mix64(base[:, None] + cols)  # [N, dim]
    return (bits >> _S40).astype(np.float64) * (1.0 / (1 << 24))


def init_rows(keys: np.ndarray, dim: int, kind: Initializer, scale: float,
              seed: int) -> np.ndarray:
    """Initial values of the rows of ``keys``, a pure function of each key.

    Args:
        keys (uint64[N]): row keys.
        dim: floats per row.
        kind: ``uniform`` (in [-scale, scale]), ``normal`` (std ``scale``, by
            Box-Muller) or ``zeros``.
        scale: range or standard deviation.
        seed: table seed; changes every row.

    Returns:
        float32[N, dim].
    """
    n = keys.shape[0]
    if kind == "zeros" or scale == 0.0:
        return np.zeros((n, dim), dtype=np.float32)
    u1 = _uniform01(keys, dim, seed, 0)
    if kind == "uniform":
        return ((u1 * 2.0 - 1.0) * scale).astype(np.float32)
    u2 = _uniform01(keys, dim, seed, 1)
    normal = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    return (normal * scale).astype(np.float32)
