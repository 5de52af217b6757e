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
summary over ``--repeats`` samples.

    python benchmarks/table_ops.py --repeats 3
"""

from __future__ import annotations

import gc
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


def new_table(dim: int) -> SparseTable:
    return SparseTable(SparseTableConfig(name=f"bench_dim{dim}", dim=dim))


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


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--pool_rows", type=int, default=1_000_000,
                        help="rows inserted before the 'existing' measurements")
    parser.add_argument("--memory_rows", type=int, default=1_000_000,
                        help="rows inserted for the memory measurement")
    parser.add_argument("--min_time_s", type=float, default=0.3,
                        help="least time one sample of an 'existing' case runs")
    args = parser.parse_args()
    for dim in DIMS:  # memory first, while the process is small
        log(f"table memory dim {dim}")
        bench_memory(dim, args.memory_rows, args.repeats)
    for dim in DIMS:
        bench_ops(dim, args.pool_rows, args.repeats, args.min_time_s)


if __name__ == "__main__":
    main()
