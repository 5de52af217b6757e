"""Oracle tests of the training modes with real processes (fleetrun + tests/jobs/oracle_job.py).

- Sync mode, W=2 workers x batch b, equals one process with batch 2b: the union of
  the workers' step-j batches is the single process's step-j batch (the reader gives
  worker k the lines k, k+2, ...), so the averaged gradient is the same. Checked for
  SGD (<= 1e-6) and Adam (<= 1e-5), dense parameters and every sparse row touched.
  The SGD job runs at half the reference's learning rate with ``lr_scaling: linear``
  (times the worker count, 2): equal only if the servers apply the scaled rate to the
  dense and the sparse tables.
  (Adagrad's exactness is the same argument on another server-side rule; the rules
  themselves are checked against torch.optim in test_rules.py.)
- The server count does not change a sync run: S=1 and S=3 (with dense parameters
  sliced over the servers) end with the same parameters.

That async and GEO jobs learn is checked on the runner's models in
test_model_sync_oracle.py.

Every job of the module runs once, a few at a time, in the module fixture ``runs``;
each job is small (2,000 lines, 20 steps). The two single-process references (SGD,
Adam) run one after the other in one process (``oracle_job.py A :: B``, a fresh fleet
for each): the fleetrun jobs are the runs that need processes of their own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import load_npz, one_process_runs, run_command, write_slice

pytestmark = [pytest.mark.job, pytest.mark.slow]

JOB = Path(__file__).resolve().parent / "jobs" / "oracle_job.py"
LINES = 2000
BATCH = 32
STEPS = 20
JOB_TIMEOUT_S = 120.0
PARALLEL_JOBS = 3
MIN_BLOCK_SIZE = 512  # the DNN's 2,033 dense values are cut into blocks on several servers


@dataclass(frozen=True)
class Job:
    """One run of oracle_job.py: alone (servers=None) or by fleetrun with 2 workers."""

    name: str
    servers: int | None
    batch: int
    args: tuple[str, ...]


def _jobs() -> list[Job]:
    sgd, adam = (("--optimizer", "sgd", "--lr", "0.05"),
                 ("--optimizer", "adam", "--lr", "0.01"))
    sync = ("--mode", "sync")
    return [
        Job("single-sgd", None, 2 * BATCH, sgd),
        Job("single-adam", None, 2 * BATCH, adam),
        Job("sync-sgd-s2", 2, BATCH,
            sync + ("--optimizer", "sgd", "--lr", "0.025", "--lr_scaling", "linear")),
        Job("sync-adam-s1", 1, BATCH, sync + adam),
        Job("sync-adam-s3", 3, BATCH, sync + adam),
    ]


def _script_args(job: Job, data: Path, workdir: Path) -> list[str]:
    return ["--data", str(data), "--out", str(workdir / f"{job.name}.npz"), "--batch",
            str(job.batch), "--steps", str(STEPS), "--min_block_size", str(MIN_BLOCK_SIZE),
            *job.args]


def run_jobs(jobs: Sequence[Job], data: Path, workdir: Path
             ) -> dict[str, dict[str, np.ndarray]]:
    """Run ``jobs`` to completion and return each one's worker 0 .npz (name -> arrays);
    fail with the logs if not. Either one fleetrun job, or single-process jobs, which
    run one after the other in one process (``oracle_job.py A :: B``)."""
    name = "+".join(job.name for job in jobs)
    log_dir = workdir / f"log-{name}"
    argv: Sequence[str]
    if all(job.servers is None for job in jobs):
        argv = one_process_runs(JOB, [_script_args(job, data, workdir) for job in jobs])
    else:
        (job,) = jobs
        argv = [sys.executable, "-m", "psfleet.launch.main", "--server_num", str(job.servers),
                "--worker_num", "2", "--log_dir", str(log_dir), "--stop_grace_s", "5",
                str(JOB), *_script_args(job, data, workdir)]
    result = run_command(argv, timeout=JOB_TIMEOUT_S, cwd=workdir)
    outs = {job.name: workdir / f"{job.name}.npz" for job in jobs}
    if result.returncode != 0 or not all(out.is_file() for out in outs.values()):
        logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}"
                       for p in sorted(log_dir.glob("*log.*")))
        pytest.fail(f"job {name} failed (exit {result.returncode})\n--- stderr\n"
                    f"{result.stderr[-3000:]}{logs}", pytrace=False)
    return {job_name: load_npz(out) for job_name, out in outs.items()}


@pytest.fixture(scope="module")
def data(criteo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_slice(criteo_dir / "train.csv",
                       tmp_path_factory.mktemp("data") / "train_2000.csv", LINES)


@pytest.fixture(scope="module")
def runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, np.ndarray]]:
    """Every job of the module, run to completion a few at a time: name -> results."""
    workdir = tmp_path_factory.mktemp("oracle")
    jobs = _jobs()
    groups = [[job for job in jobs if job.servers is None],
              *[[job] for job in jobs if job.servers is not None]]
    with ThreadPoolExecutor(PARALLEL_JOBS) as pool:
        futures = [pool.submit(run_jobs, group, data, workdir) for group in groups]
        return {name: result for future in futures
                for name, result in future.result().items()}


def _max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[float, float]:
    assert a["dense"].shape == b["dense"].shape == (2033,)
    assert np.array_equal(a["keys"], b["keys"])
    assert a["rows"].shape == (a["keys"].size, 4)
    return (float(np.abs(a["dense"] - b["dense"]).max()),
            float(np.abs(a["rows"] - b["rows"]).max()))


@pytest.mark.parametrize(("sync_run", "single_run", "tolerance"), [
    ("sync-sgd-s2", "single-sgd", 1e-6),
    ("sync-adam-s1", "single-adam", 1e-5),
])
def test_sync_two_workers_equal_one_process_with_double_batch(
        runs: dict[str, dict[str, np.ndarray]], sync_run: str, single_run: str,
        tolerance: float) -> None:
    distributed, single = runs[sync_run], runs[single_run]
    # The rows compared are every key of the 20 * 64 lines trained on.
    assert distributed["keys"].size > 4000
    dense_diff, sparse_diff = _max_diff(distributed, single)
    assert dense_diff <= tolerance, f"dense parameters differ by {dense_diff}"
    assert sparse_diff <= tolerance, f"sparse rows differ by {sparse_diff}"
    # Training moved the parameters (the comparison is not between two initial models).
    assert single["loss_after"] < single["loss_before"] - 0.3
    assert abs(float(distributed["loss_after"]) - float(single["loss_after"])) <= 1e-4


def test_server_count_does_not_change_a_sync_run(
        runs: dict[str, dict[str, np.ndarray]]) -> None:
    one, three = runs["sync-adam-s1"], runs["sync-adam-s3"]
    dense_diff, sparse_diff = _max_diff(one, three)
    assert dense_diff <= 1e-6
    assert sparse_diff <= 1e-6
