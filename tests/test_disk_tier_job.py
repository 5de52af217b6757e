"""A job whose sparse table does not fit its memory budget trains to the same model.

``psfleet train`` of the shared Criteo sample, 1 server x 2 workers, sync mode with
SGD (a fixed order of updates), once with every row in memory and once with
``hyper_parameters.sparse_accessor.memory_rows`` a quarter of the rows: the exported
embedding rows and dense tower are equal, bit for bit; the tiered run held most rows
on disk (``psfleet.ps.table.disk_tier``), and its tier folder is gone after the job.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, run_folder

from psfleet.export import load_inference_model

pytestmark = [pytest.mark.job, pytest.mark.slow]

MEMORY_ROWS = 8_192


def _train(run_cli: Callable[..., subprocess.CompletedProcess[str]], criteo_dir: Path,
           out: Path, *extra: str) -> Path:
    result = run_cli(["train", "-q", "-m", str(REPO_ROOT / "examples/criteo_dnn/config.yaml"),
                      "-o", f"runner.train_data_dir={criteo_dir / 'train.csv'}",
                      "-o", f"runner.test_data_dir={criteo_dir / 'test.csv'}",
                      "-o", "runner.epochs=1", "-o", "runner.batch_size=64",
                      "-o", "runner.sync_mode=sync",
                      "-o", "hyper_parameters.optimizer.class=SGD",
                      "-o", "hyper_parameters.optimizer.learning_rate=0.05",
                      "-o", f"runner.model_save_path={out}", *extra], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_folder(out)


def test_a_table_four_times_its_memory_trains_to_the_same_model(
        run_cli: Callable[..., subprocess.CompletedProcess[str]], criteo_dir: Path,
        tmp_path: Path) -> None:
    tiers = tmp_path / "tiers"
    plain = load_inference_model(_train(run_cli, criteo_dir, tmp_path / "plain") / "model")
    tiered = load_inference_model(_train(
        run_cli, criteo_dir, tmp_path / "tiered",
        "-o", f"hyper_parameters.sparse_accessor.memory_rows={MEMORY_ROWS}",
        "-o", f"hyper_parameters.sparse_accessor.disk_dir={tiers}") / "model")
    (table,), (tiered_table,) = plain.tables, tiered.tables
    assert table.keys.size > 4 * MEMORY_ROWS  # most rows were on disk at the end
    np.testing.assert_array_equal(tiered_table.keys, table.keys)
    np.testing.assert_array_equal(tiered_table.values, table.values)
    for a, b in zip(tiered._tower[0].state_dict().values(),
                    plain._tower[0].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert tiers.is_dir() and not any(tiers.iterdir())  # the server removed its tier
