"""A runner job's server process holds tables, not torch (real job, real processes).

``psfleet train`` decides each process's role before importing torch
(``psfleet.rec.roles``): a server never loads it, so it starts in about a second (a
restarted server serves sooner) and holds no torch memory. A sync job's servers once
loaded it to merge their rounds' pushes; the native core sums them now
(``psfleet.ps.merge``, issue 40).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import clean_env, run_folder
from test_checkpoint_resume import _job_process, _train_argv, _wait_for_checkpoint

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _loads_torch(process: psutil.Process) -> bool:
    return any("libtorch" in m.path for m in process.memory_maps())


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_server_never_loads_torch(
        tmp_path: Path, data_slice: Callable[..., Path], mode: str) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(json.dumps({
        "runner": {"train_data_dir": str(data_slice(800)), "epochs": 1, "batch_size": 8,
                   "sync_mode": mode, "model_save_path": str(tmp_path / "out"),
                   "export_model": False,
                   "checkpoint": {"checkpoint_dir": str(tmp_path / "ck"), "step_interval": 10}},
        "hyper_parameters": {"fc_sizes": [16]},
        "cluster": {"server_num": 1, "worker_num": 1},
    }))
    job = subprocess.Popen(_train_argv(config), env=clean_env(), text=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
    try:
        _wait_for_checkpoint(job, tmp_path / "ck", 10)
        run = run_folder(tmp_path / "out") / "config.yaml"
        worker = _job_process(run, "PADDLE_TRAINER_ID", "0")
        server = _job_process(run, "PSFLEET_SERVER_INDEX", "0")
        worker.suspend()  # the job must not end while its processes are looked at
        try:
            assert _loads_torch(worker)
            assert not _loads_torch(server)
        finally:
            worker.resume()
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, err[-3000:]
