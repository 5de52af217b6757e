"""Measurement (not run in CI): test AUC of the 1M-row synthetic job, undisturbed vs a
server SIGKILLed mid-epoch vs a worker SIGKILLed mid-epoch, with --max_restarts 1.

Usage (data from ``psfleet datagen criteo --rows 1000000 --seed 7 --out TRAIN
--test_rows 200000 --test_out TEST``)::

    python benchmarks/restart_recovery.py --train TRAIN --test TEST --work DIR

Each run: ``psfleet train``, async, 2 servers x 2 workers, 1 epoch, batch 512,
``runner.checkpoint`` every 200 batches, ``cluster.max_restarts: 1``. The kill comes
when the checkpoint after ``--kill_after`` batches is published. Prints one line per run
and the AUC differences.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def _config(work: Path, name: str, train: Path, test: Path) -> Path:
    path = work / f"{name}.yaml"
    path.write_text(json.dumps({
        "runner": {"train_data_dir": str(train), "test_data_dir": str(test), "epochs": 1,
                   "batch_size": 512, "sync_mode": "async", "seed": 7,
                   "model_save_path": str(work / f"out-{name}"),
                   "checkpoint": {"checkpoint_dir": str(work / f"ck-{name}"),
                                  "step_interval": 200, "max_num_checkpoints": 2}},
        "cluster": {"server_num": 2, "worker_num": 2, "max_restarts": 1},
    }))
    return path


def _published_batches(folder: Path) -> list[int]:
    out = []
    for p in folder.glob("ckpt-*/manifest.json"):
        out.append(int(json.loads(p.read_text())["batch"]))
    return out


def _victim(config: Path, variable: str, value: str) -> psutil.Process | None:
    """A process whose command line names ``config`` (or a path under it) and whose
    environment has ``variable=value``; None when there is none."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(config) in " ".join(proc.info["cmdline"] or []) and \
                    proc.environ().get(variable) == value:
                return proc
        except psutil.Error:
            continue
    return None


def run(work: Path, name: str, train: Path, test: Path, kill: tuple[str, str] | None,
        kill_after: int) -> dict[str, object]:
    config = _config(work, name, train, test)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    job = subprocess.Popen([sys.executable, "-m", "psfleet.cli.main", "train", "-m",
                            str(config)], env=env, stdout=subprocess.DEVNULL,
                           stderr=(work / f"{name}.stderr").open("w"))
    killed_at = None
    if kill is not None:
        while job.poll() is None and kill_after not in _published_batches(work / f"ck-{name}"):
            time.sleep(0.2)
        # The job's processes run the run folder's config.yaml (under model_save_path).
        victim = _victim(work / f"out-{name}", *kill)
        if victim is not None:
            victim.kill()
            killed_at = time.monotonic() - started
    code = job.wait()
    # The run folder psfleet train wrote under model_save_path (psfleet.rec.run_folder).
    metrics = json.loads((work / f"out-{name}" / "latest" / "metrics.json").read_text()) \
        if code == 0 else {}
    stderr = (work / f"{name}.stderr").read_text()
    return {"run": name, "exit": code, "killed": f"{kill[0]}={kill[1]}" if kill else None,
            "killed_at_s": killed_at, "restarts": stderr.count("restarting it"),
            "test_auc": (metrics.get("test") or {}).get("auc"),
            "wall_s": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Absolute: the paths go into YAML files written under --work.
    parser.add_argument("--train", type=lambda p: Path(p).resolve(), required=True)
    parser.add_argument("--test", type=lambda p: Path(p).resolve(), required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--kill_after", type=int, default=400)
    parser.add_argument("--runs", default="undisturbed,server_killed,worker_killed",
                        help="comma-separated runs to do (default: all three)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for name, kill in (("undisturbed", None), ("server_killed", ("PSFLEET_SERVER_INDEX", "1")),
                       ("worker_killed", ("PADDLE_TRAINER_ID", "1"))):
        if name not in args.runs.split(","):
            continue
        result = run(args.work, name, args.train, args.test, kill, args.kill_after)
        print(json.dumps(result), flush=True)
        results.append(result)
    base = results[0]["test_auc"] if results[0]["run"] == "undisturbed" else None
    for r in results[1:]:
        if isinstance(base, float) and isinstance(r["test_auc"], float):
            print(f"{r['run']}: test auc {r['test_auc']:.4f} vs undisturbed {base:.4f}: "
                  f"difference {r['test_auc'] - base:+.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
