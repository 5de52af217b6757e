"""The seeds' Fluid walkthrough: examples/transpiler_minimal.py started by hand (no
launcher), each process told its role by the seeds' variables only.

- pserver mode, sync_mode=True: 2 servers + 2 workers; every process exits 0, worker 0
  prints a test AUC above 0.6 and its plan shows fleet's sync mode.
- nccl2 mode: 2 trainers, rendezvous through the seeds' PADDLE_TRAINER_IPS +
  PADDLE_PSERVER_PORT; both exit 0 and trainer 0 prints a test AUC above 0.6.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from conftest import clean_env
from test_fleet_minimal import _free_ports, _test_auc

pytestmark = pytest.mark.job

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "transpiler_minimal.py"


def _start_by_hand(roles: Sequence[Mapping[str, str]], common: Mapping[str, str],
                   args: Sequence[str], tmp_path: Path) -> list[str]:
    """Start one example process per role, wait for all; return their outputs (all
    exit 0, else the test fails with every output's tail). Any process left is killed
    (and conftest's leak check fails a test that leaves one)."""
    procs: list[subprocess.Popen[str]] = []
    logs = []
    try:
        for i, role in enumerate(roles):
            log = open(tmp_path / f"proc{i}.log", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, str(EXAMPLE), *args], env=clean_env({**common, **role}),
                stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    outputs = [(tmp_path / f"proc{i}.log").read_text() for i in range(len(roles))]
    assert codes == [0] * len(roles), "\n\n".join(o[-2000:] for o in outputs)
    return outputs


@pytest.mark.slow
def test_two_servers_two_workers_sync_mode(criteo_dir: Path, tmp_path: Path) -> None:
    ports = _free_ports(2)
    common = {"PADDLE_PSERVER_IPS": "127.0.0.1,127.0.0.1",
              "PADDLE_PSERVER_PORT": ",".join(map(str, ports)), "PADDLE_TRAINERS": "2",
              "PSFLEET_SERVER_WAIT_TIMEOUT_S": "120"}
    roles = [{"PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_CURRENT_IP": "127.0.0.1",
              "PADDLE_PORT": str(p)} for p in ports] + [
        {"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(k)} for k in range(2)]
    outputs = _start_by_hand(roles, common, ["--epochs", "1", "--data", str(criteo_dir)],
                             tmp_path)
    assert _test_auc(outputs[2]) > 0.6, outputs[2][-2000:]  # worker 0
    assert "test auc" not in outputs[3]
    # config.print_log: the plan, with the strategy sync_mode=True chose
    plan = next(line for line in outputs[2].splitlines() if "transpiled: pserver mode" in line)
    assert "trainer_id 0 of 2" in plan and "'mode': 'sync'" in plan, plan
    assert all(f"Server listening on 127.0.0.1:{p}" in outputs[i]
               for i, p in enumerate(ports))


@pytest.mark.slow
def test_two_trainers_nccl2_mode(criteo_dir: Path, tmp_path: Path) -> None:
    (port,) = _free_ports(1)
    common = {"PADDLE_TRAINER_IPS": "127.0.0.1,127.0.0.1", "PADDLE_PSERVER_PORT": str(port),
              "PADDLE_CURRENT_IP": "127.0.0.1", "PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S": "60"}
    roles = [{"PADDLE_TRAINER_ID": str(k)} for k in range(2)]
    outputs = _start_by_hand(roles, common, ["--mode", "nccl2", "--epochs", "1", "--data",
                                             str(criteo_dir)], tmp_path)
    assert _test_auc(outputs[0]) > 0.6, outputs[0][-2000:]
    assert "test auc" not in outputs[1]
    assert "rank 1 of 2" in outputs[1] and f"rendezvous 127.0.0.1:{port}" in outputs[1]
