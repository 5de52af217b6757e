"""Tests of psfleet.data.reader on the real Criteo Kaggle sample."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import require_shared_data

from psfleet.data import Batch, CriteoReader, list_data_files, parse_lines
from psfleet.errors import ConfigError, DataError

pytestmark = pytest.mark.unit

DATA_DIR = require_shared_data()  # ../shared/data/criteo_kaggle_sample, or fail
TRAIN, DEV, TEST = (DATA_DIR / f"{name}.csv" for name in ("train", "dev", "test"))


def all_rows(reader: CriteoReader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batches = list(reader)
    labels = torch.cat([b.labels for b in batches]).numpy()
    dense = torch.cat([b.dense for b in batches]).numpy()
    sparse = torch.cat([b.sparse for b in batches]).numpy().view(np.uint64)
    return labels, dense, sparse


def row_set(rows: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[bytes]:
    """Each example (label, dense, keys) as bytes, sorted: the multiset of examples."""
    labels, dense, sparse = rows
    return sorted(
        labels[i].tobytes() + dense[i].tobytes() + sparse[i].tobytes() for i in range(len(labels))
    )


def concat(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    labels, dense, sparse = (np.concatenate([part[i] for part in parts]) for i in range(3))
    return labels, dense, sparse


def test_reads_whole_file_in_order_with_batch_shapes() -> None:
    reader = CriteoReader([TRAIN], batch_size=1000)

    batches = list(reader)

    assert reader.num_examples == 7200 and reader.malformed_lines == 0
    assert len(reader) == 8 and [len(b) for b in batches] == [1000] * 7 + [200]
    first = batches[0]
    assert isinstance(first, Batch)
    assert first.labels.dtype == torch.float32 and first.labels.shape == (1000,)
    assert first.dense.dtype == torch.float32 and first.dense.shape == (1000, 13)
    assert first.sparse.dtype == torch.int64 and first.sparse.shape == (1000, 26)
    labels, dense, sparse = all_rows(reader)
    expected = parse_lines(TRAIN.read_text().split("\n")[:-1], str(TRAIN))
    np.testing.assert_array_equal(labels, expected.labels)
    np.testing.assert_array_equal(dense, expected.dense)
    np.testing.assert_array_equal(sparse, expected.sparse)  # int64 bits give back uint64 keys
    assert int(labels.sum()) == 1549


def test_drop_last_drops_the_short_batch() -> None:
    reader = CriteoReader([TRAIN], batch_size=1000, drop_last=True)

    assert len(reader) == 7 and [len(b) for b in reader] == [1000] * 7


def test_worker_shares_partition_all_files_exactly_once() -> None:
    files = [TRAIN, DEV, TEST]
    whole = all_rows(CriteoReader(files, batch_size=4096))

    shares = [CriteoReader(files, 512, worker_index=k, worker_num=3) for k in range(3)]

    assert [r.num_examples for r in shares] == [2667, 2667, 2666]  # 8,000 lines
    union = row_set(concat([all_rows(r) for r in shares]))
    assert union == row_set(whole)
    assert len(set(union)) == 8000  # the 8,000 rows are distinct: each read exactly once
    # Worker k reads global lines k, k+3, ...: worker 1 starts with line 2 of train.csv.
    np.testing.assert_array_equal(all_rows(shares[1])[2][0], whole[2][1])


def test_line_numbering_continues_across_files() -> None:
    # dev.csv has 409 lines, so test.csv line 1 is global line 409 = 1 (mod 3): worker 1.
    share = CriteoReader([DEV, TEST], 1000, worker_index=1, worker_num=3)
    _, _, sparse = all_rows(share)
    test_lines = TEST.read_text().split("\n")[:-1]
    dev_lines = DEV.read_text().split("\n")[:-1]
    expected_dev = parse_lines(dev_lines[1::3], "dev").sparse
    expected_test = parse_lines(test_lines[0::3], "test").sparse

    np.testing.assert_array_equal(sparse, np.concatenate([expected_dev, expected_test]))


def test_shuffle_is_a_deterministic_permutation_per_epoch() -> None:
    plain = all_rows(CriteoReader([DEV], batch_size=64))
    reader = CriteoReader([DEV], batch_size=64, shuffle_seed=7)

    epoch0 = all_rows(reader)
    epoch0_again = all_rows(reader)
    reader.set_epoch(1)
    epoch1 = all_rows(reader)
    other = CriteoReader([DEV], batch_size=64, shuffle_seed=7)
    other.set_epoch(1)

    np.testing.assert_array_equal(epoch0[2], epoch0_again[2])
    np.testing.assert_array_equal(epoch1[2], all_rows(other)[2])
    assert not np.array_equal(epoch0[2], epoch1[2])
    assert not np.array_equal(epoch0[2], plain[2])
    assert row_set(epoch0) == row_set(epoch1) == row_set(plain)


def test_malformed_lines_are_counted_and_logged_with_file_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = DEV.read_text().split("\n")[:6]
    lines[3] = "1\tnot\tenough"  # line 4, read by worker 1 of 2
    path = tmp_path / "part-0"
    path.write_text("\n".join(lines) + "\n")

    with caplog.at_level(logging.WARNING):
        reader = CriteoReader([path], batch_size=2, worker_index=1, worker_num=2)

    assert reader.malformed_lines == 1 and reader.num_examples == 2
    assert any(f"{path}:4:" in r.getMessage() for r in caplog.records)
    with pytest.raises(DataError, match=r"part-0:4:"):
        CriteoReader([path], batch_size=2, worker_index=1, worker_num=2, strict=True)


def test_missing_directory_and_empty_files_are_data_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")

    with pytest.raises(DataError, match="does not exist"):
        CriteoReader([TRAIN, tmp_path / "nope.csv"], batch_size=8)
    with pytest.raises(DataError, match="is a directory"):
        CriteoReader([tmp_path], batch_size=8)
    with pytest.raises(DataError, match=r"empty\.csv.*empty"):
        CriteoReader([DEV, empty], batch_size=8)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 8, "worker_index": 3, "worker_num": 3}, "worker_index"),
        ({"batch_size": 8, "worker_index": -1, "worker_num": 3}, "worker_index"),
        ({"batch_size": 8, "worker_num": 0}, "worker_num"),
    ],
)
def test_bad_arguments_are_config_errors_naming_the_argument(
    kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{field}:"):
        CriteoReader([DEV], **kwargs)


def test_list_data_files(tmp_path: Path) -> None:
    for name in ("part-1", "part-0", ".hidden"):
        (tmp_path / name).write_text(DEV.read_text())
    (tmp_path / "subdir").mkdir()

    assert list_data_files(tmp_path) == [tmp_path / "part-0", tmp_path / "part-1"]
    assert list_data_files(str(DEV)) == [DEV]
    assert list_data_files(DATA_DIR) == [DEV, TEST, TRAIN]  # README.md is not data
    with pytest.raises(DataError, match="does not exist"):
        list_data_files(tmp_path / "missing")
    with pytest.raises(DataError, match="holds no data files"):
        list_data_files(tmp_path / "subdir")
