"""End-to-end: real processes, real gRPC on 127.0.0.1, the real Criteo sample.

- ``psfleet train`` (the YAML runner) with 1 server x 2 workers and in one process,
  on the whole sample: exit 0, metrics.json, logs, nothing left running, and the
  model learns (AUC > 0.6): a parameter server that silently does not refresh dense
  parameters gives AUC ~0.49 (DESIGN.md). Also 1 x 2 with global batch aggregation
  (GBA), whose servers apply a push only once a global batch is complete.
- ``fleetrun`` running a script written against the fleet API (tests/jobs/fleet_job.py):
  every line read by exactly one worker, the loss goes down, the servers exit; and a
  worker that raises mid-training fails the job with its log named, leaving nothing
  behind.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from conftest import assert_no_processes_mentioning, run_command, run_folder

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RunCli = Callable[..., subprocess.CompletedProcess[str]]

# No export: its own tests (test_export_*, test_run_folders) cover it.
SMALL_MODEL = ["-o", "hyper_parameters.fc_sizes=[64, 32]", "-o", "runner.epochs=2",
               "-o", "runner.export_model=false"]
FLEET_JOB = Path(__file__).resolve().parent / "jobs" / "fleet_job.py"


def _train_args(repo_root: Path, out: Path, train: Path | list[Path],
                test: Path | list[Path], server_num: int, worker_num: int) -> list[str]:
    def yaml_paths(p: Path | list[Path]) -> str:
        return str(p) if isinstance(p, Path) else json.dumps([str(x) for x in p])

    return ["train", "-m", str(repo_root / "examples" / "criteo_dnn" / "config.yaml"),
            "-o", f"runner.train_data_dir={yaml_paths(train)}",
            "-o", f"runner.test_data_dir={yaml_paths(test)}",
            "-o", f"runner.model_save_path={out}",
            "-o", f"cluster.server_num={server_num}", "-o", f"cluster.worker_num={worker_num}",
            *SMALL_MODEL]


def _metrics(out: Path, r: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The metrics.json of the run folder the run wrote under ``out`` (its latest)."""
    assert (out / "latest").is_dir(), f"no run folder\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    path = run_folder(out) / "metrics.json"
    assert path.is_file(), f"no metrics.json\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    metrics: dict[str, object] = json.loads(path.read_text())
    return metrics


def _test_auc(metrics: dict[str, object]) -> float:
    test = metrics["test"]
    assert isinstance(test, dict)
    value = float(test["auc"])
    assert math.isfinite(value)
    return value


# -- the YAML runner --------------------------------------------------------------------


GBA = ["-o", "runner.a_sync_configs.global_batch_aggregation=true"]
# Bounded staleness 0 over 2 epochs: every step waits for the other worker's earlier
# steps, and a worker done with an epoch (parked at its flush) holds no one back.
SSP = ["-o", "runner.a_sync_configs.bounded_staleness=0"]


@pytest.mark.parametrize(("server_num", "worker_num", "extra"),
                         [(0, 1, []), (1, 2, []), (1, 2, GBA), (1, 2, SSP)],
                         ids=["one_process", "1server_2workers", "1server_2workers_gba",
                              "1server_2workers_ssp"])
def test_runner_learns_on_the_whole_sample(run_cli: RunCli, repo_root: Path, tmp_path: Path,
                                           criteo_dir: Path, server_num: int,
                                           worker_num: int, extra: list[str]) -> None:
    out = tmp_path / "out"
    args = _train_args(repo_root, out, criteo_dir / "train.csv",
                       [criteo_dir / "dev.csv", criteo_dir / "test.csv"], server_num,
                       worker_num) + extra

    r = run_cli(args, timeout=90)

    assert r.returncode == 0, r.stderr[-3000:]
    metrics = _metrics(out, r)
    assert (metrics["server_num"], metrics["worker_num"]) == (server_num, worker_num)
    assert metrics["test"]["examples"] == 800  # type: ignore[index]
    # A PS whose workers never see fresh dense parameters scores ~0.49 here.
    assert _test_auc(metrics) > 0.6, metrics["test"]
    assert "test auc" in r.stdout
    # The table as trained: one row per distinct id of the 7,200 lines (26 slots; a
    # plain table, so nothing evicted or deleted).
    table = metrics["tables"]["embedding"]  # type: ignore[index]
    assert 20_000 < table["rows"] < 7200 * 26 and table["bytes"] > table["rows"] * 100
    assert table["evicted"] == table["deleted"] == 0
    log = run_folder(out) / "log"
    if server_num:
        for name in ("serverlog.0", "workerlog.0", "workerlog.1"):
            assert (log / name).is_file(), name
        assert "Server listening on 127.0.0.1:" in (log / "serverlog.0").read_text()
    if extra == SSP:  # the bound was in effect: each worker asked for its steps
        for name in ("workerlog.0", "workerlog.1"):
            asked = re.search(r"bounded staleness 0: (\d+) steps asked server 0",
                              (log / name).read_text())
            assert asked is not None and int(asked[1]) > 10, name
    assert_no_processes_mentioning(str(tmp_path))


# -- the fleet API under fleetrun -------------------------------------------------------


def _fleetrun() -> list[str]:
    script = Path(sys.executable).parent / "fleetrun"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "psfleet.launch.main"]


def _load_job_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_job", FLEET_JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_fleet_job(tmp_path: Path, data: Path, *script_args: str,
                   timeout: float = 90) -> tuple[subprocess.CompletedProcess[str], float]:
    out = tmp_path / "out"
    out.mkdir()
    argv = [*_fleetrun(), "--server_num=1", "--worker_num=2", f"--log_dir={tmp_path / 'log'}",
            "--stop_grace_s=10", str(FLEET_JOB), "--data", str(data), "--out_dir", str(out),
            *script_args]
    started = time.monotonic()
    r = run_command(argv, timeout, cwd=tmp_path)
    return r, time.monotonic() - started


def test_fleet_api_job_under_fleetrun(tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    data = data_slice(1000)

    r, _ = _run_fleet_job(tmp_path, data)

    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "out"
    workers = [json.loads((out / f"worker.{k}.json").read_text()) for k in (0, 1)]
    # Both trained, on disjoint shares that together are every line exactly once.
    assert [w["worker_index"] for w in workers] == [0, 1]
    assert all(w["steps"] > 0 for w in workers)
    assert sum(w["examples"] for w in workers) == 1000
    from psfleet.data import CriteoReader

    expected = sorted(_load_job_module().fingerprints(CriteoReader([data], 1000)))
    assert sorted(workers[0]["fingerprints"] + workers[1]["fingerprints"]) == expected
    # The model learned, and the tables hold what was trained.
    result = json.loads((out / "result.json").read_text())
    assert result["loss_after"] < result["loss_before"] - 0.03, result
    assert result["dense_values_finite"]
    (tables,) = result["tables"]  # one server
    rows = {t["name"]: t["rows"] for t in tables}
    assert rows["dense"] == 26 * 4 + 13 + 1  # the linear layer's weight and bias
    assert rows["embedding"] > 1000
    # The servers were stopped by worker 0 and exited by themselves.
    assert "server 0 exited 0" in r.stderr
    assert "stopped" in (tmp_path / "log" / "serverlog.0").read_text()
    assert_no_processes_mentioning(str(tmp_path))


def test_worker_failure_stops_the_whole_job(tmp_path: Path,
                                            data_slice: Callable[..., Path]) -> None:
    data = data_slice(1000)

    r, elapsed_s = _run_fleet_job(tmp_path, data, "--fail_worker", "1",
                                  "--fail_after_steps", "2", timeout=60)

    assert r.returncode == 1, r.stderr[-3000:]
    log = tmp_path / "log" / "workerlog.1"
    assert "worker 1" in r.stderr
    assert "first failure" in r.stderr
    assert str(log) in r.stderr
    assert "injected failure of worker 1" in r.stderr  # the tail of its log
    assert "injected failure of worker 1" in log.read_text()
    # Worker 0 waits in a barrier for worker 1 forever; the launcher must stop it, and
    # the server, whose barrier call is blocked, must still exit on SIGTERM.
    assert not (tmp_path / "out" / "result.json").exists()
    assert "SIGKILL" not in r.stderr
    assert elapsed_s < 120  # the blocked barrier alone would hold it 180 s
    assert_no_processes_mentioning(str(tmp_path))
