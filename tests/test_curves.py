"""End to end: what a user sees of a run (issue 16 item 2): TensorBoard event files,
``curves.png``, validation during training with ``runner.valid_data_dir``, and the
malformed lines in metrics.json; through ``psfleet train`` on the real Criteo sample.

- The Criteo example in one process, 2 epochs, with validation and test on the same
  dev.csv slice: the event file read back with TensorBoard's EventAccumulator holds
  every scalar (tags, counts, values equal to metrics.json's), the PNG opens, the last
  validation equals the test evaluation (same data, same final parameters), and the
  5 malformed lines added to the training slice are counted.
- The example's own cluster (1 server x 2 workers, async) with validation after each
  epoch: every worker meets for the mid-training validation, and the model validates
  above AUC 0.6.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
from conftest import assert_no_processes_mentioning
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RunCli = Callable[..., subprocess.CompletedProcess[str]]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _train(run_cli: RunCli, repo_root: Path, out: Path, *overrides: str,
           timeout: float = 180) -> dict[str, Any]:
    args = ["train", "-m", str(repo_root / "examples" / "criteo_dnn" / "config.yaml"),
            "-o", f"runner.model_save_path={out}", "-o", "runner.epochs=2",
            "-o", "hyper_parameters.fc_sizes=[64, 32]"]
    for assignment in overrides:
        args += ["-o", assignment]
    result = run_cli(args, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
    return metrics


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``folder``: tag -> [(step, value)]."""
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def test_one_process_run_writes_event_file_png_and_validates_each_epoch(
        run_cli: RunCli, repo_root: Path, tmp_path: Path,
        data_slice: Callable[..., Path]) -> None:
    train, dev = data_slice(1500), data_slice(400, source="dev.csv")
    with train.open("a", encoding="utf-8") as f:  # 5 of 1505 lines malformed (0.3%)
        f.write("".join(f"garbage line {k}\n" for k in range(5)))
    out = tmp_path / "out"

    metrics = _train(run_cli, repo_root, out, f"runner.train_data_dir={train}",
                     f"runner.test_data_dir={dev}", f"runner.valid_data_dir={dev}",
                     "cluster.server_num=0", "cluster.worker_num=1")

    # validation after each epoch; the last one is the test evaluation (same data)
    valid, test = metrics["valid"], metrics["test"]
    assert [v["epoch"] for v in valid] == [1, 2]
    assert all(0.0 <= v["auc"] <= 1.0 and v["examples"] == 400 for v in valid)
    assert valid[1] == {"epoch": 2, **test}
    assert valid[0]["auc"] != valid[1]["auc"]  # the model moved between validations
    assert 0.5 < test["copc"] < 2.0  # clicks / predicted clicks of a trained model
    assert metrics["malformed_lines"]["train"]["malformed"] == 5
    assert metrics["malformed_lines"]["train"]["lines"] == 1505
    assert ":1501 " in metrics["malformed_lines"]["train"]["first"]
    assert metrics["malformed_lines"]["test"]["malformed"] == 0
    assert metrics["interrupted"] is None

    # TensorBoard: 1500 examples / batch 128 = 12 batches per epoch, print_interval 5
    assert metrics["tensorboard"] == str(out / "tensorboard")
    scalars = _scalars(out / "tensorboard")
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert [s for s, _ in scalars["train/loss"]] == [5, 10, 17, 22]
    assert len(scalars["train/auc_running"]) == len(scalars["train/examples_per_s"]) == 4
    assert all(v > 0 for _, v in scalars["train/examples_per_s"])
    for key in ("loss", "auc"):
        assert scalars[f"epoch/train_{key}"] == [
            (e["epoch"], pytest.approx(e[key], rel=1e-6)) for e in metrics["epochs"]]
    for key in ("auc", "logloss", "copc"):
        assert scalars[f"valid/{key}"] == [
            (v["epoch"], pytest.approx(v[key], rel=1e-6)) for v in valid]
        assert scalars[f"test/{key}"] == [(2, pytest.approx(test[key], rel=1e-6))]

    # the PNG
    png = Path(metrics["curves"])
    assert png == out / "curves.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(png)
    assert image.shape == (400, 1000, 4) and image.std() > 0  # drawn, not blank
    assert sorted(p.name for p in out.iterdir()) == ["curves.png", "metrics.json",
                                                     "tensorboard"]


@pytest.mark.parametrize("mode", ["async", "geo"])
def test_one_server_two_workers_validate_mid_training(
        run_cli: RunCli, repo_root: Path, tmp_path: Path, criteo_dir: Path, mode: str) -> None:
    out = tmp_path / "out"

    metrics = _train(run_cli, repo_root, out, f"runner.valid_data_dir={criteo_dir / 'dev.csv'}",
                     f"runner.sync_mode={mode}", "runner.geo_step=10",
                     "cluster.server_num=1", "cluster.worker_num=2", timeout=240)

    assert metrics["worker_num"] == 2 and metrics["sync_mode"] == mode
    valid = metrics["valid"]
    assert [v["epoch"] for v in valid] == [1, 2]
    assert all(v["examples"] == 409 for v in valid)
    assert valid[1]["auc"] > 0.6, valid
    assert metrics["test"]["auc"] > 0.6
    scalars = _scalars(out / "tensorboard")
    assert [s for s, _ in scalars["valid/auc"]] == [1, 2]
    assert Path(metrics["curves"]).read_bytes()[:8] == PNG_SIGNATURE
    assert_no_processes_mentioning(str(out))


def test_sync_validation_equals_one_process_with_the_global_batch(
        run_cli: RunCli, repo_root: Path, tmp_path: Path,
        data_slice: Callable[..., Path]) -> None:
    """Oracle: sync mode, 2 workers x batch 64 trains as one process with batch 128
    (worker k reads lines k, k+2, ...: the union of the workers' step-j batches is the
    process's step-j batch), so each epoch's validation, the mid-training one included,
    sees the same parameters: every push of both workers applied."""
    train, dev = data_slice(2048), data_slice(409, source="dev.csv")
    common = (f"runner.train_data_dir={train}", f"runner.test_data_dir={dev}",
              f"runner.valid_data_dir={dev}", "runner.shuffle=false",
              "runner.sync_mode=sync")
    alone = _train(run_cli, repo_root, tmp_path / "alone", *common, "runner.batch_size=128",
                   "cluster.server_num=0", "cluster.worker_num=1")
    job = _train(run_cli, repo_root, tmp_path / "job", *common, "runner.batch_size=64",
                 "cluster.server_num=1", "cluster.worker_num=2", timeout=240)

    assert [v["epoch"] for v in job["valid"]] == [v["epoch"] for v in alone["valid"]] == [1, 2]
    for got, want in zip(job["valid"], alone["valid"], strict=True):
        assert got["examples"] == want["examples"] == 409
        assert got["auc"] == pytest.approx(want["auc"], abs=1e-4)
        assert got["logloss"] == pytest.approx(want["logloss"], abs=1e-5)
        assert got["copc"] == pytest.approx(want["copc"], rel=1e-4)
    assert job["valid"][0]["auc"] != job["valid"][1]["auc"]
