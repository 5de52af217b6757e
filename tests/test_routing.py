"""Tests of psfleet.ps.routing and the key mixer it is built on."""

from __future__ import annotations

import numpy as np
import pytest

from psfleet.ps.hashing import mix64
from psfleet.ps.routing import BucketRouter, DenseLayout, bucket_of

pytestmark = pytest.mark.unit

_M64 = (1 << 64) - 1


def splitmix64_finaliser(x: int) -> int:
    """SplitMix64's output function in Python integers (Steele et al. 2014)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def test_mix64_is_splitmix64() -> None:
    # The first output of SplitMix64 seeded with 0 (Java's SplittableRandom).
    assert int(mix64(np.array([0x9E3779B97F4A7C15], np.uint64))[0]) == 0xE220A8397B1DCDAF
    keys = np.array([0, 1, 2, 12345, 2**63, 2**64 - 2, 2**64 - 1], np.uint64)
    assert mix64(keys).tolist() == [splitmix64_finaliser(int(k)) for k in keys]


def test_bucket_of_is_deterministic_and_per_key() -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**64 - 1, size=1000, dtype=np.uint64)
    keys_before = keys.copy()
    buckets = bucket_of(keys, 4096)
    assert np.array_equal(keys, keys_before)  # input untouched
    assert buckets.dtype == np.int64
    assert ((buckets >= 0) & (buckets < 4096)).all()
    assert np.array_equal(bucket_of(keys.copy(), 4096), buckets)
    # A key's bucket does not depend on the batch it comes in.
    assert np.array_equal(bucket_of(keys[::-1], 4096), buckets[::-1])
    assert all(bucket_of(keys[i:i + 1], 4096)[0] == buckets[i] for i in range(0, 1000, 97))
    assert buckets.tolist() == [splitmix64_finaliser(int(k)) % 4096 for k in keys]


@pytest.mark.parametrize("kind", ["random", "sequential"])
def test_keys_spread_evenly_over_servers(kind: str) -> None:
    rng = np.random.default_rng(1)
    n = 100_000
    keys = (rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64) if kind == "random"
            else np.arange(n, dtype=np.uint64))
    router = BucketRouter(num_buckets=4096, num_servers=4)
    parts = router.split(keys)
    shares = np.array([p.size for p in parts])
    assert shares.sum() == n
    assert (np.abs(shares - n / 4) <= 0.1 * n / 4).all(), shares
    # The buckets themselves are spread: none holds more than 3x its fair share.
    counts = np.bincount(bucket_of(keys, 4096), minlength=4096)
    assert counts.max() < 3 * n / 4096


def test_router_split_is_a_partition_following_the_bucket_map() -> None:
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 2**64 - 1, size=5000, dtype=np.uint64)
    router = BucketRouter(num_buckets=64, num_servers=3)
    parts = router.split(keys)
    assert len(parts) == 3
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(keys.size))
    for server, positions in enumerate(parts):
        assert (bucket_of(keys[positions], 64) % 3 == server).all()
        assert (np.diff(positions) > 0).all()  # order within a server is kept
    single = BucketRouter(num_buckets=64, num_servers=1).split(keys)
    assert len(single) == 1 and np.array_equal(single[0], np.arange(keys.size))


def test_dense_layout_round_robin_placement() -> None:
    sizes = [3, 5, 2, 7, 1]
    layout = DenseLayout(sizes, num_servers=3)
    assert layout.total == 18
    assert [(b.offset, b.size, b.server) for b in layout.blocks] == [
        (0, 3, 0), (3, 5, 1), (8, 2, 2), (10, 7, 0), (17, 1, 1)]
    assert [layout.server_size(s) for s in range(3)] == [10, 6, 2]

    flat = np.arange(18, dtype=np.float32) * 1.5
    parts = layout.scatter(flat)
    assert [p.tolist() for p in parts] == [
        (np.r_[0:3, 10:17] * 1.5).tolist(),
        (np.r_[3:8, 17:18] * 1.5).tolist(),
        (np.r_[8:10] * 1.5).tolist(),
    ]
    assert np.array_equal(layout.gather(parts), flat)
    out = np.zeros(18, np.float32)
    assert layout.gather(parts, out=out) is out
    assert np.array_equal(out, flat)


@pytest.mark.parametrize("num_servers", [1, 2, 4, 7])
def test_dense_layout_scatter_gather_round_trip(num_servers: int) -> None:
    rng = np.random.default_rng(num_servers)
    sizes = rng.integers(1, 50, size=5).tolist()
    layout = DenseLayout(sizes, num_servers)
    flat = rng.normal(size=layout.total).astype(np.float32)
    parts = layout.scatter(flat)
    assert len(parts) == num_servers
    assert [p.size for p in parts] == [layout.server_size(s) for s in range(num_servers)]
    assert sum(p.size for p in parts) == layout.total
    assert np.array_equal(layout.gather(parts), flat)
    if num_servers > len(sizes):
        assert layout.server_size(num_servers - 1) == 0  # more servers than blocks
