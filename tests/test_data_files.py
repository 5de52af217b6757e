"""Which files of a data folder are read (psfleet.data.files): datagen's ``.json``,
READMEs, configs and Hadoop markers are not data; a file named directly always is."""

from __future__ import annotations

import gzip
import logging
import shutil
from pathlib import Path

import pytest
from conftest import require_shared_data

from psfleet.data import generate_criteo, list_data_files
from psfleet.data.files import is_data_file
from psfleet.errors import DataError

pytestmark = pytest.mark.unit

SAMPLE = require_shared_data()  # ../shared/data/criteo_kaggle_sample


def test_a_datagen_folder_reads_the_tsv_files_not_their_json(tmp_path: Path) -> None:
    generate_criteo(50, 1, tmp_path / "train.tsv")
    generate_criteo(20, 1, tmp_path / "part-00001", split="test")
    (tmp_path / "_SUCCESS").write_bytes(b"")
    shutil.copy(SAMPLE / "README.md", tmp_path / "README.md")

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md", "_SUCCESS", "part-00001", "part-00001.json", "train.tsv",
        "train.tsv.json"]
    assert list_data_files(tmp_path) == [tmp_path / "part-00001", tmp_path / "train.tsv"]


def test_compressed_and_unsuffixed_files_are_data_by_their_inner_suffix() -> None:
    for name in ("day_0", "part-00000", "train.csv", "train.csv.gz", "a.txt.zst",
                 "b.tsv.bz2", "c.data", "d.libsvm", "archive.zip"):
        assert is_data_file(name), name
    for name in ("meta.json", "meta.json.gz", "config.yaml", "README.md", "curves.png",
                 "x.parquet", "_SUCCESS", "_metadata", ".part-0.crc", "train.csv.tmp"):
        assert not is_data_file(name), name
    assert is_data_file("part-0.snappy.parquet", "parquet")
    assert not is_data_file("train.csv", "parquet")
    assert not is_data_file("_common_metadata", "parquet")


def test_a_file_named_directly_is_read_whatever_its_name(tmp_path: Path) -> None:
    named = tmp_path / "notes.md"
    shutil.copy(SAMPLE / "dev.csv", named)
    assert list_data_files(named) == [named]


def test_a_folder_of_only_non_data_names_what_it_skipped(tmp_path: Path) -> None:
    shutil.copy(SAMPLE / "README.md", tmp_path / "README.md")
    (tmp_path / "config.yaml").write_text("runner: {}\n")
    with pytest.raises(DataError, match=r"holds no data files; it holds only README\.md, "
                                        r"config\.yaml, which are not read") as info:
        list_data_files(tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(DataError, match=r"holds no Parquet files \(\.parq, \.parquet, \.pq\)"):
        list_data_files(tmp_path, "parquet")


def test_skipped_files_are_logged_with_their_names(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with gzip.open(tmp_path / "dev.csv.gz", "wb") as f:
        f.write((SAMPLE / "dev.csv").read_bytes())
    shutil.copy(SAMPLE / "README.md", tmp_path / "README.md")
    with caplog.at_level(logging.INFO, logger="psfleet.data.files"):
        assert list_data_files(tmp_path) == [tmp_path / "dev.csv.gz"]
    assert "read 1 file(s); skipped README.md (not data files" in caplog.text
