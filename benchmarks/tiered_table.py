"""The disk tier of a sparse table (``accessor.memory_rows``): the store, the table's
rates per tier, and a job whose table takes 4x its memory budget.

Four parts, each printing JSON lines (``"kind"``):

- ``store``: the embedded stores the tier could use, RocksDB (``rocksdict``, chosen) and
  LMDB, given the tier's batch operations on ``--store_rows`` rows of 193 float32
  (dim 64 with Adam's state): rows/s of a batched put, get (every key present) and
  delete, in batches of 10,000, and this process's RSS growth from opening the store
  to the end of the reads (LMDB maps its file: every page it touches stays resident).
- ``table``: an in-process ``SparseTable`` (dim 64, Adam, 8 shards) of ``--table_rows``
  rows, once all in memory and once with ``memory_rows`` a quarter of them: rows/s of
  pulls and pushes of batches of 4,096 keys drawn from the rows in memory ("hot") and
  from the rows on disk ("cold": every row read is promoted, another spilled).
- ``save``: a full save (as a checkpoint or the export at the end of a run) of an
  in-process table of ``--table_rows`` rows (dim 64, Adam, 8 shards), all in memory and
  with ``memory_rows`` a quarter of them: the save's seconds (the copy taken under the
  push gate, and in all) and this process's peak RSS growth during it (sampled every
  2 ms, and the kernel's peak, VmHWM, reset before the save where allowed), beside
  the table's own memory. A tiered save copies its memory tier and streams its disk
  rows (``psfleet.ps.persist_stream``).
- ``job``: ``psfleet train`` of ``examples/criteo_dnn`` with dim 64 on the 1M-row
  benchmark data, async, 1 server x 1 worker, 1 epoch, batch 512, with the export at the end,
  without a budget and with ``memory_budget_bytes`` a quarter of the first run's table
  bytes: test AUC, examples/s, the server's peak RSS and the table's rows per tier at
  the end.

    python benchmarks/tiered_table.py                         # every part, as BENCHMARKS.md
    python benchmarks/tiered_table.py --parts store,table     # no training job
    python benchmarks/tiered_table.py --parts save            # a save's peak memory
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from common import DEFAULT_CACHE_DIR, REPO_ROOT, _status_kb, emit, ensure_criteo, log, rss_bytes
from e2e_throughput import run_once

CONFIG = REPO_ROOT / "examples" / "criteo_dnn" / "config.yaml"
WIDTH = 193  # floats per row: dim 64 + Adam's two moments + its step
BATCH = 10_000


def _keys(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.permutation(np.arange(1, 4 * n, dtype=np.uint64))[:n]


class _Rocks:
    """RocksDB as ``psfleet.ps.table.disk_tier`` opens it (raw bytes, bloom filters, a 32 MB
    block cache, no compression, no write-ahead log)."""

    name = "rocksdb"

    def __init__(self, folder: Path) -> None:
        import rocksdict

        self._rocksdict = rocksdict
        options = rocksdict.Options(raw_mode=True)
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(10, False)
        table.set_block_cache(rocksdict.Cache(32 << 20))
        options.set_block_based_table_factory(table)
        options.set_write_buffer_size(16 << 20)
        options.set_compression_type(rocksdict.DBCompressionType.none())
        self._db = rocksdict.Rdict(str(folder), options)
        write = rocksdict.WriteOptions()
        write.disable_wal = True  # type: ignore[method-assign,assignment]  # a property
        self._db.set_write_options(write)

    def put(self, keys: list[bytes], values: list[bytes]) -> None:
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        collections.deque(map(batch.put, keys, values), maxlen=0)
        self._db.write(batch)

    def get(self, keys: list[bytes]) -> list[Any]:
        return self._db.get(keys)  # type: ignore[no-any-return]

    def delete(self, keys: list[bytes]) -> None:
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        collections.deque(map(batch.delete, keys), maxlen=0)
        self._db.write(batch)

    def close(self) -> None:
        self._db.close()


class _Lmdb:
    """LMDB with its fastest safe-enough settings for a cache (no sync)."""

    name = "lmdb"

    def __init__(self, folder: Path) -> None:
        import lmdb

        self._env = lmdb.open(str(folder), map_size=64 << 30, sync=False, metasync=False)

    def put(self, keys: list[bytes], values: list[bytes]) -> None:
        with self._env.begin(write=True) as txn:
            txn.cursor().putmulti(zip(keys, values, strict=True))

    def get(self, keys: list[bytes]) -> list[Any]:
        with self._env.begin() as txn:
            return list(map(txn.get, keys))

    def delete(self, keys: list[bytes]) -> None:
        with self._env.begin(write=True) as txn:
            collections.deque(map(txn.delete, keys), maxlen=0)

    def close(self) -> None:
        self._env.close()


def store_part(rows: int) -> list[dict[str, Any]]:
    """Rows/s of each store's batched put, get and delete, and the RSS a full read adds."""
    rng = np.random.default_rng(0)
    keys = _keys(rng, rows)
    values = rng.random((rows, WIDTH), dtype=np.float32)
    results = []
    for store_class in (_Rocks, _Lmdb):
        folder = Path(tempfile.mkdtemp(prefix=f"psfleet-bench-{store_class.name}-"))
        before = rss_bytes()
        try:
            store = store_class(folder)
            timings = {}
            start = time.perf_counter()
            for i in range(0, rows, BATCH):
                store.put(keys[i:i + BATCH].astype(">u8").view("V8").tolist(),
                          values[i:i + BATCH].view(f"V{4 * WIDTH}").ravel().tolist())
            timings["put_rows_per_s"] = rows / (time.perf_counter() - start)
            order = rng.permutation(keys)
            start = time.perf_counter()
            for i in range(0, rows, BATCH):
                got = store.get(order[i:i + BATCH].astype(">u8").view("V8").tolist())
                if any(v is None for v in got):
                    raise RuntimeError(f"{store_class.name}: a key written was not read")
            timings["get_rows_per_s"] = rows / (time.perf_counter() - start)
            grown = rss_bytes() - before
            start = time.perf_counter()
            for i in range(0, rows, BATCH):
                store.delete(keys[i:i + BATCH].astype(">u8").view("V8").tolist())
            timings["delete_rows_per_s"] = rows / (time.perf_counter() - start)
            store.close()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        record = {"kind": "store", "store": store_class.name, "rows": rows,
                  "row_bytes": 4 * WIDTH, "batch": BATCH, **timings,
                  "rss_growth_mb": grown / 1e6}
        log(f"tiered_table: store: {json.dumps(record)}")
        results.append(record)
    return results


def table_part(rows: int) -> list[dict[str, Any]]:
    """Pull and push rows/s of hot and cold keys, tiered (memory_rows = rows / 4) and not."""
    from psfleet.ps import SparseTable, SparseTableConfig
    from psfleet.ps.types import AccessorConfig, RuleConfig

    rng = np.random.default_rng(1)
    keys = _keys(rng, rows)
    batch = 4_096
    results = []
    for tiered in (False, True):
        accessor = AccessorConfig(memory_rows=rows // 4) if tiered else AccessorConfig()
        table = SparseTable(SparseTableConfig(name="bench", dim=64, rule=RuleConfig(),
                                              num_shards=8, accessor=accessor))
        for i in range(0, rows, batch):  # create every row, oldest first
            table.pull(keys[i:i + batch])
        # The last quarter was pulled last: in memory ("hot"); the first quarter on disk.
        hot, cold = keys[-rows // 4:], keys[: rows // 4]
        record: dict[str, Any] = {"kind": "table", "tiered": tiered, "rows": rows,
                                  "memory_rows": rows // 4 if tiered else None,
                                  "disk_rows": table.disk_rows,
                                  "memory_bytes": table.memory_bytes,
                                  "disk_bytes": table.disk_bytes}
        grads = rng.standard_normal((batch, 64)).astype(np.float32)
        for label, pool in (("hot", hot), ("cold", cold)):
            for n_op, op in enumerate(("pull", "push")):
                n = max(1, min(20, pool.size // (2 * batch)))
                if label == "hot":
                    picks = [np.unique(rng.choice(pool, batch)) for _ in range(n)]
                else:  # each cold key once: on disk until this read promotes it
                    fresh = pool[n_op * n * batch:]
                    picks = [fresh[j * batch:(j + 1) * batch] for j in range(n)]
                start = time.perf_counter()
                for pick in picks:
                    if op == "pull":
                        table.pull(pick)
                    else:
                        table.push(pick, grads[: pick.size])
                elapsed = time.perf_counter() - start
                record[f"{op}_{label}_rows_per_s"] = sum(p.size for p in picks) / elapsed
        counts = table.lifecycle_counts()
        record.update(spilled=counts.spilled, promoted=counts.promoted)
        table.close()
        log(f"tiered_table: table: {json.dumps(record)}")
        results.append(record)
    return results


def _peak_rss_growth(call: Callable[[], None]) -> int:
    """Bytes this process's RSS grew at most during ``call()`` over its RSS before:
    the larger of the RSS sampled every 2 ms and the kernel's peak (VmHWM, reset
    first through /proc/self/clear_refs where the kernel allows it)."""
    before = rss_bytes()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        hwm_reset = True
    except OSError:
        hwm_reset = False
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes())
            done.wait(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        call()
    finally:
        done.set()
        sampler.join()
    if hwm_reset:
        peak[0] = max(peak[0], _status_kb("self", "VmHWM:") * 1024)
    return peak[0] - before


def save_part(rows: int) -> list[dict[str, Any]]:
    """A full save's seconds and peak RSS growth, tiered (memory_rows = rows / 4) and not."""
    from psfleet.ps import SparseTable, SparseTableConfig
    from psfleet.ps.persist_delta import snapshot_mode, write_mode_snapshot
    from psfleet.ps.types import AccessorConfig, RuleConfig

    keys = _keys(np.random.default_rng(1), rows)
    results = []
    for tiered in (False, True):
        accessor = AccessorConfig(memory_rows=rows // 4) if tiered else AccessorConfig()
        table = SparseTable(SparseTableConfig(name="bench", dim=64, rule=RuleConfig(),
                                              num_shards=8, accessor=accessor))
        for i in range(0, rows, 4_096):
            table.pull(keys[i:i + 4_096])
        folder = Path(tempfile.mkdtemp(prefix="psfleet-bench-save-"))
        seconds: dict[str, float] = {}

        def save(table: SparseTable = table, folder: Path = folder,
                 seconds: dict[str, float] = seconds) -> None:
            start = time.perf_counter()
            snapshot = snapshot_mode({1: table}, "full")
            seconds["copy"] = time.perf_counter() - start
            write_mode_snapshot(snapshot, folder, 0, {})
            seconds["all"] = time.perf_counter() - start

        gc.collect()
        try:
            grown = _peak_rss_growth(save)
            file_bytes = (folder / "server-0" / "table-1.sparse").stat().st_size
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        record = {"kind": "save", "mode": "full", "tiered": tiered, "rows": rows,
                  "memory_rows": rows // 4 if tiered else None,
                  "disk_rows": table.disk_rows, "table_memory_mb": table.memory_bytes / 1e6,
                  "file_mb": file_bytes / 1e6, "copy_s": seconds["copy"],
                  "save_s": seconds["all"], "save_peak_rss_growth_mb": grown / 1e6}
        table.close()
        del table
        log(f"tiered_table: save: {json.dumps(record)}")
        results.append(record)
    return results


def _job_config(train: Path, test: Path, out: Path, budget: int | None) -> dict[str, Any]:
    config = yaml.safe_load(CONFIG.read_text())
    runner = config["runner"]
    runner.pop("train_data_dir", None)
    # With the export at the end: its save streams a tiered table's disk rows, so the
    # server's peak is the memory tier plus a chunk (docs/tiered-storage.md).
    runner.update({"train_passes": [str(train)], "test_data_dir": str(test), "epochs": 1,
                   "batch_size": 512, "sync_mode": "async", "model_save_path": str(out),
                   "export_model": True})
    config["hyper_parameters"]["sparse_feature_dim"] = 64
    config["cluster"] = {"server_num": 1, "worker_num": 1}
    if budget is not None:
        config["hyper_parameters"]["sparse_accessor"] = {"memory_budget_bytes": budget}
    return config


def job_part(train_rows: int, test_rows: int, cache_dir: Path,
             timeout_s: float) -> list[dict[str, Any]]:
    """The 1M-row async job with dim 64, without and with a budget of a quarter."""
    train, test, _ = ensure_criteo(train_rows, test_rows, cache_dir)
    work = Path(tempfile.mkdtemp(prefix="psfleet-bench-tiered-"))
    results = []
    try:
        budget = None
        for case in ("in memory", "budget 1/4"):
            out = work / case.replace(" ", "_").replace("/", "")
            config_path = work / f"{out.name}.yaml"
            config_path.write_text(yaml.safe_dump(_job_config(train, test, out, budget)))
            command = [str(Path(sys.executable).with_name("psfleet")), "train", "-m",
                       str(config_path)]
            log(f"tiered_table: job {case}")
            result = run_once(command, out, "launcher", timeout_s)
            metrics = json.loads((out / "latest" / "metrics.json").read_text())
            tables = metrics["passes"][0]["tables"]
            figures = {key: sum(int(t.get(key, 0)) for t in tables.values())
                       for key in ("rows", "bytes", "disk_rows", "disk_bytes", "spilled",
                                   "promoted")}
            record = {"kind": "job", "case": case, "train_rows": train_rows,
                      "memory_budget_bytes": budget, **result, **figures,
                      "server_peak_rss_mb": result["peak_rss_mb"].get("server0")}
            log(f"tiered_table: job: {json.dumps(record)}")
            results.append(record)
            if budget is None:
                budget = figures["bytes"] // 4
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="store,table,save,job")
    parser.add_argument("--store_rows", type=int, default=400_000)
    parser.add_argument("--table_rows", type=int, default=1_000_000)
    parser.add_argument("--train_rows", type=int, default=1_000_000)
    parser.add_argument("--test_rows", type=int, default=40_000)
    parser.add_argument("--cache_dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--timeout_s", type=float, default=3600.0)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"store", "table", "save", "job"}
    if unknown:
        parser.error(f"--parts: {sorted(unknown)} unknown; the parts are store, table, "
                     "save, job")
    records: list[dict[str, Any]] = []
    if "store" in parts:
        records += store_part(args.store_rows)
    if "table" in parts:
        records += table_part(args.table_rows)
    if "save" in parts:
        records += save_part(args.table_rows)
    if "job" in parts:
        records += job_part(args.train_rows, args.test_rows, args.cache_dir, args.timeout_s)
    for record in records:
        emit({"bench": "tiered_table", **record})


if __name__ == "__main__":
    main()
