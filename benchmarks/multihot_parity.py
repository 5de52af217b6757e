"""AUC parity and throughput of the four runner models on multi-valued features.

Trains ``dnn``, ``wide_deep``, ``deepfm`` and ``dcn_v2`` through ``psfleet train`` on
the synthetic multi-hot CSV (``psfleet datagen multihot``: 4 numeric columns, 6
single-valued id columns and 3 ``|``-joined multi-valued ones, with a known optimum
AUC), one epoch at batch 512 per worker, in three configurations each: one process,
a parameter-server async job with 1 server x 2 workers, and a sync job with 1 x 2.
The features go to two tables of dim 8: ``items`` (c1..c6 and genres) and
``behaviour`` (hist and tags, mean-pooled). The config is
``examples/multivalued_csv/config.yaml`` with the overrides printed per run.

Per run: the job's examples/s and the test AUC (``metrics.json``); per model: the
largest test-AUC difference among the three configurations (the issue asks for
<= 0.005) and the optimum AUC of the test file.

    python benchmarks/multihot_parity.py --train_rows 1000000 --test_rows 200000
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import DEFAULT_CACHE_DIR, REPO_ROOT, base_parser, emit, ensure_multihot, log, summarise
from e2e_throughput import run_once

CONFIG = REPO_ROOT / "examples" / "multivalued_csv" / "config.yaml"
BATCH_SIZE = 512
MODELS = ("dnn", "wide_deep", "deepfm", "dcn_v2")
#: (case, server_num, worker_num, sync_mode)
CASES: list[tuple[str, int, int, str]] = [
    ("single process", 0, 1, "async"),
    ("PS async 1x2", 1, 2, "async"),
    ("PS sync 1x2", 1, 2, "sync"),
]
OVERRIDES = {"runner.epochs": "1", "runner.batch_size": str(BATCH_SIZE),
             "hyper_parameters.optimizer.learning_rate": "0.001",
             "hyper_parameters.fc_sizes": "[256, 128, 64]"}


def train_command(train: Path, test: Path, model: str, server_num: int, worker_num: int,
                  mode: str, out: Path) -> list[str]:
    """The ``psfleet train`` command line of one run."""
    overrides = {**OVERRIDES, "runner.train_data_dir": str(train),
                 "runner.test_data_dir": str(test), "runner.model": model,
                 "cluster.server_num": str(server_num), "cluster.worker_num": str(worker_num),
                 "runner.sync_mode": mode, "runner.model_save_path": str(out)}
    command = [str(Path(sys.executable).with_name("psfleet")), "train", "-m", str(CONFIG)]
    for key, value in overrides.items():
        command += ["-o", f"{key}={value}"]
    return command


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], repeats=1)
    parser.add_argument("--train_rows", type=int, default=1_000_000)
    parser.add_argument("--test_rows", type=int, default=200_000)
    parser.add_argument("--cache_dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--timeout_s", type=float, default=1800.0)
    args = parser.parse_args()

    train, test, data_meta = ensure_multihot(args.train_rows, args.test_rows, args.cache_dir)
    models = args.models.split(",")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    work = Path(tempfile.mkdtemp(prefix="psfleet-bench-multihot-"))
    try:
        for repeat in range(args.repeats):
            for model in models:
                for case, server_num, worker_num, mode in CASES:
                    out = work / f"{model}_{case.replace(' ', '_')}_{repeat}"
                    log(f"multihot repeat {repeat + 1}/{args.repeats}: {model}, {case}")
                    result = run_once(train_command(train, test, model, server_num,
                                                    worker_num, mode, out), out,
                                      "launcher" if server_num else "process", args.timeout_s)
                    runs.setdefault((model, case), []).append(result)
                    emit({"bench": "multihot", "kind": "run", "model": model, "case": case,
                          "repeat": repeat, **result})
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for model in models:
        aucs = {case: summarise([r["test_auc"] for r in runs[(model, case)]])["median"]
                for case, *_ in CASES}
        for case, server_num, worker_num, mode in CASES:
            results = runs[(model, case)]
            emit({"bench": "multihot", "kind": "summary", "model": model, "case": case,
                  "server_num": server_num, "worker_num": worker_num, "mode": mode,
                  "batch_size": BATCH_SIZE, "train_rows": args.train_rows,
                  "test_rows": args.test_rows, **data_meta,
                  "command": " ".join(train_command(Path("TRAIN.csv"), Path("TEST.csv"), model,
                                                    server_num, worker_num, mode,
                                                    Path("OUT"))),
                  **{key: summarise([r[key] for r in results])
                     for key in ("examples_per_s", "test_auc", "train_wall_s")}})
        emit({"bench": "multihot", "kind": "parity", "model": model,
              "max_auc_difference": max(aucs.values()) - min(aucs.values()),
              "test_optimum_auc": data_meta["test_optimum_auc"], "test_auc": aucs})


if __name__ == "__main__":
    main()
