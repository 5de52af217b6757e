"""Tests of psfleet.ps.table.sparse_table, hash_index and the key-seeded initializer.

Oracle: a table's rows equal a reference dict (key -> float64 row updated by the
published formula) after random interleaved pulls and pushes.
"""

from __future__ import annotations

import numpy as np
import pytest

from psfleet.errors import RemoteError
from psfleet.ps.hashing import init_rows
from psfleet.ps.table.hash_index import HashIndex
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import RESERVED_KEY, RuleConfig, SparseTableConfig

pytestmark = pytest.mark.unit


class ReferenceRow:
    """One row and its rule state in float64 (SGD; Adagrad, Duchi et al. 2011; Adam,
    Kingma & Ba 2015 Algorithm 1 with a per-row step count)."""

    def __init__(self, config: RuleConfig, w: np.ndarray) -> None:
        self.c = config
        self.w = w.astype(np.float64)
        self.acc = np.full_like(self.w, config.initial_accumulator)
        self.m = np.zeros_like(self.w)
        self.v = np.zeros_like(self.w)
        self.t = 0

    def step(self, g: np.ndarray) -> None:
        c, g = self.c, g.astype(np.float64)
        if c.name == "sgd":
            self.w -= c.learning_rate * g
        elif c.name == "adagrad":
            self.acc += g * g
            self.w -= c.learning_rate * g / (np.sqrt(self.acc) + c.epsilon)
        else:
            self.t += 1
            self.m = c.beta1 * self.m + (1 - c.beta1) * g
            self.v = c.beta2 * self.v + (1 - c.beta2) * g * g
            m_hat = self.m / (1 - c.beta1 ** self.t)
            v_hat = self.v / (1 - c.beta2 ** self.t)
            self.w -= c.learning_rate * m_hat / (np.sqrt(v_hat) + c.epsilon)


RULES = {
    "sgd": RuleConfig(name="sgd", learning_rate=0.05),
    "adagrad": RuleConfig(name="adagrad", learning_rate=0.05, initial_accumulator=0.01),
    "adam": RuleConfig(name="adam", learning_rate=0.01),
}


def _key_pool(rng: np.random.Generator, n: int) -> np.ndarray:
    """Distinct keys: small ones, huge ones (>= 2^63) and 2^64-2 next to the reserved key."""
    small = np.arange(n // 4, dtype=np.uint64)
    big = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=False)
    top = np.array([2**63, 2**64 - 2], dtype=np.uint64)
    return np.unique(np.concatenate([small, big, top]))


@pytest.mark.parametrize("num_shards", [1, 8])
@pytest.mark.parametrize("dim", [1, 9, 64])
@pytest.mark.parametrize("rule_name", sorted(RULES))
def test_rows_equal_reference_dict_after_random_pulls_and_pushes(
        rule_name: str, dim: int, num_shards: int) -> None:
    rule = RULES[rule_name]
    config = SparseTableConfig(name="emb", dim=dim, rule=rule, initializer="uniform",
                               initial_range=0.5, seed=7, num_buckets=64,
                               num_shards=num_shards)
    table = SparseTable(config)
    ref: dict[int, ReferenceRow] = {}
    rng = np.random.default_rng(dim * 100 + num_shards)
    pool = _key_pool(rng, 150)

    def ref_row(key: int) -> ReferenceRow:
        if key not in ref:
            init = init_rows(np.array([key], np.uint64), dim, "uniform", 0.5, 7)[0]
            ref[key] = ReferenceRow(rule, init)
        return ref[key]

    pushes = 0
    for _ in range(40):
        batch = rng.choice(pool, size=int(rng.integers(1, 120)))  # many duplicates
        if rng.random() < 0.5:
            values = table.pull(batch)
            expected = np.stack([ref_row(int(k)).w for k in batch])
            np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-6)
        else:
            keys = np.unique(batch)  # a push carries distinct keys
            rng.shuffle(keys)
            grads = rng.normal(0.0, 1.0, size=(keys.size, dim)).astype(np.float32)
            table.push(keys, grads)
            for k, g in zip(keys, grads, strict=True):
                ref_row(int(k)).step(g)
            pushes += 1
    assert pushes > 5

    keys, rows = table.items()
    assert keys.dtype == np.uint64
    assert keys.tolist() == sorted(ref)
    assert len(table) == len(ref)
    expected = np.stack([ref[int(k)].w for k in keys])
    np.testing.assert_allclose(rows[:, :dim], expected, rtol=1e-5, atol=1e-6)
    assert rows.shape[1] == dim + table.state_width


def _random_distinct_keys(rng: np.random.Generator, n: int, exclude: set[int]) -> np.ndarray:
    keys = np.unique(rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64))
    return np.array([k for k in keys.tolist() if k not in exclude], dtype=np.uint64)


def test_hash_index_agrees_with_dict_through_growth() -> None:
    rng = np.random.default_rng(5)
    index = HashIndex(capacity=16)
    ref: dict[int, int] = {}
    start_bytes = index.memory_bytes
    batches = [np.arange(1000, dtype=np.uint64),  # sequential keys collide in low bits only
               np.arange(2**63, 2**63 + 1000, dtype=np.uint64)]
    batches += [_random_distinct_keys(rng, 20_000, set()) for _ in range(10)]
    for batch in batches:
        batch = np.array([k for k in batch.tolist() if k not in ref], dtype=np.uint64)
        rows = index.insert_new(batch)
        assert rows.tolist() == list(range(len(ref), len(ref) + batch.size))
        ref.update(zip(batch.tolist(), rows.tolist(), strict=True))
        assert len(index) == len(ref)
        # Present keys (a sample of all inserted so far) and absent keys.
        present = rng.choice(np.fromiter(ref, dtype=np.uint64, count=len(ref)), size=3000)
        absent = _random_distinct_keys(rng, 3000, set(ref))
        assert index.lookup(present).tolist() == [ref[k] for k in present.tolist()]
        assert (index.lookup(absent) == -1).all()
    assert len(ref) > 190_000
    assert index.memory_bytes > start_bytes * 1000  # it grew
    keys, rows = index.items()
    assert rows.tolist() == list(range(len(ref)))
    assert keys.tolist() == list(ref)  # dict order is insertion order
    assert index.lookup(np.zeros(0, dtype=np.uint64)).shape == (0,)


def test_initial_values_depend_only_on_the_key() -> None:
    rng = np.random.default_rng(6)
    keys = _key_pool(rng, 2000)

    def table(num_shards: int = 8) -> SparseTable:
        return SparseTable(SparseTableConfig(name="e", dim=6, initializer="uniform",
                                             initial_range=0.1, seed=3,
                                             num_shards=num_shards))

    in_order = table().pull(keys)

    perm = rng.permutation(keys.size)
    shuffled_table = table(num_shards=1)
    shuffled = np.empty_like(in_order)
    for part in np.array_split(perm, 5):  # other order, other batch splits
        shuffled[part] = shuffled_table.pull(keys[part])
    assert np.array_equal(shuffled, in_order)

    peek_table = table()
    peeked = peek_table.pull(keys, create=False)
    assert np.array_equal(peeked, in_order)
    assert len(peek_table) == 0  # create=False stores nothing

    # Pulling the same keys again (now stored) returns the same values.
    twice = table()
    twice.pull(keys[::2])
    assert np.array_equal(twice.pull(keys), in_order)
    assert len(twice) == keys.size

    # Another seed gives other values; the values do vary between keys and columns.
    other_seed = SparseTable(SparseTableConfig(name="e", dim=6, initial_range=0.1, seed=4))
    assert not np.array_equal(other_seed.pull(keys), in_order)
    assert np.unique(in_order).size > 0.99 * in_order.size


def test_uniform_initial_values_fill_the_range() -> None:
    r = 0.25
    keys = np.arange(10_000, dtype=np.uint64) * np.uint64(7919)
    values = init_rows(keys, 10, "uniform", r, seed=0)  # 100k values
    assert values.dtype == np.float32 and values.shape == (10_000, 10)
    assert values.min() >= -r and values.max() <= r
    assert values.min() < -0.99 * r and values.max() > 0.99 * r
    assert abs(values.mean()) < 0.01 * r
    assert values.std() == pytest.approx(r / np.sqrt(3), rel=0.02)


def test_normal_initial_values_have_std_r() -> None:
    r = 0.3
    keys = np.arange(10_000, dtype=np.uint64)
    values = init_rows(keys, 10, "normal", r, seed=1).astype(np.float64)
    assert abs(values.mean()) < 0.02 * r
    assert values.std() == pytest.approx(r, rel=0.02)
    assert np.mean(np.abs(values) < r) == pytest.approx(0.6827, abs=0.01)
    assert np.isfinite(values).all()


def test_zeros_initializer() -> None:
    table = SparseTable(SparseTableConfig(name="z", dim=5, initializer="zeros",
                                          initial_range=0.5))
    keys = np.array([1, 2, 2**63 + 5], np.uint64)
    assert np.array_equal(table.pull(keys), np.zeros((3, 5), np.float32))
    assert np.array_equal(init_rows(keys, 5, "uniform", 0.0, 0), np.zeros((3, 5), np.float32))


def test_reserved_key_is_rejected() -> None:
    table = SparseTable(SparseTableConfig(name="emb", dim=2))
    keys = np.array([1, RESERVED_KEY], np.uint64)
    with pytest.raises(RemoteError, match="reserved"):
        table.pull(keys)
    with pytest.raises(RemoteError, match="'emb'.*reserved"):
        table.push(keys, np.zeros((2, 2), np.float32))
    assert len(table) == 0  # nothing half-inserted


@pytest.mark.parametrize("shape", [(3, 5), (2, 4), (4, 4), (12,)])
def test_push_with_wrong_gradient_shape_raises(shape: tuple[int, ...]) -> None:
    table = SparseTable(SparseTableConfig(name="emb", dim=4))
    with pytest.raises(RemoteError, match=r"'emb'.*expected \(3, 4\)"):
        table.push(np.array([1, 2, 3], np.uint64), np.zeros(shape, np.float32))
