"""Online training by pass through ``psfleet train`` (issue 17, item 6).

Real Criteo rows split into day folders (the first, middle and last rows of the
sample's train.csv); a ctr accessor with a row cap, shrink, set_date and a base/delta
save per pass. metrics.json must hold one entry per pass whose counts add up
(rows after a pass = rows before + admitted - evicted - deleted), stay under the cap,
and agree with the data (every distinct id of pass 1 admitted at least once). A bad
key stops ``psfleet train`` with exit 2 naming it before any process starts; a job
restarted on the same checkpoints with one more pass trains only that pass.

The three-pass run checked first is also the first run of the restart test (it
checkpoints after each pass; the restart adds a fourth day): one job less in CI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from conftest import (
    assert_no_processes_mentioning,
    clean_env,
    kill_processes,
    run_command,
    run_folder,
    write_slice,
)

from psfleet.cli.main import main

pytestmark = pytest.mark.e2e

RunCli = Callable[..., subprocess.CompletedProcess[str]]

CAP = 2000  # rows per server: a pass of 1200 rows has ~9k distinct ids
PASS_ROWS = 1200
PASS_STARTS = (0, 3000, 6000)  # first, middle and last rows of train.csv (7,200)
EXTRA_PASS_START = 1500  # the fourth day of the restart test: rows no other day holds


def _passes(criteo_dir: Path, tmp_path: Path,
            starts: tuple[int, ...] = PASS_STARTS) -> list[Path]:
    """Day folders of real rows (one per start; three by default), one file each."""
    days = []
    for k, start in enumerate(starts):
        day = tmp_path / "days" / f"day-{k + 1}"
        write_slice(criteo_dir / "train.csv", day / "part-0.csv", PASS_ROWS, start)
        days.append(day)
    return days


def _config(tmp_path: Path, criteo_dir: Path, days: list[Path],
            cluster: dict[str, int] | None = None, **runner: Any) -> Path:
    raw: dict[str, Any] = {
        "runner": {"train_passes": [str(d) for d in days],
                   "valid_data_dir": str(criteo_dir / "dev.csv"),
                   "epochs": 1, "batch_size": 128, "sync_mode": "async",
                   "model_save_path": str(tmp_path / "out"), "export_model": False,
                   "seed": 7, "after_pass": {"shrink": True, "set_date": True,
                                             "save": "delta"}, **runner},
        "hyper_parameters": {"fc_sizes": [16],
                             "sparse_accessor": {"name": "ctr", "max_rows": CAP,
                                                 "eviction": "lowest_score",
                                                 "delete_threshold": 0.5}},
        "cluster": cluster or {"server_num": 1, "worker_num": 1}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _distinct_ids(file: Path) -> int:
    """Distinct (column, value) pairs of the 26 categorical columns, empty ones left
    out: a lower bound of the ids a pass over ``file`` admits (no admission rule)."""
    seen: set[tuple[int, str]] = set()
    for line in file.read_text().splitlines():
        cols = line.split("\t")[14:40]
        seen.update((i, v) for i, v in enumerate(cols) if v)
    return len(seen)


def _metrics(out: Path) -> dict[str, Any]:
    return json.loads((run_folder(out) / "metrics.json").read_text())


@pytest.fixture(scope="module")
def three_passes(criteo_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, list[Path], Path, dict[str, Any]]:
    """The three day folders trained by one ``psfleet train`` run (1 x 1), which
    checkpoints after each pass: (work folder, days, checkpoint dir, its metrics.json).
    The pass test checks this run; the restart test continues from its checkpoints."""
    work = tmp_path_factory.mktemp("online_passes")
    days = _passes(criteo_dir, work)
    checkpoint = {"checkpoint_dir": str(work / "ckpt"), "epoch_interval": 1}
    config = _config(work, criteo_dir, days, checkpoint=checkpoint, run_name="three-days")
    r = run_command([sys.executable, "-m", "psfleet.cli.main", "train", "-m", str(config)],
                    timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return work, days, work / "ckpt", _metrics(work / "out")


@pytest.mark.slow
def test_passes_with_ctr_cap_and_shrink(
        three_passes: tuple[Path, list[Path], Path, dict[str, Any]]) -> None:
    _, days, _, metrics = three_passes
    passes = metrics["passes"]

    assert [p["pass"] for p in passes] == [1, 2, 3]
    assert [p["data"] for p in passes] == [str(d) for d in days]
    assert [(e["epoch"], e["pass"]) for e in metrics["epochs"]] == [(1, 1), (2, 2), (3, 3)]
    assert [e["examples"] for e in metrics["epochs"]] == [PASS_ROWS] * 3
    rows_before = 0
    for entry in passes:
        table = entry["tables"]["embedding"]
        assert set(entry["tables"]) == {"embedding"}  # the sparse tables only
        assert 0 < table["rows"] <= CAP
        # every row change of the pass is counted: admitted in, evicted and deleted out
        assert table["rows"] == (rows_before + table["admitted"] - table["evicted"]
                                 - table["deleted"])
        assert table["deleted"] == entry["shrink_deleted"] > 0  # only shrink deletes
        assert table["evicted"] > 0  # far more distinct ids than the cap
        assert table["bytes"] > 0
        # the pass's validation, on the whole dev file, is the run's validation there
        assert entry["valid"]["examples"] == 409 and 0 < entry["valid"]["auc"] < 1
        assert entry["valid"] == metrics["valid"][entry["pass"] - 1]
        rows_before = table["rows"]
    first = passes[0]["tables"]["embedding"]
    assert first["admitted"] >= _distinct_ids(days[0] / "part-0.csv") > CAP
    # the per-pass validations are the run's validations: no extra one at the end
    assert [v["epoch"] for v in metrics["valid"]] == [1, 2, 3]
    # one save per pass: a base, then deltas with tombstones
    saves = [json.loads((Path(p["save"]) / "manifest.json").read_text())["save_mode"]
             for p in passes]
    assert saves == ["base", "delta", "delta"]
    assert all(Path(p["save"]).parent.name == "saves" for p in passes)


# Through the CLI: a bad value of the config (the other keys' checks are unit tests in
# test_online_config.py) and a pass folder that is not there (the preflight's check).
@pytest.mark.parametrize(("edit", "named"), [
    ({"hyper_parameters.sparse_accessor.name": "ctrr"},
     "hyper_parameters.sparse_accessor.name: 'ctrr' is not one of"),
    ({"runner.train_passes": "missing"}, "runner.train_passes[1]"),
], ids=["unknown_accessor", "missing_pass"])
def test_bad_online_key_is_exit_2_before_any_process(
        criteo_dir: Path, tmp_path: Path, edit: dict[str, Any], named: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    days = _passes(criteo_dir, tmp_path)
    config = _config(tmp_path, criteo_dir, days)
    overrides = []
    for key, value in edit.items():
        if value == "missing":
            value = [str(days[0]), str(tmp_path / "days" / "no-such-day")]
        overrides += ["-o", f"{key}={json.dumps(value)}"]
    overrides += ["-o", "cluster.worker_num=2"]

    # ``psfleet train``'s main() in this process (its exit code and stderr; a process
    # of its own would cost a torch import per case). A job it started would be a
    # child of this process: the leak check and the check below would find it.
    capsys.readouterr()
    code = main(["train", "-m", str(config), *overrides])
    out, err = capsys.readouterr()

    assert code == 2, out[-2000:] + err[-2000:]
    assert named in err
    if "missing" in edit.values():
        assert "no-such-day" in err and "does not exist" in err
    assert not (tmp_path / "out").exists()  # no job started, no run folder
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_restart_with_one_more_pass_trains_only_it(
        run_cli: RunCli, criteo_dir: Path,
        three_passes: tuple[Path, list[Path], Path, dict[str, Any]]) -> None:
    # The first run: the module's three-pass run, checkpointed after each pass.
    work, days, checkpoint_dir, before = three_passes
    (fourth,) = _passes(criteo_dir, work / "extra", (EXTRA_PASS_START,))
    checkpoint = {"checkpoint_dir": str(checkpoint_dir), "epoch_interval": 1}
    again = _config(work, criteo_dir, [*days, fourth], checkpoint=checkpoint,
                    run_name="four-days")
    r = run_cli(["train", "-m", str(again)], timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    after = _metrics(work / "out")

    # resumed at pass 4 (epoch 4): passes 1 to 3 are not trained again ...
    assert [(e["epoch"], e["pass"]) for e in after["epochs"]] == [(4, 4)]
    # ... and their entries come back from the checkpoint, as the first run wrote them
    assert after["passes"][:3] == before["passes"]
    last = after["passes"][3]["tables"]["embedding"]
    rows_three = before["passes"][2]["tables"]["embedding"]["rows"]
    assert last["rows"] <= CAP
    assert last["rows"] == rows_three + last["admitted"] - last["evicted"] - last["deleted"]


def _checkpoint_at(folder: Path, epoch: int, batch: int) -> bool:
    """Whether a complete checkpoint of ``folder`` has worker 0's cursor there."""
    for manifest in folder.glob("ckpt-*/manifest.json"):
        try:
            found = json.loads(manifest.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # pruned or being written
        if (found.get("epoch"), found.get("batch")) == (epoch, batch):
            return True
    return False


@pytest.mark.slow
def test_job_killed_in_pass_2_resumes_there(criteo_dir: Path, tmp_path: Path) -> None:
    days = _passes(criteo_dir, tmp_path)
    checkpoint = {"checkpoint_dir": str(tmp_path / "ckpt"), "step_interval": 20,
                  "max_num_checkpoints": 3}
    config = _config(tmp_path, criteo_dir, days, checkpoint=checkpoint, batch_size=8,
                     sync_mode="sync", cluster={"server_num": 1, "worker_num": 2})
    argv = [sys.executable, "-m", "psfleet.cli.main", "train", "-m", str(config)]
    job = subprocess.Popen(argv, env=clean_env(), text=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not _checkpoint_at(tmp_path / "ckpt", 1, 40):  # pass 2, batch 40
            assert job.poll() is None, f"the job ended (exit {job.returncode}) first"
            assert time.monotonic() < deadline, "no checkpoint in pass 2"
            time.sleep(0.02)
    finally:
        kill_processes([psutil.Process(job.pid), *psutil.Process(job.pid).children(True)])
        job.wait()
    cut = run_folder(tmp_path / "out")
    assert not (cut / "metrics.json").exists(), "the job ended before the kill"

    r = run_command(argv, timeout=240)  # the same command: continues from the checkpoint
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    resumed = run_folder(tmp_path / "out")
    assert resumed != cut
    log = (resumed / "log" / "workerlog.0").read_text()
    metrics = json.loads((resumed / "metrics.json").read_text())

    assert "resuming at epoch 2, batch 40" in log  # pass 2 (epoch 2 of the run)
    # pass 1 is not trained again; pass 2 only from batch 40 on (35 of the 75 batches
    # of worker 0's 600 examples); each pass's counts agreed among the workers anew
    assert [(e["epoch"], e["pass"], e["examples"]) for e in metrics["epochs"]] == [
        (2, 2, (75 - 40) * 8), (3, 3, PASS_ROWS // 2)]
    assert [p["pass"] for p in metrics["passes"]] == [1, 2, 3]  # pass 1's from the checkpoint
    assert metrics["passes"][0]["save"].startswith(str(cut))  # written by the killed run
    for entry in metrics["passes"]:
        assert 0 < entry["tables"]["embedding"]["rows"] <= CAP
    assert [json.loads((Path(p["save"]) / "manifest.json").read_text())["save_mode"]
            for p in metrics["passes"]] == ["base", "delta", "delta"]
