"""Whole-job restarts and hang detection with real jobs (issue 15, findings 6 and 10).

Each job is ``fleetrun`` (1 server, 2 workers (1 in the stopped-server test without
restarts), sync mode, SGD, seed 11, checkpoints every 10 steps) running ``psfleet
train`` in every process through ``tests/jobs/faulty_train_job.py``, which can make
worker 1 SIGKILL itself right after a given step (on its first start only) or slow the
steps down.

- Finding 6: worker 1 killed at step 15 with ``--max_restarts 1 --restart_policy gang``:
  fleetrun logs one line naming worker 1, the checkpoint of step 10 and "restart 1 of
  --max_restarts 1", restarts every process, and the job exits 0 with final tables
  (final checkpoint) and exported model bit-identical to an undisturbed run's.
- Finding 10: the server SIGSTOPped mid-run with ``PSFLEET_HEALTH_TIMEOUT_S=3``: without
  a restart the job fails within ~10 s, the summary naming the server, its endpoint and
  "did not answer health checks"; in an async job (``--restart_policy process``) with a
  restart left only the server is restarted and the job finishes. (A gang restart after
  a hang is the same restart as after the SIGKILL above; it is not run again here, to
  keep CI within its time.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from conftest import REPO_ROOT, clean_env, kill_processes, run_command

from psfleet.api import prepare
from psfleet.export import load_inference_model
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.restore import read_checkpoint
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.rec.run_folder import open_run_folder

pytestmark = [pytest.mark.job, pytest.mark.slow]

JOB_SCRIPT = REPO_ROOT / "tests" / "jobs" / "faulty_train_job.py"
STEPS = 30  # 480 examples / 2 workers / batch 8, one epoch


def _run_folder(tmp_path: Path, name: str, train: Path, test: Path,
                mode: str = "sync", workers: int = 2) -> tuple[Path, Path]:
    """Prepare a 1 x ``workers`` run as ``psfleet train`` does; (run folder, checkpoint
    dir)."""
    checkpoint_dir = tmp_path / f"ck-{name}"
    config = tmp_path / f"{name}.yaml"
    config.write_text(json.dumps({
        "runner": {"train_data_dir": str(train), "test_data_dir": str(test), "epochs": 1,
                   "batch_size": 8, "sync_mode": mode, "seed": 11,
                   "model_save_path": str(tmp_path / f"out-{name}"),
                   "checkpoint": {"checkpoint_dir": str(checkpoint_dir), "step_interval": 10,
                                  "epoch_interval": 1, "max_num_checkpoints": 5}},
        "hyper_parameters": {"fc_sizes": [16, 8],
                             "optimizer": {"class": "SGD", "learning_rate": 0.05}},
        "cluster": {"server_num": 1, "worker_num": workers},
    }))
    return open_run_folder(prepare(config)), checkpoint_dir


def _fleetrun(run: Path, *args: str, workers: int = 2) -> list[str]:
    return [sys.executable, "-m", "psfleet.launch.main", "--server_num", "1", "--worker_num",
            str(workers), "--log_dir", str(run / "log"), *args, str(JOB_SCRIPT)]


def _final_parameters(checkpoint_dir: Path) -> list[torch.Tensor]:
    """(keys, rows, dense) of the newest checkpoint (the one taken at the end)."""
    found = read_checkpoint(str(checkpoint_dir), 0)
    assert found is not None
    tables, _, latest = found
    assert latest.manifest.step == STEPS, latest.storage.url
    sparse, dense = tables[0], tables[1]
    assert isinstance(sparse, SparseTable) and isinstance(dense, DenseTable)
    keys, rows = sparse.items()
    order = np.argsort(keys)
    return [torch.from_numpy(keys[order]), torch.from_numpy(rows[order]),
            torch.from_numpy(dense.state()[0])]


def _exported(run: Path) -> list[torch.Tensor]:
    """The exported model's tower parameters and its embedding rows (sorted by key)."""
    model = load_inference_model(run / "model")
    tensors = [t.detach() for t in model._tower[0].state_dict().values()]
    for table in model.tables:
        order = np.argsort(table.keys)
        tensors += [torch.from_numpy(table.keys[order]), torch.from_numpy(table.values[order])]
    return tensors


@contextlib.contextmanager
def _job(argv: list[str], env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str],
                                                                  list[str]]]:
    """fleetrun in its own session, its stderr lines collected as they come; every
    process of its tree is continued and killed at the end if still there."""
    proc = subprocess.Popen(argv, env=clean_env(env), text=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    lines: list[str] = []
    stderr = proc.stderr
    assert stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(stderr.readline, "")),
                              daemon=True)
    reader.start()
    try:
        yield proc, lines
    finally:
        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGCONT)
            if proc.poll() is None:
                kill_processes(tree)
        proc.wait()
        reader.join(10)
        stderr.close()


def _wait_for(what: str, condition: Callable[[], bool], proc: subprocess.Popen[str],
              lines: list[str], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the job ended (exit {proc.returncode}) before {what}:\n"
                        + "".join(lines[-30:]))
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n" + "".join(lines[-30:]))
        time.sleep(0.05)


def _server_pid(lines: list[str]) -> int:
    for line in lines:
        match = re.search(r"started server 0 \(pid (\d+)\)", line)
        if match:
            return int(match.group(1))
    raise AssertionError("fleetrun did not log the server's pid")


def _checkpoint_steps(checkpoint_dir: Path) -> list[int]:
    return [int(m.group(1)) for p in checkpoint_dir.glob("ckpt-*")
            if (m := re.search(r"step(\d+)$", p.name)) and (p / "manifest.json").is_file()]


def test_sync_worker_killed_restarts_the_whole_job_and_ends_as_undisturbed(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    train, test = data_slice(480), data_slice(200, source="dev.csv")
    ref_run, ref_ck = _run_folder(tmp_path, "ref", train, test)
    run, ck = _run_folder(tmp_path, "cut", train, test)
    started = time.monotonic()
    # The undisturbed run goes on beside the other (they share nothing but the data).
    with _job([*_fleetrun(ref_run), str(ref_run / "config.yaml")], {}) as (ref, ref_lines):
        r = run_command([*_fleetrun(run, "--max_restarts", "1", "--restart_policy", "gang"),
                         "--kill_worker", "1", "--at_step", "15", str(run / "config.yaml")],
                        timeout=150, env={"PSFLEET_CHECKPOINT_DIR": str(ck)})
        restarted_s = time.monotonic() - started
        assert ref.wait(timeout=120) == 0, "".join(ref_lines[-30:])
    both_s = time.monotonic() - started
    assert r.returncode == 0, r.stderr[-4000:]
    restarts = [line for line in r.stderr.splitlines() if "restarting the whole job" in line]
    assert len(restarts) == 1, r.stderr[-4000:]
    assert re.search(r"worker 1 \(pid \d+\) failed with signal SIGKILL \(9\); restarting the "
                     r"whole job \(--restart_policy gang\)", restarts[0]), restarts[0]
    assert f"from checkpoint {ck}/ckpt-" in restarts[0] and "-step10 " in restarts[0]
    assert "(restart 1 of --max_restarts 1)" in restarts[0]
    log = run / "log"
    assert (log / "workerlog.1.failed1").is_file()
    assert (log / "workerlog.0.stopped1").is_file() and (log / "serverlog.0.stopped1").is_file()
    assert "recovered 2 tables from checkpoint" in (log / "serverlog.0").read_text()
    assert "resuming at epoch 1, batch 10 (step 10)" in (log / "workerlog.1").read_text()

    for got, want in zip(_final_parameters(ck), _final_parameters(ref_ck), strict=True):
        assert torch.equal(got, want)
    exported, reference = _exported(run), _exported(ref_run)
    assert len(exported) == len(reference)
    for got, want in zip(exported, reference, strict=True):
        assert torch.equal(got, want)
    print(f"killed and restarted run {restarted_s:.1f} s, both runs {both_s:.1f} s")


def _stop_server_mid_run(tmp_path: Path, data_slice: Callable[..., Path],
                         *restart_flags: str, mode: str = "sync", workers: int = 2
                         ) -> tuple[int, list[str], Path, float]:
    """Run a slowed-down 1 x ``workers`` job, SIGSTOP its server once a checkpoint
    past step 0 exists; return (exit code, fleetrun's stderr lines, run folder, seconds
    from the stop to the end)."""
    train, test = data_slice(480), data_slice(200, source="dev.csv")
    run, ck = _run_folder(tmp_path, "stop", train, test, mode, workers)
    argv = [*_fleetrun(run, *restart_flags, workers=workers), "--step_sleep_s", "0.1",
            str(run / "config.yaml")]
    env = {"PSFLEET_HEALTH_TIMEOUT_S": "3", "PSFLEET_CHECKPOINT_DIR": str(ck)}
    with _job(argv, env) as (proc, lines):
        _wait_for("a checkpoint past step 0", lambda: any(_checkpoint_steps(ck)), proc, lines)
        server = _server_pid(lines)
        os.kill(server, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("the job did not end within 90 s of its server's SIGSTOP:\n"
                        + "".join(lines[-30:]))
        ended = time.monotonic() - stopped
        assert not psutil.pid_exists(server) or psutil.Process(server).status() == "zombie"
    return proc.returncode, lines, run, ended


def test_stopped_server_without_restarts_fails_naming_it(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    # One worker: the hang is the server's; what is checked is fleetrun's health check
    # and its summary, which a second worker would not change (one process less).
    code, lines, _, ended = _stop_server_mid_run(tmp_path, data_slice, workers=1)
    text = "".join(lines)
    assert code == 1, text[-4000:]
    assert ended < 12, f"{ended:.1f} s from the SIGSTOP to the end"
    assert re.search(r"fleetrun: server 0 \(pid \d+, 127\.0\.0\.1:\d+\) did not answer health "
                     r"checks for [3-9] s \(its process is stopped: state T, e\.g\. SIGSTOP\) "
                     r"\(PSFLEET_HEALTH_TIMEOUT_S=3\); fleetrun killed it \(SIGKILL\); this is "
                     r"the first failure \(the root cause\)", text), text[-4000:]
    print(f"job failed {ended:.1f} s after the SIGSTOP")


def test_stopped_server_of_an_async_job_is_restarted_alone(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    code, lines, run, ended = _stop_server_mid_run(
        tmp_path, data_slice, "--max_restarts", "1", mode="async")  # --restart_policy process
    text = "".join(lines)
    assert code == 0, text[-4000:]
    assert "restarting the whole job" not in text
    (restart,) = [line for line in lines if "restarting it" in line]
    assert re.search(r"server 0 \(pid \d+, 127\.0\.0\.1:\d+\) did not answer health checks "
                     r"for [3-9] s .*; fleetrun killed it \(SIGKILL\); restarting it \(restart 1 "
                     r"of --max_restarts 1\)", restart), restart
    assert "recovered 2 tables from checkpoint" in (run / "log" / "serverlog.0").read_text()
    assert not (run / "log" / "workerlog.0.stopped1").exists()  # the workers went on
    print(f"job ended {ended:.1f} s after the SIGSTOP")
