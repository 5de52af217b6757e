"""Data the config cannot read at all is refused before any process starts (issue 45,
item 6): text labels without ``columns.label_positive`` once started the job's
processes and made a run folder, and then failed on 100% malformed lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from psfleet.cli.main import main
from psfleet.rec.config_load import load_config
from psfleet.rec.preflight import check_before_start

pytestmark = pytest.mark.unit


def _census_like(tmp_path: Path, label_positive: str | None) -> Path:
    """A user's CSV of its own: a text label, one numeric and two categorical columns."""
    data = tmp_path / "train.csv"
    data.write_text("income,age,city,job\n" + "".join(
        f"{'>50K' if i % 3 else '<=50K'},{18 + i % 60},c{i % 7},j{i % 5}\n" for i in range(300)))
    columns: dict[str, object] = {"label": "income", "dense": ["age"], "sparse": ["city", "job"]}
    if label_positive is not None:
        columns["label_positive"] = label_positive
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({
        "runner": {"train_data_dir": str(data), "parser": "csv", "columns": columns,
                   "epochs": 1, "batch_size": 32, "model_save_path": str(tmp_path / "out")},
        "cluster": {"server_num": 1, "worker_num": 1}}))
    return config


def test_text_labels_without_a_mapping_exit_2_before_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "-q", "-m", str(_census_like(tmp_path, None))]) == 2
    err = capsys.readouterr().err
    assert "runner.train_data_dir" in err and "train.csv:2" in err
    assert "every one of its first 100 data lines is malformed" in err
    assert "label is '<=50K'" in err and "columns.label_positive" in err  # what to do
    assert not (tmp_path / "out").exists()  # no run folder: nothing started


@pytest.mark.slow  # builds the model: imports torch
def test_a_malformed_first_line_alone_does_not_refuse_the_data(tmp_path: Path) -> None:
    """Only data with no readable line among the first is refused; a bad line among
    good ones is the workers' to skip and count."""
    config = _census_like(tmp_path, ">50K")
    data = tmp_path / "train.csv"
    lines = data.read_text().splitlines(keepends=True)
    data.write_text(lines[0] + "not,a,number,row,extra\n" + "".join(lines[1:]))
    check_before_start(load_config(config, []))  # raises nothing
