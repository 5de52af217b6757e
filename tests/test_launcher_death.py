"""A SIGKILLed fleetrun takes its children with it (issue 15, finding 5).

A real ``fleetrun --server_num=1 --worker_num=2`` job trains on a Criteo slice; once
every child runs, the launcher (only it) gets SIGKILL. Within 10 s no process of the job
may remain, and each child's log says why it exited
(``launcher <pid> died; exiting``). Before the fix the server was still running 300 s
later, worker 0 died with an empty log and worker 1 hung for 180 s.

The same holds for a collective job's ranks (``--mode collective``). Two quicker
tests check each half of :mod:`psfleet.launcher_guard` alone, with a
stand-in launcher process SIGKILLed the same way: a child that never imports psfleet
dies by the parent-death signal alone (what ``ChildProcess`` sets between fork and
exec), and a child without prctl (the portable fallback) notices through its watch
thread and logs why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import (
    assert_no_processes_mentioning,
    clean_env,
    kill_processes,
    processes_mentioning,
)

pytestmark = pytest.mark.job

START_TIMEOUT_S = 90.0


def _config(tmp_path: Path, train: Path) -> Path:
    path = tmp_path / "death.yaml"
    path.write_text(json.dumps({
        "runner": {"train_data_dir": str(train), "epochs": 200, "batch_size": 8,
                   "sync_mode": "async", "model_save_path": str(tmp_path / "out"),
                   "seed": 3},
        "hyper_parameters": {"fc_sizes": [8]},
    }))
    return path


def _children(config: Path, launcher_pid: int) -> list[int]:
    return [p.pid for p in processes_mentioning(str(config)) if p.pid != launcher_pid]


@pytest.mark.slow
def test_sigkilled_launcher_leaves_no_child(tmp_path: Path,
                                            data_slice: Callable[..., Path]) -> None:
    config = _config(tmp_path, data_slice(2000))
    log_dir = tmp_path / "log"
    argv = [sys.executable, "-m", "psfleet.launch.main", "--server_num=1", "--worker_num=2",
            "--log_dir", str(log_dir), "-m", "psfleet.cli.main", "train", "-m", str(config)]
    launcher = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        logs = [log_dir / "serverlog.0", log_dir / "workerlog.0", log_dir / "workerlog.1"]
        # Running: three children, and both workers past start-up (worker 0 trains).
        while not (len(_children(config, launcher.pid)) == 3
                   and "epoch 1/200" in _read(logs[1])
                   and "worker" in _read(logs[2])):
            assert launcher.poll() is None, f"the job ended early: {_read(logs[1])[-2000:]}"
            assert time.monotonic() < deadline, "the job did not start in time"
            time.sleep(0.2)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        killed_at = time.monotonic()
        assert_no_processes_mentioning(str(config), timeout_s=10.0)
        assert time.monotonic() - killed_at < 10.0
        for log in logs:
            assert f"launcher {launcher.pid} died; exiting" in _read(log), (
                f"{log.name} does not say why it exited:\n{_read(log)[-1500:]}")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        kill_processes(processes_mentioning(str(config)))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
def test_sigkilled_collective_launcher_leaves_no_rank(tmp_path: Path) -> None:
    script = tmp_path / f"ranks_{os.getpid()}.py"
    script.write_text("import time\nimport psfleet\nprint('rank up', flush=True)\n"
                      "time.sleep(120)\n")
    log_dir = tmp_path / "log"
    argv = [sys.executable, "-m", "psfleet.launch.main", "--mode", "collective",
            "--nproc_per_node", "2", "--log_dir", str(log_dir), str(script)]
    launcher = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    logs = [log_dir / "workerlog.0", log_dir / "workerlog.1"]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all("rank up" in _read(log) for log in logs):
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        assert_no_processes_mentioning(str(script), timeout_s=10.0)
        for log in logs:
            assert f"launcher {launcher.pid} died; exiting" in _read(log), _read(log)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        kill_processes(processes_mentioning(str(script)))


# A stand-in launcher: starts one child as ChildProcess does (or, with "--no-prctl", a
# child that disables prctl and relies on the watch thread), prints its pid, sleeps.
_STAND_IN = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from psfleet.launch.process import ChildProcess
    from psfleet.launch.types import ProcessSpec, Role
    child_code, log = sys.argv[1], Path(sys.argv[2])
    spec = ProcessSpec(Role.WORKER, 0, (sys.executable, "-c", child_code),
                       dict(os.environ), log, False)
    child = ChildProcess(spec)
    print(child.pid, flush=True)
    time.sleep(120)
""")
_PLAIN_CHILD = "import time; time.sleep(120)  # never imports psfleet"
_NO_PRCTL_CHILD = textwrap.dedent("""
    import os, time
    launcher = int(os.environ.pop("PSFLEET_LAUNCHER_PID"))  # before psfleet reads it
    import psfleet.launcher_guard as guard
    guard.set_parent_death_signal(0)  # undo the launcher's prctl: as on a system
    guard._PRCTL = None               # without it, only the watch thread is left
    guard.watch_launcher(launcher)
    time.sleep(120)
""")


@pytest.mark.parametrize("child_code", [_PLAIN_CHILD, _NO_PRCTL_CHILD],
                         ids=["parent-death-signal", "watch-thread-fallback"])
def test_child_dies_with_its_stand_in_launcher(tmp_path: Path, child_code: str) -> None:
    log = tmp_path / "child.log"
    launcher = subprocess.Popen([sys.executable, "-c", _STAND_IN, child_code, str(log)],
                                env=clean_env(), stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    child_pid = None
    try:
        assert launcher.stdout is not None
        child_pid = int(launcher.stdout.readline())
        time.sleep(1.0 if child_code is _NO_PRCTL_CHILD else 0.3)  # child is running
        assert _pid_alive(child_pid)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 5.0
        while _pid_alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _pid_alive(child_pid), "the child outlived its launcher by 5 s"
        if child_code is _NO_PRCTL_CHILD:
            assert f"launcher {launcher.pid} died; exiting" in _read(log)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if launcher.stdout is not None:
            launcher.stdout.close()
        if child_pid is not None and _pid_alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
