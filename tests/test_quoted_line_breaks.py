"""CSV records whose quoted free text holds line breaks (issue 45, item 6).

The file is what Python's :mod:`csv` writer (as pandas' ``to_csv``) makes of reviews
whose text holds ``\\n``, ``\\r\\n``, blank lines, doubled quotes and the delimiter.
Every record is read once, by exactly one worker, with every reader and worker count,
also when the blocks a file is read in are smaller than a record; sync mode's record
counts are right; a bad record is named by the file line it starts on (as the
:mod:`csv` module counts lines); a quote never closed makes one malformed record at
the end of the file.
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest

from psfleet.data import ColumnsConfig, InMemoryDataset, QueueDataset
from psfleet.data.parsers import make_parser
from psfleet.data.pipeline import parse_share
from psfleet.data.records import count_records
from psfleet.data.split import plan_share
from psfleet.errors import DataError

pytestmark = pytest.mark.unit

ROWS = 600
COLUMNS = ColumnsConfig(label="label", dense=["price"], sparse=["product", "stars"])
TEXTS = ["fine", 'line one\nline two, "quoted"\n\nend', "crlf\r\ninside", "",
         'only ""quotes"", and, commas', "trailing break\n"]


def _write_reviews(path: Path, rows: int = ROWS) -> Path:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["label", "price", "review", "product", "stars"])
        for i in range(rows):
            out.writerow([i % 2, i, TEXTS[i % len(TEXTS)], f"p{i % 7}", i % 5])
    return path


def _prices(chunks: list[np.ndarray]) -> list[int]:
    return sorted(int(v) for c in chunks for v in c)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_record_is_read_once_by_one_worker(tmp_path: Path, workers: int) -> None:
    path = _write_reviews(tmp_path / "reviews.csv")
    assert path.read_bytes().count(b"\n") > ROWS + 300  # records do span lines
    memory, stream = [], []
    for k in range(workers):
        loaded = InMemoryDataset(64, "csv", COLUMNS, worker_index=k, worker_num=workers,
                                 max_malformed_fraction=0.0, strict=True)
        loaded.set_filelist([path])
        loaded.load_into_memory()
        memory.append(np.concatenate([b.dense[:, 0].numpy() for b in loaded]))
        queue = QueueDataset(64, "csv", COLUMNS, worker_index=k, worker_num=workers,
                             strict=True)
        queue.set_filelist([path])
        stream.append(np.concatenate([b.dense[:, 0].numpy() for b in queue]))
        assert sum(queue.worker_lines()) == ROWS  # sync mode's shares count records
        assert queue.worker_lines()[k] == len(stream[-1])
    assert _prices(memory) == _prices(stream) == list(range(ROWS))  # disjoint, complete
    assert [len(m) for m in memory] == [len(range(k, ROWS, workers)) for k in range(workers)]


def test_records_longer_than_a_block(tmp_path: Path) -> None:
    path = _write_reviews(tmp_path / "reviews.csv")
    parser = make_parser("csv", COLUMNS)
    for workers in (1, 2):
        chunks = []
        for k in range(workers):
            share = plan_share([path], k, workers, True)
            parsed = list(parse_share(share, parser, strict=True, chunk_bytes=16))
            chunks.append(np.concatenate([c.dense[:, 0] for c in parsed]))
            labels = np.concatenate([c.labels for c in parsed])
            np.testing.assert_array_equal(labels, chunks[-1] % 2)
        assert _prices(chunks) == list(range(ROWS))


def _line_of(path: Path, price: int) -> int:
    """The file line (1-based) the record with ``price`` starts on, by the csv module."""
    with path.open(newline="") as f:
        reader = csv.reader(f)
        start = 1
        for row in reader:
            if row[1] == str(price):
                return start
            start = reader.line_num + 1
    raise AssertionError(price)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_record_is_named_by_its_first_line(tmp_path: Path, workers: int) -> None:
    path = _write_reviews(tmp_path / "reviews.csv")
    bad_price = 457  # after multi-line records
    line = _line_of(path, bad_price)
    assert line > bad_price + 2
    text = path.read_text()
    assert text.count(f"\n1,{bad_price},") == 1
    path.write_text(text.replace(f"\n1,{bad_price},", "\n1,not-a-price,"))
    messages = []
    for k in range(workers):
        loaded = InMemoryDataset(64, "csv", COLUMNS, worker_index=k, worker_num=workers,
                                 strict=True)
        loaded.set_filelist([path])
        try:
            loaded.load_into_memory()
        except DataError as exc:
            messages.append(str(exc))
    assert len(messages) == 1, messages  # only the worker holding that record
    assert f"reviews.csv:{line}:" in messages[0] and "not a number" in messages[0], messages


def test_an_unclosed_quote_is_one_malformed_record_at_the_end(tmp_path: Path) -> None:
    path = _write_reviews(tmp_path / "reviews.csv", 40)
    start = path.read_text().count("\n") + 1
    with path.open("a", newline="") as f:
        f.write('1,999,"never closed\nmore text\n')
    assert count_records(path, True) == 41 + 1  # header, 40 records, the unclosed one
    loaded = InMemoryDataset(8, "csv", COLUMNS, max_malformed_fraction=0.1)
    loaded.set_filelist([path])
    loaded.load_into_memory()
    assert loaded.num_examples == 40
    strict = InMemoryDataset(8, "csv", COLUMNS, strict=True)
    strict.set_filelist([path])
    with pytest.raises(DataError, match=rf"reviews.csv:{start}: .*quoted field is not closed"):
        strict.load_into_memory()


def test_count_records_of_plain_and_compressed_files(tmp_path: Path) -> None:
    path = _write_reviews(tmp_path / "reviews.csv")
    packed = tmp_path / "reviews.csv.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert count_records(path, True) == count_records(packed, True) == ROWS + 1
    assert count_records(path, False) == path.read_bytes().count(b"\n")
    loaded = InMemoryDataset(64, "csv", COLUMNS, worker_index=1, worker_num=2, strict=True)
    loaded.set_filelist([packed])
    loaded.load_into_memory()
    assert loaded.num_examples == ROWS // 2


def test_a_quote_inside_an_unquoted_field_is_one_named_malformed_record(
        tmp_path: Path) -> None:
    lines = ["label,price,review,product,stars",
             *(f"{i % 2},{i},ok,p{i},1" for i in range(20))]
    lines[4], lines[8] = '1,3,5" screen,p3,1', '1,7,7" screen,p7,1'  # not RFC 4180
    path = tmp_path / "stray.csv"
    path.write_text("\n".join(lines) + "\n")
    loaded = InMemoryDataset(8, "csv", COLUMNS, max_malformed_fraction=1.0)
    loaded.set_filelist([path])
    loaded.load_into_memory()
    stats = loaded.last_pass
    assert stats is not None
    # lines 5..9 are read as one record (the quotes' parity), which is malformed
    assert (loaded.num_examples, stats.malformed, stats.lines) == (15, 1, 16)
    assert stats.first_malformed is not None
    assert stats.first_malformed.startswith(f"{path}:5 ")
    assert "inside an unquoted field" in stats.first_malformed
