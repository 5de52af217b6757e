"""A user's own CSV through ``psfleet train``, unpadded: 7 categorical columns (one
multi-valued), 3 numeric ones, quoted text fields and a text label.

The file is made from the real Criteo sample's rows (so the labels carry signal):
the label becomes ``yes`` / ``no``, three I columns the numeric ones, six C columns
the single-valued categoricals (one written as a quoted title holding the
delimiter and doubled quotes), C10..C12 the multi-valued ``interests`` (``|``
separated, empty values left out, so 0 to 3 per row), and a quoted free-text
``comment`` column the config does not use. Every line must be read, in one process
and in a 1 server x 2 workers async job; the bad schema cases exit 2 naming the
field before any process starts.
"""

from __future__ import annotations

import csv
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import run_folder

from psfleet.cli.main import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RunCli = Callable[..., subprocess.CompletedProcess[str]]

SINGLE = {"site": 14, "app": 15, "device": 18, "region": 19, "campaign": 21}
MULTI = (23, 24, 25)  # C10, C11, C12
NUMERIC = {"age": 1, "visits": 2, "spend": 5}


def _user_csv(source: Path, dest: Path) -> int:
    """Write the user's CSV from Criteo TSV rows; returns the rows written."""
    rows = [line.rstrip("\n").split("\t") for line in source.read_text().splitlines()]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("w", newline="") as f:
        out = csv.writer(f)  # RFC 4180: quotes fields holding , or "
        out.writerow(["clicked", *NUMERIC, *SINGLE, "title", "interests", "comment"])
        for r in rows:
            interests = "|".join(r[c] for c in MULTI if r[c])
            title = f'Ad {r[26]}, "{r[27]}" edition' if r[26] else ""
            out.writerow(["yes" if r[0] == "1" else "no", *(r[c] for c in NUMERIC.values()),
                          *(r[c] for c in SINGLE.values()), title, interests,
                          f"seen on {r[16]}, {r[17]}"])
    return len(rows)


def _config(tmp: Path, train: Path, test: Path, **cluster: int) -> Path:
    config = {
        "runner": {
            "train_data_dir": str(train), "test_data_dir": str(test), "epochs": 2,
            "batch_size": 128, "sync_mode": "async", "model_save_path": str(tmp / "out"),
            "parser": "csv", "model": "wide_deep",
            "columns": {"label": "clicked", "label_positive": "yes", "label_negative": ["no"],
                        "dense": list(NUMERIC), "dense_transform": "log1p",
                        "sparse": [*SINGLE, "title"], "multi": ["interests"],
                        "multi_separator": "|"},
        },
        "hyper_parameters": {"fc_sizes": [64, 32], "sparse_feature_dim": 8,
                             "tables": [{"name": "ids", "features": [*SINGLE, "title"]},
                                        {"name": "interests", "features": ["interests"],
                                         "dim": 4, "pooling": "mean"}]},
        "cluster": cluster,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def user_data(criteo_dir: Path, tmp_path: Path) -> tuple[Path, Path, int, int]:
    train, test = tmp_path / "data" / "train.csv", tmp_path / "data" / "test.csv"
    return train, test, _user_csv(criteo_dir / "train.csv", train), _user_csv(
        criteo_dir / "dev.csv", test)


@pytest.mark.parametrize("cluster", [{"server_num": 0, "worker_num": 1},
                                     {"server_num": 1, "worker_num": 2}],
                         ids=["single-process", "async-1x2"])
def test_user_csv_every_line_read(run_cli: RunCli, tmp_path: Path, cluster: dict[str, int],
                                  user_data: tuple[Path, Path, int, int]) -> None:
    train, test, train_rows, test_rows = user_data
    r = run_cli(["train", "-m", str(_config(tmp_path, train, test, **cluster))], timeout=180)

    assert r.returncode == 0, r.stderr[-4000:]
    assert "skipping malformed line" not in r.stderr, r.stderr[-4000:]
    metrics = json.loads((run_folder(tmp_path / "out") / "metrics.json").read_text())
    workers = cluster["worker_num"]
    # worker 0 reads lines 0, W, 2W, ... of the file (split_file_list)
    assert [e["examples"] for e in metrics["epochs"]] == [-(-train_rows // workers)] * 2
    assert metrics["test"]["examples"] == test_rows
    assert metrics["malformed_lines"]["train"]["malformed"] == 0
    assert metrics["test"]["auc"] > 0.6


@pytest.mark.parametrize(("override", "named"), [
    ("runner.columns.dense=[age, visits, spnd]", "'spnd'"),
    ("hyper_parameters.tables=[{name: ids, features: [site, app, device, region, campaign,"
     " title]}]", "interests"),
    ("hyper_parameters.tables=[{name: ids, features: [site, app, device, region, campaign,"
     " title, interests, intrests]}]", "'intrests'"),
    ("runner.columns.multi_separator=','", "runner.columns: multi_separator: ','"),
])
def test_bad_schema_exits_2_naming_the_field(tmp_path: Path,
                                             user_data: tuple[Path, Path, int, int],
                                             override: str, named: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # ``psfleet train``'s main() in this process (the command's exit code and stderr;
    # a process of its own would cost a torch import per case): the config is
    # refused before any process starts (a job started would fail the leak check).
    train, test, _, _ = user_data
    config = _config(tmp_path, train, test, server_num=1, worker_num=2)
    capsys.readouterr()
    code = main(["train", "-m", str(config), "-o", override])
    out, err = capsys.readouterr()

    assert code == 2, (out[-2000:], err[-2000:])
    assert named in err, err[-2000:]
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # no run folder: no process was started
