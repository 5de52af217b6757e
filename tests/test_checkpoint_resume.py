"""Resume and restarts with real jobs (``psfleet train``, real processes, 127.0.0.1).

- Sync mode: a job SIGKILLed (every process) after a checkpoint and run again with the
  same command, on 3 servers instead of 2, ends with the same parameters as an
  uninterrupted run on 1 server (<= 1e-6), every example trained exactly once.
- Async mode, ``cluster.max_restarts: 1``: a server SIGKILLed mid-training is restarted
  on its endpoint and recovers its tables from the newest checkpoint; then a worker
  SIGKILLed (while the workers wait for the server) is restarted and rejoins from its
  cursor. The job exits 0, each restart is
  logged with its cause, and the test AUC is sane.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import clean_env, kill_processes, run_command, run_folder

from psfleet.checkpoint import CheckpointStore
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.persist import load_server, saved_table_configs
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import DenseTableConfig, SparseTableConfig

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _config(tmp_path: Path, name: str, train: Path, test: Path, mode: str, epochs: int,
            batch: int, checkpoint: dict[str, object], servers: int,
            max_restarts: int = 0) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({
        "runner": {"train_data_dir": str(train), "test_data_dir": str(test),
                   "epochs": epochs, "batch_size": batch, "sync_mode": mode,
                   "model_save_path": str(tmp_path / f"out-{name}"), "seed": 11,
                   "checkpoint": checkpoint, "export_model": False},  # checkpoints only
        "hyper_parameters": {"fc_sizes": [32, 16]},
        "cluster": {"server_num": servers, "worker_num": 2, "max_restarts": max_restarts},
    }))
    return path


def _train_argv(config: Path, *overrides: str) -> list[str]:
    args = [sys.executable, "-m", "psfleet.cli.main", "train", "-m", str(config)]
    for o in overrides:
        args += ["-o", o]
    return args


def _wait_for(what: str, condition: Callable[[], bool], job: subprocess.Popen[str],
              timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if job.poll() is not None:
            pytest.fail(f"the job ended (exit {job.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def _wait_for_checkpoint(job: subprocess.Popen[str], folder: Path, batch: int) -> None:
    """Wait until ``job`` published the checkpoint after ``batch`` batches in ``folder``."""
    _wait_for(f"the checkpoint after batch {batch}",
              lambda: any(_manifest(p).get("batch") == batch for p in _checkpoints(folder)),
              job)


def _checkpoints(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("ckpt-*") if (p / "manifest.json").is_file())


def _manifest(folder: Path) -> dict[str, object]:
    """A checkpoint's manifest; empty when the folder was removed meanwhile (pruned)."""
    try:
        return json.loads((folder / "manifest.json").read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return {}


def _job_process(config: Path, variable: str, value: str) -> psutil.Process:
    """The running child of the job whose command line names ``config`` (the run
    folder's config.yaml) and whose environment has ``variable=value``."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(config) in " ".join(proc.info["cmdline"] or []) and \
                    proc.environ().get(variable) == value:
                return proc
        except psutil.Error:
            continue
    pytest.fail(f"no process of the job with {variable}={value}")


def _final_parameters(checkpoint_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, rows, dense) of the newest checkpoint, gathered from every server's files."""
    latest = CheckpointStore(checkpoint_dir).latest()
    assert latest is not None
    servers = latest.manifest.server_num
    configs = [saved_table_configs(latest.storage, s) for s in range(servers)]
    sparse_config = configs[0][0]
    assert isinstance(sparse_config, SparseTableConfig)
    sparse = SparseTable(sparse_config)
    dense_config = configs[0][1]
    assert isinstance(dense_config, DenseTableConfig)
    total = sum(c[1].size for c in configs)  # type: ignore[union-attr]
    dense = DenseTable(dense_config.model_copy(update={"size": total}),
                       np.zeros(total, np.float32))
    load_server({0: sparse, 1: dense}, latest.storage, 0, 1, {1: np.arange(total)})
    keys, rows = sparse.items()
    return keys, rows, dense.state()[0]


def test_sync_job_killed_after_a_checkpoint_resumes_exactly(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    train, test = data_slice(800), data_slice(300, source="dev.csv")
    checkpoint = {"checkpoint_dir": str(tmp_path / "ck-ref"), "epoch_interval": 1,
                  "step_interval": 20, "max_num_checkpoints": 2}
    # The uninterrupted reference on 1 server: in sync mode the parameters do not depend
    # on the server count (the resumed run below is on 3), and it is one process less.
    reference = _config(tmp_path, "ref", train, test, "sync", 2, 8, checkpoint, 1)
    r = run_command(_train_argv(reference), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]

    config = _config(tmp_path, "cut", train, test, "sync", 2, 8,
                     {**checkpoint, "checkpoint_dir": str(tmp_path / "ck-cut")}, 2)
    job = subprocess.Popen(_train_argv(config), env=clean_env(), text=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        _wait_for_checkpoint(job, tmp_path / "ck-cut", 20)
    finally:
        everything = [psutil.Process(job.pid), *psutil.Process(job.pid).children(True)]
        kill_processes(everything)  # SIGKILL: the launcher, servers and workers
        job.wait()
    cut = _checkpoints(tmp_path / "ck-cut")
    assert max(int(_manifest(p)["epoch"]) for p in cut) < 2, "the job ended before the kill"  # type: ignore[call-overload]
    cut_run = run_folder(tmp_path / "out-cut")
    assert not (cut_run / "metrics.json").exists()

    # The same command again, on 3 servers: a new run folder, and it continues from the
    # newest checkpoint (checkpoint_dir is the config's, not the run folder's).
    r = run_command(_train_argv(config, "cluster.server_num=3"), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert run_folder(tmp_path / "out-cut") != cut_run
    log = (run_folder(tmp_path / "out-cut") / "log" / "workerlog.0").read_text()
    assert "resumed tables from checkpoint" in log and "resuming at epoch" in log
    steps = [int(_manifest(p)["step"]) for p in _checkpoints(tmp_path / "ck-cut")]  # type: ignore[call-overload]
    assert max(steps) == 2 * 400 // 8  # every worker's examples once per epoch

    ref_keys, ref_rows, ref_dense = _final_parameters(tmp_path / "ck-ref")
    keys, rows, dense = _final_parameters(tmp_path / "ck-cut")
    assert np.array_equal(keys, ref_keys)
    np.testing.assert_allclose(rows, ref_rows, rtol=0, atol=1e-6)
    np.testing.assert_allclose(dense, ref_dense, rtol=0, atol=1e-6)


def test_killed_server_and_killed_worker_are_restarted(tmp_path: Path, criteo_dir: Path) -> None:
    # step_interval: every worker runs the same steps, so the restarted worker must take
    # the agreed examples per worker from the checkpoint (it cannot count with the others).
    checkpoint = {"checkpoint_dir": str(tmp_path / "ck"), "epoch_interval": 1,
                  "step_interval": 40}
    config = _config(tmp_path, "async", criteo_dir / "train.csv", criteo_dir / "dev.csv",
                     "async", 2, 64, checkpoint, 2, max_restarts=1)
    job = subprocess.Popen(_train_argv(config), env=clean_env(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    try:
        _wait_for("the first epoch's checkpoint", lambda: any(
            _manifest(p).get("epoch") == 1 for p in _checkpoints(tmp_path / "ck")), job)
        run = run_folder(tmp_path / "out-async")  # the launcher made it first
        log = run / "log"
        # The job's processes run the run folder's config.yaml, not the one given.
        _job_process(run / "config.yaml", "PSFLEET_SERVER_INDEX", "1").kill()
        _wait_for("server 1 to recover", lambda: (log / "serverlog.1").is_file() and
                  "recovered" in (log / "serverlog.1").read_text(), job)
        _job_process(run / "config.yaml", "PADDLE_TRAINER_ID", "1").kill()
        stdout, stderr = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            kill_processes([psutil.Process(job.pid), *psutil.Process(job.pid).children(True)])
            job.wait()
    assert job.returncode == 0, stderr[-4000:]
    assert "server 1" in stderr and "worker 1" in stderr
    restarts = [line for line in stderr.splitlines() if "restarting it" in line]
    assert len(restarts) == 2 and all("signal SIGKILL" in line for line in restarts)
    assert (log / "serverlog.1.failed1").is_file() and (log / "workerlog.1.failed1").is_file()
    assert "recovered 2 tables from checkpoint" in (log / "serverlog.1").read_text()
    worker_log = (log / "workerlog.1").read_text()
    assert "rejoins from checkpoint" in worker_log
    assert "restarted worker: 3600 examples per worker per epoch, as the job agreed" in worker_log
    metrics = json.loads((log.parent / "metrics.json").read_text())
    assert 0.65 < metrics["test"]["auc"] < 1.0
