"""What a run shows (issue 45, item 8): the curves' title says how the run ran (``dnn,
one process`` for a single process, not ``async, 0x1``), and ``psfleet.train(...,
quiet=True)`` drops psfleet's INFO lines and the progress bar while the default
shows both. In-process runs (``server_num: 0``) on the real Criteo sample.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from PIL import Image

import psfleet
from psfleet.rec.reporting import run_title

pytestmark = [pytest.mark.unit, pytest.mark.slow]


def test_run_title_names_the_shape() -> None:
    assert run_title("dnn", "async", 0, 1) == "dnn, one process"
    assert run_title("dnn", "collective", 0, 2) == "dnn, collective, 2 workers"
    assert run_title("deepfm", "sync", 1, 2) == "deepfm, sync, 1 server x 2 workers"
    assert run_title("dnn", "geo", 2, 4) == "dnn, geo, 2 servers x 4 workers"


def _train(repo_root: Path, tmp_path: Path, name: str, quiet: bool) -> psfleet.TrainResult:
    return psfleet.train(repo_root / "examples" / "criteo_dnn" / "config.yaml",
                         ["hyper_parameters.fc_sizes=[32]"], quiet=quiet,
                         runner={"epochs": 1, "model_save_path": str(tmp_path / name)},
                         cluster={"server_num": 0, "worker_num": 1})


def test_quiet_train_shows_no_info_and_no_bar(repo_root: Path, tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.INFO, logger="psfleet")
    loud = _train(repo_root, tmp_path, "loud", quiet=False)
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert any("epoch 1/1" in r.getMessage() for r in infos)
    assert "epoch 1/1" in capfd.readouterr().err  # the progress bar
    assert Image.open(loud.metrics["curves"]).text["Title"] == "dnn, one process"

    caplog.clear()
    quiet = _train(repo_root, tmp_path, "quiet", quiet=True)
    assert [r.getMessage() for r in caplog.records if r.levelno < logging.WARNING] == []
    assert "epoch 1/1" not in capfd.readouterr().err
    assert quiet.metrics["test"]["examples"] == loud.metrics["test"]["examples"] == 800
    assert logging.getLogger("psfleet").level == logging.INFO  # restored after the run
