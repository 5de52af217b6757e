"""Tests of HashIndex.remove: removal without tombstones and reuse of freed rows.

Oracle: a plain dict key -> row driven by the same random inserts and removals; after
every step the index finds exactly the dict's keys at the dict's rows, and the rows
it hands out never exceed the most keys ever held at once.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psfleet.ps.table.hash_index import HashIndex

pytestmark = pytest.mark.unit


def distinct_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct random uint64 keys below 2^63 (never the reserved key)."""
    keys = np.unique(rng.integers(0, 2**63, size=2 * n + 16, dtype=np.uint64))
    return rng.permutation(keys)[:n]


def _check(index: HashIndex, model: dict[int, int], universe: np.ndarray) -> None:
    rows = index.lookup(universe)
    expected = np.array([model.get(int(k), -1) for k in universe], dtype=np.int64)
    np.testing.assert_array_equal(rows, expected)
    assert len(index) == len(model)
    keys, held = index.items()
    assert dict(zip(keys.tolist(), held.tolist(), strict=True)) == model


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 12),
       key_space=st.sampled_from([8, 64, 5000]))
def test_random_inserts_and_removals_match_a_dict(seed: int, rounds: int,
                                                  key_space: int) -> None:
    rng = np.random.default_rng(seed)
    universe = distinct_keys(rng, key_space)
    index, model, peak = HashIndex(capacity=16), {}, 0
    for _ in range(rounds):
        batch = rng.choice(universe, size=rng.integers(1, key_space + 1))
        new = np.unique(batch[index.lookup(batch) < 0])
        rows = index.insert_new(new)
        model.update(zip(new.tolist(), rows.tolist(), strict=True))
        assert len(set(model.values())) == len(model)  # rows are distinct
        peak = max(peak, len(model))
        assert index.row_limit == peak  # freed rows are reused before new ones
        gone = rng.choice(universe, size=rng.integers(0, key_space + 1))  # repeats, absent
        removed = index.remove(gone)
        expected_first = {}
        for i, k in enumerate(gone.tolist()):
            if k in model and k not in expected_first:
                expected_first[k] = i
        want = np.full(gone.size, -1, dtype=np.int64)
        for k, i in expected_first.items():
            want[i] = model.pop(k)
        np.testing.assert_array_equal(removed, want)
        _check(index, model, universe)


def test_remove_everything_then_reinsert_reuses_rows() -> None:
    keys = np.arange(1, 10_001, dtype=np.uint64)
    index = HashIndex()
    index.insert_new(keys)
    removed = index.remove(keys[::-1])
    assert sorted(removed.tolist()) == list(range(10_000))
    assert len(index) == 0
    np.testing.assert_array_equal(index.lookup(keys), np.full(10_000, -1))
    rows = index.insert_new(keys[:100] + np.uint64(10**9))
    assert len(set(rows.tolist())) == 100 and rows.max() < 10_000  # from the free list
    assert index.row_limit == 10_000


def test_churn_keeps_slots_and_rows_bounded() -> None:
    """10^5 keys streamed through an index held at 2,000 keys (2,500 just before each
    removal): the slot array and the row numbers stay at the size 2,500 keys need."""
    rng = np.random.default_rng(3)
    stream = distinct_keys(rng, 100_000)
    index = HashIndex()
    for i in range(0, stream.size, 500):
        index.insert_new(stream[i:i + 500])
        if len(index) > 2_000:
            index.remove(stream[max(0, i - 2_000):i - 1_500])
    assert len(index) <= 2_000
    assert index.row_limit <= 2_500
    assert index.memory_bytes <= 16 * 8192 + 8 * 2_500
    held, _ = index.items()
    np.testing.assert_array_equal(np.sort(held), np.sort(stream[-len(index):]))
