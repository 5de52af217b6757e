"""Multi-valued (jagged) features in the parsers, text labels, quoting, dense
transforms, libSVM / libFFM and the malformed-line limit, each against a
straightforward reference written here (value oracles), on the shared sample data."""

from __future__ import annotations

import csv
import io
import math
import random
import re
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import CRITEO_DIR, require_shared_data
from pydantic import ValidationError

from psfleet.data import (
    ColumnsConfig,
    InMemoryDataset,
    LibsvmConfig,
    QueueDataset,
    SlotFormatConfig,
    hash_feature,
    make_parser,
    slot_format,
)
from psfleet.data._fields import generic_low_bits
from psfleet.data._ids import crc32_fields, decimal_low_bits
from psfleet.data._slot_variable import parse_variable
from psfleet.data.jagged_rows import JaggedRows
from psfleet.data.libsvm import LibsvmParser
from psfleet.data.slot_format import SlotParser
from psfleet.data.types import ParsedChunk, RawChunk
from psfleet.errors import ConfigError, DataError

pytestmark = pytest.mark.unit

PADDLEREC = require_shared_data(require_shared_data().parent / "criteo_paddlerec",
                                ("slot_dnn_feasign_format/demo_10",
                                 "slot_format/sample_train.txt"))
DEMO = PADDLEREC / "slot_dnn_feasign_format" / "demo_10"
SLOT_SAMPLE = PADDLEREC / "slot_format" / "sample_train.txt"
DEMO_CONFIG = SlotFormatConfig(label_slot="1", value_first=True, dense_slots={},
                               sparse_slots=[], multi_slots=["2..301"])


def slot_key(slot: int, raw: str) -> int:
    """The slot-format key of a decimal id (module docstring of slot_format)."""
    low = int(raw) if int(raw) < 2**32 else generic_low_bits(raw)
    return ((slot + 1) << 33) | low


def chunk(data: bytes, source: str = "data.txt", header: bytes | None = None) -> RawChunk:
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    return RawChunk(source, 2 if header is not None else 1, 1, lines, lines, data, header)


def bags(jagged: JaggedRows) -> list[list[list[int]]]:
    """Per example, per feature: the keys, as Python ints."""
    out, position = [], 0
    values = jagged.values.tolist()
    for lengths in jagged.lengths.tolist():
        row = []
        for length in lengths:
            row.append(values[position:position + length])
            position += length
        out.append(row)
    return out


def assert_same(a: ParsedChunk, b: ParsedChunk) -> None:
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.sparse, b.sparse)
    assert a.malformed == b.malformed and a.lines == b.lines
    assert (a.jagged is None) == (b.jagged is None)
    if a.jagged is not None and b.jagged is not None:
        np.testing.assert_array_equal(a.jagged.values, b.jagged.values)
        np.testing.assert_array_equal(a.jagged.lengths, b.jagged.lengths)
        if a.jagged.weights is not None or b.jagged.weights is not None:
            np.testing.assert_array_equal(a.jagged.weights, b.jagged.weights)


# -- vectorised id keys --------------------------------------------------------------


def test_vectorised_crc32_and_decimal_ids_equal_zlib_and_int() -> None:
    rng = random.Random(3)
    values = [b"", b"a", b"18446744073709551615", b"4294967296", b"4294967295",
              b"0004294967296", b"12x", "é".encode(), b"9" * 20, b"1" * 21]
    values += [str(rng.randrange(10 ** rng.randrange(1, 21))).encode() for _ in range(3000)]
    values += [bytes(rng.randrange(256) for _ in range(rng.randrange(40))) for _ in range(500)]
    data = np.frombuffer(b"".join(values) + bytes(8), dtype=np.uint8)
    lengths = np.array([len(v) for v in values], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    assert crc32_fields(data, starts, lengths).tolist() == [zlib.crc32(v) for v in values]
    low, valid = decimal_low_bits(data, starts, lengths)
    for value, key, ok in zip(values, low.tolist(), valid.tolist(), strict=True):
        assert ok == (1 <= len(value) <= 20 and value.isdigit())
        if ok:
            assert key == slot_key(-1, value.decode())


# -- slot parser ---------------------------------------------------------------------


def test_slot_dnn_demo_keeps_every_line_with_every_feasign() -> None:
    memory = InMemoryDataset(4, "slot", DEMO_CONFIG)
    memory.set_filelist([DEMO])
    memory.load_into_memory()
    assert memory.last_pass is not None and memory.last_pass.malformed == 0
    batches = list(memory)
    labels = np.concatenate([b.labels.numpy() for b in batches])
    lines = DEMO.read_text().splitlines()
    assert len(labels) == len(lines) == 10
    expected_labels, expected_bags = [], []
    for line in lines:
        pairs = [token.split(":") for token in line.split()]
        expected_labels.append(float(next(f for f, s in pairs if s == "1")))
        expected_bags.append([[slot_key(slot - 2, f) for f, s in pairs if s == str(slot)]
                              for slot in range(2, 302)])
    np.testing.assert_array_equal(labels, expected_labels)
    parser = SlotParser(DEMO_CONFIG)
    parsed = parser.parse(chunk(DEMO.read_bytes(), str(DEMO)), strict=True)
    assert parsed.jagged is not None and bags(parsed.jagged) == expected_bags
    assert parser.schema.multi == tuple(str(s) for s in range(2, 302))
    assert parsed.jagged.lengths.sum(axis=1).tolist() == [
        sum(1 for t in line.split() if not t.endswith(":1")) for line in lines]
    assert_same(parsed, parser.parse(chunk(DEMO.read_bytes(), str(DEMO)), True, fast=False))
    # the model config's slot_num 408 (slots 2..409): the same ids, 108 more empty bags
    wide = SlotParser(DEMO_CONFIG.model_copy(update={"multi_slots": [str(s) for s in
                                                                     range(2, 410)]}))
    wide_parsed = wide.parse(chunk(DEMO.read_bytes(), str(DEMO)), strict=True)
    assert wide_parsed.jagged is not None and len(wide_parsed) == 10
    np.testing.assert_array_equal(wide_parsed.jagged.values, parsed.jagged.values)
    assert not wide_parsed.jagged.lengths[:, 300:].any()
    # the batches carry the bags key-major (KeyedJagged), every id once
    assert sum(int(b.jagged.lengths.sum()) for b in batches if b.jagged is not None) == int(
        parsed.jagged.lengths.sum())


def _mixed_config(**extra: object) -> SlotFormatConfig:
    return SlotFormatConfig(dense_slots={"dense_feature": 13},
                            sparse_slots=[str(i) for i in range(1, 14)],
                            multi_slots=["14..26", "tags"], **extra)  # type: ignore[arg-type]


def _reference(line: str, config: SlotFormatConfig) -> tuple[float, list[float], list[int],
                                                              list[list[int]]] | None:
    """Straightforward parse of one slot line with multi-valued slots (None: malformed)."""
    pairs = [token.partition(":") for token in line.split()]
    if any(not sep for _, sep, _ in pairs):
        return None
    labels = [v for n, _, v in pairs if n == config.label_slot]
    if not labels or labels[-1] not in ("0", "1"):
        return None
    dense = [float(v) for n, _, v in pairs if n == "dense_feature"]
    id_slots = set(config.sparse_widths()) | set(config.multi_slots)
    if len(dense) > 13 or not all(v.isdigit() for n, _, v in pairs if n in id_slots):
        return None
    sparse = []
    for index, name in enumerate(config.sparse_widths()):
        ids = [v for n, _, v in pairs if n == name]
        if len(ids) > 1:
            return None
        sparse.append(slot_key(index, ids[0]) if ids else slot_key(index, "0"))
    multi = [[slot_key(13 + m, v) for n, _, v in pairs if n == name]
             for m, name in enumerate(config.multi_slots)]
    return float(labels[-1]), dense + [0.0] * (13 - len(dense)), sparse, multi


def test_slot_multi_slots_any_order_and_count_equal_a_straightforward_parse() -> None:
    rng = random.Random(7)
    config = _mixed_config()
    lines = []
    for line in SLOT_SAMPLE.read_text().splitlines():
        tokens = line.split()
        extra = [f"{rng.choice(range(14, 27))}:{rng.randrange(10**rng.randrange(1, 21))}"
                 for _ in range(rng.randrange(6))]
        extra += [f"tags:{rng.randrange(100)}" for _ in range(rng.randrange(3))]
        drop = set(rng.sample(range(27, 40), rng.randrange(4)))  # multi slots left out: empty
        tokens = [t for i, t in enumerate(tokens) if i not in drop] + extra
        rng.shuffle(tokens)
        lines.append(" ".join(tokens))
    lines += ["click:1 1:5 1:6", "click:2 14:1", "click:0 tags:x", "click:1 14:1 tags:2 junk"]
    data = ("\n".join(lines) + "\n").encode()
    parser = SlotParser(config)
    parsed = parser.parse(chunk(data), strict=False)
    expected = [r for r in (_reference(line, config) for line in lines) if r is not None]
    assert parsed.malformed == 4 and len(parsed) == len(expected) == len(lines) - 4
    np.testing.assert_array_equal(parsed.labels, [e[0] for e in expected])
    np.testing.assert_array_equal(parsed.dense, np.array([e[1] for e in expected], np.float32))
    assert parsed.sparse.tolist() == [e[2] for e in expected]
    assert parsed.jagged is not None and bags(parsed.jagged) == [e[3] for e in expected]
    assert_same(parsed, parser.parse(chunk(data), strict=False, fast=False))


def test_slot_lines_of_many_layouts_equal_the_reference_line_parser(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Fixed slots only, but most lines in their own token order, with odd values: the
    # any-layout path takes them (more than a tenth of the chunk), the reference agrees.
    rng = random.Random(11)
    odd = ["1e5", "-0", "nan", "inf", "1_0", "+.5", "0x10", "", "99999999999999999999999",
           "4294967296", "00012", "é"]
    lines = []
    for line in SLOT_SAMPLE.read_text().splitlines() * 5:
        tokens = line.split()
        if rng.random() < 0.7:
            rng.shuffle(tokens)
        if rng.random() < 0.3:
            at = rng.randrange(len(tokens))
            name = tokens[at].partition(":")[0]
            tokens[at] = f"{name}:{rng.choice(odd)}"
        if rng.random() < 0.1:
            tokens.append(rng.choice(["dense_feature:1", "7:7", "click:1", "x", "other:3"]))
        lines.append(rng.choice([" ", "  ", "\t"]).join(tokens))
    data = ("\n".join(lines) + "\n").encode()
    parser = SlotParser(SlotFormatConfig())
    calls = []

    def spy(*args: object) -> object:
        calls.append(1)
        return parse_variable(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(slot_format, "parse_variable", spy)
    fast = parser.parse(chunk(data), strict=False)
    assert calls and 0 < fast.malformed < len(lines) // 2
    assert_same(fast, parser.parse(chunk(data), strict=False, fast=False))


def test_slot_dense_transforms() -> None:
    data = SLOT_SAMPLE.read_bytes()
    plain = SlotParser(_mixed_config()).parse(chunk(data), True)
    log = SlotParser(_mixed_config(dense_transform="log1p")).parse(chunk(data), True)
    np.testing.assert_array_equal(log.dense, np.log1p(np.maximum(plain.dense, 0)))
    mean, std = [0.1 * i for i in range(13)], [0.5 + i for i in range(13)]
    standard = SlotParser(_mixed_config(dense_transform="standardize", dense_mean=mean,
                                        dense_std=std)).parse(chunk(data), True)
    expected = ((plain.dense.astype(np.float64) - mean) / std).astype(np.float32)
    np.testing.assert_allclose(standard.dense, expected, rtol=1e-6)
    fixed = SlotParser(SlotFormatConfig(dense_transform="log1p")).parse(chunk(data), True)
    np.testing.assert_array_equal(fixed.dense, log.dense)  # the fixed fast path too
    with pytest.raises(ValidationError, match="dense_std"):
        _mixed_config(dense_transform="standardize", dense_mean=mean)
    with pytest.raises(ValidationError, match="dense_mean"):
        _mixed_config(dense_transform="standardize", dense_mean=[0.0], dense_std=std)


def test_slot_config_ranges_and_names_are_checked() -> None:
    assert SlotFormatConfig(multi_slots=["3..5", "x"]).multi_slots == ["3", "4", "5", "x"]
    with pytest.raises(ValidationError, match="range"):
        SlotFormatConfig(multi_slots=["5..3"])
    with pytest.raises(ValidationError, match="at least one sparse"):
        SlotFormatConfig(sparse_slots=[], multi_slots=[])
    with pytest.raises(ConfigError, match=r"\['1'\] are declared twice"):
        SlotParser(SlotFormatConfig(multi_slots=["1"]))


# -- csv / parquet -------------------------------------------------------------------


def _criteo_rows(count: int) -> list[list[str]]:
    path = require_shared_data() / "train.csv"
    with path.open() as handle:
        return [handle.readline().rstrip("\n").split("\t") for _ in range(count)]


def _user_table(rows: list[list[str]]) -> list[dict[str, str]]:
    """Criteo rows as a user's table: a text label, a quoted text field with the
    delimiter and quotes in it, a "|"-separated multi-valued column of C19..C21 (empty
    when all three are), two numbers."""
    table = []
    for row in rows:
        genres = "|".join(v for v in row[32:35] if v)
        table.append({"label": "yes" if row[0] == "1" else "no", "i1": row[1], "i2": row[2],
                      "title": f'{row[14]}, "{row[18]}"', "c5": row[19], "genres": genres})
    return table


def _write_csv(path: Path, table: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)


USER_COLUMNS = ColumnsConfig(label="label", label_map={"yes": 1, "no": 0},
                             dense=["i1", "i2"], sparse=["title", "c5"], multi=["genres"])


def _expected(table: list[dict[str, str]]) -> tuple[list[float], list[list[int]],
                                                    list[list[list[int]]]]:
    labels = [1.0 if r["label"] == "yes" else 0.0 for r in table]
    sparse = [[hash_feature(0, r["title"]), hash_feature(1, r["c5"])] for r in table]
    multi = [[[hash_feature(2, g) for g in r["genres"].split("|") if g]] for r in table]
    return labels, sparse, multi


def test_csv_quoted_fields_multi_column_and_text_label(tmp_path: Path) -> None:
    table = _user_table(_criteo_rows(300))
    assert any(not r["genres"] for r in table) and any("|" in r["genres"] for r in table)
    path = tmp_path / "user.csv"
    _write_csv(path, table)
    assert '"' in path.read_text() and '""' in path.read_text()
    parser = make_parser("csv", USER_COLUMNS)
    header, body = path.read_bytes().split(b"\n", 1)
    parsed = parser.parse(chunk(body, str(path), header), strict=True)
    labels, sparse, multi = _expected(table)
    np.testing.assert_array_equal(parsed.labels, labels)
    assert parsed.sparse.tolist() == sparse
    assert parsed.jagged is not None and bags(parsed.jagged) == multi
    dense = [[float(r["i1"] or 0), float(r["i2"] or 0)] for r in table]
    np.testing.assert_array_equal(parsed.dense, np.array(dense, np.float32))
    assert parser.schema.features == ("title", "c5", "genres")
    # the line-by-line path (taken when a chunk has a bad line) gives the same examples
    bad = body + b'no,1,2,"unclosed,x,y\n'
    slow = parser.parse(chunk(bad, str(path), header), strict=False)
    assert slow.malformed == 1
    assert_same(ParsedChunk(slow.labels, slow.dense, slow.sparse, 0, len(table), slow.jagged),
                parsed)
    # through a dataset, with a standardised dense column
    memory = InMemoryDataset(64, "csv", USER_COLUMNS.model_copy(update={
        "dense_transform": "standardize", "dense_mean": [1.0, 2.0], "dense_std": [2.0, 4.0]}))
    memory.set_filelist([path])
    memory.load_into_memory()
    batches = list(memory)
    got = np.concatenate([b.dense.numpy() for b in batches])
    np.testing.assert_allclose(got, (np.array(dense) - [1.0, 2.0]) / [2.0, 4.0], rtol=1e-6)
    assert sum(len(b) for b in batches) == len(table)
    assert all(b.jagged is not None and b.jagged.keys == ("genres",) for b in batches)


def test_csv_unmappable_label_is_malformed_and_a_quoted_line_break_is_kept(
        tmp_path: Path) -> None:
    table = _user_table(_criteo_rows(50))
    path = tmp_path / "user.csv"
    _write_csv(path, table)
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(4, 'maybe,1,2,t,c,g\n')  # line 5: a label that is not in the map
    lines.insert(8, 'no,1,2,"two\nlines",c,g\n')  # lines 9-10: one record, a quoted break
    lines.insert(12, 'maybe,1,2,t,c,g\n')  # line 14 (the 13th record)
    path.write_text("".join(lines))
    strict = QueueDataset(8, "csv", USER_COLUMNS, strict=True)
    strict.set_filelist([path])
    with pytest.raises(DataError, match=f"{path}:5: .*label is 'maybe'"):
        list(strict)
    stream = QueueDataset(8, "csv", USER_COLUMNS, max_malformed_fraction=0.1)
    stream.set_filelist([path])
    batches = list(stream)
    labels = np.concatenate([b.labels.numpy() for b in batches])
    sparse = np.concatenate([b.sparse.numpy() for b in batches])
    assert stream.last_pass is not None and stream.last_pass.malformed == 2
    expected = _expected(table)
    np.testing.assert_array_equal(labels, [*expected[0][:6], 0.0, *expected[0][6:]])
    assert sparse[6].tolist() == [hash_feature(0, "two\nlines"), hash_feature(1, "c")]
    without_first = path.read_text().replace("maybe,1,2,t,c,g\n", "yes,1,2,t,c,g\n", 1)
    path.write_text(without_first)
    with pytest.raises(DataError, match=f"{path}:14: .*label is 'maybe'"):
        list(strict)  # the line after the two-line record is numbered as the file's
    positive = ColumnsConfig(label="label", label_positive="yes", sparse=["c5"])
    parsed = make_parser("csv", positive).parse(
        chunk(b"yes,a\nno,b\n maybe ,c\n", header=b"label,c5"), strict=True)
    np.testing.assert_array_equal(parsed.labels, [1.0, 0.0, 0.0])  # no negatives listed
    strict_positive = positive.model_copy(update={"label_negative": ["no"]})
    with pytest.raises(DataError, match=r"data.txt:4: .*label is ' maybe '"):
        make_parser("csv", strict_positive).parse(
            chunk(b"yes,a\nno,b\n maybe ,c\n", header=b"label,c5"), strict=True)


def test_csv_quoting_agrees_with_python_csv_on_odd_fields() -> None:
    rows = [["1", "a,b", 'say "x"'], ["0", "", "plain"], ["1", "x|y", '"']]
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    config = ColumnsConfig(label=0, header=False, sparse=[1, 2])
    parsed = make_parser("csv", config).parse(chunk(buffer.getvalue().encode()), True)
    assert parsed.sparse.tolist() == [[hash_feature(0, r[1]), hash_feature(1, r[2])]
                                      for r in rows]
    with pytest.raises(ValidationError, match="sparse or multi-valued"):
        ColumnsConfig(label=0, sparse=[])
    with pytest.raises(ValidationError, match="label_negative"):
        ColumnsConfig(label=0, sparse=[1], label_negative=["n"])


def test_parquet_list_columns_and_text_labels(tmp_path: Path) -> None:
    rows = _criteo_rows(120)
    tags = [[v for v in row[32:35] if v] for row in rows]
    numbers = [[int(v) for v in row[1:4] if v] for row in rows]
    table = pa.table({
        "label": pa.array(["yes" if r[0] == "1" else "no" for r in rows]),
        "tags": pa.array([t or None for t in tags], pa.list_(pa.string())),
        "numbers": pa.array(numbers, pa.list_(pa.int64())),
        "genres": pa.array(["|".join(t) for t in tags]),
        "c1": pa.array([r[14] for r in rows]),
    })
    path = tmp_path / "user.parquet"
    pq.write_table(table, path, row_group_size=50)
    config = ColumnsConfig(label="label", label_map={"yes": 1, "no": 0}, sparse=["c1"],
                           multi=["tags", "numbers", "genres"])
    memory = InMemoryDataset(1000, "parquet", config)
    memory.set_filelist([path])
    memory.load_into_memory()
    parsed = memory._loaded()
    assert len(parsed) == 120 and parsed.jagged is not None
    np.testing.assert_array_equal(parsed.labels, [float(r[0]) for r in rows])
    assert parsed.sparse[:, 0].tolist() == [hash_feature(0, r[14]) for r in rows]
    assert bags(parsed.jagged) == [
        [[hash_feature(1, v) for v in t], [hash_feature(2, str(n)) for n in ns],
         [hash_feature(3, v) for v in t]] for t, ns in zip(tags, numbers, strict=True)]


# -- libSVM / libFFM -----------------------------------------------------------------


def _libsvm_lines(rows: list[list[str]], fields: bool) -> list[str]:
    """Criteo rows as libSVM (idx = column for I, the hex value for C; value = the
    integer for I, 1 for C) or libFFM (field = the column), labels as -1 / +1."""
    lines = []
    for row in rows:
        tokens = ["+1" if row[0] == "1" else "-1"]
        for column, raw in enumerate(row[1:]):
            if not raw:
                continue
            index, value = (column, raw) if column < 13 else (int(raw, 16), "1")
            tokens.append(f"{column}:{index}:{value}" if fields else f"{index}:{value}")
        lines.append(" ".join(tokens))
    return lines


@pytest.mark.parametrize("fields", [False, True], ids=["libsvm", "libffm"])
def test_libsvm_and_libffm_from_criteo_rows(tmp_path: Path, fields: bool) -> None:
    rows = _criteo_rows(200)
    lines = _libsvm_lines(rows, fields)
    path = tmp_path / "data.svm"
    path.write_text("\n".join(lines) + "\n")
    options = LibsvmConfig(fields=True, num_fields=39) if fields else None
    parser = make_parser("libsvm", options)
    parsed = parser.parse(chunk(path.read_bytes(), str(path)), strict=True)
    np.testing.assert_array_equal(parsed.labels, [float(r[0]) for r in rows])
    assert parsed.jagged is not None and parsed.jagged.weights is not None
    assert parser.schema.weighted and parser.schema.dense == parser.schema.sparse == ()
    features = 39 if fields else 1
    expected_bags: list[list[list[int]]] = []
    expected_weights: list[float] = []
    for line in lines:
        row_bags: list[list[int]] = [[] for _ in range(features)]
        row_weights: list[list[float]] = [[] for _ in range(features)]
        for token in line.split()[1:]:
            parts = token.split(":")
            field = int(parts[0]) if fields else 0
            row_bags[field].append(slot_key(field, parts[-2]))
            row_weights[field].append(float(parts[-1]))
        expected_bags.append(row_bags)
        expected_weights.extend(w for ws in row_weights for w in ws)
    assert bags(parsed.jagged) == expected_bags
    np.testing.assert_array_equal(parsed.jagged.weights,
                                  np.array(expected_weights, np.float32))
    assert isinstance(parser, LibsvmParser)
    assert_same(parsed, parser.parse(chunk(path.read_bytes(), str(path)), True, fast=False))
    # streamed in batches: key-major ids and weights, the same multiset per feature
    stream = QueueDataset(64, "libsvm", options, thread_num=2)
    stream.set_filelist([path])
    batches = list(stream)
    assert sum(len(b) for b in batches) == 200
    assert all(b.jagged is not None and b.jagged.weights is not None for b in batches)
    total = sum(float(b.jagged.weights.sum()) for b in batches if b.jagged is not None
                and b.jagged.weights is not None)
    assert math.isclose(total, float(parsed.jagged.weights.astype(np.float64).sum()),
                        rel_tol=1e-6)


def test_libsvm_malformed_lines_are_named() -> None:
    parser = LibsvmParser(LibsvmConfig(fields=True, num_fields=2))
    data = b"1 0:1:1\n2 0:1:1\n0 2:5:1\n0 1:5\n\n-1 1:7:0.5 0:3:2\n"
    parsed = parser.parse(chunk(data, "x.ffm"), strict=False)
    assert parsed.malformed == 4 and parsed.labels.tolist() == [1.0, 0.0]
    assert parsed.jagged is not None and bags(parsed.jagged) == [
        [[slot_key(0, "1")], []], [[slot_key(0, "3")], [slot_key(1, "7")]]]
    assert parsed.jagged.weights is not None
    assert parsed.jagged.weights.tolist() == [1.0, 2.0, 0.5]
    with pytest.raises(DataError, match=r"x.ffm:3: .*field 2 .*num_fields 2"):
        parser.parse(chunk(b"1 0:1:1\n1 1:1:1\n0 2:5:1\n", "x.ffm"), strict=True)
    with pytest.raises(ValidationError, match="num_fields"):
        LibsvmConfig(fields=True)


# -- the malformed-line limit --------------------------------------------------------


def test_too_many_malformed_lines_fail_the_pass_with_the_counts(tmp_path: Path) -> None:
    lines = (CRITEO_DIR / "train.csv").read_text().splitlines()[:40]
    lines[6] = "garbage"
    lines[20] = "more garbage"
    path = tmp_path / "bad.tsv"
    path.write_text("\n".join(lines) + "\n")
    stream = QueueDataset(8, "criteo")
    stream.set_filelist([path])
    with pytest.raises(DataError) as error:
        list(stream)
    message = str(error.value)
    assert "worker 0: 2 of 40 lines (5.0%)" in message
    assert f"first: {path}:7 has 1 tab-separated fields" in message
    assert "runner.max_malformed_fraction" in message
    lenient = InMemoryDataset(8, "criteo", max_malformed_fraction=0.05)
    lenient.set_filelist([path])
    lenient.load_into_memory()
    assert lenient.get_memory_data_size() == 38
    with pytest.raises(ConfigError, match="max_malformed_fraction"):
        QueueDataset(8, "criteo", max_malformed_fraction=1.5)
    assert math.isclose(QueueDataset(8).max_malformed_fraction, 0.01)


def test_the_worked_examples_of_docs_datasets_parse_as_documented() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "datasets.md").read_text()
    texts = re.findall(r"```text\n(.*?)```", doc, re.S)
    configs = [yaml.safe_load(block)["runner"] for block in
               re.findall(r"```yaml\n(.*?)```", doc, re.S)]
    header, body = texts[0].encode().split(b"\n", 1)
    columns = ColumnsConfig(**configs[0]["columns"])
    parsed = make_parser("csv", columns).parse(chunk(body, "doc.csv", header), strict=True)
    assert parsed.labels.tolist() == [0.0, 1.0, 1.0]
    assert parsed.sparse[0, 1] == hash_feature(1, 'Toy Story, the "original"')
    assert parsed.jagged is not None and parsed.jagged.lengths.tolist() == [[2], [0], [2]]
    np.testing.assert_allclose(parsed.dense[0], [(39 - 38.6) / 13.7, (40 - 40.4) / 12.3],
                               rtol=1e-6)
    demo = SlotParser(SlotFormatConfig(**configs[1]["slots"]))
    assert len(demo.parse(chunk(DEMO.read_bytes()), strict=True)) == 10
    for text, config in ((texts[1], configs[2]), (texts[2], configs[3])):
        options = LibsvmConfig(**config["libsvm"]) if "libsvm" in config else None
        svm = make_parser(config["parser"], options).parse(chunk(text.encode()), strict=True)
        assert svm.labels.tolist() == [1.0, 0.0] and svm.jagged is not None
        assert svm.jagged.weights is not None
        assert svm.jagged.weights.tolist() == [1.0, 0.5, 1.0, 2.5]
