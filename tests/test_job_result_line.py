"""A sync 1 server x 2 workers run of ``psfleet train`` (real processes, the Criteo
sample with 6 malformed lines, 3 in each worker's share):

- its result line says that its updates saw a global batch of 2 x ``batch_size`` and
  names ``runner.lr_scaling``; metrics.json holds what the note is made of (issue 45,
  item 7);
- metrics.json counts the malformed lines and examples of both workers, not worker
  0's alone (issue 45, item 8).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_folder

pytestmark = [pytest.mark.job, pytest.mark.slow]

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def test_sync_two_workers_name_lr_scaling_and_count_every_worker(
        run_cli: RunCli, repo_root: Path, tmp_path: Path,
        data_slice: Callable[..., Path]) -> None:
    train, test = data_slice(1000), data_slice(200, source="dev.csv")
    with train.open("a", encoding="utf-8") as f:  # lines 1001..1006: 3 per worker
        f.write("".join(f"garbage line {k}\n" for k in range(6)))
    r = run_cli(["train", "-m", str(repo_root / "examples" / "criteo_dnn" / "config.yaml"),
                 "-o", f"runner.train_data_dir={train}", "-o", f"runner.test_data_dir={test}",
                 "-o", f"runner.model_save_path={tmp_path / 'out'}", "-o", "runner.epochs=1",
                 "-o", "runner.sync_mode=sync", "-o", "runner.export_model=false",
                 "-o", "hyper_parameters.fc_sizes=[32]",
                 "-o", "cluster.server_num=1", "-o", "cluster.worker_num=2"], timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = next(line for line in r.stdout.splitlines() if "examples/s" in line)
    assert ("global batch 256 (2 workers x 128, averaged per update; one process steps "
            "with 128) at the same learning rate (runner.lr_scaling: auto)") in result, result
    metrics = json.loads((run_folder(tmp_path / "out") / "metrics.json").read_text())
    assert (metrics["batch_averaged"], metrics["lr_scaling"], metrics["lr_factor"]) == (
        True, "auto", 1.0)
    train_lines = metrics["malformed_lines"]["train"]
    assert (train_lines["malformed"], train_lines["lines"], train_lines["workers"]) == (
        6, 1006, 2)
    assert "skipped 6 malformed of 1,006 train lines" in result
    assert [e["job_examples"] for e in metrics["epochs"]] == [1000]
    assert [e["examples"] for e in metrics["epochs"]] == [500]  # worker 0's
