"""Tests of the sparse table's row lifecycle (issue 17): CTR statistics, admission,
the row cap with eviction, shrink and aging.

Oracle: a reference model, plain Python dicts (per internal shard: key -> [row,
show, click, unseen_days, delta_score, last_access]) updated one key at a time by the
rules as documented in psfleet.ps.table.lifecycle / admission / eviction / accessor, driven
by the same random stream of pulls, pushes, shrinks and agings as the table. With
SGD, a power-of-two learning rate and gradients, shows and clicks that are small
multiples of 1/8, every sum is exact in float32, so the surviving keys, values,
statistics and counters must agree exactly.
"""

from __future__ import annotations

import numpy as np
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psfleet.ps.hashing import init_rows, mix64
from psfleet.ps.table.admission import pending_slot, probability_u, shard_pending_slots
from psfleet.ps.table.lifecycle import LifecycleCounts, shard_caps
from psfleet.ps.table.shard import Shard
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import AccessorConfig, RuleConfig, SparseTableConfig

pytestmark = pytest.mark.unit

F = np.float32
DIM = 3
LR = 0.5


class Model:
    """The reference: the table's documented behaviour, one key at a time."""

    def __init__(self, table: SparseTable) -> None:
        self.table = table
        self.cfg = table.config
        self.a = table.config.accessor
        n = table.config.num_shards
        self.shards: list[dict[int, list]] = [{} for _ in range(n)]
        self.caps = shard_caps(self.a.max_rows, n)
        slots = shard_pending_slots(self.a, n)
        self.slots = slots
        self.pending: list[dict[int, tuple[int, int]]] = [{} for _ in range(n)]
        self.clock = 0
        self.counts = [0, 0, 0, 0]

    def _init(self, key: int) -> np.ndarray:
        c = self.cfg
        return init_rows(np.array([key], dtype=np.uint64), DIM, c.initializer,
                         c.initial_range, c.seed)[0]

    def _shard(self, key: int) -> int:
        return int(self.table.shard_of(np.array([key], dtype=np.uint64))[0])

    def _score(self, r: list) -> np.float32:
        return (r[1] - r[2]) * F(self.a.nonclk_coeff) + r[2] * F(self.a.click_coeff)

    def _admitted(self, s: int, key: int) -> bool:
        a = self.a
        if a.admission == "none":
            return True
        if a.admission == "probability":
            u = probability_u(np.array([key], dtype=np.uint64), a.admission_seed)[0]
            return bool(u < a.admit_probability)
        slot = int(pending_slot(mix64(np.array([key], dtype=np.uint64)), self.slots)[0])
        held_key, count = self.pending[s].get(slot, (-1, 0))
        count = count + 1 if held_key == key else 1
        if count >= a.admit_count:
            self.pending[s].pop(slot, None)
            return True
        self.pending[s][slot] = (key, count)
        return False

    def _insert(self, s: int, new: list[int], protected: set[int], admission: bool) -> None:
        rows = self.shards[s]
        ok = [k for k in sorted(new) if not admission or self._admitted(s, k)]
        rejected = len(new) - len(ok)
        cap = self.caps[s]
        if cap is not None and len(rows) + len(ok) > cap:
            over = len(rows) + len(ok) - cap
            evictable = len(rows) - len(protected)
            if over > evictable:
                keep = len(ok) - (over - evictable)
                rejected += len(ok) - keep
                ok = ok[:keep]
                over = evictable
            n = min(evictable, over + int(cap * self.a.evict_batch_fraction))
            cands = [k for k in rows if k not in protected]
            if self.a.eviction == "lru":
                cands.sort(key=lambda k: (rows[k][5], k))
            else:
                cands.sort(key=lambda k: (self._score(rows[k]), k))
            for k in cands[:n]:
                del rows[k]
            self.counts[2] += min(n, len(cands))
        for k in ok:
            rows[k] = [self._init(k), F(0), F(0), F(0), F(0), self.clock]
        self.counts[0] += len(ok)
        self.counts[1] += rejected

    def _rows(self, keys: list[int], create: bool, admission: bool = True) -> None:
        """Create what the request creates, shard by shard (distinct keys)."""
        by_shard: dict[int, list[int]] = {}
        for k in dict.fromkeys(keys):
            by_shard.setdefault(self._shard(k), []).append(k)
        for s, ks in by_shard.items():
            present = {k for k in ks if k in self.shards[s]}
            if create:
                self._insert(s, [k for k in ks if k not in present], present, admission)

    def pull(self, keys: list[int], create: bool) -> np.ndarray:
        self.clock += 1
        self._rows(keys, create)
        out = []
        for k in keys:
            row = self.shards[self._shard(k)].get(k)
            out.append(self._init(k) if row is None else row[0])
            if row is not None:
                row[5] = self.clock
        return np.array(out, dtype=np.float32).reshape(len(keys), DIM)

    def push(self, keys: list[int], grads: np.ndarray, shows: np.ndarray,
             clicks: np.ndarray) -> None:
        self.clock += 1
        merged: dict[int, list] = {}
        for k, g, sh, cl in zip(keys, grads, shows, clicks, strict=True):
            if k in merged:
                merged[k] = [merged[k][0] + g, merged[k][1] + sh, merged[k][2] + cl]
            else:
                merged[k] = [g.copy(), F(sh), F(cl)]
        self._rows(list(merged), True)
        for k, (g, sh, cl) in merged.items():
            row = self.shards[self._shard(k)].get(k)
            if row is None:
                continue  # not admitted: dropped
            row[0] = row[0] - F(LR) * g
            if self.a.name == "ctr":
                row[1], row[2], row[3] = row[1] + sh, row[2] + cl, F(0)
                row[4] = row[4] + self._score([None, sh, cl])
            row[5] = self.clock

    def shrink(self) -> int:
        if self.a.name != "ctr":
            return 0
        deleted = 0
        for rows in self.shards:
            for k in list(rows):
                r = rows[k]
                r[1], r[2] = r[1] * F(self.a.show_click_decay_rate), \
                    r[2] * F(self.a.show_click_decay_rate)
                if self._score(r) < F(self.a.delete_threshold) or \
                        r[3] > F(self.a.delete_after_unseen_days):
                    del rows[k]
                    deleted += 1
        self.counts[3] += deleted
        return deleted

    def age(self) -> None:
        if self.a.name == "ctr":
            for rows in self.shards:
                for r in rows.values():
                    r[3] = r[3] + F(1)

    def check(self) -> None:
        keys, rows = self.table.items()
        merged = {k: r for shard in self.shards for k, r in shard.items()}
        assert sorted(merged) == keys.tolist()
        want = np.array([merged[k][0] for k in keys.tolist()], dtype=np.float32)
        np.testing.assert_array_equal(rows[:, :DIM], want.reshape(-1, DIM))
        if self.a.name == "ctr":
            skeys, stats = self.table.stats_items()
            assert skeys.tolist() == keys.tolist()
            want_stats = np.array([merged[k][1:5] for k in keys.tolist()], dtype=np.float32)
            np.testing.assert_array_equal(stats, want_stats.reshape(-1, 4))
        # A table without a lifecycle counts nothing (its plain path is untouched).
        want_counts = LifecycleCounts(*self.counts) if self.a.active else LifecycleCounts()
        assert self.table.lifecycle_counts() == want_counts
        for s, cap in enumerate(self.caps):
            assert cap is None or len(self.shards[s]) <= cap


def make_table(num_shards: int = 1, **accessor: object) -> SparseTable:
    return SparseTable(SparseTableConfig(
        name="t", dim=DIM, rule=RuleConfig(name="sgd", learning_rate=LR),
        num_shards=num_shards, num_buckets=64, accessor=AccessorConfig(**accessor)))


def eighths(rng: np.random.Generator, shape: tuple[int, ...], high: int = 16) -> np.ndarray:
    """Small multiples of 1/8 (exact float32 sums)."""
    return (rng.integers(0, high, size=shape) / 8).astype(np.float32)


def run_stream(table: SparseTable, seed: int, steps: int, universe: int) -> Model:
    model = Model(table)
    rng = np.random.default_rng(seed)
    space = np.unique(rng.integers(0, 2**63, size=universe * 2, dtype=np.uint64))[:universe]
    for _ in range(steps):
        op = rng.choice(["pull", "pull_nocreate", "push", "shrink", "age"],
                        p=[0.35, 0.1, 0.4, 0.05, 0.1])
        keys = rng.choice(space, size=int(rng.integers(1, 12)))  # repeats allowed
        if op in ("pull", "pull_nocreate"):
            create = op == "pull"
            np.testing.assert_array_equal(table.pull(keys, create=create),
                                          model.pull(keys.tolist(), create))
        elif op == "push":
            grads = eighths(rng, (keys.size, DIM)) - np.float32(1)
            shows = eighths(rng, (keys.size,))
            clicks = np.minimum(shows, eighths(rng, (keys.size,)))
            table.push(keys, grads, shows, clicks)
            model.push(keys.tolist(), grads, shows, clicks)
        elif op == "shrink":
            assert table.shrink() == model.shrink()
        else:
            table.age_one_day()
            model.age()
        model.check()
    return model


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1),
       num_shards=st.sampled_from([1, 3]),
       name=st.sampled_from(["none", "ctr"]),
       admission=st.sampled_from(["none", "probability", "count_filter"]),
       max_rows=st.sampled_from([None, 1, 4, 12]),
       eviction=st.sampled_from(["lru", "lowest_score"]),
       fraction=st.sampled_from([0.0, 0.25]))
def test_random_streams_match_the_reference_model(
        seed: int, num_shards: int, name: str, admission: str, max_rows: int | None,
        eviction: str, fraction: float) -> None:
    if eviction == "lowest_score" and name != "ctr":
        eviction = "lru"
    table = make_table(
        num_shards, name=name, admission=admission, admit_probability=0.6,
        admit_count=2, pending_slots=5, admission_seed=seed % 7, max_rows=max_rows,
        eviction=eviction, evict_batch_fraction=fraction, delete_threshold=0.5,
        delete_after_unseen_days=2, show_click_decay_rate=0.5)
    run_stream(table, seed, steps=40, universe=30)


def test_a_fixed_stream_exercises_every_rule() -> None:
    """The oracle stream is not vacuous: admission rejects, the cap evicts and shrink
    deletes, and the model still agrees."""
    table = make_table(3, name="ctr", admission="count_filter", admit_count=2,
                       pending_slots=8, max_rows=6, eviction="lowest_score",
                       evict_batch_fraction=0.25, delete_threshold=0.5,
                       delete_after_unseen_days=2, show_click_decay_rate=0.5)
    model = run_stream(table, seed=11, steps=300, universe=40)
    counts = table.lifecycle_counts()
    assert min(counts.admitted, counts.rejected, counts.evicted, counts.deleted) > 0
    assert counts == LifecycleCounts(*model.counts)


def test_cap_of_one_row_keeps_the_most_recent_key() -> None:
    table = make_table(max_rows=1, eviction="lru")
    keys = np.array([5, 7, 9], dtype=np.uint64)
    first = table.pull(keys[:1])
    table.pull(keys[1:2])
    np.testing.assert_array_equal(table.items()[0], keys[1:2])
    # A request bringing 2 new keys into a full shard of 1: the smallest is admitted.
    table.pull(keys[[2, 0]])
    np.testing.assert_array_equal(table.items()[0], keys[:1])
    np.testing.assert_array_equal(table.items()[1][:, :DIM], first)
    assert table.lifecycle_counts() == LifecycleCounts(admitted=3, rejected=1, evicted=2)
    # A key already held is protected from its own request's eviction.
    table.push(keys[[0, 1]], np.ones((2, DIM), dtype=np.float32))
    np.testing.assert_array_equal(table.items()[0], keys[:1])
    np.testing.assert_array_equal(table.items()[1][:, :DIM], first - np.float32(LR))


def test_all_admitted_equals_the_plain_table() -> None:
    rng = np.random.default_rng(4)
    plain, admitted = make_table(3), make_table(3, admission="probability",
                                                admit_probability=1.0)
    for _ in range(20):
        keys = rng.integers(0, 1000, size=64).astype(np.uint64)
        grads = eighths(rng, (64, DIM))
        np.testing.assert_array_equal(plain.pull(keys), admitted.pull(keys))
        plain.push(keys, grads)
        admitted.push(keys, grads)
    for a, b in zip(plain.items(), admitted.items(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert admitted.lifecycle_counts().admitted == len(plain)


def test_none_admitted_stores_nothing_and_drops_gradients() -> None:
    table = make_table(2, name="ctr", admission="probability", admit_probability=0.0)
    keys = np.arange(1, 101, dtype=np.uint64)
    initial = init_rows(keys, DIM, "uniform", 0.01, 0)
    np.testing.assert_array_equal(table.pull(keys), initial)
    table.push(keys, np.ones((100, DIM), dtype=np.float32), np.ones(100, np.float32))
    np.testing.assert_array_equal(table.pull(keys), initial)
    assert len(table) == 0
    assert table.lifecycle_counts() == LifecycleCounts(rejected=300)


def test_probability_admission_is_a_pure_function_of_key_and_seed() -> None:
    keys = np.arange(1, 20_001, dtype=np.uint64)
    chosen = []
    for shards in (1, 5):
        table = make_table(shards, admission="probability", admit_probability=0.3,
                           admission_seed=9)
        table.pull(keys[::-1])
        chosen.append(table.items()[0])
    np.testing.assert_array_equal(chosen[0], chosen[1])
    assert abs(chosen[0].size / keys.size - 0.3) < 0.02
    other = make_table(admission="probability", admit_probability=0.3, admission_seed=10)
    other.pull(keys)
    assert not np.array_equal(other.items()[0], chosen[0])


def test_count_filter_admits_at_the_nth_sighting() -> None:
    table = make_table(admission="count_filter", admit_count=3, pending_slots=1024)
    key = np.array([42], dtype=np.uint64)
    table.pull(key)
    table.push(key, np.ones((1, DIM), dtype=np.float32))  # dropped: 2nd sighting
    assert len(table) == 0
    table.pull(key)  # 3rd sighting: admitted, initial values
    np.testing.assert_array_equal(table.items()[1][:, :DIM],
                                  init_rows(key, DIM, "uniform", 0.01, 0))
    assert table.lifecycle_counts() == LifecycleCounts(admitted=1, rejected=2)


def test_count_filter_memory_is_fixed_whatever_the_stream() -> None:
    table = make_table(4, admission="count_filter", admit_count=2, pending_slots=4096)
    before = table.memory_bytes
    table.pull(np.arange(1, 200_001, dtype=np.uint64), create=True)
    assert len(table) == 0 and table.memory_bytes == before
    assert before >= 4096 * 16


def test_duplicate_keys_in_one_push_sum_gradients_shows_and_clicks() -> None:
    table = make_table(name="ctr")
    keys = np.array([3, 3, 8, 3], dtype=np.uint64)
    start = table.pull(np.array([3, 8], dtype=np.uint64))
    grads = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]], dtype=np.float32)
    table.push(keys, grads, np.array([1, 2, 3, 4], np.float32),
               np.array([1, 0, 1, 1], np.float32))
    k, rows = table.items()
    np.testing.assert_array_equal(k, [3, 8])
    np.testing.assert_array_equal(rows[:, :DIM], start - np.float32(LR) * np.array(
        [[2, 2, 1], [0, 0, 1]], np.float32))
    _, stats = table.stats_items()
    # show, click, unseen_days, delta_score = (show - click) * 0.1 + click * 1.0
    np.testing.assert_allclose(stats, [[7, 2, 0, 5 * 0.1 + 2], [3, 1, 0, 2 * 0.1 + 1]],
                               rtol=1e-6)


def test_shrink_decays_then_deletes_by_score_and_unseen_days() -> None:
    table = make_table(name="ctr", delete_threshold=0.8, delete_after_unseen_days=1,
                       show_click_decay_rate=0.5)
    keys = np.array([1, 2, 3], dtype=np.uint64)
    table.pull(keys)
    # Scores after decay by 0.5: key 1: (10-0)*0.5*0.1 = 0.5 < 0.8 (deleted);
    # key 2: (4-2)*0.5*0.1 + 2*0.5 = 1.1 (kept); key 3: same counts, unseen 2 days.
    table.push(keys, np.zeros((3, DIM), np.float32), np.array([10, 4, 4], np.float32),
               np.array([0, 2, 2], np.float32))
    table.age_one_day()
    table.push(keys[:2], np.zeros((2, DIM), np.float32))  # resets unseen_days of 1, 2
    table.age_one_day()
    assert table.shrink() == 2
    k, stats = table.stats_items()
    np.testing.assert_array_equal(k, [2])
    np.testing.assert_allclose(stats, [[2, 1, 1, 0.2 + 2]], rtol=1e-6)
    assert table.lifecycle_counts().deleted == 2


def test_lowest_score_eviction_keeps_the_best_rows() -> None:
    table = make_table(name="ctr", max_rows=3, eviction="lowest_score")
    keys = np.array([10, 20, 30], dtype=np.uint64)
    table.pull(keys)
    table.push(keys, np.zeros((3, DIM), np.float32), np.array([5, 1, 9], np.float32),
               np.array([1, 0, 0], np.float32))  # scores 1.4, 0.1, 0.9
    table.pull(np.array([40], dtype=np.uint64))
    np.testing.assert_array_equal(table.items()[0], [10, 30, 40])


def test_lru_eviction_in_one_batch_with_slack() -> None:
    table = make_table(max_rows=10, eviction="lru", evict_batch_fraction=0.3)
    for k in range(10):
        table.pull(np.array([k + 1], dtype=np.uint64))
    table.pull(np.array([1, 2], dtype=np.uint64))  # 1 and 2 are now the most recent
    table.pull(np.array([100], dtype=np.uint64))  # evicts 1 + 3 of slack: 3, 4, 5, 6
    np.testing.assert_array_equal(table.items()[0], [1, 2, 7, 8, 9, 10, 100])
    assert table.lifecycle_counts().evicted == 4


def test_streaming_many_new_ids_keeps_rows_and_memory_under_the_cap() -> None:
    table = make_table(4, max_rows=5_000, eviction="lru")
    rng = np.random.default_rng(0)
    for i in range(40):
        keys = np.arange(i * 2_000, (i + 1) * 2_000, dtype=np.uint64) + np.uint64(1)
        table.pull(keys)
        table.push(keys, eighths(rng, (keys.size, DIM)))
        assert len(table) <= 5_000
    table.pull(np.arange(10**6, 10**6 + 20_000, dtype=np.uint64))
    # Requests of 20,000 new keys into shards of 1,250 rows: each shard fills to its
    # cap (the excess is rejected), and never holds more row arrays than that.
    assert [s.index.row_limit for s in table._shards] == [s.cap for s in table._shards]
    assert all(s.data.shape[0] == s.cap for s in table._shards)
    held = table.memory_bytes
    table.pull(np.arange(2 * 10**6, 2 * 10**6 + 20_000, dtype=np.uint64))
    assert table.memory_bytes == held  # freed rows and slots are reused
    counts = table.lifecycle_counts()
    assert counts.rejected == 30_000 and counts.admitted == 90_000
    assert counts.evicted == counts.admitted - len(table) and len(table) == 5_000


def test_default_accessor_keeps_the_plain_table() -> None:
    table = make_table(2)
    assert table._life is None
    table.pull(np.arange(1, 1001, dtype=np.uint64))
    assert table.memory_bytes == sum(s.index.row_limit * s.data.shape[1] * 4
                                     + s.index.memory_bytes for s in table._shards)
    assert table.shrink() == 0 and table.lifecycle_counts() == LifecycleCounts()


def test_items_load_and_stats_round_trip_into_a_new_table() -> None:
    source = make_table(3, name="ctr", max_rows=50, eviction="lowest_score")
    run_stream(source, seed=5, steps=60, universe=80)
    keys, rows = source.items()
    skeys, stats = source.stats_items()
    # Into another shard count (the per-shard caps of max_rows=50 would split the
    # rows differently, so the target has no cap).
    target = make_table(2, name="ctr")
    target.load(keys, rows)
    target.load_stats(skeys, stats)
    for a, b in zip(source.items() + source.stats_items(),
                    target.items() + target.stats_items(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_persist_round_trips_a_lifecycle_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from psfleet.ps.persist import load_server, save_server

    source = make_table(3, name="ctr", admission="count_filter", admit_count=2,
                        max_rows=40, eviction="lru")
    run_stream(source, seed=8, steps=80, universe=60)
    save_server({0: source}, tmp_path, 0, {})
    target = make_table(3, name="ctr", admission="count_filter", admit_count=2,
                        max_rows=40, eviction="lru")
    load_server({0: target}, tmp_path, 0, 1, {})
    for a, b in zip(source.items(), target.items(), strict=True):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize(("field", "value"), [
    ("delete_threshold", -1.0), ("delete_after_unseen_days", -2.0),
    ("nonclk_coeff", float("nan")), ("click_coeff", float("inf")),
    ("admission", "sometimes"), ("eviction", "lfu"), ("admit_probability", 1.5),
    ("admit_count", 0), ("max_rows", 0), ("evict_batch_fraction", 0.9), ("name", "ctr2"),
])
def test_bad_accessor_configs_name_the_field(field: str, value: object) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        SparseTableConfig(name="t", dim=2, accessor={field: value})
    assert f"accessor.{field}" in str(info.value)


def test_lowest_score_needs_the_ctr_accessor() -> None:
    with pytest.raises(pydantic.ValidationError, match="accessor.eviction.*'ctr'"):
        SparseTableConfig(name="t", dim=2, accessor={"max_rows": 5,
                                                      "eviction": "lowest_score"})


def test_update_stats_counts_existing_rows_only() -> None:
    table = make_table(name="ctr")
    held = np.array([4, 6], dtype=np.uint64)
    table.pull(held)
    table.age_one_day()
    before = table.items()
    table.update_stats(np.array([4, 9, 4], dtype=np.uint64), np.array([2, 5, 1], np.float32),
                       np.array([1, 5, 0], np.float32))
    for a, b in zip(before, table.items(), strict=True):  # values untouched, no row for 9
        np.testing.assert_array_equal(a, b)
    _, stats = table.stats_items()
    np.testing.assert_allclose(stats, [[3, 1, 0, 2 * 0.1 + 1], [0, 0, 1, 0]], rtol=1e-6)


def test_counts_of_the_wrong_shape_name_the_argument() -> None:
    from psfleet.errors import InvalidRequestError

    table = make_table(name="ctr")
    keys = np.array([1, 2], dtype=np.uint64)
    with pytest.raises(InvalidRequestError, match=r"push of 2 keys with clicks of shape \(3,\)"):
        table.push(keys, np.zeros((2, DIM), np.float32), clicks=np.zeros(3, np.float32))
    with pytest.raises(InvalidRequestError, match="update_stats of 2 keys with shows"):
        table.update_stats(keys, np.zeros(1, np.float32), np.zeros(2, np.float32))
    assert len(table) == 0


def test_a_cap_beyond_the_address_space_fails_naming_max_rows() -> None:
    # A capped shard allocates its cap's row arrays at its first insert.
    shard = Shard(28, stats=True, last_access=True, cap=10**13)
    with pytest.raises(MemoryError, match="cap of 10,000,000,000,000 rows.*lower max_rows"):
        shard.reserve(1)
    assert shard.data.shape[0] == 0  # nothing changed
