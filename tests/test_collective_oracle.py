"""Oracle tests of collective mode with real processes (fleetrun --mode collective).

tests/jobs/collective_oracle_job.py trains a small DNN (dense layers and a sparse
embedding) with SGD on a fixed schedule of batches; ``--single`` runs the same
schedule in one process on local tables, each step on the union of the ranks' batches.
Collective training must end with the single process's parameters (<= 1e-6, dense and
every sparse row touched), with every rank holding bit-identical tables:

- 2 ranks x batch 32 equal one process with batch 64 (20 steps);
- uneven ranks: rank 0 with batch 32 for 13 steps, rank 1 with batch 16 for 20 steps.
  Its first 13 steps equal one process on the 48 examples of each step (the gradient
  is weighted by examples, not averaged per rank: an average per rank differs there),
  and both ranks finish (Join, no hang) and equal one process whose last 7 steps hold
  rank 1's batches only. (Uneven batches and uneven steps were two cases, two more
  jobs; one job shows both, and either fault still fails it.)

The three single-process references run one after the other in one process
(``collective_oracle_job.py --single A :: --single B``, a fresh fleet for each).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import load_npz, one_process_runs, run_command, write_slice

pytestmark = [pytest.mark.job, pytest.mark.slow]

JOB = Path(__file__).resolve().parent / "jobs" / "collective_oracle_job.py"
LINES = 2000
JOB_TIMEOUT_S = 120.0
TOLERANCE = 1e-6


@dataclass(frozen=True)
class Case:
    name: str
    batches: str
    steps: str


CASES = [Case("equal", "32,32", "20,20"), Case("uneven", "32,16", "13,20")]


def _run(cases: list[Case], single: bool, data: Path, workdir: Path
         ) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """Run ``cases`` alone (every case in one process, one after the other) or one case
    collectively; case name -> {"single"} or {"rank0", "rank1"}."""
    label = "+".join(case.name for case in cases)
    log_dir = workdir / f"log-{label}"
    scripts = [["--data", str(data), "--out_dir", str(workdir / case.name),
                "--batches", case.batches, "--steps", case.steps] for case in cases]
    argv: list[str]
    if single:
        argv = one_process_runs(JOB, [[*script, "--single"] for script in scripts])
    else:
        (script,) = scripts
        argv = [sys.executable, "-m", "psfleet.launch.main", "--mode", "collective",
                "--nproc_per_node", "2", "--log_dir", str(log_dir), "--stop_grace_s", "5",
                str(JOB), *script]
    result = run_command(argv, timeout=JOB_TIMEOUT_S, cwd=workdir)
    names = ["single"] if single else ["rank0", "rank1"]
    outs = {case.name: {name: workdir / case.name / f"{name}.npz" for name in names}
            for case in cases}
    if result.returncode != 0 or not all(p.is_file() for o in outs.values()
                                         for p in o.values()):
        logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}"
                       for p in sorted(log_dir.glob("workerlog.*")))
        pytest.fail(f"{label} ({'single' if single else 'collective'}) failed (exit "
                    f"{result.returncode})\n--- stderr\n{result.stderr[-3000:]}{logs}",
                    pytrace=False)
    return {case: {name: load_npz(path) for name, path in o.items()} for case, o in outs.items()}


@pytest.fixture(scope="module")
def runs(criteo_dir: Path, tmp_path_factory: pytest.TempPathFactory,
         ) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """Every case run alone and collectively: name -> {"single", "rank0", "rank1"}."""
    workdir = tmp_path_factory.mktemp("collective")
    data = write_slice(criteo_dir / "train.csv", workdir / "train_2000.csv", LINES)
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_run, CASES, True, data, workdir)]
        futures += [pool.submit(_run, [case], False, data, workdir) for case in CASES]
        results: dict[str, dict[str, dict[str, np.ndarray]]] = {}
        for future in futures:
            for name, loaded in future.result().items():
                results.setdefault(name, {}).update(loaded)
    return results


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_collective_equals_one_process_on_the_union_batch(
        runs: dict[str, dict[str, dict[str, np.ndarray]]], case: str) -> None:
    single, rank0 = runs[case]["single"], runs[case]["rank0"]
    assert single["dense"].shape == (2033,)
    assert np.array_equal(single["keys"], rank0["keys"])
    assert rank0["rows"].shape == (single["keys"].size, 4)
    assert float(np.abs(single["dense"] - rank0["dense"]).max()) <= TOLERANCE
    assert float(np.abs(single["rows"] - rank0["rows"]).max()) <= TOLERANCE
    # The model moved: the comparison is not between two untrained models.
    assert float(np.abs(single["dense"]).mean()) > 0.01


@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_every_rank_holds_the_same_tables(
        runs: dict[str, dict[str, dict[str, np.ndarray]]], case: str) -> None:
    rank0, rank1 = runs[case]["rank0"], runs[case]["rank1"]
    for key in ("dense", "rows", "keys"):
        assert np.array_equal(rank0[key], rank1[key]), key
    for rank in (rank0, rank1):
        assert np.array_equal(rank["params"], rank["dense"])  # the model is the table
        # A rank that ran out of batches kept applying the others' steps (Join).
        assert int(rank["steps"]) == 20
