"""``psfleet predict`` on rows without a label (issue 45, item 4), in this process.

A model is trained (``server_num: 0``, one epoch, the command's main() in this
process) on a CSV or Parquet file made from the real Criteo sample's rows, with a
header naming the label ``clicked``. The test rows are then scored twice: as they are
(the result line keeps its AUC and log loss, ``--out`` its ``label<TAB>probability``
lines) and with the label column dropped and the other columns reordered: the same
probabilities in the same order, the label field empty, and a result line that says
there is no AUC or log loss. A data folder mixing both kinds of file is refused
naming one of each.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import psfleet
from psfleet import fleet
from psfleet.cli.main import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DENSE = {"age": 1, "visits": 2, "spend": 5}
SPARSE = {"site": 14, "app": 15, "device": 18, "region": 19, "campaign": 21}


def _rows(source: Path, n: int) -> list[dict[str, str]]:
    """The first ``n`` Criteo rows as named columns (label ``clicked``)."""
    rows = []
    for line in source.read_text().splitlines()[:n]:
        r = line.split("\t")
        rows.append({"clicked": r[0], **{k: r[c] for k, c in DENSE.items()},
                     **{k: r[c] for k, c in SPARSE.items()}})
    return rows


def _write(rows: list[dict[str, str]], path: Path, columns: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(pa.table({c: [r[c] for r in rows] for c in columns}), path)
        return path
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(columns)
        out.writerows([r[c] for c in columns] for r in rows)
    return path


def _config(tmp: Path, parser: str, train: Path, test: Path) -> Path:
    config = {
        "runner": {"train_data_dir": str(train), "test_data_dir": str(test), "epochs": 1,
                   "batch_size": 128, "model_save_path": str(tmp / "out"), "parser": parser,
                   "model": "dnn",
                   "columns": {"label": "clicked", "dense": list(DENSE),
                               "dense_transform": "log1p", "sparse": list(SPARSE)}},
        "hyper_parameters": {"fc_sizes": [32, 16], "sparse_feature_dim": 8},
        "cluster": {"server_num": 0, "worker_num": 1},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _predict(capsys: pytest.CaptureFixture[str], config: Path, model: Path, data: Path,
             out: Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["predict", "-m", str(config), "--model", str(model), "--data", str(data),
                 "--out", str(out)])
    printed, err = capsys.readouterr()
    return code, printed, err


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_predict_scores_rows_without_a_label(criteo_dir: Path, tmp_path: Path, suffix: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    parser = "parquet" if suffix == ".parquet" else "csv"
    names = ["clicked", *DENSE, *SPARSE]
    test_rows = _rows(criteo_dir / "dev.csv", 300)
    train = _write(_rows(criteo_dir / "train.csv", 1500), tmp_path / f"train{suffix}", names)
    test = _write(test_rows, tmp_path / f"test{suffix}", names)
    unlabelled = _write(test_rows, tmp_path / "unlabelled" / f"rows{suffix}",
                        [*reversed(SPARSE), *DENSE])  # no label, another column order
    config = _config(tmp_path, parser, train, test)
    try:
        assert main(["train", "-m", str(config)]) == 0, capsys.readouterr().err[-3000:]
    finally:
        fleet.reset()  # train leaves this process's fleet as a job's process does
    model = tmp_path / "out" / "latest" / "model"

    code, printed, err = _predict(capsys, config, model, test, tmp_path / "labelled.tsv")
    assert code == 0, err
    assert "predict auc " in printed and "logloss" in printed, printed
    labelled = [line.split("\t") for line in
                (tmp_path / "labelled.tsv").read_text().splitlines()]
    assert [y for y, _ in labelled] == [r["clicked"] for r in test_rows]

    code, printed, err = _predict(capsys, config, model, unlabelled, tmp_path / "scores.tsv")
    assert code == 0, err
    assert "predict scored (no label column: no auc or logloss) 300 examples" in printed, (
        printed)
    assert "auc 0." not in printed
    scored = [line.split("\t") for line in (tmp_path / "scores.tsv").read_text().splitlines()]
    assert [y for y, _ in scored] == [""] * len(test_rows)
    np.testing.assert_array_equal([float(p) for _, p in scored],
                                  [float(p) for _, p in labelled])
    probs = np.array([float(p) for _, p in scored])
    assert probs.std() > 0.0 and ((probs > 0.0) & (probs < 1.0)).all()

    result = psfleet.predict(model, unlabelled, config)
    assert (result["auc"], result["logloss"], result["labelled"]) == (None, None, False)
    assert result["examples"] == len(test_rows)

    mixed = tmp_path / "mixed"
    _write(test_rows[:10], mixed / f"a{suffix}", names)
    _write(test_rows[:10], mixed / f"b{suffix}", list(SPARSE))
    code, _, err = _predict(capsys, config, model, mixed, tmp_path / "mixed.tsv")
    assert code == 2
    assert "has the label column 'clicked'" in err and f"b{suffix}" in err, err


def test_training_refuses_a_config_without_a_label(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "csv", tmp_path / "train.csv", tmp_path / "test.csv")
    raw = yaml.safe_load(config.read_text())
    raw["runner"]["columns"]["label"] = None
    config.write_text(yaml.safe_dump(raw))
    assert main(["train", "-m", str(config)]) == 2
    assert "runner.columns.label: required" in capsys.readouterr().err
