"""``psfleet train`` on compressed data files: a .gz training file (and .zst test
file) trains on every line with none malformed and gives the test AUC of the plain
files; a .zip exits 2 before anything starts, naming the file. The reader-level
checks of each codec are in test_compressed_data.py."""

from __future__ import annotations

import gzip
import json
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import assert_no_processes_mentioning

pytestmark = pytest.mark.e2e

RunCli = Callable[..., subprocess.CompletedProcess[str]]
TRAIN_LINES, TEST_LINES = 2000, 400


def _args(repo_root: Path, out: Path, train: Path, test: Path, *extra: str) -> list[str]:
    return ["train", "-m", str(repo_root / "examples" / "criteo_dnn" / "config.yaml"),
            "-o", f"runner.train_data_dir={train}", "-o", f"runner.test_data_dir={test}",
            "-o", f"runner.model_save_path={out}", "-o", "cluster.server_num=0",
            "-o", "cluster.worker_num=1", "-o", "runner.epochs=1",
            "-o", "hyper_parameters.fc_sizes=[16]",
            "-o", "runner.export_model=false", *extra]  # the data is under test, not export


def _metrics(out: Path, r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """metrics.json of the run (in ``out`` or, with per-run folders, ``out/latest``)."""
    for path in (out / "metrics.json", out / "latest" / "metrics.json"):
        if path.is_file():
            metrics: dict[str, Any] = json.loads(path.read_text())
            return metrics
    raise AssertionError(f"no metrics.json under {out}\n{r.stdout[-3000:]}\n"
                         f"{r.stderr[-3000:]}")


@pytest.mark.slow
def test_train_on_gz_and_zst_equals_training_on_the_plain_files(
        run_cli: RunCli, repo_root: Path, tmp_path: Path,
        data_slice: Callable[..., Path]) -> None:
    train = data_slice(TRAIN_LINES)
    test = data_slice(TEST_LINES, source="dev.csv")
    packed_train = tmp_path / "packed" / "train.csv.gz"
    packed_train.parent.mkdir()
    packed_train.write_bytes(gzip.compress(train.read_bytes()))
    packed_test = tmp_path / "packed" / "dev.csv.zst"
    packed_test.write_bytes(zstandard.ZstdCompressor().compress(test.read_bytes()))

    runs = {}
    for name, (train_file, test_file) in {"plain": (train, test),
                                          "packed": (packed_train, packed_test)}.items():
        out = tmp_path / f"out_{name}"
        r = run_cli(_args(repo_root, out, train_file, test_file), timeout=90)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[name] = _metrics(out, r)

    packed, plain = runs["packed"], runs["plain"]
    assert packed["malformed_lines"]["train"]["lines"] == TRAIN_LINES
    assert packed["malformed_lines"]["train"]["malformed"] == 0
    assert packed["malformed_lines"]["test"]["malformed"] == 0
    assert packed["test"]["examples"] == plain["test"]["examples"] == TEST_LINES
    assert packed["test"]["auc"] == plain["test"]["auc"]  # same examples, same order
    assert packed["test"]["logloss"] == plain["test"]["logloss"]
    assert 0.5 < packed["test"]["auc"] < 1.0
    assert_no_processes_mentioning(str(tmp_path))


def test_zip_training_file_exits_2_naming_it(run_cli: RunCli, repo_root: Path,
                                             tmp_path: Path,
                                             data_slice: Callable[..., Path]) -> None:
    train = data_slice(100)
    archive = tmp_path / "train.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(train, "train.csv")
    out = tmp_path / "out"

    r = run_cli(_args(repo_root, out, archive, data_slice(50, source="dev.csv")),
                timeout=60)

    assert r.returncode == 2, r.stderr[-3000:]
    error = r.stderr.strip().splitlines()[-1]
    assert "runner.train_data_dir" in error and repr(str(archive)) in error
    assert "zip archive" in error and "unzip it" in error  # what to do
    assert "Traceback" not in r.stderr
    assert not list(out.glob("**/metrics.json"))
    assert_no_processes_mentioning(str(tmp_path))
