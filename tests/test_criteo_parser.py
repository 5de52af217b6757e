"""Tests of psfleet.data.criteo on the real Criteo Kaggle sample."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import require_shared_data

from psfleet.data import criteo
from psfleet.data.criteo import NUM_DENSE, NUM_SLOTS, hash_feature, hash_features, parse_lines
from psfleet.errors import DataError

pytestmark = pytest.mark.unit

DATA_DIR = require_shared_data()  # ../shared/data/criteo_kaggle_sample, or fail
TRAIN = DATA_DIR / "train.csv"

# Line 1 of train.csv (README.md of the sample).
FIRST_DENSE_RAW = [1, 1, 5, 0, 1382, 4, 15, 2, 181, 1, 2, None, 2]
FIRST_CATEGORICAL = [
    "68fd1e64",
    "80e26c9b",
    "fb936136",
    "7b4723c4",
    "25c83c98",
    "7e0ccccf",
    "de7995b8",
    "1f89b562",
    "a73ee510",
    "a8cd5504",
    "b2cb9c98",
    "37c9c164",
    "2824a5f6",
    "1adce6ef",
    "8ba8b39a",
    "891b62e7",
    "e5ba7672",
    "f54016b9",
    "21ddcdc9",
    "b1252a9d",
    "07b5194c",
    "_",
    "3a171ecb",
    "c5c50484",
    "e8b83407",
    "9727dd16",
]


def read_lines(path: Path, count: int | None = None) -> list[str]:
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    return lines if count is None else lines[:count]


def test_first_line_of_train_parses_to_exact_values() -> None:
    chunk = parse_lines(read_lines(TRAIN, 1), str(TRAIN))

    assert chunk.malformed == 0
    assert chunk.labels.dtype == np.float32 and chunk.labels.tolist() == [0.0]
    expected_dense = np.log1p([0 if x is None else x for x in FIRST_DENSE_RAW]).astype(np.float32)
    assert chunk.dense.dtype == np.float32 and chunk.dense.shape == (1, NUM_DENSE)
    np.testing.assert_array_equal(chunk.dense[0], expected_dense)
    assert chunk.dense[0, 4] == np.float32(np.log(1383.0))  # I5 = 1382
    assert chunk.dense[0, 11] == 0.0  # I12 missing

    expected_keys = [
        ((slot + 1) << 33) | (1 << 32 if value == "_" else int(value, 16))
        for slot, value in enumerate(FIRST_CATEGORICAL)
    ]
    assert chunk.sparse.dtype == np.uint64 and chunk.sparse.shape == (1, NUM_SLOTS)
    assert chunk.sparse[0].tolist() == expected_keys
    assert chunk.sparse[0, 0] == (1 << 33) | 0x68FD1E64
    assert chunk.sparse[0, 21] == (22 << 33) | (1 << 32)  # C22 missing


def test_negative_and_missing_dense_values_map_to_zero() -> None:
    # train.csv line 5: I1 missing, I2 = -1, I4 missing, I5 = 12824, I8 = 0.
    chunk = parse_lines(read_lines(TRAIN, 5)[4:], str(TRAIN), first_line_no=5)

    assert chunk.labels.tolist() == [0.0]
    row = chunk.dense[0]
    assert row[0] == 0.0 and row[1] == 0.0 and row[3] == 0.0 and row[7] == 0.0
    assert row[4] == np.float32(np.log1p(12824.0))
    assert row[8] == np.float32(np.log1p(6.0))


def test_whole_train_file_parses_with_known_label_counts() -> None:
    chunk = parse_lines(read_lines(TRAIN), str(TRAIN))

    assert len(chunk) == 7200 and chunk.malformed == 0
    assert int(chunk.labels.sum()) == 1549  # positives, README.md
    assert chunk.dense.min() >= 0.0
    # Missing-rate of C22 over train.csv is about .817 (README.md, all 8,000 rows).
    missing_c22 = np.mean(chunk.sparse[:, 21] == ((22 << 33) | (1 << 32)))
    assert 0.78 < missing_c22 < 0.85


def test_batched_keys_equal_scalar_keys_and_are_collision_free() -> None:
    rows = [line.split("\t")[14:] for line in read_lines(TRAIN)]
    flat = [value for row in rows for value in row]

    keys = hash_features(flat, NUM_SLOTS)

    scalar = [hash_feature(index % NUM_SLOTS, value) for index, value in enumerate(flat)]
    assert keys.ravel().tolist() == scalar
    distinct_pairs = {(index % NUM_SLOTS, value) for index, value in enumerate(flat)}
    assert len(np.unique(keys)) == len(distinct_pairs)


def test_generic_strings_use_a_stable_31_bit_hash() -> None:
    crc = zlib.crc32(b"not-hex") & 0x7FFFFFFF
    expected = (4 << 33) | (1 << 32) | (1 + crc)

    assert hash_feature(3, "not-hex") == expected
    assert hash_feature(3, "123456789") != hash_feature(3, "12345678")  # 9 chars: generic
    assert hash_feature(3, "ABCDEF12") == hash_feature(3, "abcdef12")  # read as a number
    values = ["not-hex", "", "0", "ffffffff", "x" * 50, "é", "-1"]
    assert hash_features(values, 1).ravel().tolist() == [hash_feature(0, v) for v in values]


@pytest.mark.slow
def test_keys_do_not_depend_on_python_hash_seed() -> None:
    code = (
        "from psfleet.data.criteo import hash_feature, hash_features;"
        "print(hash_feature(5, 'generic'), hash_features(['generic', 'abc'], 2).tolist())"
    )
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        env["PYTHONPATH"] = os.pathsep.join([str(Path(criteo.__file__).parents[2]), *sys.path])
        result = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(result.stdout)
    assert len(outputs) == 1


def _malformed_file(tmp_path: Path) -> tuple[Path, list[str]]:
    good = read_lines(TRAIN, 2)
    fields = good[0].split("\t")
    lines = [
        good[0],
        "0\t1\t2",  # line 2: 3 fields
        "\t".join(["2", *fields[1:]]),  # line 3: label 2
        "\t".join([fields[0], "1.5", *fields[2:]]),  # line 4: I1 not an integer
        good[1],
    ]
    path = tmp_path / "bad.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, lines


def test_malformed_lines_are_counted_skipped_and_logged_with_file_and_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, lines = _malformed_file(tmp_path)

    with caplog.at_level(logging.WARNING, logger="psfleet.data.criteo"):
        chunk = parse_lines(lines, str(path))

    assert chunk.malformed == 3 and len(chunk) == 2
    good = parse_lines([lines[0], lines[4]], "good")
    np.testing.assert_array_equal(chunk.sparse, good.sparse)
    np.testing.assert_array_equal(chunk.dense, good.dense)
    # Rate limited: one warning for this file within 5 s, naming the first bad line.
    messages = [r.getMessage() for r in caplog.records if r.name == "psfleet.data.criteo"]
    assert len(messages) == 1
    assert f"{path}:2:" in messages[0] and "3 tab-separated fields" in messages[0]


def test_rate_limited_warning_reports_suppressed_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(criteo, "_warner", criteo._RateLimitedWarner(5.0, lambda: now[0]))
    path, lines = _malformed_file(tmp_path)

    with caplog.at_level(logging.WARNING, logger="psfleet.data.criteo"):
        parse_lines(lines, str(path))  # warns line 2, suppresses 3 and 4
        now[0] += 6.0
        parse_lines(lines, str(path))  # warns line 2 again, with 2 suppressed

    messages = [r.getMessage() for r in caplog.records if r.name == "psfleet.data.criteo"]
    assert len(messages) == 2
    assert "2 more malformed lines" in messages[1] and f"{path}:2:" in messages[1]


@pytest.mark.parametrize(
    ("line_index", "reason"),
    [(1, "3 tab-separated fields"), (2, "label is '2'"), (3, "I1 is '1.5'")],
)
def test_strict_raises_data_error_naming_file_line_and_reason(
    tmp_path: Path, line_index: int, reason: str
) -> None:
    path, lines = _malformed_file(tmp_path)

    with pytest.raises(DataError) as info:
        parse_lines([lines[0], lines[line_index]], str(path), first_line_no=10, strict=True)

    assert f"{path}:11:" in str(info.value) and reason in str(info.value)


def test_line_step_numbers_lines_of_a_strided_share(tmp_path: Path) -> None:
    path, lines = _malformed_file(tmp_path)

    with pytest.raises(DataError, match=r"bad\.tsv:7:"):
        parse_lines([lines[0], lines[1]], str(path), first_line_no=3, line_step=4, strict=True)


def test_crlf_line_endings_parse_like_lf() -> None:
    lines = read_lines(TRAIN, 20)

    lf = parse_lines(lines, "lf")
    crlf = parse_lines([line + "\r\n" for line in lines], "crlf")

    assert crlf.malformed == 0
    np.testing.assert_array_equal(lf.sparse, crlf.sparse)
    np.testing.assert_array_equal(lf.dense, crlf.dense)
