"""Tests of psfleet.data.synthetic and ``psfleet datagen criteo``."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from psfleet.data import generate_criteo, true_probabilities
from psfleet.data.criteo import NUM_DENSE, NUM_SLOTS, ParsedChunk, hash_feature, parse_lines
from psfleet.data.synthetic import VOCAB_SIZES
from psfleet.errors import ConfigError, DataError
from psfleet.metrics import auc

pytestmark = pytest.mark.e2e

ROWS = 20_000
SEED = 11


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("datagen") / "train.tsv"
    generate_criteo(ROWS, SEED, path)
    return path


def _parse(path: Path) -> ParsedChunk:
    with open(path, encoding="utf-8", newline="") as handle:
        return parse_lines(handle, str(path), strict=True)


def test_same_seed_same_bytes_other_seed_other_bytes(train_file: Path, tmp_path: Path) -> None:
    again = generate_criteo(ROWS, SEED, tmp_path / "again.tsv")
    other = generate_criteo(ROWS, SEED + 1, tmp_path / "other.tsv")
    assert (tmp_path / "again.tsv").read_bytes() == train_file.read_bytes()
    assert (tmp_path / "other.tsv").read_bytes() != train_file.read_bytes()
    assert again.sha256 == hashlib.sha256(train_file.read_bytes()).hexdigest()
    assert other.sha256 != again.sha256
    assert not (tmp_path / "again.tsv.tmp").exists()


def test_every_line_parses_in_the_raw_layout(train_file: Path) -> None:
    data = train_file.read_bytes()
    assert data.endswith(b"\n") and b"\r" not in data
    lines = data.decode("ascii").split("\n")[:-1]
    assert len(lines) == ROWS
    parsed = _parse(train_file)  # strict: raises on a malformed line
    assert parsed.malformed == 0 and len(parsed) == ROWS
    fields = np.array([line.split("\t") for line in lines[:2000]])  # [2000, 40]
    assert fields.shape == (2000, 1 + NUM_DENSE + NUM_SLOTS)
    categorical = fields[:, 1 + NUM_DENSE:].ravel()
    present = categorical[categorical != ""]
    assert all(len(v) == 8 and v == v.lower() for v in present)
    int(present[0], 16)
    dense = fields[:, 1:1 + NUM_DENSE]
    values = np.array([int(v) for v in dense.ravel() if v != ""])
    assert values.min() < 0 and values.max() > 1000  # I2 negatives; I5 large counts
    assert all(v == str(int(v)) for v in dense.ravel() if v != "")  # no padding or '+'
    missing_dense = (dense == "").mean(axis=0)
    assert missing_dense[1] == 0.0 and 0.35 < missing_dense[0] < 0.55  # I2, I1 as in Criteo


def test_positive_rate_and_optimum_auc_match_the_true_probabilities(train_file: Path) -> None:
    meta = json.loads(Path(f"{train_file}.json").read_text())
    labels, probs = true_probabilities(ROWS, SEED)
    assert labels.shape == probs.shape == (ROWS,)
    np.testing.assert_array_equal(labels, _parse(train_file).labels)
    assert 0.15 <= meta["positive_rate"] <= 0.35
    assert meta["positive_rate"] == pytest.approx(labels.mean(), abs=1e-12)
    assert meta["optimum_auc"] == pytest.approx(auc(labels, probs), abs=1e-12)
    assert 0.74 < meta["optimum_auc"] < 0.83
    assert meta["rows"] == ROWS and meta["seed"] == SEED and meta["split"] == "train"
    assert meta["vocab_sizes"] == list(VOCAB_SIZES)
    assert meta["sha256"] == hashlib.sha256(train_file.read_bytes()).hexdigest()


def test_vocabulary_sizes_are_respected(train_file: Path) -> None:
    assert len(VOCAB_SIZES) == NUM_SLOTS
    assert min(VOCAB_SIZES) == 10 and max(VOCAB_SIZES) == 10**6
    sparse = _parse(train_file).sparse  # [N, 26]
    for slot, size in enumerate(VOCAB_SIZES):
        keys = np.unique(sparse[:, slot])
        distinct = int((keys != hash_feature(slot, "")).sum())
        assert 1 <= distinct <= size, (slot, distinct, size)
    smallest = VOCAB_SIZES.index(10)
    assert len(np.unique(sparse[:, smallest])) == 10  # Zipf over 10 values: all seen
    largest = VOCAB_SIZES.index(10**6)
    assert len(np.unique(sparse[:, largest])) > ROWS // 10  # a long tail


def test_test_split_shares_the_model_with_other_rows(train_file: Path, tmp_path: Path) -> None:
    test = generate_criteo(ROWS // 2, SEED, tmp_path / "test.tsv", split="test")
    train_lines = set(train_file.read_text().splitlines())
    test_lines = (tmp_path / "test.tsv").read_text().splitlines()
    assert not train_lines.intersection(test_lines)
    assert test.optimum_auc == pytest.approx(auc(*true_probabilities(ROWS // 2, SEED, "test")),
                                             abs=1e-12)
    # Shared hidden model: the frequent values (and their ids) are the same in both.
    train_c9 = {line.split("\t")[1 + NUM_DENSE + 8] for line in train_lines}
    test_c9 = {line.split("\t")[1 + NUM_DENSE + 8] for line in test_lines}
    assert test_c9 == train_c9


def test_bad_arguments_raise(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rows"):
        generate_criteo(0, 1, tmp_path / "x.tsv")
    with pytest.raises(ConfigError, match="split"):
        generate_criteo(10, 1, tmp_path / "x.tsv", split="valid")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DataError, match="file/x.tsv"):
        generate_criteo(10, 1, blocker / "x.tsv")


RunCli = Callable[..., subprocess.CompletedProcess[str]]


def _datagen(run_cli: RunCli, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m psfleet.cli.main datagen criteo *args`` (conftest's run_cli)."""
    return run_cli(["datagen", "criteo", *args], timeout=120)


@pytest.mark.slow
def test_cli_writes_train_and_test_and_prints_the_optimum(run_cli: RunCli, tmp_path: Path) -> None:
    out, test_out = tmp_path / "train.tsv", tmp_path / "test.tsv"
    done = _datagen(run_cli, "--rows", "3000", "--seed", "5", "--out", str(out),
                "--test_rows", "1000", "--test_out", str(test_out))
    assert done.returncode == 0, done.stderr
    meta = json.loads(Path(f"{out}.json").read_text())
    test_meta = json.loads(Path(f"{test_out}.json").read_text())
    assert meta["rows"] == 3000 and test_meta["rows"] == 1000 and test_meta["split"] == "test"
    assert f"optimum auc {meta['optimum_auc']:.6f}" in done.stdout
    assert f"positive rate {meta['positive_rate']:.6f}" in done.stdout
    assert f"optimum auc {test_meta['optimum_auc']:.6f}" in done.stdout
    assert meta["optimum_auc"] == pytest.approx(auc(*true_probabilities(3000, 5)), abs=1e-12)
    api = generate_criteo(3000, 5, tmp_path / "api.tsv")
    assert (tmp_path / "api.tsv").read_bytes() == out.read_bytes()
    assert api.optimum_auc == meta["optimum_auc"]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--rows", "0", "--seed", "1"], "--rows"),
        (["--rows", "10", "--seed", "-1"], "--seed"),
        (["--rows", "10", "--seed", "1", "--test_rows", "5"], "--test_out"),
    ],
)
def test_cli_rejects_bad_numbers(
    run_cli: RunCli, tmp_path: Path, args: list[str], names: str
) -> None:
    done = _datagen(run_cli, *args, "--out", str(tmp_path / "x.tsv"))
    assert done.returncode == 2
    assert names in done.stderr
    assert not (tmp_path / "x.tsv").exists()


def test_cli_rejects_an_unwritable_out_path(run_cli: RunCli, tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    bad = blocker / "x.tsv"
    done = _datagen(run_cli, "--rows", "10", "--seed", "1", "--out", str(bad))
    assert done.returncode == 2
    assert "--out" in done.stderr and str(bad) in done.stderr
