"""Collective mode end to end: the Criteo example, a failing rank, bad input.

- examples/criteo_dnn/config_collective.yaml trains with 2 ranks started three ways
  (``psfleet train`` launching the job itself, ``fleetrun --mode collective``,
  ``torchrun``), exit 0; the three runs are the same computation, so they report the
  same test AUC, and the model learned (AUC well above 0.5).
- The ``psfleet train`` run of those three also takes a checkpoint: the same job asked
  for 2 epochs resumes from it at epoch 2 and ends where an uninterrupted 2-epoch run
  ends (the first epoch is that shared run, not a job of its own).
- A rank that fails: fleetrun exits 1 naming it and its log, and stops the rank
  waiting at the barrier.
- A world size given twice with two values fails naming both.
- A rank that cannot reach MASTER_ADDR:MASTER_PORT fails within the connect timeout
  with an error naming the address.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_command, run_folder

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "criteo_dnn" / "config_collective.yaml"
PROBE = REPO / "tests" / "jobs" / "collective_probe_job.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
TIMEOUT_S = 180.0


def _train_args(train: Path, test: Path, out: Path) -> list[str]:
    return ["train", "-m", str(CONFIG), "-o", f"runner.train_data_dir={train}",
            "-o", f"runner.test_data_dir={test}", "-o", "runner.epochs=1",
            "-o", f"runner.model_save_path={out}",
            "-o", "runner.export_model=false"]  # export has its own tests


def _checkpoint_arg(checkpoint_dir: Path) -> list[str]:
    return ["-o", f"runner.checkpoint={{checkpoint_dir: {checkpoint_dir}}}"]


@pytest.fixture(scope="module")
def criteo_slices(criteo_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> tuple[Path, Path, Path]:
    """(work folder, train slice of 3,000 lines, test slice of 400 lines)."""
    from conftest import write_slice

    work = tmp_path_factory.mktemp("criteo_collective")
    train = write_slice(criteo_dir / "train.csv", work / "train.csv", 3000)
    test = write_slice(criteo_dir / "dev.csv", work / "test.csv", 400)
    return work, train, test


@pytest.fixture(scope="module")
def criteo_runs(criteo_slices: tuple[Path, Path, Path]) -> Iterator[dict[str, object]]:
    """The example trained three ways: name -> (CompletedProcess, metrics or None).
    The ``psfleet train`` run checkpoints into ``<work>/ckpt`` after its epoch (the
    resume test continues from there)."""
    work, train, test = criteo_slices
    module = ["-m", "psfleet.cli.main"]
    commands = {
        "psfleet train": [sys.executable, *module, *_train_args(train, test, work / "cli"),
                          *_checkpoint_arg(work / "ckpt")],
        "fleetrun": [sys.executable, "-m", "psfleet.launch.main", "--mode", "collective",
                     "--nproc_per_node", "2", "--log_dir", str(work / "fleetrun-log"), *module,
                     *_train_args(train, test, work / "fleetrun")],
        "torchrun": [str(TORCHRUN), "--nproc_per_node", "2", *module,
                     *_train_args(train, test, work / "torchrun")],
    }
    runs: dict[str, object] = {}
    for name, argv in commands.items():
        result = run_command(argv, timeout=TIMEOUT_S, cwd=work)
        # psfleet train names the run (latest points at it); a process started by
        # fleetrun or torchrun without runner.run_name writes the run folder "run".
        folder = work / "cli" / "latest" if name == "psfleet train" else work / name / "run"
        out = folder / "metrics.json"
        metrics = json.loads(out.read_text()) if out.is_file() else None
        runs[name] = (result, metrics)
    yield runs


@pytest.mark.parametrize("how", ["psfleet train", "fleetrun", "torchrun"])
@pytest.mark.slow
def test_criteo_example_trains_with_two_ranks(criteo_runs: dict[str, object], how: str) -> None:
    result, metrics = criteo_runs[how]  # type: ignore[misc]
    assert result.returncode == 0, f"{how}: exit {result.returncode}\n{result.stderr[-4000:]}"
    assert metrics is not None
    assert (metrics["sync_mode"], metrics["worker_num"], metrics["server_num"]) == (
        "collective", 2, 0)
    assert metrics["global_batch"] == 2 * metrics["batch_size"]
    assert metrics["epochs"][0]["examples"] == 1500  # rank 0's half of the 3,000 lines
    assert metrics["test"]["examples"] == 400
    assert metrics["test"]["auc"] > 0.6
    reference = criteo_runs["psfleet train"][1]  # type: ignore[index]
    assert metrics["test"]["auc"] == pytest.approx(reference["test"]["auc"], abs=1e-6)


@pytest.mark.slow
def test_failing_rank_is_the_root_cause(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    result = run_command([sys.executable, "-m", "psfleet.launch.main", "--mode", "collective",
                          "--nproc_per_node", "2", "--log_dir", str(log_dir),
                          "--stop_grace_s", "2", str(PROBE), "--fail_rank", "1"],
                         timeout=TIMEOUT_S, cwd=tmp_path)
    assert result.returncode == 1
    assert "worker 1" in result.stderr and "exit code 3" in result.stderr
    assert "stopping the other processes: worker 0" in result.stderr
    assert str(log_dir / "workerlog.1") in result.stderr
    assert "rank 1 fails on purpose" in (log_dir / "workerlog.1").read_text()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 bound (so nobody else takes it) but not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.mark.slow
def test_unreachable_master_fails_within_the_timeout_naming_it(
        tmp_path: Path, closed_port: int) -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(closed_port), "PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S": "2"}
    result = run_command([sys.executable, str(PROBE)], timeout=60, env=env, cwd=tmp_path)
    assert result.returncode != 0
    assert f"MASTER_ADDR:MASTER_PORT 127.0.0.1:{closed_port}" in result.stderr
    assert "within 2 s" in result.stderr


def test_world_size_mismatch_fails_naming_both(tmp_path: Path) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "PADDLE_TRAINERS_NUM": "3",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    result = run_command([sys.executable, str(PROBE)], timeout=60, env=env, cwd=tmp_path)
    assert result.returncode != 0
    assert "WORLD_SIZE is 2 but PADDLE_TRAINERS_NUM is 3" in result.stderr


@pytest.mark.slow
def test_collective_job_resumes_from_its_checkpoint_exactly(
        criteo_slices: tuple[Path, Path, Path], criteo_runs: dict[str, object],
        tmp_path: Path) -> None:
    """2 ranks: 1 epoch with a checkpoint (the ``psfleet train`` run of
    ``criteo_runs``), then the same job asked for 2 epochs resumes at epoch 2 on every
    rank (each holds all tables) and ends where an uninterrupted 2-epoch run ends."""
    work, train, test = criteo_slices
    first, _ = criteo_runs["psfleet train"]  # type: ignore[misc]
    assert first.returncode == 0, first.stderr[-4000:]
    assert any((work / "ckpt").glob("ckpt-*/manifest.json")), "the first run took no checkpoint"

    def run(epochs: int, name: str, checkpoint_dir: Path) -> dict[str, object]:
        args = _train_args(train, test, tmp_path / name)
        args[args.index("runner.epochs=1")] = f"runner.epochs={epochs}"
        args += _checkpoint_arg(checkpoint_dir)
        result = run_command([sys.executable, "-m", "psfleet.cli.main", *args],
                             timeout=TIMEOUT_S, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-4000:]
        return json.loads(  # type: ignore[no-any-return]
            (run_folder(tmp_path / name) / "metrics.json").read_text())

    resumed = run(2, "resumed", work / "ckpt")
    straight = run(2, "straight", tmp_path / "ckpt-straight")
    assert [e["epoch"] for e in resumed["epochs"]] == [2]  # type: ignore[index]
    assert resumed["test"]["auc"] == pytest.approx(  # type: ignore[index]
        straight["test"]["auc"], abs=1e-6)  # type: ignore[index]
    assert resumed["test"]["logloss"] == pytest.approx(  # type: ignore[index]
        straight["test"]["logloss"], abs=1e-6)  # type: ignore[index]
