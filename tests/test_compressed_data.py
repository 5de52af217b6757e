"""Compressed data files (psfleet.data.compression): each codec gives exactly the
examples of the plain file with every parser, a 2-worker split of one compressed file
covers every line once, a pipe_command reads the decompressed text, and a .zip, an
unsuffixed compressed file or corrupt data is a DataError naming the file. Real data
from ../shared/data, compressed in tmp_path. The CLI runs are in
test_compressed_data_e2e.py."""

from __future__ import annotations

import bz2
import gzip
import lzma
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import CRITEO_DIR, require_shared_data

from psfleet.data import (
    ColumnsConfig,
    CriteoReader,
    InMemoryDataset,
    ParsedChunk,
    QueueDataset,
    make_parser,
)
from psfleet.data.compression import check_pipe_input, open_data_file
from psfleet.data.pipeline import parse_share
from psfleet.data.sources import iter_text_chunks
from psfleet.data.split import count_lines, plan_share
from psfleet.errors import ConfigError, DataError
from psfleet.rec.preflight import _check_first_lines, check_data_files

pytestmark = pytest.mark.unit

PADDLEREC = require_shared_data(require_shared_data().parent / "criteo_paddlerec",
                                ("slot_format/sample_train.txt",
                                 "autoint_format/sample_train.txt"))


def _two_zstd_frames(data: bytes) -> bytes:
    cut = data.index(b"\n", len(data) // 2) + 1  # two frames, as pzstd writes
    return (zstandard.ZstdCompressor().compress(data[:cut])
            + zstandard.ZstdCompressor().compress(data[cut:]))


def _two_gzip_members(data: bytes) -> bytes:
    cut = len(data) // 3  # mid-line: members are byte streams, not line groups
    return gzip.compress(data[:cut]) + gzip.compress(data[cut:])


CODECS: dict[str, Callable[[bytes], bytes]] = {
    ".gz": _two_gzip_members,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
    ".lzma": lambda data: lzma.compress(data, format=lzma.FORMAT_ALONE),
    ".zst": _two_zstd_frames,
}


def compressed(plain: Path, folder: Path, suffix: str) -> Path:
    """``plain`` compressed with the codec of ``suffix`` into ``folder``."""
    path = folder / (plain.name + suffix)
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(CODECS[suffix](plain.read_bytes()))
    return path


def head(source: Path, lines: int, dest: Path, header: bytes = b"") -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(header + b"".join(source.read_bytes().splitlines(keepends=True)[:lines]))
    return dest


Arrays = tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.uint64]]


def streamed(path: Path, parser: str, options: object = None) -> Arrays:
    """Labels, dense, sparse of every example of ``path`` through QueueDataset."""
    stream = QueueDataset(500, parser, options, thread_num=2, max_malformed_fraction=0.0)
    stream.set_filelist([path])
    batches = list(stream)
    assert stream.last_pass is not None and stream.last_pass.malformed == 0
    return (np.concatenate([b.labels.numpy() for b in batches]),
            np.concatenate([b.dense.numpy() for b in batches]),
            np.concatenate([b.sparse.numpy() for b in batches]).view(np.uint64))


def _csv_with_header(tmp: Path) -> tuple[Path, ColumnsConfig]:
    names = ["click", *[f"i{k}" for k in range(1, 14)], *[f"c{k}" for k in range(1, 27)]]
    path = head(CRITEO_DIR / "dev.csv", 409, tmp / "dev_header.tsv",
                ("\t".join(names) + "\n").encode())
    return path, ColumnsConfig(delimiter="\t", label="click", dense=names[1:14],
                               sparse=names[14:], dense_transform="log1p")


PARSER_CASES = ["criteo", "slot", "csv_autoint", "csv_header"]


def _case(name: str, tmp: Path) -> tuple[Path, str, object, int]:
    """(plain file, parser, options, examples) of a parser case on real data."""
    if name == "criteo":
        return head(CRITEO_DIR / "train.csv", 2000, tmp / "train_2000.csv"), "criteo", None, 2000
    if name == "slot":
        return PADDLEREC / "slot_format" / "sample_train.txt", "slot", None, 80
    if name == "csv_autoint":
        config = ColumnsConfig(delimiter=" ", header=False, label=0,
                               sparse=list(range(1, 40)), dense=list(range(40, 79)))
        return PADDLEREC / "autoint_format" / "sample_train.txt", "csv", config, 100
    path, config = _csv_with_header(tmp)
    return path, "csv", config, 409


@pytest.mark.parametrize("suffix", list(CODECS))
@pytest.mark.parametrize("case", PARSER_CASES)
def test_each_codec_gives_the_examples_of_the_plain_file(tmp_path: Path, case: str,
                                                         suffix: str) -> None:
    plain, parser, options, examples = _case(case, tmp_path)
    packed = compressed(plain, tmp_path / "packed", suffix)
    assert packed.stat().st_size < plain.stat().st_size  # really compressed

    want = streamed(plain, parser, options)
    got = streamed(packed, parser, options)

    assert len(want[0]) == examples
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_in_memory_readers_and_line_counts_decompress(tmp_path: Path, suffix: str) -> None:
    plain = CRITEO_DIR / "train.csv"
    packed = compressed(plain, tmp_path, suffix)
    upper = packed.rename(packed.with_suffix(suffix.upper()))  # suffixes are case-blind

    want = CriteoReader([plain], 7200)
    got = CriteoReader([upper], 7200)
    memory = InMemoryDataset(7200, "criteo")
    memory.set_filelist([upper])
    memory.load_into_memory()

    assert got.num_examples == want.num_examples == memory.num_examples == 7200
    assert got.malformed_lines == 0
    first_want, first_got, first_memory = next(iter(want)), next(iter(got)), next(iter(memory))
    for a, b in ((first_got, first_want), (first_memory, first_want)):
        np.testing.assert_array_equal(a.labels.numpy(), b.labels.numpy())
        np.testing.assert_array_equal(a.dense.numpy(), b.dense.numpy())
        np.testing.assert_array_equal(a.sparse.numpy(), b.sparse.numpy())
    assert count_lines(upper) == count_lines(plain) == 7200


def test_total_lines_of_compressed_files_come_from_the_pass_not_a_recount(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = head(CRITEO_DIR / "dev.csv", 409, tmp_path / "dev.csv")
    packed = compressed(plain, tmp_path / "packed", ".zst")
    counted = InMemoryDataset(100, "criteo", worker_index=1, worker_num=2)
    counted.set_filelist([plain])
    counted.load_into_memory()
    assert counted.total_lines == 409  # counted (plain files are read again)
    memory = InMemoryDataset(100, "criteo", worker_index=1, worker_num=2)
    memory.set_filelist([packed])

    def no_recount(path: Path) -> int:
        raise AssertionError(f"{path} decompressed again to count its lines")

    monkeypatch.setattr("psfleet.data.dataset_base.count_lines", no_recount)
    memory.load_into_memory()

    assert memory.num_examples == counted.num_examples == 204  # lines 1, 3, ... of 409
    assert memory.total_lines == 409


def _share_examples(files: list[Path], worker: int, workers: int) -> ParsedChunk:
    share = plan_share(files, worker, workers, split_file_list=True)
    chunks = list(parse_share(share, make_parser("criteo"), chunk_bytes=1 << 16,
                              thread_num=2))
    return ParsedChunk.concat(chunks)


@pytest.mark.parametrize("suffix", [".gz", ".zst", ".bz2"])
def test_two_workers_split_compressed_files_and_cover_every_line_once(
        tmp_path: Path, suffix: str) -> None:
    # Two files (positions 0 and 1: the split rule shifts by the position) of odd
    # line counts, read in 64 KiB chunks (many chunks per file).
    plain = [head(CRITEO_DIR / "train.csv", 7200, tmp_path / "a.csv"),
             head(CRITEO_DIR / "dev.csv", 409, tmp_path / "b.csv")]
    packed = [compressed(p, tmp_path / "packed", suffix) for p in plain]
    whole = ParsedChunk.concat([_share_examples([p], 0, 1) for p in plain])
    rows_a = np.arange(7200)
    rows_b = 7200 + np.arange(409)

    shares = [_share_examples(packed, k, 2) for k in range(2)]

    # worker k keeps line i of file f when (i + f) % 2 == k
    expected = [np.concatenate([rows_a[k::2], rows_b[(k + 1) % 2::2]]) for k in range(2)]
    for share, rows in zip(shares, expected, strict=True):
        np.testing.assert_array_equal(share.labels, whole.labels[rows])
        np.testing.assert_array_equal(share.dense, whole.dense[rows])
        np.testing.assert_array_equal(share.sparse, whole.sparse[rows])
    covered = np.sort(np.concatenate(expected))
    np.testing.assert_array_equal(covered, np.arange(7200 + 409))  # each line once
    assert sum(len(s) for s in shares) == len(whole) == 7609


def test_pipe_command_reads_the_decompressed_text(tmp_path: Path) -> None:
    plain = head(CRITEO_DIR / "dev.csv", 300, tmp_path / "dev.csv")
    packed = compressed(plain, tmp_path / "packed", ".gz")
    raw_gzip = tmp_path / "packed" / "dev_gzip_without_suffix"
    raw_gzip.write_bytes(gzip.compress(plain.read_bytes()))
    want = streamed(plain, "criteo")

    def piped(path: Path, command: str) -> Arrays:
        stream = QueueDataset(500, "criteo", pipe_command=command,
                              max_malformed_fraction=0.0)
        stream.set_filelist([path])
        batches = list(stream)
        return (np.concatenate([b.labels.numpy() for b in batches]),
                np.concatenate([b.dense.numpy() for b in batches]),
                np.concatenate([b.sparse.numpy() for b in batches]).view(np.uint64))

    # A suffixed file reaches the command as text (as PaddlePaddle's zcat-then-converter);
    # a file without a codec suffix reaches it as it is, so 'zcat' still decompresses it.
    for got in (piped(packed, "cat"), piped(packed, "head -n 1000"),
                piped(raw_gzip, "zcat")):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    # A command that stops reading early (head) ends the feed without an error.
    first = piped(packed, "head -n 7")
    np.testing.assert_array_equal(first[2], want[2][:7])
    # Decompressing a suffixed file twice is caught before the command runs.
    for command in ("zcat", "gzip -dc", "/usr/bin/zstd -d -c", "xz --decompress"):
        with pytest.raises(ConfigError, match=f"{packed.name}.*remove the decompression"):
            check_pipe_input(packed.with_suffix(".gz"), command)
    with pytest.raises(ConfigError, match=str(packed)):
        piped(packed, "zcat")
    check_pipe_input(raw_gzip, "zcat")  # unsuffixed: the command decompresses it
    check_pipe_input(packed, "python3 reader.py")


def test_closing_a_piped_compressed_read_early_stops_the_command_and_the_feed(
        tmp_path: Path) -> None:
    packed = tmp_path / "big.csv.gz"  # 35 MB of text: the feed is still writing
    packed.write_bytes(gzip.compress((CRITEO_DIR / "train.csv").read_bytes() * 20, 1))
    share = plan_share([packed], 0, 1, split_file_list=True)
    chunks = iter_text_chunks(packed, 0, share, "cat", chunk_bytes=1 << 16)

    first = next(chunks)
    chunks.close()  # kills 'cat'; the feeder thread ends on the broken pipe

    assert first.lines > 200 and first.first_line_no == 1
    assert not [t for t in threading.enumerate() if t.name == "psfleet-pipe-feed"]
    # (the autouse leak check fails the test if 'cat' is still running)


def test_zip_unsuffixed_and_corrupt_files_are_data_errors_naming_the_file(
        tmp_path: Path) -> None:
    import zipfile

    plain = head(CRITEO_DIR / "dev.csv", 200, tmp_path / "dev.csv")
    data = plain.read_bytes()
    archive = tmp_path / "dev.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(plain, "dev.csv")
    zip_named_csv = tmp_path / "dev_zip.csv"
    zip_named_csv.write_bytes(archive.read_bytes())
    unsuffixed = tmp_path / "dev_gz.csv"
    unsuffixed.write_bytes(gzip.compress(data))
    truncated_gz = tmp_path / "cut.csv.gz"
    truncated_gz.write_bytes(gzip.compress(data)[:-40])
    truncated_zst = tmp_path / "cut.csv.zst"
    truncated_zst.write_bytes(zstandard.ZstdCompressor().compress(data)[:-40])
    not_gzip = tmp_path / "plain.csv.gz"
    not_gzip.write_bytes(data)
    cases = {archive: "zip archive, not a stream of lines; unzip it",
             zip_named_csv: "zip archive, not a stream of lines; unzip it",
             unsuffixed: "gzip-compressed but its name does not end with .gz; rename it "
                         "to dev_gz.csv.gz",
             truncated_gz: "not valid gzip data",
             truncated_zst: "ends inside a zstd frame \\(truncated\\); copy or",
             not_gzip: "not valid gzip data .*remove its .gz suffix"}
    for path, message in cases.items():
        for read in (streamed, lambda p, parser: CriteoReader([p], 10)):
            with pytest.raises(DataError, match=f"'{path}'.*{message}"):
                read(path, "criteo")

    piped = QueueDataset(10, "criteo", pipe_command="cat")  # the feed fails, not 'cat'
    piped.set_filelist([truncated_gz])
    with pytest.raises(DataError, match=f"'{truncated_gz}'.*not valid gzip data"):
        list(piped)

    packed_parquet = tmp_path / "dev.parquet.gz"
    pq.write_table(pa.table({"click": [1, 0], "c1": ["a", "b"]}), tmp_path / "dev.parquet")
    packed_parquet.write_bytes(gzip.compress((tmp_path / "dev.parquet").read_bytes()))
    stream = QueueDataset(10, "parquet", ColumnsConfig(label="click", sparse=["c1"]))
    stream.set_filelist([packed_parquet])
    with pytest.raises(DataError, match=f"'{packed_parquet}'.*compress their own columns"):
        list(stream)


def test_preflight_reads_compressed_files_and_decompresses_only_their_start(
        tmp_path: Path) -> None:
    plain = CRITEO_DIR / "train.csv"
    data = plain.read_bytes()
    # Cut before the end: only a reader that goes that far can notice.
    cut = tmp_path / "train.csv.gz"
    cut.write_bytes(gzip.compress(data)[:-1000])
    blank = tmp_path / "blank.csv.zst"
    blank.write_bytes(zstandard.ZstdCompressor().compress(b"\n \n\n"))
    archive = tmp_path / "folder" / "part-0.zip"
    archive.parent.mkdir()
    archive.write_bytes(b"PK\x03\x04" + data[:100])
    csv, config = _csv_with_header(tmp_path)
    packed_csv = compressed(csv, tmp_path / "packed", ".xz")

    assert check_data_files("runner.train_data_dir", cut) == [cut]
    _check_first_lines(make_parser("criteo"), "runner.train_data_dir", cut)
    _check_first_lines(make_parser("csv", config), "runner.test_data_dir", packed_csv)
    with pytest.raises(DataError, match="not valid gzip data"):
        CriteoReader([cut], 100)  # the whole file is corrupt at its end
    with pytest.raises(DataError, match=f"runner.train_data_dir: .*'{blank}' is empty "
                                        r"\(only blank lines\)"):
        check_data_files("runner.train_data_dir", blank)
    with pytest.raises(DataError, match=f"runner.valid_data_dir: .*'{archive}' is a zip"):
        check_data_files("runner.valid_data_dir", archive.parent)
    assert check_data_files("runner.valid_data_dir", archive.parent, "funzip") == [archive]
    with pytest.raises(ConfigError, match=f"runner.pipe_command: 'zcat' .*'{cut}'"):
        check_data_files("runner.train_data_dir", cut, "zcat")
    wrong = ColumnsConfig(delimiter="\t", label="clicked", sparse=["c1"])
    with pytest.raises(ConfigError, match=r"^runner.columns.label: 'clicked' is not a column "
                                          r".*\(runner.test_data_dir\)$"):
        _check_first_lines(make_parser("csv", wrong), "runner.test_data_dir", packed_csv)


def test_open_data_file_reads_lines_and_plain_files_unchanged(tmp_path: Path) -> None:
    plain = CRITEO_DIR / "dev.csv"
    lines = plain.read_bytes().splitlines(keepends=True)
    for suffix in CODECS:
        with open_data_file(compressed(plain, tmp_path, suffix)) as stream:
            assert stream.readline() == lines[0]
            assert stream.readline() == lines[1]
            assert stream.read() == b"".join(lines[2:])
    with open_data_file(plain) as stream:
        assert stream.read() == plain.read_bytes()
