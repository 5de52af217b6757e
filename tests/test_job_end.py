"""The end of a job (issue 44, finding 3): a finished job always ends as finished.

After the last step worker 0 alone evaluates the test set and exports. The other
workers used to wait for it at the ``stop_worker`` barrier, whose deadline is the
server's barrier timeout (``PSFLEET_RPC_DEADLINE_S``, 180 s): a slow export failed a
finished job (sync 1 x 2: rc 1 after every step) or, with restarts, had the timed-out
worker restarted after worker 0 had stopped the servers. Now worker 0 evaluates past the
stop barrier (``fleet.stop_worker(finish)``), so nobody waits on it with a deadline.

Each job is ``fleetrun`` (1 server, 2 workers) running ``psfleet train`` through
``tests/jobs/faulty_train_job.py --finish_sleep_s``, which makes worker 0's evaluation
and export take longer than the barrier deadline (4 s here).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO_ROOT, assert_no_processes_mentioning, run_command

from psfleet.api import prepare
from psfleet.rec.run_folder import open_run_folder

pytestmark = [pytest.mark.job, pytest.mark.slow]

JOB_SCRIPT = REPO_ROOT / "tests" / "jobs" / "faulty_train_job.py"
DEADLINE_S = 4  # the servers' barrier timeout: every RPC deadline of the job
FINISH_SLEEP_S = 10  # worker 0's evaluation and export take longer than that


def _run_folder(tmp_path: Path, train: Path, test: Path, mode: str) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(json.dumps({
        "runner": {"train_data_dir": str(train), "test_data_dir": str(test), "epochs": 1,
                   "batch_size": 8, "sync_mode": mode, "seed": 11,
                   "model_save_path": str(tmp_path / "out")},
        "hyper_parameters": {"fc_sizes": [16, 8],
                             "optimizer": {"class": "SGD", "learning_rate": 0.05}},
        "cluster": {"server_num": 1, "worker_num": 2},
    }))
    return open_run_folder(prepare(config))


@pytest.mark.parametrize(("mode", "restart_flags"),
                         [("sync", []), ("async", ["--max_restarts", "1"])],
                         ids=["sync", "async_with_restarts"])
def test_slow_evaluation_and_export_do_not_fail_a_finished_job(
        tmp_path: Path, data_slice: Callable[..., Path], mode: str,
        restart_flags: list[str]) -> None:
    run = _run_folder(tmp_path, data_slice(480), data_slice(200, source="dev.csv"), mode)
    argv = [sys.executable, "-m", "psfleet.launch.main", "--server_num", "1",
            "--worker_num", "2", "--log_dir", str(run / "log"), *restart_flags,
            str(JOB_SCRIPT), "--finish_sleep_s", str(FINISH_SLEEP_S), str(run / "config.yaml")]

    r = run_command(argv, timeout=150, env={"PSFLEET_RPC_DEADLINE_S": str(DEADLINE_S)})

    assert r.returncode == 0, r.stderr[-4000:]
    assert "restarting it" not in r.stderr, r.stderr[-4000:]  # nothing restarted
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test"]["examples"] == 200
    assert math.isfinite(metrics["test"]["auc"])
    assert metrics["export"] == str(run / "model")
    for name in ("workerlog.0", "workerlog.1"):
        assert "did not arrive" not in (run / "log" / name).read_text(), name
    assert "worker 1 exited 0" in r.stderr and "server 0 exited 0" in r.stderr, r.stderr[-4000:]
    assert_no_processes_mentioning(str(tmp_path))


def test_a_worker_far_behind_is_waited_for_while_it_trains(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    """Async: worker 1 finishes its steps about 15 s after worker 0 (0.5 s per step),
    with a barrier deadline of 4 s. Worker 0 waits at the last barrier while worker 1
    still pushes: the barrier's timeout counts from the latest push or pull of a worker
    that has not arrived, so only a worker silent for the deadline fails it (before:
    worker 0 failed after 4 s, "workers [1] did not arrive within 4 s")."""
    run = _run_folder(tmp_path, data_slice(480), data_slice(200, source="dev.csv"), "async")
    argv = [sys.executable, "-m", "psfleet.launch.main", "--server_num", "1",
            "--worker_num", "2", "--log_dir", str(run / "log"), str(JOB_SCRIPT),
            "--step_sleep_s", "0.5", "--sleep_worker", "1", str(run / "config.yaml")]

    r = run_command(argv, timeout=150, env={"PSFLEET_RPC_DEADLINE_S": str(DEADLINE_S)})

    assert r.returncode == 0, r.stderr[-4000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test"]["examples"] == 200
    assert sum(epoch["examples"] for epoch in metrics["epochs"]) == 240  # worker 0's half
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.parametrize("restart_flags", [[], ["--max_restarts", "1"]],
                         ids=["no_restarts", "with_restarts"])
def test_a_worker_failing_after_the_stop_barrier_neither_restarts_nor_fails_the_job(
        tmp_path: Path, data_slice: Callable[..., Path], restart_flags: list[str]) -> None:
    """Worker 1 exits 3 right after its stop barrier, while worker 0 still evaluates
    (10 s). Every step ran and worker 0 writes the metrics: the job ends exit 0, nothing
    is restarted, and fleetrun warns naming worker 1 (before: exit 1 naming it as the
    root cause, or with restarts a new worker 1 that trained again and waited for
    peers that had left)."""
    run = _run_folder(tmp_path, data_slice(480), data_slice(200, source="dev.csv"), "async")
    argv = [sys.executable, "-m", "psfleet.launch.main", "--server_num", "1",
            "--worker_num", "2", "--log_dir", str(run / "log"), *restart_flags,
            str(JOB_SCRIPT), "--finish_sleep_s", str(FINISH_SLEEP_S), "--fail_after_stop",
            "1", str(run / "config.yaml")]

    r = run_command(argv, timeout=150)

    assert r.returncode == 0, r.stderr[-4000:]
    assert "restarting it" not in r.stderr, r.stderr[-4000:]
    assert re.search(r"worker 1 \(pid \d+\) failed with exit code 3 after the job's stop "
                     r"barrier \(its training was complete\); not restarted", r.stderr), \
        r.stderr[-4000:]
    assert "injected exit 3 of worker 1" in (run / "log" / "workerlog.1").read_text()
    assert not (run / "log" / ".done").exists()  # fleetrun's own file, removed at the end
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test"]["examples"] == 200 and metrics["export"] == str(run / "model")
    assert_no_processes_mentioning(str(tmp_path))
