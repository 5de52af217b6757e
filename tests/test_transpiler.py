"""The seeds' Fluid walkthrough: examples/transpiler_minimal.py as 2 servers and 2 workers
started by hand (no launcher), each told its role by the seeds' variables only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_no_processes_mentioning, clean_env
from test_fleet_minimal import _free_ports, _test_auc

pytestmark = pytest.mark.job

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "transpiler_minimal.py"


@pytest.mark.slow
def test_four_processes_started_by_hand_sync_mode(criteo_dir: Path, tmp_path: Path) -> None:
    """sync_mode=True (the seeds' default): fleet's sync mode, workers in lockstep."""
    ports = _free_ports(2)
    common = {"PADDLE_PSERVER_IPS": "127.0.0.1,127.0.0.1",
              "PADDLE_PSERVER_PORT": ",".join(map(str, ports)), "PADDLE_TRAINERS": "2",
              "PSFLEET_SERVER_WAIT_TIMEOUT_S": "120"}
    roles = [{"PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_CURRENT_IP": "127.0.0.1",
              "PADDLE_PORT": str(p)} for p in ports] + [
        {"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(k)} for k in range(2)]
    procs: list[subprocess.Popen[str]] = []
    logs = []
    try:
        for i, role in enumerate(roles):
            log = open(tmp_path / f"proc{i}.log", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, str(EXAMPLE), "--epochs", "1", "--data", str(criteo_dir)],
                env=clean_env({**common, **role}), stdout=log, stderr=subprocess.STDOUT,
                text=True, start_new_session=True))
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    outputs = [(tmp_path / f"proc{i}.log").read_text() for i in range(4)]
    assert codes == [0, 0, 0, 0], "\n\n".join(o[-2000:] for o in outputs)
    assert _test_auc(outputs[2]) > 0.6, outputs[2][-2000:]  # worker 0
    # config.print_log: the plan, with the strategy sync_mode=True chose
    plan = next(line for line in outputs[2].splitlines() if "transpiled: pserver mode" in line)
    assert "trainer_id 0 of 2" in plan and "'mode': 'sync'" in plan, plan
    assert "test auc" not in outputs[3]
    assert all(f"Server listening on 127.0.0.1:{p}" in outputs[i]
               for i, p in enumerate(ports))
    assert_no_processes_mentioning(str(EXAMPLE), timeout_s=5)
