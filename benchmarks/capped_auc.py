"""Test AUC of the DNN with a row cap of half the distinct ids, against the uncapped run.

Trains ``examples/criteo_dnn/config.yaml``'s DNN through ``psfleet train`` on the
synthetic Criteo benchmark data (``--train_rows`` 1M, ``--test_rows`` 40,000 as the
end-to-end benchmark; seed 7), 1 epoch, batch 512, in ONE process
(``cluster.server_num: 0``: the table lives in the worker, no async staleness, so
the only difference between the runs is the cap). The training file is the job's
single pass (``runner.train_passes: [file]``) so that ``metrics.json`` records the
table's rows and lifecycle counts after it (``passes[0].tables``).

Runs, in order:

- **uncapped**: the plain table (no ``sparse_accessor``): its final row count is the
  number of distinct ids seen in training;
- **capped, per eviction policy** (``--evictions``, default ``lowest_score,lru``):
  ``hyper_parameters.sparse_accessor: {name: ctr, max_rows: M, eviction: POLICY}`` with
  ``M = --cap_fraction`` (0.5) x the uncapped run's rows. With one process there is
  one server-side table, so ``max_rows`` (per table per server) is the whole table's cap.

Prints one JSON line per run (``"kind": "run"``: test AUC and logloss, rows, admitted,
evicted, the cap, examples/s, the command) and a summary (``"kind": "summary"``: each
capped run's AUC minus the uncapped one's, the largest |difference| and whether it is
<= 0.01, issue 17's target).

    python benchmarks/capped_auc.py                                     # 1M rows
    python benchmarks/capped_auc.py --train_rows 20000 --test_rows 5000  # a quick check
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from common import DEFAULT_CACHE_DIR, REPO_ROOT, emit, ensure_criteo, log
from e2e_throughput import run_once

__all__ = ["AUC_TARGET", "job_config", "main", "table_figures"]

CONFIG = REPO_ROOT / "examples" / "criteo_dnn" / "config.yaml"
BATCH_SIZE = 512
#: Issue 17: |capped AUC - uncapped AUC| <= this.
AUC_TARGET = 0.01


def job_config(train: Path, test: Path, out: Path,
               accessor: dict[str, Any] | None) -> dict[str, Any]:
    """The example DNN config with the benchmark's data, sizes and ``accessor``.

    Args:
        train: the training file (the job's one pass).
        test: the test file.
        out: ``runner.model_save_path`` (a fresh folder).
        accessor: ``hyper_parameters.sparse_accessor``, or None for the plain table.

    Returns:
        The config as a dict, every path absolute.
    """
    config = yaml.safe_load(CONFIG.read_text())
    runner = config["runner"]
    runner.pop("train_data_dir", None)
    runner.update({"train_passes": [str(train)], "test_data_dir": str(test), "epochs": 1,
                   "batch_size": BATCH_SIZE, "sync_mode": "async",
                   "model_save_path": str(out)})
    config["cluster"] = {"server_num": 0, "worker_num": 1}
    if accessor is not None:
        config["hyper_parameters"]["sparse_accessor"] = accessor
    return config


def table_figures(metrics: dict[str, Any]) -> dict[str, int]:
    """Rows, admitted and evicted of the job's sparse tables after its one pass, summed
    over the tables (metrics.json ``passes[0].tables``).

    Raises:
        RuntimeError: metrics.json has no per-pass table figures.
    """
    passes = metrics.get("passes") or []
    tables = passes[0].get("tables") if passes else None
    if not tables:
        raise RuntimeError("metrics.json has no passes[0].tables (the lifecycle counts)")
    return {key: sum(int(t.get(key, 0)) for t in tables.values())
            for key in ("rows", "admitted", "evicted", "bytes")} | {"tables": len(tables)}


def run_case(work: Path, name: str, train: Path, test: Path,
             accessor: dict[str, Any] | None, timeout_s: float) -> dict[str, Any]:
    """Train one configuration; its metrics, table figures and command."""
    out = work / name
    config_path = work / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(job_config(train, test, out, accessor)))
    command = [str(Path(sys.executable).with_name("psfleet")), "train", "-m", str(config_path)]
    log(f"capped_auc: {name}")
    result = run_once(command, out, "process", timeout_s)
    metrics = json.loads((out / "latest" / "metrics.json").read_text())
    shown = "" if accessor is None else (
        " with hyper_parameters.sparse_accessor: " + json.dumps(accessor))
    return {**result, **table_figures(metrics),
            "command": "psfleet train -m CONFIG.yaml  # examples/criteo_dnn/config.yaml, "
                       "runner.train_passes: [TRAIN.tsv], 1 epoch, batch 512, "
                       "cluster.server_num: 0" + shown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_rows", type=int, default=1_000_000)
    parser.add_argument("--test_rows", type=int, default=40_000)
    parser.add_argument("--cache_dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--evictions", default="lowest_score,lru",
                        help="comma-separated eviction policies of the capped runs")
    parser.add_argument("--cap_fraction", type=float, default=0.5,
                        help="max_rows as a fraction of the uncapped run's rows")
    parser.add_argument("--timeout_s", type=float, default=1800.0)
    args = parser.parse_args()
    if not 0 < args.cap_fraction < 1:
        parser.error(f"--cap_fraction: {args.cap_fraction} is not in (0, 1)")
    evictions = [e for e in args.evictions.split(",") if e]

    train, test, data_meta = ensure_criteo(args.train_rows, args.test_rows, args.cache_dir)
    common = {"bench": "capped_auc", "train_rows": args.train_rows,
              "test_rows": args.test_rows, "batch_size": BATCH_SIZE, "epochs": 1,
              "mode": "one process (cluster.server_num 0)", **data_meta}
    work = Path(tempfile.mkdtemp(prefix="psfleet-bench-capped-"))
    try:
        uncapped = run_case(work, "uncapped", train, test, None, args.timeout_s)
        emit({**common, "kind": "run", "case": "uncapped", "eviction": None,
              "max_rows": None, **uncapped})
        max_rows = max(1, int(uncapped["rows"] * args.cap_fraction))
        capped = {}
        for eviction in evictions:
            accessor = {"name": "ctr", "max_rows": max_rows, "eviction": eviction}
            capped[eviction] = run_case(work, f"capped_{eviction}", train, test, accessor,
                                        args.timeout_s)
            emit({**common, "kind": "run", "case": f"capped {eviction}",
                  "eviction": eviction, "max_rows": max_rows, **capped[eviction]})
    finally:
        shutil.rmtree(work, ignore_errors=True)

    diffs = {e: r["test_auc"] - uncapped["test_auc"] for e, r in capped.items()}
    worst = max((abs(d) for d in diffs.values()), default=None)
    emit({**common, "kind": "summary", "uncapped_rows": uncapped["rows"],
          "cap_fraction": args.cap_fraction, "max_rows": max_rows,
          "uncapped_auc": uncapped["test_auc"],
          "capped_auc": {e: r["test_auc"] for e, r in capped.items()},
          "evicted": {e: r["evicted"] for e, r in capped.items()},
          "auc_difference": diffs, "max_abs_auc_difference": worst,
          "auc_target": AUC_TARGET,
          "met": worst is not None and worst <= AUC_TARGET})


if __name__ == "__main__":
    main()
