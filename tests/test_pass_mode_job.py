"""Pass mode through the YAML runner: ``examples/criteo_dnn/config_gpubox.yaml`` as a
real 1 server x 2 workers job on the real Criteo sample, sub-passes forced by a small
cache budget, and the config errors a user meets first.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import assert_no_processes_mentioning, run_folder

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def test_the_gpubox_example_learns_in_sub_passes(run_cli: RunCli, repo_root: Path,
                                                 tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = run_cli(["train", "-m", str(repo_root / "examples/criteo_dnn/config_gpubox.yaml"),
                 "-o", f"runner.model_save_path={out}", "-o", "runner.epochs=2",
                 "-o", "runner.export_model=false",
                 "-o", "hyper_parameters.fc_sizes=[64, 32]",
                 # about 26 x 60 ids x 4 floats... per batch: several sub-passes an epoch
                 "-o", "runner.pass_configs.cache_budget_bytes=1048576"], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((run_folder(out) / "metrics.json").read_text())
    assert metrics["sync_mode"] == "gpubox"
    assert metrics["test"]["examples"] == 800
    assert metrics["test"]["auc"] > 0.6, metrics["test"]  # a cache never pushed back: ~0.5
    worker_log = (run_folder(out) / "log" / "workerlog.0").read_text()
    assert "sub-passes" in worker_log and "pass 1 ended" in worker_log
    table = metrics["tables"]["embedding"]
    assert 20_000 < table["rows"] < 7200 * 26
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.parametrize(("override", "message"), [
    ("runner.reader_type=DataLoader", "runner.reader_type: sync_mode gpubox"),
    ("runner.pass_configs.device=tpu", "runner.pass_configs.device: 'tpu': must be cpu, cuda"),
    ("runner.pass_configs.cache_budget_bytes=10",
     "runner.pass_configs.cache_budget_bytes"),
])
def test_pass_mode_config_errors_name_the_key(run_cli: RunCli, repo_root: Path,
                                              tmp_path: Path, override: str,
                                              message: str) -> None:
    r = run_cli(["train", "-m", str(repo_root / "examples/criteo_dnn/config_gpubox.yaml"),
                 "-o", f"runner.model_save_path={tmp_path / 'out'}", "-o", override])
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr
    assert not (tmp_path / "out").exists()  # refused before any run folder
