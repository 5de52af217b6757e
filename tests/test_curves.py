"""End to end: what a user sees of a run (issue 16 item 2): TensorBoard event files,
``curves.png``, validation during training with ``runner.valid_data_dir``, and the
malformed lines in metrics.json; through ``psfleet train`` on the real Criteo sample.

- The Criteo example in one process, 2 epochs, with validation and test on the same
  dev.csv slice: the event file read back with TensorBoard's EventAccumulator holds
  every scalar (tags, counts, values equal to metrics.json's), the PNG opens, the last
  validation equals the test evaluation (same data, same final parameters), and the
  5 malformed lines added to the training slice are counted.
- The example's own cluster (1 server x 2 workers, async and GEO; 2 collective ranks)
  with validation after each epoch: every worker meets for the mid-training
  validation, and the model validates above AUC 0.6; worker 1 and the server have their
  TensorBoard runs; the async job runs with ``cluster.tls: self-signed`` (its servers
  serve TLS).
- Sync mode, 2 workers x batch 64, validates each epoch exactly as one process with
  batch 128 (the sync oracle).
- SIGINT to a 1x2 job with checkpoints, after its second checkpoint: metrics.json holds
  the finished epochs and ``interrupted`` names the newest complete checkpoint.

Only the one-process run exports the model (its run folder's ``model/`` is checked);
the jobs whose assertions read no model run with ``runner.export_model=false``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.image
import psutil
import pytest
from conftest import assert_no_processes_mentioning, clean_env, kill_processes, run_folder
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
    metrics: dict[str, Any] = json.loads((run_folder(out) / "metrics.json").read_text())
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
    run = run_folder(out)
    assert metrics["tensorboard"] == str(run / "tensorboard")
    scalars = _scalars(run / "tensorboard")
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 1
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
    # the in-process tables, sampled at the same steps: rows only grow, 9 floats a row
    server = _scalars(run / "tensorboard" / "server_0")
    rows = [v for _, v in server["server/embedding/rows"]]
    assert [s for s, _ in server["server/embedding/rows"]] == [5, 10, 17, 22]
    assert rows == sorted(rows) and rows[0] > 0
    assert all(b >= r * 9 * 4 for (_, r), (_, b) in zip(
        server["server/embedding/rows"], server["server/embedding/memory_bytes"], strict=True))
    assert all(v > 0 for _, v in server["server/embedding/pulls_per_s"])

    # the PNG
    png = Path(metrics["curves"])
    assert png == run / "curves.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(png)
    assert image.shape == (400, 1000, 4) and image.std() > 0  # drawn, not blank
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "curves.png",
                                                     "metrics.json", "model", "tensorboard"]
    assert sorted(p.name for p in out.iterdir()) == sorted([run.name, "latest"])


@pytest.mark.parametrize(("mode", "servers"), [("async", 1), ("geo", 1), ("collective", 0)])
def test_two_workers_validate_mid_training(run_cli: RunCli, repo_root: Path, tmp_path: Path,
                                           criteo_dir: Path, mode: str, servers: int) -> None:
    out = tmp_path / "out"

    tls = ["cluster.tls=self-signed"] if mode == "async" else []  # TLS channels train alike
    metrics = _train(run_cli, repo_root, out, f"runner.valid_data_dir={criteo_dir / 'dev.csv'}",
                     f"runner.sync_mode={mode}", "runner.geo_step=10",
                     f"cluster.server_num={servers}", "cluster.worker_num=2",
                     "runner.export_model=false", *tls, timeout=240)

    assert metrics["worker_num"] == 2 and metrics["sync_mode"] == mode
    valid = metrics["valid"]
    assert [v["epoch"] for v in valid] == [1, 2]
    assert all(v["examples"] == 409 for v in valid)
    assert valid[1]["auc"] > 0.6, valid
    assert metrics["test"]["auc"] > 0.6
    board = run_folder(out) / "tensorboard"
    scalars = _scalars(board)
    assert [s for s, _ in scalars["valid/auc"]] == [1, 2]
    # worker 1's throughput beside worker 0's; the server's tables sampled by worker 0
    assert all(v > 0 for _, v in _scalars(board / "worker_1")["train/examples_per_s"])
    assert (board / "server_0").is_dir() == (servers > 0)
    if servers:
        server = _scalars(board / "server_0")
        assert server["server/embedding/rows"][-1][1] > 0
        assert any(v > 0 for _, v in server["server/embedding/pushes_per_s"])  # geo: every 10
    assert Path(metrics["curves"]).read_bytes()[:8] == PNG_SIGNATURE
    log = run_folder(out) / "log"
    assert (log / "tls" / "cert.pem").is_file() == bool(tls)
    if servers:
        assert ("(TLS; auth token required" in (log / "serverlog.0").read_text()) == bool(tls)
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
              "runner.sync_mode=sync", "runner.export_model=false")
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


def test_sigint_to_a_job_keeps_the_finished_epochs_and_names_the_newest_checkpoint(
        repo_root: Path, tmp_path: Path, criteo_dir: Path) -> None:
    out, checkpoints = tmp_path / "out", tmp_path / "ck"
    argv = [sys.executable, "-m", "psfleet.cli.main", "train",
            "-m", str(repo_root / "examples" / "criteo_dnn" / "config.yaml"),
            "-o", f"runner.model_save_path={out}", "-o", "runner.epochs=60",
            "-o", f"runner.valid_data_dir={criteo_dir / 'dev.csv'}",
            "-o", f"runner.checkpoint={{checkpoint_dir: {checkpoints}, epoch_interval: 1}}",
            "-o", "hyper_parameters.fc_sizes=[32]"]
    log = (tmp_path / "console.txt").open("w")
    proc = subprocess.Popen(argv, env=clean_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:  # the first checkpoint is taken at the start, the second after epoch 1
        deadline = time.monotonic() + 120
        while not (checkpoints / "ckpt-000002-step29" / "manifest.json").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, (
                (tmp_path / "console.txt").read_text()[-3000:])
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            kill_processes([psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)])
            proc.wait()
        log.close()

    console = (tmp_path / "console.txt").read_text()
    assert code == 130, console[-3000:]
    run = run_folder(out)
    worker_log = run / "log" / "workerlog.0"
    assert (run / "metrics.json").is_file(), (  # what worker 0 did with the interrupt
        console[-3000:] + (worker_log.read_text()[-3000:] if worker_log.is_file() else ""))
    metrics = json.loads((run / "metrics.json").read_text())
    interrupted = metrics["interrupted"]
    newest = max(p for p in checkpoints.iterdir() if (p / "manifest.json").is_file())
    assert interrupted["checkpoint"] == str(newest)
    assert interrupted["epoch"] >= 2 and interrupted["step"] >= 29
    finished = interrupted["epoch"] - 1
    assert [e["epoch"] for e in metrics["epochs"]] == list(range(1, finished + 1))
    # an interrupt between an epoch's last batch and its validation leaves that epoch
    # trained but not validated
    assert [v["epoch"] for v in metrics["valid"]] in (list(range(1, finished + 1)),
                                                      list(range(1, finished)))
    assert interrupted["step"] == 29 * finished + interrupted["batch"]  # 29 batches/epoch
    assert metrics["test"] is None
    assert not [p for p in (*out.iterdir(), *run.iterdir())
                if p.name.startswith(".")]  # no temporary file
    assert_no_processes_mentioning(str(tmp_path))
