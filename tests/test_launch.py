"""Tests of the local launcher (fleetrun) with real processes and real sockets.

Each job runs ``tests/launch_scripts/ps_job.py`` through ``python -m
psfleet.launch.main``. The children record their pids (and their grandchildren's) in
the job's output directory, so every test can assert with psutil that nothing the
launcher started is still alive; the fixture kills leftovers even when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from psfleet.errors import ConfigError, LaunchError
from psfleet.launch import LaunchConfig, describe_exit, launch_local, read_endpoint
from psfleet.launch.specs import server_spec, worker_spec
from psfleet.rpc import parse_endpoint
from psfleet.rpc.endpoint_file import write_endpoint_file

pytestmark = pytest.mark.job

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "launch_scripts"
SCRIPT = SCRIPTS / "ps_job.py"
JOB_TIMEOUT_S = 60.0


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float


class Job:
    """One launcher run in a temporary directory, with leak checks and cleanup."""

    def __init__(self, root: Path) -> None:
        self.log_dir = root / "log"
        self.out_dir = root / "out"
        self.out_dir.mkdir(parents=True)
        self.launchers: list[subprocess.Popen[str]] = []
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(SCRIPTS)])
        env.pop("PSFLEET_LOG_LEVEL", None)
        self.env = env

    def start(
        self, *flags: str, script_args: Sequence[str] = (), module: bool = False
    ) -> subprocess.Popen[str]:
        target = ["-m", "ps_job"] if module else [str(SCRIPT)]
        argv = [
            sys.executable, "-m", "psfleet.launch.main", "--log_dir", str(self.log_dir),
            "--stop_grace_s", "2", *flags, *target, "--out_dir", str(self.out_dir),
            *script_args,
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            env=self.env,
            cwd=self.out_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.launchers.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen[str], started: float) -> Result:
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT_S)
        return Result(proc.returncode, stdout, stderr, time.monotonic() - started)

    def run(self, *flags: str, script_args: Sequence[str] = (), module: bool = False) -> Result:
        started = time.monotonic()
        return self.wait(self.start(*flags, script_args=script_args, module=module), started)

    def child_pids(self) -> dict[str, int]:
        """``{"server.0": pid, "server.0.grandchild": pid, ...}`` from the pid files."""
        pids = {}
        for path in self.out_dir.glob("pid.*"):
            name, _, pid = path.name[len("pid.") :].rpartition(".")
            pids[name] = int(pid)
        return pids

    def alive(self) -> dict[str, int]:
        return {name: pid for name, pid in self.child_pids().items() if _alive(pid)}

    def result(self, worker: int) -> dict[str, object]:
        return json.loads((self.out_dir / f"worker.{worker}.json").read_text())

    def cleanup(self) -> None:
        for proc in self.launchers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate(timeout=10)
        _kill_leftovers(self.out_dir)


def _recorded_pids(out_dir: Path) -> list[int]:
    return [int(p.name.rpartition(".")[2]) for p in out_dir.glob("pid.*")]


def _kill_leftovers(out_dir: Path) -> None:
    for pid in _recorded_pids(out_dir):
        if _alive(pid):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    j = Job(tmp_path)
    try:
        yield j
    finally:
        j.cleanup()


def _wait_for(paths: Sequence[Path], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"timed out waiting for {paths}"
        time.sleep(0.05)


# -- whole jobs -------------------------------------------------------------------------


def test_two_servers_two_workers_succeed(job: Job) -> None:
    stale = job.log_dir / ".endpoints" / "server.1"
    stale.parent.mkdir(parents=True)
    stale.write_text("127.0.0.1:1\n")  # a previous job's; must be ignored

    r = job.run("--server_num", "2", "--worker_num", "2", script_args=["alpha"])

    assert r.returncode == 0, r.stderr
    endpoints = [read_endpoint(job.log_dir / ".endpoints" / f"server.{i}") for i in (0, 1)]
    assert "127.0.0.1:1" not in endpoints
    for k in (0, 1):
        res = job.result(k)
        assert res["trainer_id"] == str(k)
        assert res["trainers_num"] == "2"
        assert res["training_role"] == res["paddle_training_role"] == "TRAINER"
        assert res["pod_ip"] == res["current_ip"] == "127.0.0.1"
        assert res["endpoints"] == endpoints
        assert res["replies"] == ["ok server 0", "ok server 1"]
        assert res["args"] == ["alpha"]
    for name in ("serverlog.0", "serverlog.1", "workerlog.0", "workerlog.1"):
        assert (job.log_dir / name).stat().st_size > 0, name
    worker1_log = (job.log_dir / "workerlog.1").read_text()
    assert "worker 1 marker-stdout" in worker1_log
    assert "worker 1 marker-stderr" in worker1_log
    assert "server 0 served 2 worker(s)" in (job.log_dir / "serverlog.0").read_text()
    # Worker 0's output is teed to the launcher's stdout; worker 1's is not.
    assert "worker 0 marker-stdout" in r.stdout
    assert "worker 0 marker-stderr" in r.stdout
    assert "worker 0 done" in (job.log_dir / "workerlog.0").read_text()
    assert "worker 1" not in r.stdout
    assert str(job.log_dir) in r.stderr  # where the logs are
    assert len(job.child_pids()) == 6  # 2 servers + their grandchildren + 2 workers
    assert job.alive() == {}


def test_servers_that_do_not_stop_are_terminated_after_grace(job: Job) -> None:
    r = job.run("--server_num", "1", "--worker_num", "1", script_args=["--no_stop"])

    assert r.returncode == 0, r.stderr
    assert "SIGTERM" in r.stderr
    assert r.elapsed_s < 60  # far below any hang (timeouts of 300 s, barriers of 180 s)
    assert job.alive() == {}


def test_worker_failure_names_root_cause_and_stops_everything(job: Job) -> None:
    r = job.run(
        "--server_num", "2", "--worker_num", "2",
        script_args=["--fail_worker", "1", "--fail_code", "3"],
    )  # fmt: skip

    assert r.returncode == 1
    assert "worker 1" in r.stderr
    assert "exit code 3" in r.stderr
    assert "first failure" in r.stderr
    assert str(job.log_dir / "workerlog.1") in r.stderr
    assert "RuntimeError: simulated failure of worker 1" in r.stderr  # the log's tail
    assert r.elapsed_s < 60  # far below any hang (timeouts of 300 s, barriers of 180 s)
    assert {"server.0", "server.1", "worker.0", "worker.1"} <= set(job.child_pids())
    assert job.alive() == {}


def test_worker_killed_by_signal_is_named(job: Job) -> None:
    r = job.run("--server_num", "1", "--worker_num", "2", script_args=["--kill_worker", "0"])

    assert r.returncode == 1
    assert "worker 0" in r.stderr
    assert "signal SIGKILL" in r.stderr
    assert job.alive() == {}


def test_server_crash_before_endpoint_fails_at_once(job: Job) -> None:
    r = job.run("--server_num", "2", "--worker_num", "2", script_args=["--crash_server", "1"])

    assert r.returncode == 1
    assert "server 1" in r.stderr
    assert "exit code 5" in r.stderr
    assert "before writing its endpoint" in r.stderr
    assert str(job.log_dir / "serverlog.1") in r.stderr
    assert "simulated crash before listening" in r.stderr
    assert not list(job.log_dir.glob("workerlog.*"))  # no worker was started
    assert r.elapsed_s < 60  # far below any hang (timeouts of 300 s, barriers of 180 s)
    assert job.alive() == {}


def test_fleetrun_waits_as_long_as_the_environment_says(job: Job) -> None:
    """Without the flag, fleetrun's own wait is PSFLEET_SERVER_WAIT_TIMEOUT_S, as the
    workers' is (it once waited 300 s whatever the variable said)."""
    job.env["PSFLEET_SERVER_WAIT_TIMEOUT_S"] = "1.5"
    r = job.run("--server_num", "1", "--worker_num", "1", script_args=["--silent_server", "0"])

    assert r.returncode == 1
    assert "--server_wait_timeout_s=1.5:" in r.stderr
    assert r.elapsed_s < 60
    assert job.alive() == {}


def test_server_that_never_reports_endpoint_times_out(job: Job) -> None:
    r = job.run(
        "--server_num", "2", "--worker_num", "1", "--server_wait_timeout_s", "1",
        script_args=["--silent_server", "0"],
    )  # fmt: skip

    assert r.returncode == 1
    assert "--server_wait_timeout_s" in r.stderr
    assert "server 0 (log" in r.stderr
    assert "server 1 (log" not in r.stderr  # server 1 did report
    assert str(job.log_dir / "serverlog.0") in r.stderr
    assert r.elapsed_s < 60  # far below any hang (timeouts of 300 s, barriers of 180 s)
    assert job.alive() == {}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_stops_all_children(job: Job, signum: signal.Signals) -> None:
    proc = job.start("--server_num", "2", "--worker_num", "2", script_args=["--hang"])
    started = time.monotonic()
    _wait_for([job.out_dir / "ready.0", job.out_dir / "ready.1"])
    names = set(job.child_pids())
    assert {"server.0", "server.1", "worker.0", "worker.1", "worker.0.grandchild"} <= names
    assert set(job.alive()) == names

    proc.send_signal(signum)
    r = job.wait(proc, started)

    assert r.returncode == 128 + signum
    assert signum.name in r.stderr
    assert job.alive() == {}


def test_module_mode_without_servers(job: Job) -> None:
    r = job.run("--worker_num", "1", module=True)

    assert r.returncode == 0, r.stderr
    res = job.result(0)
    assert res["has_endpoint_list"] is False
    assert res["trainers_num"] == "1"
    assert job.alive() == {}


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--worker_num", "0"], "--worker_num"),
        (["--server_num", "-1"], "--server_num"),
        (["--stop_grace_s", "-1"], "--stop_grace_s"),
        (["--server_wait_timeout_s", "0"], "--server_wait_timeout_s"),
        (["--worker_num", "two"], "--worker_num"),
    ],
)
def test_bad_flag_value_exits_2_naming_the_flag(job: Job, flags: list[str], named: str) -> None:
    r = job.run(*flags)

    assert r.returncode == 2
    assert named in r.stderr
    assert not job.log_dir.exists()  # nothing was started


def test_missing_script_exits_2(job: Job) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "psfleet.launch.main", str(job.out_dir / "nope.py")],
        env=job.env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "nope.py" in proc.stderr


# -- the Python API ---------------------------------------------------------------------


def test_launch_local_api(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    try:
        code = launch_local(
            [str(SCRIPT), "--out_dir", str(out_dir)],
            server_num=1,
            worker_num=2,
            log_dir=tmp_path / "log",
            stop_grace_s=2,
            tee_worker_0=False,
        )
        assert code == 0
        assert json.loads((out_dir / "worker.1.json").read_text())["replies"] == ["ok server 0"]
        pids = _recorded_pids(out_dir)
        assert len(pids) == 4
        assert not [pid for pid in pids if _alive(pid)]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    finally:
        _kill_leftovers(out_dir)


def test_launcher_error_after_start_still_stops_children(tmp_path: Path) -> None:
    out_dir, log_dir = tmp_path / "out", tmp_path / "log"
    (log_dir / "workerlog.0").mkdir(parents=True)  # worker 0's log cannot be opened
    try:
        with pytest.raises(IsADirectoryError):
            launch_local([str(SCRIPT), "--out_dir", str(out_dir)], 1, 1, log_dir, stop_grace_s=2)
        pids = _recorded_pids(out_dir)
        assert len(pids) == 2  # the server and its grandchild were running
        assert not [pid for pid in pids if _alive(pid)]
    finally:
        _kill_leftovers(out_dir)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"worker_num": 0}, "--worker_num"),
        ({"server_num": -2}, "--server_num"),
        ({"server_num": True}, "--server_num"),
        ({"stop_grace_s": float("nan")}, "--stop_grace_s"),
        ({"server_wait_timeout_s": -1}, "--server_wait_timeout_s"),
        ({"command": ()}, "command"),
        ({"command": "train.py"}, "command"),
        ({"command": ("-m",)}, "-m"),
    ],
)
def test_launch_config_rejects_bad_values(kwargs: dict[str, object], named: str) -> None:
    args: dict[str, object] = {"command": ("train.py",)}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=named):
        LaunchConfig(**args)  # type: ignore[arg-type]


def test_specs_set_role_variables_and_drop_inherited_ones(tmp_path: Path) -> None:
    config = LaunchConfig(command=("-m", "pkg.mod"), server_num=2, worker_num=3, log_dir=tmp_path)
    inherited = {"PATH": "/bin", "PADDLE_TRAINER_ID": "7", "RANK": "5", "PYTHONUNBUFFERED": "0"}

    server = server_spec(config, 1, inherited)
    worker = worker_spec(config, 2, ["h:1", "h:2"], inherited)

    assert server.argv == (config.python_executable, "-m", "pkg.mod")
    assert server.env["TRAINING_ROLE"] == server.env["PADDLE_TRAINING_ROLE"] == "PSERVER"
    assert server.env["PADDLE_PORT"] == "0"
    assert server.env["PSFLEET_SERVER_INDEX"] == "1"
    assert server.env["PSFLEET_ENDPOINT_FILE"] == str(tmp_path / ".endpoints" / "server.1")
    assert server.env["PADDLE_TRAINERS_NUM"] == "3"
    assert "PADDLE_TRAINER_ID" not in server.env and "RANK" not in server.env
    assert server.log_path == tmp_path / "serverlog.1"
    assert worker.env["TRAINING_ROLE"] == "TRAINER"
    assert worker.env["PADDLE_TRAINER_ID"] == "2"
    assert worker.env["PADDLE_PSERVERS_IP_PORT_LIST"] == "h:1,h:2"
    assert worker.env["POD_IP"] == worker.env["PADDLE_CURRENT_IP"] == "127.0.0.1"
    assert worker.env["PYTHONUNBUFFERED"] == "0"  # the user's choice is kept
    assert "PSFLEET_ENDPOINT_FILE" not in worker.env
    assert worker.log_path == tmp_path / "workerlog.2"
    assert not worker.tee and worker_spec(config, 0, [], inherited).tee


def test_endpoint_files_round_trip_and_reject_garbage(tmp_path: Path) -> None:
    path = tmp_path / "server.0"
    assert read_endpoint(path) is None
    write_endpoint_file(path, "127.0.0.1", 4321)
    assert path.read_text() == "127.0.0.1:4321\n"
    assert read_endpoint(path) == "127.0.0.1:4321"
    assert parse_endpoint("::1:80") == ("::1", 80)
    path.write_text("localhost:0\n")
    with pytest.raises(LaunchError, match="host:port"):
        read_endpoint(path)


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-signal.SIGKILL) == "signal SIGKILL (9)"
