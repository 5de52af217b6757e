"""A server's table spreads every share's keys over all its internal shards (issue 41).

A key's share is ``bucket % shares`` (``psfleet.ps.routing``); its internal shard once
came from the same bucket (``bucket % num_shards``), so a server holding share s of S
used only the shards congruent to s modulo gcd(S, num_shards), and with them only that
part of its ``max_rows`` (measured: 0.475 of the cap kept at 2 shares).
"""

from __future__ import annotations

import numpy as np
import pytest

from psfleet.ps.routing import BucketRouter
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import RuleConfig, SparseTableConfig

pytestmark = pytest.mark.unit

SHARDS, BUCKETS, MAX_ROWS = 8, 4096, 803  # 803: the shards' caps differ (101, 100)


def _share_keys(rng: np.random.Generator, shares: int, share: int, n: int) -> np.ndarray:
    """``n`` distinct keys that the router sends to ``share`` of ``shares``."""
    router = BucketRouter(BUCKETS, shares)
    keys = np.unique(rng.integers(1, 2**63, size=n * shares * 2, dtype=np.uint64))
    mine = keys[router.split(keys)[share]]
    assert mine.size >= n
    return rng.permutation(mine)[:n]


@pytest.mark.parametrize("shares", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("eviction", ["lru", "lowest_score"])
def test_every_shard_serves_a_share_and_the_cap_is_met_exactly(shares: int,
                                                               eviction: str) -> None:
    table = SparseTable(SparseTableConfig(
        name="spread", dim=4, rule=RuleConfig(name="sgd", learning_rate=0.1),
        num_shards=SHARDS, num_buckets=BUCKETS,
        accessor={"name": "ctr", "max_rows": MAX_ROWS, "eviction": eviction,
                  "evict_batch_fraction": 0}))  # evict only what an insert needs
    rng = np.random.default_rng(shares)
    share = shares - 1  # the last share: not only share 0 is spread
    keys = _share_keys(rng, shares, share, 4 * MAX_ROWS)
    for batch in np.array_split(keys, 8):
        table.pull(batch)
    held = [len(shard.index) for shard in table.shards]
    caps = [MAX_ROWS // SHARDS + (1 if i < MAX_ROWS % SHARDS else 0) for i in range(SHARDS)]
    assert held == caps  # every shard full to its own cap
    assert len(table) == MAX_ROWS
    # The shard of a key does not depend on the share count: the same key, the same shard.
    np.testing.assert_array_equal(table.shard_of(keys), SparseTable(SparseTableConfig(
        name="other", dim=4, num_shards=SHARDS, num_buckets=64)).shard_of(keys))


def test_keys_of_one_share_fill_the_shards_evenly() -> None:
    """Without a cap, 2 shares' keys spread over 8 shards within a few percent."""
    table = SparseTable(SparseTableConfig(name="even", dim=2, num_shards=SHARDS,
                                          num_buckets=BUCKETS))
    keys = _share_keys(np.random.default_rng(5), 2, 0, 40_000)
    table.pull(keys)
    held = np.array([len(shard.index) for shard in table.shards])
    assert held.sum() == keys.size
    assert held.min() > 0.9 * keys.size / SHARDS and held.max() < 1.1 * keys.size / SHARDS
