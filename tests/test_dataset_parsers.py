"""The registered parsers on the real sample files of ../shared/data/criteo_paddlerec,
and the Arrow fast path against the reference line parser."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CRITEO_DIR, require_shared_data

from psfleet.data import (
    ColumnsConfig,
    InMemoryDataset,
    QueueDataset,
    SlotFormatConfig,
    hash_feature,
    make_parser,
    parse_criteo_bytes,
    parse_lines,
    parser_names,
)
from psfleet.data._slot_fast import parse_layout
from psfleet.data.criteo import ParsedChunk
from psfleet.data.slot_format import SlotParser
from psfleet.data.types import RawChunk
from psfleet.errors import ConfigError, DataError

pytestmark = pytest.mark.unit

PADDLEREC = require_shared_data(require_shared_data().parent / "criteo_paddlerec",
                                ("raw_tsv/part-0", "slot_format/sample_train.txt"))


def load(files: list[Path], parser: str, options: object = None) -> InMemoryDataset:
    memory = InMemoryDataset(1000, parser, options, thread_num=2)
    memory.set_filelist(files)
    memory.load_into_memory()
    return memory


def arrays(memory: InMemoryDataset) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batches = list(memory)
    return (np.concatenate([b.labels.numpy() for b in batches]),
            np.concatenate([b.dense.numpy() for b in batches]),
            np.concatenate([b.sparse.numpy() for b in batches]).view(np.uint64))


def test_registry_lists_the_built_in_parsers_and_rejects_unknown_names() -> None:
    assert {"criteo", "slot", "csv", "parquet"} <= set(parser_names())
    with pytest.raises(ConfigError, match="'tsv' is not one of .*criteo"):
        make_parser("tsv")


def test_fast_criteo_path_equals_the_line_parser_including_odd_values() -> None:
    lines = (CRITEO_DIR / "train.csv").read_text().split("\n")[:2000]
    odd = "\t".join(["1", "-3", "", "12345678901", *[""] * 10,
                     "ABCDEF", "zz", "é", "123456789", "0", *["7"] * 21])
    lines = [odd, *lines]
    fast = parse_criteo_bytes(("\n".join(lines) + "\n").encode(), "x")
    ref = parse_lines(lines, "x")
    assert fast.malformed == 0 and len(fast) == 2001
    for name in ("labels", "dense", "sparse"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name))
    assert fast.sparse[0, 0] == hash_feature(0, "ABCDEF")
    assert fast.sparse[0, 1] == hash_feature(1, "zz")


def test_raw_tsv_part0() -> None:
    labels, dense, sparse = arrays(load([PADDLEREC / "raw_tsv" / "part-0"], "criteo"))
    assert len(labels) == 100 and int(labels.sum()) == 29
    assert sparse.shape == (100, 26) and dense.shape == (100, 13)


def test_slot_format_sample() -> None:
    path = PADDLEREC / "slot_format" / "sample_train.txt"
    labels, dense, sparse = arrays(load([path], "slot"))
    first = path.read_text().split("\n")[0].split()
    assert len(labels) == 80 and int(labels.sum()) == 23
    assert dense[0, 2] == np.float32(0.05) and dense[0, 1] == np.float32(0.00497512437811)
    assert sparse[0, 0] == (1 << 33) | 737395 and first[14] == "1:737395"
    assert sparse[0, 25] == (26 << 33) | 306163


def test_slot_format_pads_missing_slots_and_names_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "slots.txt"
    path.write_text("click:1 dense_feature:0.5 2:7\nclick:x 1:3\nclick:0 1:4 1:5\n")
    stream = QueueDataset(10, "slot", max_malformed_fraction=1.0)
    stream.set_filelist([path])
    batches = list(stream)
    assert len(batches) == 1 and len(batches[0]) == 1
    dense = batches[0].dense.numpy()[0]
    assert dense[0] == 0.5 and not dense[1:].any()
    sparse = batches[0].sparse.numpy().view(np.uint64)[0]
    assert sparse[0] == 1 << 33 and sparse[1] == (2 << 33) | 7  # slot 1 padded with id 0
    assert stream.last_pass is not None and stream.last_pass.malformed == 2
    strict = QueueDataset(10, "slot", strict=True)
    strict.set_filelist([path])
    with pytest.raises(DataError, match=f"{path}:2: .*label 'x'"):
        list(strict)


def test_feat_idx_format_as_slots_with_widths() -> None:
    config = SlotFormatConfig(label_slot="label", dense_slots={"feat_value": 39},
                              sparse_slots={"feat_idx": 39})
    path = PADDLEREC / "feat_idx_format" / "sample_train.txt"
    labels, dense, sparse = arrays(load([path], "slot", config))
    tokens = path.read_text().split("\n")[0].split()
    assert len(labels) == 100 and int(labels.sum()) == 22
    assert sparse.shape == (100, 39) and dense.shape == (100, 39)
    assert sparse[0, 38] == (39 << 33) | int(tokens[38].split(":")[1])
    assert dense[0, 0] == np.float32(float(tokens[39].split(":")[1]))


def test_autoint_format_as_space_separated_columns() -> None:
    config = ColumnsConfig(delimiter=" ", header=False, label=0,
                           sparse=list(range(1, 40)), dense=list(range(40, 79)))
    path = PADDLEREC / "autoint_format" / "sample_train.txt"
    labels, dense, sparse = arrays(load([path], "csv", config))
    tokens = path.read_text().split("\n")[0].split()
    assert len(labels) == 100 and int(labels.sum()) == 21
    assert sparse[0, 0] == hash_feature(0, tokens[1])
    assert dense[0, 3] == np.float32(float(tokens[43]))


def test_csv_with_header_and_parquet_give_the_same_examples(tmp_path: Path) -> None:
    lines = (CRITEO_DIR / "dev.csv").read_text().split("\n")[:50]
    fields = [line.split("\t") for line in lines]
    names = ["click", *[f"i{k}" for k in range(1, 14)], *[f"c{k}" for k in range(1, 27)]]
    csv = tmp_path / "dev.csv"
    csv.write_text(",".join(names) + "\n" + "\n".join(",".join(f) for f in fields) + "\n")
    config = ColumnsConfig(label="click", dense=names[1:14], sparse=names[14:],
                           dense_transform="log1p")
    from_csv = arrays(load([csv], "csv", config))
    table = pa.table({name: [f[i] for f in fields] for i, name in enumerate(names)})
    table = table.set_column(0, "click", pa.array([int(f[0]) for f in fields]))
    parquet = tmp_path / "dev.parquet"
    pq.write_table(table, parquet)
    from_parquet = arrays(load([parquet], "parquet", config))
    criteo = parse_lines(lines, "dev")

    for a, b, c in zip(from_csv, from_parquet, (criteo.labels, criteo.dense, criteo.sparse),
                       strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-6)  # same values as the criteo parser


def test_csv_unknown_column_is_named_with_its_key() -> None:
    path = PADDLEREC / "raw_tsv" / "part-0"
    with pytest.raises(ConfigError, match=r"^columns.label: 'clicked' is not a column"):
        load([path], "csv", ColumnsConfig(label="clicked", sparse=["a"]))
    # Read with the default delimiter ",", the tab-separated file has one column.
    with pytest.raises(ConfigError, match=r"^columns.sparse\[1\]: position 5 is past the "
                                          r"last column \(1 columns\)"):
        load([path], "csv", ColumnsConfig(label=0, sparse=[0, 5]))


# -- slot format: the vectorised fast path against the per-line reference -------------------

FEAT_IDX = SlotFormatConfig(label_slot="label", dense_slots={"feat_value": 39},
                            sparse_slots={"feat_idx": 39})


def slot_chunk(data: bytes, first_line_no: int = 1, line_step: int = 1) -> RawChunk:
    return RawChunk("mem.txt", first_line_no, line_step, data.count(b"\n"), 0, data)


def assert_same_parse(parser: SlotParser, chunk: RawChunk) -> ParsedChunk:
    """Fast and reference parse agree bit for bit (values, malformed count, strict error)."""
    fast, ref = parser.parse(chunk, False), parser.parse(chunk, False, fast=False)
    assert (fast.malformed, fast.lines) == (ref.malformed, ref.lines)
    for name in ("labels", "dense", "sparse"):
        a, b = getattr(fast, name), getattr(ref, name)
        assert a.shape == b.shape and a.dtype == b.dtype
        assert a.tobytes() == b.tobytes(), name  # bitwise: -0.0, inf and rounding included
    if ref.malformed:
        with pytest.raises(DataError) as expected:
            parser.parse(chunk, True, fast=False)
        with pytest.raises(DataError, match=re.escape(str(expected.value))):
            parser.parse(chunk, True)
    return fast


@pytest.mark.parametrize(("folder", "config"), [("slot_format", None),
                                                ("feat_idx_format", FEAT_IDX)])
def test_slot_fast_path_parses_the_sample_files_as_the_reference(
        folder: str, config: SlotFormatConfig | None) -> None:
    data = (PADDLEREC / folder / "sample_train.txt").read_bytes()
    parser = SlotParser(config)
    layout = parser._layout(data)
    assert layout is not None  # every line takes the fast path
    assert parse_layout(data, layout, parser.num_dense, parser.num_slots).parsed.all()
    assert len(assert_same_parse(parser, slot_chunk(data))) == data.count(b"\n")
    unterminated = assert_same_parse(parser, slot_chunk(data.rstrip(b"\n"), 11, 3))
    assert len(unterminated) == data.count(b"\n")
    for line_end in (b"\r\n", b" \n", b" \r\n"):  # Windows line ends, trailing separator
        variant = data.replace(b"\n", line_end)
        assert parse_layout(variant, layout, parser.num_dense, parser.num_slots).parsed.all()
        assert len(assert_same_parse(parser, slot_chunk(variant))) == data.count(b"\n")


_ODD_VALUES = ["0", "-0", "+1", "-1", "007", "", "1e5", "1E-3", "+.5", "5.", ".", "-", "1e",
               "1e400", "-1e400", "1e-400", "nan", "inf", "-Infinity", "1_0", "0x10", "1.5.2",
               "3.4028235e38", "3.4028236e38", "0.1000000000000000055511151231257827",
               "99999999", "100000000", "4294967295", "4294967296", "18446744073709551616",
               "٣", "a:b", "\u00e9", "1\t2", "1\x002", "1\x7f", "1\x1c2", "1\u20002"]


def _mutate(line: str, rng: np.random.Generator) -> str:
    tokens = line.split(" ")
    k = int(rng.integers(len(tokens)))
    name, _, value = tokens[k].partition(":")
    pick = int(rng.integers(13))
    if pick == 0:
        tokens[k] = f"{name}:{_ODD_VALUES[int(rng.integers(len(_ODD_VALUES)))]}"
    elif pick == 1:
        del tokens[k]  # a missing slot (padded) or value
    elif pick == 2:
        j = int(rng.integers(len(tokens)))
        tokens[k], tokens[j] = tokens[j], tokens[k]  # reordered slots
    elif pick == 3:
        tokens.insert(k, tokens[k])  # a slot given twice
    elif pick == 4:
        tokens[k] = f"{name}{value}"  # no ':'
    elif pick == 5:
        tokens[k] = f"x{name}:{value}"  # an undeclared slot (ignored)
    elif pick == 6:
        return line.replace(" ", "  ", 1) if k % 2 else " " + line + " "
    elif pick == 7:
        return line + "\r"
    elif pick == 8:
        return ""
    elif pick == 9:
        tokens[k] = f"{name}:{''.join(rng.choice(list('0123456789.+-eE'), 4))}"
    elif pick == 10:
        tokens[k] = f"{name}:{''.join(rng.choice(list('0123456789'), int(rng.integers(1, 21))))}"
    elif pick == 11:
        tokens[k] = f"{name}:{float(rng.normal()) * 10.0 ** int(rng.integers(-40, 40))!r}"
    else:
        tokens[k] = f"{name}::{value}"
    return " ".join(tokens)


@pytest.mark.parametrize("value_first", [False, True])
def test_slot_fast_path_equals_the_reference_on_mutated_lines(value_first: bool) -> None:
    lines = (PADDLEREC / "slot_format" / "sample_train.txt").read_text().splitlines()
    if value_first:  # Fleet's value:slot order
        lines = [" ".join(":".join(t.split(":")[::-1]) for t in line.split()) for line in lines]
    parser = SlotParser(SlotFormatConfig(value_first=value_first))
    rng = np.random.default_rng(5)
    fast_rows = 0
    for trial in range(30):
        rows = [lines[int(i)] for i in rng.integers(len(lines), size=200)]
        for row in rng.choice(len(rows), size=int(rng.integers(1, 40)), replace=False):
            rows[row] = _mutate(rows[row], rng)
        data = ("\n".join(rows) + "\n").encode("utf-8", "surrogatepass")
        parsed = assert_same_parse(parser, slot_chunk(data, 1 + trial, 2))
        assert parsed.malformed < 40 and len(parsed) > 100
        layout = parser._layout(data)
        if layout is not None:
            fast_rows += int(parse_layout(data, layout, 13, 26).parsed.sum())
    assert fast_rows > 30 * 150  # most unmutated lines took the fast path
    # a chunk whose first lines are malformed or of another layout still parses
    data = ("click:2\n\n" + "\n".join(lines[:5][::-1]) + "\n").encode()
    assert_same_parse(parser, slot_chunk(data))


def test_slot_fast_path_floats_equal_python_float_on_random_text() -> None:
    rng = np.random.default_rng(11)
    alphabet = list("0123456789.+-eE")
    values = ["".join(rng.choice(alphabet, int(rng.integers(1, 7)))) for _ in range(3000)]
    values += [f"{x:.{int(rng.integers(1, 20))}g}" for x in rng.lognormal(0, 30, 3000)]
    lines = [f"click:1 dense_feature:{v} 1:5" for v in values]
    data = ("\n".join(lines) + "\n").encode()
    parser = SlotParser()
    parsed = assert_same_parse(parser, slot_chunk(data))
    assert 3000 < len(parsed) < 6000  # both accepted and rejected strings occur
