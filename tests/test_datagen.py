"""Tests of psfleet.data.synthetic, psfleet.data.synthetic_multihot and ``psfleet datagen``."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from psfleet.data import generate_criteo, true_probabilities
from psfleet.data._multihot_format import format_rows
from psfleet.data.criteo import NUM_DENSE, NUM_SLOTS, ParsedChunk, hash_feature, parse_lines
from psfleet.data.synthetic import VOCAB_SIZES
from psfleet.data.synthetic_multihot import CHUNK_ROWS as CHUNK_ROWS_MH
from psfleet.data.synthetic_multihot import (
    INTERACTIONS,
    MULTIHOT_COLUMNS,
    MultihotModel,
    generate_multihot,
    multihot_probabilities,
    multihot_true_probabilities,
)
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
    out, test_out = tmp_path / "train.tsv", tmp_path / "new" / "folder" / "test.tsv"  # made
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


@pytest.mark.slow  # several seconds: the slow tier
def test_cli_rejects_an_unwritable_out_path(run_cli: RunCli, tmp_path: Path) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    bad = blocker / "x.tsv"
    done = _datagen(run_cli, "--rows", "10", "--seed", "1", "--out", str(bad))
    assert done.returncode == 2
    assert "--out" in done.stderr and str(blocker) in done.stderr

    # a --test_out that cannot be written: refused before --out is written
    out = tmp_path / "train.tsv"
    done = _datagen(run_cli, "--rows", "10", "--seed", "1", "--out", str(out),
                    "--test_rows", "5", "--test_out", str(bad))
    assert done.returncode == 2
    assert "--test_out: cannot create the folder" in done.stderr
    assert not out.exists()


# -- datagen multihot ---------------------------------------------------------------------

MH_ROWS = CHUNK_ROWS_MH + 4_464  # two chunks
MH_SEED = 3


@dataclass(frozen=True)
class MultihotFile:
    """A generate_multihot file as read back by the csv module (independent of numpy)."""

    header: list[str]
    labels: npt.NDArray[np.int8]  # [N]
    numeric: npt.NDArray[np.float64]  # [N, 4]
    single: npt.NDArray[np.int64]  # [N, 6]
    bag_ids: tuple[npt.NDArray[np.int64], ...]  # 3 x [T_m]
    bag_lengths: tuple[npt.NDArray[np.int64], ...]  # 3 x [N]
    cells: list[list[str]]  # the raw cells of every row


def _read_multihot(path: Path) -> MultihotFile:
    with open(path, encoding="ascii", newline="") as handle:
        reader = csv.reader(handle, strict=True)
        header = next(reader)
        cells = list(reader)
    columns = list(zip(*cells, strict=True))
    c = MULTIHOT_COLUMNS
    position = {name: i for i, name in enumerate(header)}
    bag_ids, bag_lengths = [], []
    for name in c.multi:
        bags = [cell.split(c.separator) if cell else [] for cell in columns[position[name]]]
        bag_lengths.append(np.array([len(b) for b in bags], dtype=np.int64))
        bag_ids.append(np.array([int(i) for b in bags for i in b], dtype=np.int64))
    return MultihotFile(
        header=header,
        labels=np.array([int(v) for v in columns[position[c.label]]], dtype=np.int8),
        numeric=np.array([[float(v) for v in columns[position[n]]] for n in c.numeric]).T,
        single=np.array([[int(v) for v in columns[position[n]]] for n in c.single],
                        dtype=np.int64).T,
        bag_ids=tuple(bag_ids), bag_lengths=tuple(bag_lengths), cells=cells)


@pytest.fixture(scope="module")
def multihot_train(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("multihot") / "train.csv"
    generate_multihot(MH_ROWS, MH_SEED, path)
    return path


@pytest.fixture(scope="module")
def multihot_read(multihot_train: Path) -> MultihotFile:
    return _read_multihot(multihot_train)


@pytest.mark.slow  # several seconds: the slow tier
def test_multihot_same_seed_same_bytes_other_streams_differ(
        multihot_train: Path, tmp_path: Path) -> None:
    data = multihot_train.read_bytes()
    again = generate_multihot(MH_ROWS, MH_SEED, tmp_path / "again.csv")
    assert (tmp_path / "again.csv").read_bytes() == data
    assert again.sha256 == hashlib.sha256(data).hexdigest()
    assert not (tmp_path / "again.csv.tmp").exists()
    # Chunks have streams of their own: a file of one whole chunk is a prefix of ours.
    generate_multihot(CHUNK_ROWS_MH, MH_SEED, tmp_path / "short.csv")
    short = (tmp_path / "short.csv").read_bytes()
    assert short.count(b"\n") == CHUNK_ROWS_MH + 1 and data.startswith(short)
    generate_multihot(1000, MH_SEED, tmp_path / "test.csv", split="test")
    generate_multihot(1000, MH_SEED + 1, tmp_path / "other.csv")
    train_lines = set(data.split(b"\n")[1:-1])
    for other in ("test.csv", "other.csv"):
        lines = (tmp_path / other).read_bytes().split(b"\n")
        assert lines[0] == data.split(b"\n")[0]  # the header
        assert not train_lines.intersection(lines[1:-1]), other


def test_multihot_columns_and_bag_lengths(multihot_train: Path,
                                          multihot_read: MultihotFile) -> None:
    c = MULTIHOT_COLUMNS
    got = multihot_read
    data = multihot_train.read_bytes()
    assert data.endswith(b"\n") and b"\r" not in data and b'"' not in data
    assert got.header == list(c.names) == ["label", "n1", "n2", "n3", "n4", "c1", "c2", "c3",
                                           "c4", "c5", "c6", "hist", "tags", "genres"]
    assert len(got.cells) == MH_ROWS and {len(row) for row in got.cells} == {14}
    numeric_cells = [v for row in got.cells[:3000] for v in row[1:5]]
    assert all(re.fullmatch(r"(0|[1-9]\d*)\.\d{4}", v) for v in numeric_cells)
    assert got.numeric.min() >= 0.0 and 8.0 < got.numeric[:, 2].max() < 20.0
    assert got.numeric[:, 3].min() >= 0.0 and got.numeric[:, 3].max() <= 1.0
    assert set(np.unique(got.labels)) == {0, 1}
    for name, ids in zip(c.single + c.multi, [*got.single.T, *got.bag_ids], strict=True):
        assert ids.min() >= 0 and ids.max() < c.vocab_sizes[name], name
    assert len(np.unique(got.single[:, 0])) == 10  # c1: Zipf over 10 values, all seen
    assert len(np.unique(got.bag_ids[0])) > 20_000  # hist: a long tail of 10**5
    hist, tags, genres = got.bag_lengths
    assert hist.mean() == pytest.approx(20.0, abs=0.4) and hist.max() <= 200
    assert 0.03 < (hist == 0).mean() < 0.07  # geometric: P(0) = 1/21
    assert tags.mean() == pytest.approx(4.0, abs=0.1) and 0.01 < (tags == 0).mean() < 0.03
    assert set(np.unique(genres)) == {1, 2, 3}
    genre_cells = [row[13].split("|") for row in got.cells[:3000]]
    assert all(len(set(g)) == len(g) for g in genre_cells)  # distinct genres
    meta = json.loads(Path(f"{multihot_train}.json").read_text())
    assert meta["columns"] == {"label": "label", "numeric": list(c.numeric),
                               "single": list(c.single), "multi": list(c.multi),
                               "separator": "|", "delimiter": ","}
    for name, lengths in zip(c.multi, got.bag_lengths, strict=True):
        assert meta["mean_lengths"][name] == pytest.approx(lengths.mean(), abs=1e-12)
        assert meta["empty_rates"][name] == pytest.approx((lengths == 0).mean(), abs=1e-12)
    assert meta["vocab_sizes"] == [c.vocab_sizes[n] for n in c.single + c.multi]


def test_multihot_format_rows_writes_exact_bytes() -> None:
    data = format_rows(
        labels=np.array([1, 0, 0], dtype=np.int8),
        numeric_ticks=np.array([[0, 7], [123456, 10000], [99999, 5]]),
        single=np.array([[0, 42], [100000, 9], [7, 0]]),
        bag_ids=[np.array([5, 60, 700, 99999]), np.array([1, 2, 3])],
        bag_lengths=[np.array([0, 3, 1]), np.array([2, 0, 1])])
    assert data == (b"1,0.0000,0.0007,0,42,,1|2\n"
                    b"0,12.3456,1.0000,100000,9,5|60|700,\n"
                    b"0,9.9999,0.0005,7,0,99999,3\n")


def _row_logit(model: MultihotModel, got: MultihotFile, row: int) -> float:
    """The docstring's formula for one row, one term at a time (plain Python)."""
    starts = [int(lengths[:row].sum()) for lengths in got.bag_lengths]
    bags = [ids[s:s + int(lengths[row])].tolist()
            for ids, lengths, s in zip(got.bag_ids, got.bag_lengths, starts, strict=True)]
    single = got.single[row].tolist()
    terms = [model.bias]
    terms += [float(w[v]) for w, v in zip(model.single_weights, single, strict=True)]
    terms += [s * sum(float(w[i]) for i in bag) / len(bag) if bag else 0.0
              for w, s, bag in zip(model.bag_weights, model.bag_scales, bags, strict=True)]
    terms += [float(d) * x for d, x in zip(model.dense_weights, got.numeric[row], strict=True)]
    for (bag, field), (u, v) in zip(INTERACTIONS, model.factors, strict=True):
        if bags[bag]:
            pooled = sum(u[i] for i in bags[bag]) / len(bags[bag])
            terms.append(float(pooled @ v[single[field]]))
    return math.fsum(terms)


def test_multihot_optimum_auc_recomputed_from_the_file(multihot_train: Path,
                                                       multihot_read: MultihotFile) -> None:
    meta = json.loads(Path(f"{multihot_train}.json").read_text())
    got = multihot_read
    probs = multihot_probabilities(MH_SEED, got.numeric, got.single, got.bag_ids,
                                   got.bag_lengths)
    assert meta["optimum_auc"] == pytest.approx(auc(got.labels, probs), abs=1e-9)
    assert 0.75 < meta["optimum_auc"] < 0.82
    assert meta["positive_rate"] == pytest.approx(got.labels.mean(), abs=1e-12)
    assert 0.22 < meta["positive_rate"] < 0.28
    labels, drawn = multihot_true_probabilities(MH_ROWS, MH_SEED)
    np.testing.assert_array_equal(labels, got.labels)
    np.testing.assert_allclose(probs, drawn, rtol=0, atol=1e-12)
    model = MultihotModel(MH_SEED)
    rows = [0, 1, 2, *np.flatnonzero(got.bag_lengths[0] == 0)[:3].tolist(), MH_ROWS - 1]
    for row in rows:
        expected = 1.0 / (1.0 + math.exp(-_row_logit(model, got, row)))
        assert probs[row] == pytest.approx(expected, abs=1e-9), row
    assert meta["rows"] == MH_ROWS and meta["seed"] == MH_SEED and meta["split"] == "train"
    assert meta["sha256"] == hashlib.sha256(multihot_train.read_bytes()).hexdigest()
    assert meta["generator"] == "psfleet.data.synthetic_multihot"


def _one_hot_keys(single: npt.NDArray[np.int64], vocab_sizes: list[int]
                 ) -> npt.NDArray[np.int64]:
    """Column j's id v -> key offset_j + v, plus the bias key sum(vocab_sizes). [N, S + 1]"""
    offsets = np.cumsum([0, *vocab_sizes[:-1]])
    return np.concatenate([single + offsets, np.full((len(single), 1), sum(vocab_sizes))],
                          axis=1)


def _fit_logistic_regression(keys: npt.NDArray[np.int64], labels: npt.NDArray[np.int8],
                             l2: float = 1.0, steps: int = 40) -> npt.NDArray[np.float64]:
    """One weight per one-hot key, L2-regularised log loss, damped diagonal Newton steps
    (each key's gradient over its own curvature, vectorised with bincount; the step is
    1 / keys per row, so the simultaneous updates of a row's keys cannot overshoot)."""
    weights = np.zeros(int(keys.max()) + 1)
    flat = keys.ravel()
    for _ in range(steps):
        probs = 1.0 / (1.0 + np.exp(-weights[keys].sum(axis=1)))
        grad = np.bincount(flat, np.repeat(probs - labels, keys.shape[1]), weights.size)
        hess = np.bincount(flat, np.repeat(probs * (1 - probs), keys.shape[1]), weights.size)
        weights -= (grad + l2 * weights) / (hess + l2) / keys.shape[1]
    return weights


@pytest.mark.slow  # several seconds: the slow tier
def test_multihot_linear_model_stays_below_the_optimum(multihot_read: MultihotFile,
                                                       tmp_path: Path) -> None:
    test = generate_multihot(20_000, MH_SEED, tmp_path / "test.csv", split="test")
    got = _read_multihot(tmp_path / "test.csv")
    c = MULTIHOT_COLUMNS
    sizes = [c.vocab_sizes[n] for n in c.single]
    weights = _fit_logistic_regression(_one_hot_keys(multihot_read.single, sizes),
                                       multihot_read.labels)
    lr_auc = auc(got.labels, weights[_one_hot_keys(got.single, sizes)].sum(axis=1))
    print(f"logistic regression on c1..c6: test auc {lr_auc:.4f}, "
          f"optimum {test.optimum_auc:.4f}")
    model = MultihotModel(MH_SEED)
    true_single = auc(got.labels, sum(w[got.single[:, f]]
                                      for f, w in enumerate(model.single_weights)))
    # It learns the single-valued terms (AUC near theirs, about 0.66) and no more.
    assert true_single - 0.04 < lr_auc < test.optimum_auc - 0.08, (lr_auc, true_single)
    # Even the true linear part (every term but the pooled interactions) falls short.
    factors = model.factors
    model.factors = [(np.zeros_like(u), v) for u, v in factors]
    linear = auc(got.labels, model.logits(got.numeric, got.single, got.bag_ids,
                                          got.bag_lengths))
    print(f"true model without the interactions: test auc {linear:.4f}")
    assert linear < test.optimum_auc - 0.02


def test_multihot_bad_arguments_raise(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rows"):
        generate_multihot(0, 1, tmp_path / "x.csv")
    with pytest.raises(ConfigError, match="seed"):
        generate_multihot(10, -1, tmp_path / "x.csv")
    with pytest.raises(ConfigError, match="split"):
        generate_multihot(10, 1, tmp_path / "x.csv", split="valid")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DataError, match="file/x.csv"):
        generate_multihot(10, 1, blocker / "x.csv")
    single = np.zeros((2, 6), dtype=np.int64)
    single[1, 0] = 10  # c1 has 10 values: 0 .. 9
    bags = [np.zeros(2, dtype=np.int64)] * 3
    with pytest.raises(DataError, match="c1"):
        multihot_probabilities(1, np.zeros((2, 4)), single, bags,
                               [np.ones(2, dtype=np.int64)] * 3)
    with pytest.raises(ConfigError, match="lengths"):
        multihot_probabilities(1, np.zeros((2, 4)), single * 0, bags,
                               [np.ones(3, dtype=np.int64)] * 3)


@pytest.mark.slow
def test_cli_multihot_writes_train_and_test_and_prints_the_optimum(
        run_cli: RunCli, tmp_path: Path) -> None:
    out, test_out = tmp_path / "train.csv", tmp_path / "test.csv"
    done = run_cli(["datagen", "multihot", "--rows", "3000", "--seed", "5", "--out", str(out),
                    "--test_rows", "1000", "--test_out", str(test_out)], timeout=120)
    assert done.returncode == 0, done.stderr
    meta = json.loads(Path(f"{out}.json").read_text())
    test_meta = json.loads(Path(f"{test_out}.json").read_text())
    assert meta["rows"] == 3000 and meta["split"] == "train" and meta["seed"] == 5
    assert test_meta["rows"] == 1000 and test_meta["split"] == "test"
    assert meta["generator"] == test_meta["generator"] == "psfleet.data.synthetic_multihot"
    for path, m in ((out, meta), (test_out, test_meta)):
        assert f"optimum auc {m['optimum_auc']:.6f}, positive rate {m['positive_rate']:.6f}" \
            in done.stdout
        assert m["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert path.read_bytes().count(b"\n") == m["rows"] + 1
    labels, probs = multihot_true_probabilities(1000, 5, "test")
    assert test_meta["optimum_auc"] == pytest.approx(auc(labels, probs), abs=1e-12)
    api = generate_multihot(3000, 5, tmp_path / "api.csv")
    assert (tmp_path / "api.csv").read_bytes() == out.read_bytes()
    assert api.optimum_auc == meta["optimum_auc"]
    done = run_cli(["datagen", "multihot", "--rows", "0", "--seed", "5", "--out",
                    str(tmp_path / "x.csv")])
    assert done.returncode == 2 and "--rows" in done.stderr
