"""The seeds' Fluid walkthrough: examples/transpiler_minimal.py started by hand (no
launcher), each process told its role by the seeds' variables only.

- pserver mode, sync_mode=True: 2 servers + 2 workers; every process exits 0, worker 0
  prints a test AUC above 0.6 and its plan shows fleet's sync mode.
- nccl2 mode: 2 trainers, rendezvous through the seeds' PADDLE_TRAINER_IPS +
  PADDLE_PSERVER_PORT; both exit 0 and trainer 0 prints a test AUC above 0.6.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import start_by_hand
from test_fleet_minimal import _free_ports, _test_auc

pytestmark = pytest.mark.job

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "transpiler_minimal.py"


@pytest.mark.slow
def test_two_servers_two_workers_sync_mode(criteo_dir: Path, tmp_path: Path) -> None:
    ports = _free_ports(2)
    common = {"PADDLE_PSERVER_IPS": "127.0.0.1,127.0.0.1",
              "PADDLE_PSERVER_PORT": ",".join(map(str, ports)), "PADDLE_TRAINERS": "2",
              "PSFLEET_SERVER_WAIT_TIMEOUT_S": "120"}
    roles = [{"PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_CURRENT_IP": "127.0.0.1",
              "PADDLE_PORT": str(p)} for p in ports] + [
        {"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(k)} for k in range(2)]
    outputs = start_by_hand(EXAMPLE, roles, common, ["--epochs", "1", "--data", str(criteo_dir)],
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
    outputs = start_by_hand(EXAMPLE, roles, common, ["--mode", "nccl2", "--epochs", "1", "--data",
                                             str(criteo_dir)], tmp_path)
    assert _test_auc(outputs[0]) > 0.6, outputs[0][-2000:]
    assert "test auc" not in outputs[1]
    assert "rank 1 of 2" in outputs[1] and f"rendezvous 127.0.0.1:{port}" in outputs[1]
