"""Run folders, the Python API and early stopping (issue 16 items 1, 2, 7, 8), on
slices of the real Criteo sample.

- Two ``psfleet train`` runs of one config write two run folders; ``latest`` points
  at the second; each holds its effective config (read back equal to the run's),
  metrics.json, the curves, the TensorBoard folder and the exported model.
- A finished run named again (``-o runner.run_name=``) is refused with exit 2 naming
  the folder, and nothing in it changes; an interrupted one may continue, and so may a
  process the launcher restarted (``PSFLEET_RESTART_NUM`` > 0).
- ``psfleet.train(dict)`` twice in one process: two run folders, two results, and
  the second run's model equals a fresh process's (fleet state is per run).
- ``psfleet predict --model RUN_FOLDER`` (no -m) reproduces the run's test AUC.
- Early stopping with ``min_delta: 1.0`` (no AUC can improve by 1) and patience 1
  stops a 1 server x 2 workers job after epoch 2 of 6: both workers stop (exit 0),
  metrics.json has 2 epochs and ``early_stopped``.
- :class:`EarlyStopping`'s rule on metric sequences (AUC up, log loss down,
  min_delta, NaN).

The two runs of the first test are one module fixture; the finished run the second
test names again is the second of them (one ``psfleet train`` less in CI), and the
refused command runs main() in the test's process (it starts nothing).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_command, write_slice

from psfleet.cli.main import main
from psfleet.errors import ConfigError
from psfleet.rec.config import EarlyStoppingConfig
from psfleet.rec.config_load import load_config
from psfleet.rec.early_stopping import EarlyStopping
from psfleet.rec.run_folder import LATEST, check_run_folder, find_run_folder

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def _config(tmp_path: Path, data_slice: Callable[..., Path], **runner: Any) -> Path:
    return _config_with(tmp_path, data_slice(2000), data_slice(391, source="test.csv"),
                        **runner)


def _config_with(tmp_path: Path, train: Path, dev: Path, **runner: Any) -> Path:
    raw = {"runner": {"train_data_dir": str(train), "test_data_dir": str(dev),
                      "epochs": 1, "batch_size": 64, "model_save_path": "out",
                      "seed": 3, **runner},
           "hyper_parameters": {"fc_sizes": [32, 16],
                                "optimizer": {"class": "Adam", "learning_rate": 0.01}},
           "cluster": {"server_num": 0, "worker_num": 1}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture(scope="module")
def two_runs(criteo_dir: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, Path, str]:
    """Two ``psfleet train`` runs of one config (its ``model_save_path`` is ``out``,
    relative to the config's folder): the first named ``first`` (1 epoch), the second
    unnamed with 2 epochs. Returns (config, out, the second run's name). The second
    test names the second run again and continues it in place, with its own
    overrides: ``latest`` still points at it and its files stay what the first test
    checks, whichever test runs first."""
    work = tmp_path_factory.mktemp("run_folders")
    config = _config_with(work, write_slice(criteo_dir / "train.csv", work / "train.csv",
                                            2000),
                          write_slice(criteo_dir / "test.csv", work / "dev.csv", 391))
    for override in ("runner.run_name=first", "runner.epochs=2"):
        _ok(run_command([sys.executable, "-m", "psfleet.cli.main", "train", "-m",
                         str(config), "-o", override], timeout=60))
    out = work / "out"
    second = next(p.name for p in out.iterdir() if p.name not in (LATEST, "first"))
    return config, out, second


@pytest.mark.slow
def test_two_runs_two_folders_latest_and_effective_config(
        run_cli: RunCli, two_runs: tuple[Path, Path, str]) -> None:
    config, out, second = two_runs
    runs = sorted(p.name for p in out.iterdir() if p.name != LATEST)
    assert runs == sorted(["first", second])
    assert (out / LATEST).resolve() == (out / second).resolve()
    for name, epochs in (("first", 1), (second, 2)):
        folder = out / name
        assert {"config.yaml", "metrics.json", "curves.png", "tensorboard",
                "model"} <= {p.name for p in folder.iterdir()}
        metrics = json.loads((folder / "metrics.json").read_text())
        assert metrics["run_name"] == name and len(metrics["epochs"]) == epochs
        assert metrics["export"] == str(folder / "model")
        assert (folder / "model" / "manifest.json").is_file()
        effective = load_config(folder / "config.yaml")
        assert effective.runner.run_name == name and effective.runner.epochs == epochs
        assert effective == load_config(config, [f"runner.run_name={name}",
                                                 f"runner.epochs={epochs}"])
    # predict on the run folder alone (its config.yaml and model/) gives the test AUC
    result = run_cli(["predict", "--model", str(out), "--data",
                      str(load_config(config).runner.test_data_dir)])
    _ok(result)
    test_auc = json.loads((out / second / "metrics.json").read_text())["test"]["auc"]
    assert f"predict auc {test_auc:.6f}" in result.stdout
    assert "INFO" not in result.stderr  # predict shows warnings and errors only


@pytest.mark.slow
def test_a_finished_run_is_not_continued_an_interrupted_one_is(
        run_cli: RunCli, two_runs: tuple[Path, Path, str],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    config, out, name = two_runs  # its second run: finished (2 epochs)
    again = ["train", "-m", str(config), "-o", f"runner.run_name={name}",
             "-o", "runner.epochs=2"]  # the command of that run, naming it
    folder = out / name
    assert (folder / "metrics.json").is_file()
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    monkeypatch.delenv("PSFLEET_RESTART_NUM", raising=False)  # as run_cli's children
    capsys.readouterr()
    code = main(again)  # refused before training: no process of its own needed
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert f"{folder} holds a finished run" in err
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before
    # a process the launcher restarted continues its own job's folder (a gang restart
    # after worker 0 wrote metrics.json)
    _ok(run_cli(again, env={"PSFLEET_RESTART_NUM": "1"}))
    assert (folder / "metrics.json").stat().st_mtime_ns > before[folder / "metrics.json"]
    # an interrupted run (metrics.json with "interrupted") continues in its folder
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["interrupted"] = {"epoch": 1, "step": 3, "batch": 3, "checkpoint": None}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    _ok(run_cli(again))
    assert json.loads((folder / "metrics.json").read_text())["interrupted"] is None


@pytest.mark.slow
def test_python_api_trains_twice_in_one_process(
        tmp_path: Path, data_slice: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    import torch

    import psfleet
    from psfleet import fleet

    fleet.reset()  # an earlier test of this pytest process may have left its fleet
    raw = yaml.safe_load(_config(tmp_path, data_slice).read_text())
    monkeypatch.chdir(tmp_path)  # a dict config's relative paths: the current folder
    first = psfleet.train(raw)
    second = psfleet.train(raw, runner={"run_name": "again", "epochs": 1})
    assert first.run_dir != second.run_dir == tmp_path / "out" / "again"
    for result in (first, second):
        assert result.metrics == json.loads((result.run_dir / "metrics.json").read_text())
        assert result.model is not None and 0.6 < result.metrics["test"]["auc"] < 1
    # Same config and seed, fresh fleet state: the same training, the same scores.
    assert second.metrics["test"]["auc"] == first.metrics["test"]["auc"]
    batch = torch.randint(0, 1000, (4, 26)), torch.rand(4, 13)
    assert first.model is not None and second.model is not None
    assert torch.equal(first.model(*batch), second.model(*batch))
    scored = psfleet.predict(second.run_dir, second.config.runner.test_data_dir)
    assert scored["auc"] == pytest.approx(second.metrics["test"]["auc"], abs=1e-9)
    assert scored["files"] == [str(second.config.runner.test_data_dir)]


@pytest.mark.slow
def test_early_stopping_stops_every_worker(
        run_cli: RunCli, tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    valid = data_slice(400, source="dev.csv", name="valid.csv")
    config = _config(tmp_path, data_slice, epochs=6, valid_data_dir=str(valid),
                     early_stopping={"metric": "auc", "patience": 1, "min_delta": 1.0})
    result = run_cli(["train", "-m", str(config), "-o", "cluster.server_num=1",
                      "-o", "cluster.worker_num=2"], timeout=180)
    _ok(result)
    assert "stopped early after epoch 2" in result.stdout
    metrics = json.loads((find_run_folder(tmp_path / "out") or tmp_path) .joinpath(
        "metrics.json").read_text())
    assert len(metrics["epochs"]) == 2
    assert metrics["early_stopped"] == {"epoch": 2, "metric": "auc",
                                        "best": metrics["valid"][0]["auc"], "best_epoch": 1}
    assert [v["epoch"] for v in metrics["valid"]] == [1, 2]


@pytest.mark.parametrize(("metric", "values", "min_delta", "patience", "stop_at"), [
    ("auc", [0.70, 0.71, 0.71, 0.705], 0.0, 2, 4),      # no gain at 3 and 4
    ("auc", [0.70, 0.705, 0.709], 0.01, 2, 3),          # gains below min_delta
    ("logloss", [0.50, 0.49, 0.495, 0.48], 0.0, 2, None),  # 0.48 improves
    ("logloss", [0.50, 0.51], 0.0, 1, 2),
    ("auc", [math.nan, 0.6, math.nan, math.nan], 0.0, 2, 4),  # NaN never improves
])
def test_early_stopping_rule(metric: str, values: list[float], min_delta: float,
                             patience: int, stop_at: int | None, tmp_path: Path) -> None:
    rule = EarlyStopping(EarlyStoppingConfig(metric=metric, patience=patience,  # type: ignore[arg-type]
                                             min_delta=min_delta), tmp_path, 1)
    stops = [epoch for epoch, value in enumerate(values, 1)
             if rule.observe(epoch, {metric: value})]
    assert (stops[0] if stops else None) == stop_at
    rule.publish(1, True)  # one worker: no decision file
    assert not list(tmp_path.iterdir())


def test_decision_file_is_read_by_the_other_workers(tmp_path: Path) -> None:
    config = EarlyStoppingConfig(patience=1)
    chief = EarlyStopping(config, tmp_path / "exchange", 2)
    other = EarlyStopping(config, tmp_path / "exchange", 2)
    chief.publish(3, True)
    chief.publish(4, False)
    assert other.read(3) is True and other.read(4) is False


def test_early_stopping_needs_validation_data(tmp_path: Path,
                                              data_slice: Callable[..., Path]) -> None:
    from psfleet.errors import ConfigError

    config = _config(tmp_path, data_slice, early_stopping={"patience": 1})
    with pytest.raises(ConfigError, match="runner.early_stopping: needs runner.valid_data_dir"):
        load_config(config)


def test_an_unnamed_finished_run_of_a_hand_or_mpirun_job_asks_for_a_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes started without psfleet train's launcher (by hand, mpirun) write the
    folder ``run`` when unnamed; a finished one there is refused, asking for a name."""
    monkeypatch.delenv("PSFLEET_RESTART_NUM", raising=False)
    config = load_config(REPO / "examples" / "criteo_dnn" / "config.yaml",
                         [f"runner.model_save_path={tmp_path}"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.json").write_text(json.dumps({"interrupted": None}))
    with pytest.raises(ConfigError) as refused:
        check_run_folder(config)
    assert str(refused.value).startswith(
        f"runner.run_name is not set, so this job writes {tmp_path / 'run'}, which holds a "
        "finished run (its metrics.json): name this run (-o runner.run_name=NAME")
