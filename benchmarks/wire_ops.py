"""Sparse pulls and pushes over the wire: gRPC on 127.0.0.1.

One server (``psfleet.ps.run_server`` bound to port 0) runs in a subprocess; this
process is the worker, calling it through ``psfleet.ps.RemoteClient``, so client and
server each have a core. Tables as in ``table_ops.py`` (Adam rule, dim 9 and 64,
``--pool_rows`` rows inserted first), the same batches of 10^3, 10^4 and 10^5
distinct keys, existing and new, plus a 1-key pull (the per-call floor).

Per case: rows/s, MB/s (payload: 8-byte keys + 4*dim bytes of values or gradients
per row, 10^6 bytes per MB), calls/s (one call in flight at a time) and the p50 /
p99 latency of single calls. One JSON line per case, each a summary over
``--repeats`` samples (p50 / p99 are medians of the samples' percentiles).

    python benchmarks/wire_ops.py --repeats 3
"""

from __future__ import annotations

import time

import numpy as np
from common import ServerProcess, base_parser, emit, log, percentile, summarise

from psfleet.ps import RemoteClient, SparseTableConfig
from psfleet.rpc import RpcConfig

DIMS = (9, 64)
BATCHES = (1, 1_000, 10_000, 100_000)
INSERT_BATCH = 100_000
NEW_CALLS = {1: 200, 1_000: 60, 10_000: 20, 100_000: 4}


def random_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct random uint64 keys below 2^63."""
    keys = np.unique(rng.integers(0, 2**63, size=n + n // 100 + 16, dtype=np.uint64))
    return rng.permutation(keys)[:n]


def run_calls(call_batches: list[np.ndarray], call: object, min_time_s: float,
              max_calls: int) -> list[float]:
    """Latency (s) of each call, cycling through the batches, until the limits pass."""
    assert callable(call)
    latencies: list[float] = []
    start = time.perf_counter()
    i = 0
    while i < max_calls and (i < 3 or time.perf_counter() - start < min_time_s):
        keys = call_batches[i % len(call_batches)]
        t0 = time.perf_counter()
        call(keys)
        latencies.append(time.perf_counter() - t0)
        i += 1
    return latencies


def bench_table(client: RemoteClient, table_id: int, dim: int, pool_rows: int, repeats: int,
                min_time_s: float) -> None:
    rng = np.random.default_rng(100 + dim)
    client.create_sparse_table(table_id, SparseTableConfig(name=f"wire_dim{dim}", dim=dim))
    pool = random_keys(rng, pool_rows)
    for i in range(0, pool_rows, INSERT_BATCH):
        client.pull_sparse(table_id, pool[i:i + INSERT_BATCH])
    log(f"wire_ops dim {dim}: {pool_rows} rows on the server")
    for n in BATCHES:
        grads = rng.standard_normal((n, dim), dtype=np.float32) * np.float32(1e-3)
        existing = [rng.choice(pool, n, replace=False) for _ in range(8)]
        for op in ("pull", "push"):
            for kind in ("existing", "new"):
                if n == 1 and (op == "push" or kind == "new"):
                    continue
                if op == "pull":
                    def call(keys: np.ndarray) -> None:
                        client.pull_sparse(table_id, keys)
                else:
                    def call(keys: np.ndarray, g: np.ndarray = grads) -> None:
                        client.push_sparse(table_id, keys, g)
                samples = []
                for _ in range(repeats):
                    if kind == "existing":
                        lat = run_calls(existing, call, min_time_s, 10**9)
                    else:  # fresh keys for every call
                        fresh = [random_keys(rng, n) for _ in range(NEW_CALLS[n])]
                        lat = run_calls(fresh, call, 0.0, len(fresh))
                    samples.append(lat)
                mean_s = [sum(lat) / len(lat) for lat in samples]
                rows_per_s = [n / m for m in mean_s]
                emit({"bench": "wire_ops", "op": op, "keys": n, "dim": dim, "kind": kind,
                      "rows_per_s": summarise(rows_per_s),
                      "mb_per_s": summarise([r * (8 + 4 * dim) / 1e6 for r in rows_per_s]),
                      "calls_per_s": summarise([1 / m for m in mean_s]),
                      "p50_ms": summarise([percentile(lat, 0.5) * 1e3 for lat in samples]),
                      "p99_ms": summarise([percentile(lat, 0.99) * 1e3 for lat in samples]),
                      "calls": summarise([len(lat) for lat in samples])})


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--pool_rows", type=int, default=1_000_000)
    parser.add_argument("--min_time_s", type=float, default=0.5,
                        help="least time one sample of an 'existing' case runs")
    args = parser.parse_args()
    with ServerProcess() as server:
        log(f"wire_ops: server at {server.endpoint}")
        client = RemoteClient([server.endpoint], RpcConfig())
        try:
            client.wait_ready(60.0)
            for table_id, dim in enumerate(DIMS):
                bench_table(client, table_id, dim, args.pool_rows, args.repeats,
                            args.min_time_s)
        finally:
            try:
                client.stop_servers(0)
            finally:
                client.close()


if __name__ == "__main__":
    main()
