"""Measurement (not run in CI): test AUC and examples/s of one job whose worker 1 is a
straggler, in each way async mode can treat it: plain async, bounded staleness (SSP),
global batch aggregation (GBA), and sync mode for reference.

Usage (data from ``psfleet datagen criteo --rows 150000 --seed 7 --out TRAIN
--test_rows 40000 --test_out TEST``)::

    python benchmarks/straggler.py --train TRAIN --test TEST --work DIR \\
        [--runs async,ssp0,ssp2,gba,sync,async_even] [--servers 1] [--workers 2] \\
        [--duty 0.33] [--period_s 0.1]

The straggler: worker 1 (``PADDLE_TRAINER_ID=1``) is stopped (SIGSTOP) for ``1 -
duty`` of every ``period_s`` seconds and continued (SIGCONT) for the rest, from its
start to its end: a worker that gets a third of a core, as a busy shared machine
gives it. ``async_even`` is the same async job with no straggler. Each run: ``psfleet
train`` of ``examples/criteo_dnn/config.yaml``, 1 epoch, batch 512. Prints one JSON
line per run (test AUC, log loss, examples/s, wall seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from common import REPO_ROOT, job_parser, job_process

#: run name -> (``psfleet train -o`` overrides, whether worker 1 straggles)
RUNS: dict[str, tuple[list[str], bool]] = {
    "async": ([], True),
    "ssp0": (["runner.a_sync_configs.bounded_staleness=0"], True),
    "ssp2": (["runner.a_sync_configs.bounded_staleness=2"], True),
    "gba": (["runner.a_sync_configs.global_batch_aggregation=true"], True),
    "sync": (["runner.sync_mode=sync"], True),
    "async_even": ([], False),
}
EXAMPLE = REPO_ROOT / "examples" / "criteo_dnn" / "config.yaml"


def _command(args: argparse.Namespace, name: str) -> list[str]:
    """``psfleet train`` of the criteo example with the run's settings."""
    overrides = [f"runner.train_data_dir={args.train}", f"runner.test_data_dir={args.test}",
                 "runner.epochs=1", "runner.batch_size=512", "runner.sync_mode=async",
                 f"runner.model_save_path={args.work / f'out-{name}'}",
                 f"cluster.server_num={args.servers}", f"cluster.worker_num={args.workers}",
                 *RUNS[name][0]]
    return [sys.executable, "-m", "psfleet.cli.main", "train", "-q", "-m", str(EXAMPLE),
            *(arg for o in overrides for arg in ("-o", o))]


def _straggle(job: subprocess.Popen[bytes], under: Path, duty: float,
              period_s: float) -> float:
    """Stop and continue worker 1 of ``job`` until it ends; returns the seconds it was
    stopped in all."""
    worker = None
    while job.poll() is None and worker is None:
        worker = job_process(under, "PADDLE_TRAINER_ID", "1")
        time.sleep(0.05)
    stopped_s = 0.0
    try:
        while job.poll() is None and worker is not None and worker.is_running():
            worker.send_signal(signal.SIGSTOP)
            time.sleep(period_s * (1 - duty))
            stopped_s += period_s * (1 - duty)
            worker.send_signal(signal.SIGCONT)
            time.sleep(period_s * duty)
    except psutil.NoSuchProcess:  # the worker ended between two signals
        pass
    finally:
        if worker is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.send_signal(signal.SIGCONT)
    return stopped_s


def run(args: argparse.Namespace, name: str) -> dict[str, object]:
    # fleetrun's hang detection takes a worker seen stopped (state T) at every state
    # check for PSFLEET_HEALTH_TIMEOUT_S as hung and kills it: the longest timeout (7
    # checks, each finding the straggler stopped with probability 1 - duty) makes that
    # rare; such a run ends with exit 1, and the log says so.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PSFLEET_HEALTH_TIMEOUT_S": "30"}
    started = time.monotonic()
    job = subprocess.Popen(_command(args, name), env=env, stdout=subprocess.DEVNULL,
                           stderr=(args.work / f"{name}.stderr").open("w"))
    # The job's processes run the run folder's config.yaml (under model_save_path).
    stopped_s = (_straggle(job, args.work / f"out-{name}", args.duty, args.period_s)
                 if RUNS[name][1] else 0.0)
    code = job.wait()
    run_dir = (args.work / f"out-{name}" / "latest").resolve()
    metrics = json.loads((run_dir / "metrics.json").read_text()) if code == 0 else {}
    test = metrics.get("test") or {}
    return {"run": name, "exit": code, "straggler_stopped_s": round(stopped_s, 1),
            "test_auc": test.get("auc"), "test_logloss": test.get("logloss"),
            "examples_per_s": round(metrics["examples_per_s"]) if metrics else None,
            "wall_s": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = job_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"comma-separated runs, of {', '.join(RUNS)} (default: all)")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--duty", type=float, default=0.33,
                        help="the share of each period the straggler runs (0 < duty <= 1)")
    parser.add_argument("--period_s", type=float, default=0.1)
    args = parser.parse_args()
    unknown = set(args.runs.split(",")) - set(RUNS)
    if unknown:
        parser.error(f"--runs: unknown {sorted(unknown)}; choose from {', '.join(RUNS)}")
    if not 0 < args.duty <= 1:
        parser.error(f"--duty: {args.duty} is not in (0, 1]")
    args.work.mkdir(parents=True, exist_ok=True)
    for name in args.runs.split(","):
        print(json.dumps(run(args, name)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
