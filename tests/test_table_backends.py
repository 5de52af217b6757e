"""The native table backend against the numpy reference, bit for bit (issue 41).

Oracle: two tables of one config, one per backend (``SparseTable(config, backend=)``),
driven by the same hypothesis-generated stream of operations (pull with and without
create and state, push with and without counts, add, assign, load, contains,
update_stats, shrink, age_one_day, the reserved key): every result, every error and,
after each step, every observable of the tables (keys, rows, optimizer state,
statistics, counters, and inside each shard the slots, row keys, free list, pending
table and tombstones) must be identical, floats compared as bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psfleet.errors import InvalidRequestError
from psfleet.ps import SparseTable, SparseTableConfig
from psfleet.ps.table.native import NativeShard, scatter_add
from psfleet.ps.types import RESERVED_KEY, AccessorConfig, RuleConfig

pytestmark = pytest.mark.unit

DIM = 3
RULES = {
    "sgd": RuleConfig(name="sgd", learning_rate=0.05),
    "adagrad": RuleConfig(name="adagrad", learning_rate=0.05, initial_accumulator=0.1),
    "adam": RuleConfig(name="adam", learning_rate=0.01),
}
ACCESSORS = {
    "none": AccessorConfig(),
    "ctr": AccessorConfig(name="ctr", delete_threshold=0.05, delete_after_unseen_days=2),
    "probability": AccessorConfig(admission="probability", admit_probability=0.6),
    "count_filter": AccessorConfig(admission="count_filter", admit_count=2, pending_slots=16),
    "show_click_score": AccessorConfig(name="ctr", admission="show_click_score",
                                       admit_score=0.5, pending_slots=16),
    "cap_lru": AccessorConfig(max_rows=12, eviction="lru"),
    "cap_lowest_score": AccessorConfig(name="ctr", max_rows=12, eviction="lowest_score",
                                       evict_batch_fraction=0.2),
}
CASES = [(rule, accessor, shards, init)
         for rule, accessor, shards, init in [
             ("adam", "none", 3, "uniform"), ("adam", "none", 1, "normal"),
             ("sgd", "none", 3, "zeros"), ("adagrad", "none", 3, "uniform"),
             ("adam", "ctr", 3, "uniform"), ("sgd", "ctr", 1, "normal"),
             ("adagrad", "probability", 3, "uniform"), ("adam", "count_filter", 3, "normal"),
             ("adam", "show_click_score", 3, "uniform"), ("sgd", "cap_lru", 3, "uniform"),
             ("adagrad", "cap_lru", 1, "normal"), ("adam", "cap_lowest_score", 3, "uniform")]]
#: A small pool of keys (so streams repeat and collide), some near the top of uint64.
POOL = np.array([0, 1, 2, 3, 5, 8, 13, 2**63, 2**64 - 2, 12345678901234567890]
                + list(range(100, 140)), dtype=np.uint64)


def pair(rule: str, accessor: str, shards: int, init: str) -> tuple[SparseTable, SparseTable]:
    config = SparseTableConfig(name=f"t_{rule}_{accessor}", dim=DIM, rule=RULES[rule],
                               initializer=init, initial_range=0.1, num_buckets=7,
                               num_shards=shards, accessor=ACCESSORS[accessor])
    return SparseTable(config, backend="numpy"), SparseTable(config, backend="native")


def bits(a: np.ndarray | None) -> Any:
    """An array's bytes with its dtype and shape (floats compared as bits)."""
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    return (a.dtype.str, a.shape, a.tobytes())


def observe(table: SparseTable) -> list[Any]:
    """Everything a reader of the table can see, inside its shards included."""
    keys, rows = table.items()
    skeys, stats = table.stats_items()
    seen: list[Any] = [len(table), bits(keys), bits(rows), bits(skeys), bits(stats),
                       table.lifecycle_counts()]
    for shard in table.shards:
        index = shard.index
        seen += [len(index), index.row_limit, bits(index._slots),
                 bits(index.row_keys[: index.row_limit]), bits(index._free), bits(shard.data),
                 bits(shard.stats), bits(shard.last_access), bits(shard.saved),
                 bits(shard.tombs[: shard.tomb_count]), bits(shard.pending_keys),
                 bits(shard.pending_counts), bits(shard.pending_scores), list(shard.counts)]
    return seen


def run(table: SparseTable, op: str, keys: np.ndarray, values: np.ndarray,
        counts: np.ndarray | None, flag: bool) -> Any:
    """One operation; its result (as bits) or its error (type and message)."""
    try:
        if op == "pull":
            return bits(table.pull(keys, create=flag, with_state=not flag and keys.size % 2 == 1))
        if op == "pull_state":
            return bits(table.pull(keys, create=True, with_state=True))
        if op == "push":
            shows = None if counts is None else counts[:, 0]
            clicks = None if counts is None else counts[:, 1]
            return table.push(keys, values[:, :DIM], shows, clicks)
        if op == "add":
            width = DIM + table.state_width if flag else DIM
            return table.add(keys, values[:, :width], with_state=flag)
        uniq = np.unique(keys)
        if op == "assign":
            return table.assign(uniq, values[: uniq.size, :DIM])
        if op == "load":
            rows = values[: uniq.size, : DIM + table.state_width].copy()
            if table.rule.name == "adam":  # v >= 0 and whole step counts, as saved
                rows[:, 2 * DIM:] = np.floor(np.abs(rows[:, 2 * DIM:]) * 3)
            return table.load(uniq, rows)
        if op == "contains":
            return bits(table.contains(keys))
        if op == "update_stats":
            assert counts is not None
            return table.update_stats(keys, counts[:, 0], counts[:, 1])
        if op == "shrink":
            return table.shrink()
        if op == "age":
            return table.age_one_day()
        raise AssertionError(op)
    except InvalidRequestError as exc:
        return ("error", type(exc).__name__, str(exc))


OPS = ["pull", "pull", "pull_state", "push", "push", "add", "assign", "load", "contains",
       "update_stats", "shrink", "age"]
step = st.tuples(st.sampled_from(OPS), st.lists(st.integers(0, POOL.size - 1), max_size=40),
                 st.integers(0, 2**32 - 1), st.booleans(), st.integers(0, 30))


# A pass-mode add of state deltas can make Adagrad's or Adam's sums negative: sqrt
# gives NaN in both backends alike.
@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt")
@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
@settings(max_examples=12, deadline=None)
@given(steps=st.lists(step, min_size=1, max_size=12))
def test_backends_agree_bit_for_bit(case: tuple[str, str, int, str],
                                    steps: list[tuple[str, list[int], int, bool, int]]) -> None:
    reference, native = pair(*case)
    assert isinstance(native.shards[0], NativeShard)
    for op, picks, seed, flag, odd in steps:
        keys = POOL[np.array(picks, dtype=np.int64)]
        if odd == 0:  # now and then the reserved key, which both must refuse
            keys = np.append(keys, np.uint64(RESERVED_KEY))
        rng = np.random.default_rng(seed)
        values = rng.standard_normal((keys.size, 4 * DIM + 1)).astype(np.float32)
        counts = None
        if ACCESSORS[case[1]].name == "ctr" or op == "update_stats":
            counts = rng.integers(0, 3, size=(keys.size, 2)).astype(np.float32)
            counts[:, 1] = np.minimum(counts[:, 0], counts[:, 1])
        expected = run(reference, op, keys, values, counts, flag)
        got = run(native, op, keys, values, counts, flag)
        assert got == expected, (op, keys)
        assert observe(native) == observe(reference), (op, keys)


@pytest.mark.parametrize("shards", [1, 3])
def test_many_rows_and_adam_step_counts(shards: int) -> None:
    """Thousands of rows (growth, clusters, the pipelined probes), Adam rows loaded with
    step counts far and near the factor table's end, and fractional ones (the numpy
    rule's), then pushed twice: identical."""
    config = SparseTableConfig(name="big", dim=DIM, rule=RULES["adam"], num_shards=shards)
    reference, native = (SparseTable(config, backend=b) for b in ("numpy", "native"))
    rng = np.random.default_rng(7)
    keys = np.unique(rng.integers(0, 2**64 - 1, size=6000, dtype=np.uint64))
    rows = rng.standard_normal((keys.size, 3 * DIM + 1)).astype(np.float32)
    rows[:, 2 * DIM:3 * DIM] = np.abs(rows[:, 2 * DIM:3 * DIM])  # v >= 0
    steps = np.concatenate([rng.integers(0, 50_000, keys.size - 8), [2**24, 2**24 - 1, 0.5,
                                                                     3.25, 2**20, 2**20 + 1,
                                                                     36_000, 40_000]])
    rows[:, -1] = steps.astype(np.float32)
    for table in (reference, native):
        table.load(keys, rows)
        table.push(keys[::2], rows[::2, :DIM])
        table.push(keys, rows[:, DIM:2 * DIM])
        table.add(keys[::3], rows[::3, :DIM])
    assert observe(native) == observe(reference)
    mixed = np.concatenate([keys[:500], rng.integers(0, 2**63, 500, dtype=np.uint64)])
    assert bits(native.pull(mixed, create=False)) == bits(reference.pull(mixed, create=False))
    assert bits(native.pull(mixed)) == bits(reference.pull(mixed))
    assert observe(native) == observe(reference)


def test_native_refuses_bad_arrays_with_the_tables_name() -> None:
    """The core checks dtype, dimensions and contiguity and names the table; nothing
    reaches native code unchecked."""
    from psfleet.ps.table import _core

    _, native = pair("adam", "none", 3, "uniform")
    cores = [s.core for s in native.shards if isinstance(s, NativeShard)]
    keys = np.arange(4, dtype=np.uint64)
    with pytest.raises(ValueError, match="table 'x': keys must have dtype uint64"):
        _core.table_pull(cores, keys.astype(np.int64), np.empty((4, DIM), np.float32), 0, 7,
                         1, "'x'")
    with pytest.raises(ValueError, match="table 'x': out must be C-contiguous"):
        _core.table_pull(cores, keys, np.empty((DIM, 4), np.float32).T, 0, 7, 1, "'x'")
    with pytest.raises(ValueError, match="table 'x': out must have one row per key"):
        _core.table_pull(cores, keys, np.empty((3, DIM), np.float32), 0, 7, 1, "'x'")
    with pytest.raises(ValueError, match="gradients must have dim columns"):
        _core.table_update(cores, keys, np.zeros((4, DIM + 1), np.float32), 2, DIM, {},
                           np.zeros((0, 2), np.float32), False, 0, 7, 1, "'x'")
    with pytest.raises(InvalidRequestError, match="key 2\\^64-1 is reserved"):
        native.pull(np.array([1, RESERVED_KEY], dtype=np.uint64))
    # Arrays the wire never sends (other dtypes) go to the reference, not the core.
    reference, _ = pair("adam", "none", 3, "uniform")
    for table in (reference, native):
        table.push(np.array([1, 2], dtype=np.uint64), np.ones((2, DIM)))  # float64
    assert observe(native) == observe(reference)


def test_threads_on_disjoint_keys_with_saves_in_between() -> None:
    """Four threads push and pull their own keys (pool of 2 native threads per call)
    while a fifth reads every row under the shard locks (as saves do) and ages the
    table: no deadlock, and the rows equal those of the numpy table that ran each
    thread's calls one after another."""
    import threading

    config = SparseTableConfig(name="threads", dim=DIM, rule=RULES["adam"], num_shards=3)
    reference, native = (SparseTable(config, backend=b) for b in ("numpy", "native"))
    assert native._native is not None
    native._native.threads = 2
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(0, 2**63, size=4000, dtype=np.uint64))[:3600]
    parts = np.array_split(rng.permutation(keys), 4)
    grads = [rng.standard_normal((p.size, DIM)).astype(np.float32) for p in parts]

    def work(table: SparseTable, part: np.ndarray, grad: np.ndarray) -> None:
        for i in range(6):
            table.pull(part[: 200 * (i + 1)])
            table.push(part, grad * np.float32(i + 1))
    for part, grad in zip(parts, grads, strict=True):
        work(reference, part, grad)
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            native.items()
            native.age_one_day()
    threads = [threading.Thread(target=work, args=(native, p, g))
               for p, g in zip(parts, grads, strict=True)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    done.set()
    watcher.join(timeout=120)
    assert not any(t.is_alive() for t in [*threads, watcher]), "deadlock"
    assert [bits(a) for a in native.items()] == [bits(a) for a in reference.items()]


def test_backend_variable_is_checked() -> None:
    """PSFLEET_TABLE_BACKEND: native (default) or numpy; anything else names both."""
    from psfleet.errors import ConfigError
    from psfleet.ps.table.backend import backend_name

    assert backend_name({}) == "native"
    assert backend_name({"PSFLEET_TABLE_BACKEND": " NumPy "}) == "numpy"
    with pytest.raises(ConfigError, match="PSFLEET_TABLE_BACKEND: 'cuda' is not one of "
                                          "native, numpy"):
        backend_name({"PSFLEET_TABLE_BACKEND": "cuda"})
    with pytest.raises(ConfigError, match="PSFLEET_TABLE_BACKEND"):
        SparseTable(SparseTableConfig(name="t", dim=2), backend="cuda")


def test_shard_lock_behaves_as_a_lock() -> None:
    """A native shard's lock: acquire (blocking, non-blocking, timeout), release,
    locked, and ``with``; releasing an unlocked one is an error, not a crash."""
    import threading

    from psfleet.ps.table import _core

    lock = _core.ShardCore()
    assert lock.acquire() and lock.locked()
    tried: list[bool] = []
    other = threading.Thread(target=lambda: tried.extend(
        [lock.acquire(blocking=False), lock.acquire(timeout=0.01)]))
    other.start()
    other.join()
    assert tried == [False, False]
    lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(ValueError, match="unlocked"):
        lock.release()


@pytest.mark.parametrize("shards", [1, 3, 8])
def test_native_kernels_pick_the_shards_split_picks(shards: int) -> None:
    """The native kernels' shard of a key (``SparseTable._shard_rule``) is the one
    ``shard_of`` / ``_split`` store it in: every row created by the numpy path is found
    natively. (A mismatch would not change results, only send every key back to the
    numpy path, so the differential test alone would not see it.)"""
    config = SparseTableConfig(name="rule", dim=DIM, num_shards=shards, num_buckets=4096)
    table = SparseTable(config, backend="native")
    assert table._native is not None
    keys = np.unique(np.random.default_rng(shards).integers(0, 2**64 - 1, 3000,
                                                            dtype=np.uint64))
    created = table.pull(keys)  # absent: created by the numpy path
    present = table._native.pull(keys, DIM)
    assert present is not None
    rows, missing = present
    assert missing.size == 0
    assert bits(rows) == bits(created)
    owner = table.shard_of(keys)
    for number, shard in enumerate(table.shards):
        assert (shard.index.lookup(keys[owner == number]) >= 0).all()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 400), u=st.integers(1, 50), d=st.integers(1, 12),
       seed=st.integers(0, 2**32 - 1))
def test_native_scatter_add_is_numpy_add_at_bit_for_bit(n: int, u: int, d: int,
                                                        seed: int) -> None:
    """The sums of equal keys (``psfleet.ps.merge.sum_equal_keys``): the native kernel
    adds in the order of the rows, as ``np.add.at`` does."""
    rng = np.random.default_rng(seed)
    index = rng.integers(0, u, n)
    values = (rng.standard_normal((n, d)) * 10.0 ** rng.integers(-8, 8, (n, 1))
              ).astype(np.float32)
    want = np.zeros((u, d), np.float32)
    np.add.at(want, index, values)
    got = np.zeros((u, d), np.float32)
    scatter_add(got, index, values)
    np.testing.assert_array_equal(got, want)


def test_native_scatter_add_checks_its_arguments() -> None:
    out = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="index: must be in 0 .. len"):
        scatter_add(out, np.array([0, 3]), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"values: must be \[len\(index\), out.shape\[1\]\]"):
        scatter_add(out, np.array([0, 1]), np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="values must have dtype float32"):
        scatter_add(out, np.array([0, 1]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="out must be writeable"):
        out.flags.writeable = False
        scatter_add(out, np.array([0]), np.ones((1, 2), np.float32))
