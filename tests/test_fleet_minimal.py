"""The seeds' fleet example, started by fleetrun and by hand with environment only."""

from __future__ import annotations

import os
import runpy
import socket
import sys
from pathlib import Path

import pytest
from conftest import (
    JOB_PREFIXES,
    JOB_VARIABLES,
    assert_no_processes_mentioning,
    run_command,
    start_by_hand,
)

pytestmark = pytest.mark.job

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fleet_minimal.py"


def _test_auc(stdout: str) -> float:
    lines = [line for line in stdout.splitlines() if line.startswith("test auc ")]
    assert lines, f"no 'test auc' line in:\n{stdout[-3000:]}"
    return float(lines[-1].split()[-1])


@pytest.mark.slow
def test_fleetrun_two_servers_two_workers(tmp_path: Path) -> None:
    # Run from the job's folder: the servers save and load under fleetrun's working
    # folder (PSFLEET_STORAGE_ROOTS' default, docs/security.md).
    result = run_command([sys.executable, "-m", "psfleet.launch.main", "--server_num=2",
                          "--worker_num=2", "--log_dir", str(tmp_path / "log"), str(EXAMPLE),
                          "--epochs", "1", "--save_dir", str(tmp_path / "save")], timeout=240,
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert _test_auc(result.stdout) > 0.6
    saved = sorted(p.relative_to(tmp_path / "save").as_posix()
                   for p in (tmp_path / "save").rglob("*") if p.is_file())
    # save.json: the save's mode (full), read by a load (psfleet.ps.persist_delta).
    assert saved == ["manifest.json",
                     "server-0/save.json", "server-0/table-0.sparse", "server-0/table-1.dense",
                     "server-0/tables.json",
                     "server-1/save.json", "server-1/table-0.sparse", "server-1/table-1.dense",
                     "server-1/tables.json"]
    # The save loads into one server and scores exactly what was saved (no training).
    reloaded = run_command([sys.executable, "-m", "psfleet.launch.main", "--server_num=1",
                            "--worker_num=1", "--log_dir", str(tmp_path / "log2"),
                            str(EXAMPLE), "--epochs", "0", "--load_dir",
                            str(tmp_path / "save")], timeout=240, cwd=tmp_path)
    assert reloaded.returncode == 0, reloaded.stderr[-4000:]
    assert _test_auc(reloaded.stdout) == _test_auc(result.stdout)
    assert_no_processes_mentioning(str(tmp_path))


def _free_ports(count: int) -> list[int]:
    """Ports free now (bound to 0 then closed: a test convenience with a tiny race)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.slow
def test_four_processes_started_by_hand_with_environment_only(tmp_path: Path) -> None:
    """The seeds' two-machine walkthrough, on one host: no launcher, only variables."""
    ports = _free_ports(2)
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    common = {"PADDLE_PSERVERS_IP_PORT_LIST": endpoints, "PADDLE_TRAINERS_NUM": "2",
              "POD_IP": "127.0.0.1", "PSFLEET_SERVER_WAIT_TIMEOUT_S": "120"}
    roles = [{"TRAINING_ROLE": "PSERVER", "PADDLE_PORT": str(p)} for p in ports] + [
        {"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(k)} for k in range(2)]
    outputs = start_by_hand(EXAMPLE, roles, common, ["--epochs", "1"], tmp_path)
    assert _test_auc(outputs[2]) > 0.6  # worker 0
    assert all(f"Server listening on 127.0.0.1:{p}" in outputs[i]
               for i, p in enumerate(ports))


@pytest.mark.parametrize("bad, message", [
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:1"},
     "POD_IP"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:1",
      "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "2"}, "PADDLE_TRAINER_ID"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": "localhost"},
     "PADDLE_PSERVERS_IP_PORT_LIST"),
])
def test_bad_environment_fails_naming_the_variable(bad: dict[str, str], message: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The example run as ``__main__`` in this process (its fleet.init() fails on the
    environment before any process or socket exists; a process of its own would cost a
    torch import per case): the error that would end the script names the variable."""
    import torch

    from psfleet import fleet
    from psfleet.errors import ConfigError

    for name in list(os.environ):  # the environment run_command's children get
        if name in JOB_VARIABLES or name.startswith(JOB_PREFIXES):
            monkeypatch.delenv(name)
    for name, value in bad.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--epochs", "1"])
    with torch.random.fork_rng(), pytest.raises(ConfigError) as failed:
        try:
            runpy.run_path(str(EXAMPLE), run_name="__main__")
        finally:
            fleet.reset()
    assert message in str(failed.value), str(failed.value)
