"""The sparse table in process: pull / push throughput and memory per row.

``psfleet.ps.SparseTable`` with the Adam rule (the DNN's), dim 9 and 64, 8 shards:

- pull (create=True) and push of batches of 10^3, 10^4 and 10^5 distinct random
  uint64 keys, either **existing** (drawn from a pool of ``--pool_rows`` rows inserted
  first) or **new** (never seen: a pull inserts them, a push creates then updates
  them). One sample runs calls with fresh key batches for at least ``--min_time_s``;
  rows/s = keys / seconds; GB/s counts the payload a call moves (8 bytes of key plus
  4*dim bytes of values or gradients per row, 10^9 bytes per GB).
- memory: RSS growth per million rows inserted (pulls of 10^5 new keys) and
  ``table.memory_bytes / rows``, against the raw size of a row: 8-byte key + 4*dim
  bytes of values + Adam's state (2*dim + 1 floats).

Prints one JSON line per (op, keys, dim, existing/new) and per dim for memory, each a
summary over ``--repeats`` samples. ``--backend`` picks the table's kernels
(``PSFLEET_TABLE_BACKEND``'s values; default: the variable's).

``--compare_backends`` (issue 41) measures instead, in one process and alternated round
by round so that drift on shared cores hits all alike, on the same batches of
``--compare_keys`` existing keys of a table of ``--pool_rows`` rows (dim 9, Adam):
the numpy and native backends' pull and push, pandas' C hash lookup
(``Index.get_indexer``) + ``np.take`` of the same rows, ``np.take`` alone; and native
pulls with 1 and 2 pool threads in one call, and by two Python threads on disjoint
halves (1 pool thread each) against one thread doing both halves. Ratios are taken
within a round, then summarised; one JSON line ``table_backends``.

    python benchmarks/table_ops.py --repeats 3
    python benchmarks/table_ops.py --compare_backends --repeats 7
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable

import numpy as np
from common import base_parser, emit, log, rss_bytes, summarise

from psfleet.ps import SparseTable, SparseTableConfig

DIMS = (9, 64)
BATCHES = (1_000, 10_000, 100_000)
INSERT_BATCH = 100_000


def raw_row_bytes(dim: int) -> int:
    """Key + values + Adam state (m, v, step count) of one row, bytes."""
    return 8 + 4 * dim + 4 * (2 * dim + 1)


BACKEND: str | None = None  # --backend


def new_table(dim: int, backend: str | None = None) -> SparseTable:
    return SparseTable(SparseTableConfig(name=f"bench_dim{dim}", dim=dim),
                       backend=backend or BACKEND)


def random_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct random uint64 keys (below 2^63, so never the reserved key)."""
    keys = np.unique(rng.integers(0, 2**63, size=n + n // 100 + 16, dtype=np.uint64))
    return rng.permutation(keys)[:n]


def time_calls(call: Callable[[int], None], min_time_s: float, min_calls: int = 3) -> float:
    """Run ``call(i)`` for i = 0, 1, ... until both limits are passed; seconds per call."""
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_time_s:
        call(calls)
        calls += 1
    return (time.perf_counter() - start) / calls


def bench_memory(dim: int, rows: int, repeats: int) -> None:
    growth, table_bytes = [], []
    for _ in range(repeats):
        gc.collect()
        rng = np.random.default_rng(1)
        keys = random_keys(rng, rows)
        before = rss_bytes()
        table = new_table(dim)
        for i in range(0, rows, INSERT_BATCH):
            table.pull(keys[i:i + INSERT_BATCH])
        after = rss_bytes()
        growth.append((after - before) / rows)
        table_bytes.append(table.memory_bytes / len(table))
        del table
        gc.collect()
    raw = raw_row_bytes(dim)
    rss = summarise(growth)
    held = summarise(table_bytes)
    emit({"bench": "table_memory", "dim": dim, "rows": rows, "raw_row_bytes": raw,
          "rss_bytes_per_row": rss, "rss_mb_per_million_rows": summarise(
              [g * 1e6 / 1e6 for g in growth]),
          "table_bytes_per_row": held,
          "rss_ratio_to_raw": summarise([g / raw for g in growth]),
          "table_ratio_to_raw": summarise([b / raw for b in table_bytes])})


def bench_ops(dim: int, pool_rows: int, repeats: int, min_time_s: float) -> None:
    rng = np.random.default_rng(dim)
    table = new_table(dim)
    pool = random_keys(rng, pool_rows)
    for i in range(0, pool_rows, INSERT_BATCH):
        table.pull(pool[i:i + INSERT_BATCH])
    log(f"table_ops dim {dim}: {len(table)} rows in the table")
    for n in BATCHES:
        grads = rng.standard_normal((n, dim), dtype=np.float32) * np.float32(1e-3)
        # Batches drawn up front so key generation is not timed.
        existing = [rng.choice(pool, n, replace=False) for _ in range(8)]
        for op in ("pull", "push"):
            for kind in ("existing", "new"):
                per_call = []
                for _ in range(repeats):
                    if kind == "existing":
                        batches = existing
                    else:  # fresh keys for every call (they become existing afterwards)
                        batches = [random_keys(rng, n) for _ in range(8)]
                    if op == "pull":
                        def call(i: int, b: list[np.ndarray] = batches,
                                 t: SparseTable = table) -> None:
                            t.pull(b[i % len(b)])
                    else:
                        def call(i: int, b: list[np.ndarray] = batches, t: SparseTable = table,
                                 g: np.ndarray = grads) -> None:
                            t.push(b[i % len(b)], g)
                    # "new" batches must not repeat: at most len(batches) calls.
                    budget = min_time_s if kind == "existing" else 0.0
                    calls = 3 if kind == "existing" else len(batches)
                    per_call.append(time_calls(call, budget, calls))
                rows_per_s = [n / t for t in per_call]
                emit({"bench": "table_ops", "op": op, "keys": n, "dim": dim, "kind": kind,
                      "table_rows_before": pool_rows,
                      "rows_per_s": summarise(rows_per_s),
                      "gb_per_s": summarise([r * (8 + 4 * dim) / 1e9 for r in rows_per_s]),
                      "ms_per_call": summarise([t * 1e3 for t in per_call])})


CPU_RATES: dict[str, list[float]] = {}  # rows per CPU second of this process


def _per_s(call: Callable[[], object], rows: int, calls: int, name: str = "") -> float:
    """Rows per wall-clock second of ``calls`` calls; with ``name``, rows per CPU
    second of the process too (into CPU_RATES: fairer on busy shared cores)."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    if name:
        CPU_RATES.setdefault(name, []).append(rows * calls / (time.process_time() - cpu))
    return rows * calls / (time.perf_counter() - start)


def _two_threads(call: Callable[[np.ndarray], object], halves: list[np.ndarray],
                 calls: int) -> float:
    """Rows/s of two threads, each calling ``call`` on its own half ``calls`` times."""
    def work(half: np.ndarray) -> None:
        for _ in range(calls):
            call(half)
    threads = [threading.Thread(target=work, args=(h,)) for h in halves]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(h.size for h in halves) * calls / (time.perf_counter() - start)


def compare_backends(pool_rows: int, keys: int, repeats: int, calls: int) -> None:
    """See the module docstring (``--compare_backends``)."""
    import pandas as pd

    dim = 9
    rng = np.random.default_rng(41)
    pool = random_keys(rng, pool_rows)
    tables = {b: new_table(dim, b) for b in ("numpy", "native")}
    for table in tables.values():
        for i in range(0, pool_rows, INSERT_BATCH):
            table.pull(pool[i:i + INSERT_BATCH])
    index = pd.Index(pool)
    values = tables["numpy"].pull(pool, create=False)  # [R, dim], the rows themselves
    batches = [rng.choice(pool, keys, replace=False) for _ in range(4)]
    grads = rng.standard_normal((keys, dim), dtype=np.float32) * np.float32(1e-3)
    positions = [index.get_indexer(b) for b in batches]
    native = tables["native"]
    kernels = native._native
    assert kernels is not None
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}

    def pull_with(threads: int) -> Callable[[np.ndarray], object]:
        def call(b: np.ndarray) -> object:
            kernels.threads = threads
            return native.pull(b, create=False)
        return call

    default_threads = kernels.threads

    def one_round(b: np.ndarray, p: np.ndarray) -> dict[str, float]:
        halves = [b[: keys // 2], b[keys // 2:]]
        one = pull_with(1)
        out = {
            "numpy_pull": _per_s(lambda: tables["numpy"].pull(b), keys, calls, "numpy_pull"),
            "native_pull": _per_s(lambda: native.pull(b), keys, calls, "native_pull"),
            "pandas_lookup_take": _per_s(
                lambda: np.take(values, index.get_indexer(b), axis=0), keys, calls,
                "pandas_lookup_take"),
            "np_take": _per_s(lambda: np.take(values, p, axis=0), keys, calls, "np_take"),
            "numpy_push_adam": _per_s(lambda: tables["numpy"].push(b, grads), keys, calls,
                                      "numpy_push_adam"),
            "native_push_adam": _per_s(lambda: native.push(b, grads), keys, calls,
                                       "native_push_adam"),
            "native_pull_pool1": _per_s(lambda: one(b), keys, calls, "native_pull_pool1"),
            "native_pull_pool2": _per_s(lambda: pull_with(2)(b), keys, calls),
            "native_pull_1_thread_both_halves": _per_s(
                lambda: [one(h) for h in halves], keys, calls),
            "native_pull_2_threads_disjoint": _two_threads(one, halves, calls),
        }
        kernels.threads = default_threads
        return out

    for r in range(repeats):
        round_rates = one_round(batches[r % 4], positions[r % 4])
        for name, rate in round_rates.items():
            rates.setdefault(name, []).append(rate)
        pairs = {"native_pull_vs_numpy": ("native_pull", "numpy_pull"),
                 "native_pull_vs_pandas_take": ("native_pull", "pandas_lookup_take"),
                 "native_push_adam_vs_numpy": ("native_push_adam", "numpy_push_adam"),
                 "pool2_vs_pool1": ("native_pull_pool2", "native_pull_pool1"),
                 "two_threads_vs_one": ("native_pull_2_threads_disjoint",
                                        "native_pull_1_thread_both_halves")}
        for name, (a, c) in pairs.items():
            ratios.setdefault(name, []).append(round_rates[a] / round_rates[c])
        log(f"round {r}: " + ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in round_rates.items()))
    same = bool(np.array_equal(tables["numpy"].pull(pool[:1000]).view(np.uint32),
                               native.pull(pool[:1000]).view(np.uint32)))
    memory = {b: t.memory_bytes / len(t) / raw_row_bytes(dim) for b, t in tables.items()}
    emit({"bench": "table_backends", "dim": dim, "rows": pool_rows, "keys": keys,
          "calls_per_sample": calls, "load_average": list(os.getloadavg()),
          "cpus": os.cpu_count(), "rows_identical_after": same,
          "table_ratio_to_raw": memory,
          "rows_per_s": {k: summarise(v) for k, v in rates.items()},
          "ratios": {k: summarise(v) for k, v in ratios.items()},
          "rows_per_cpu_s": {k: summarise(v) for k, v in CPU_RATES.items()},
          "cpu_ratios": {k: summarise([x / y for x, y in zip(CPU_RATES[a], CPU_RATES[c],
                                                              strict=True)])
                         for k, (a, c) in list(pairs.items())[:3]}})


def main() -> None:
    global BACKEND
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--pool_rows", type=int, default=1_000_000,
                        help="rows inserted before the 'existing' measurements")
    parser.add_argument("--memory_rows", type=int, default=1_000_000,
                        help="rows inserted for the memory measurement")
    parser.add_argument("--min_time_s", type=float, default=0.3,
                        help="least time one sample of an 'existing' case runs")
    parser.add_argument("--backend", choices=("native", "numpy"), default=None,
                        help="the tables' kernels (default: PSFLEET_TABLE_BACKEND's)")
    parser.add_argument("--compare_backends", action="store_true",
                        help="measure the backends and references alternately (only)")
    parser.add_argument("--compare_keys", type=int, default=100_000,
                        help="existing keys per call of --compare_backends")
    parser.add_argument("--compare_calls", type=int, default=5,
                        help="calls per variant per round of --compare_backends")
    args = parser.parse_args()
    BACKEND = args.backend
    if args.compare_backends:
        compare_backends(args.pool_rows, args.compare_keys, args.repeats, args.compare_calls)
        return
    for dim in DIMS:  # memory first, while the process is small
        log(f"table memory dim {dim}")
        bench_memory(dim, args.memory_rows, args.repeats)
    for dim in DIMS:
        bench_ops(dim, args.pool_rows, args.repeats, args.min_time_s)


if __name__ == "__main__":
    main()
