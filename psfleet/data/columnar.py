"""Delimited text (CSV, TSV, space-separated) and Parquet with a declared schema.

The config (:class:`ColumnsConfig`) names the label column, the dense columns, the
single-valued sparse columns and the multi-valued columns, by header name or by 0-based
position, so a user brings their own schema without writing code::

    parser: csv
    columns: {delimiter: ",", header: true, label: income, label_positive: ">50K",
              label_negative: ["<=50K"], dense: [age, hours], dense_transform: log1p,
              sparse: [workclass, title], multi: [genres], multi_separator: "|"}

- label: numbers ``0`` / ``1`` by default; text labels with ``label_positive`` (and
  optionally ``label_negative``) or ``label_map`` (:mod:`psfleet.data._labels`). A label
  that cannot be mapped is a malformed line naming ``file:line`` and the value.
  ``label: null`` reads files without a label (every example's label is NaN): what
  ``psfleet predict`` uses for a file whose header or schema lacks the label column
  (:func:`has_label_column`); training refuses it.
- dense: numbers; empty / null -> 0.0; ``dense_transform``: ``none``, ``log1p`` or
  ``standardize`` (with ``dense_mean`` / ``dense_std``), :mod:`psfleet.data._dense`.
- sparse: any text (or integers in Parquet); keys as :func:`psfleet.data.criteo.hash_feature`
  with slot = the column's position in ``sparse``: values of up to 8 hex digits are
  read as numbers (decimal ids like ``737395`` included), others hashed (crc32).
- multi: multi-valued columns, slots after the sparse ones (slot = ``len(sparse)`` +
  position in ``multi``): text split at ``multi_separator`` (``Action|Comedy``; empty
  items and an empty cell give no id: an empty bag), or Parquet list columns
  (``list<string>``, ``list<int>``; a null list is empty). Keys as for sparse values.

Text follows RFC 4180 quoting (``"``): a quoted field may hold the delimiter, the
separator, doubled quotes (``"say ""hi"", then go"``) and line breaks (free text as
pandas and :mod:`csv` write it). Records end at a line break outside quotes: the
readers cut files, chunks and workers' shares at record ends (``quoted_records``,
:mod:`psfleet.data.records`), and a record is named by the file line it starts on.
Arrow's CSV reader splits the fields (``newlines_in_values`` when a chunk has records
spanning lines). A quote that is never closed runs its record to the end of the file,
which is then one malformed record (``a quoted field is not closed``). A chunk with a
malformed record (wrong field count, an unclosed quote, non-numeric dense, a label that
cannot be mapped) is re-read record by record with Python's :mod:`csv` module, which
gives the same fields, to name each bad one (rate-limited warnings, or
:class:`~psfleet.errors.DataError` with ``strict``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from psfleet.data._columnar_lines import parse_lines_slowly, split_line, split_records
from psfleet.data._dense import DenseTransform, check_dense_transform, transform_dense
from psfleet.data._labels import LabelRule
from psfleet.data._tokens import bags_to_rows
from psfleet.data.compression import open_data_file
from psfleet.data.criteo import binary_keys, slot_prefixes
from psfleet.data.jagged_rows import JaggedRows
from psfleet.data.malformed import RateLimitedWarner
from psfleet.data.parsers import Parser, register_parser
from psfleet.data.types import FeatureSchema, ParsedChunk, RawChunk
from psfleet.errors import ConfigError, DataError, ParserConfigError

__all__ = ["ColumnsConfig", "ColumnarParser", "has_label_column"]

logger = logging.getLogger(__name__)
_warner = RateLimitedWarner(log=logger)

Column = str | int
_QUOTE = b'"'


class ColumnsConfig(BaseModel):
    """Which columns hold the label, dense, sparse and multi-valued features, and how to
    read them (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: Column | None
    dense: list[Column] = []
    sparse: list[Column] = []
    multi: list[Column] = []
    multi_separator: str = "|"
    delimiter: str = ","
    header: bool = True
    dense_transform: DenseTransform = "none"
    dense_mean: list[float] | None = None
    dense_std: list[float] | None = None
    label_positive: str | None = None
    label_negative: list[str] | None = None
    label_map: dict[str, int] | None = None

    @field_validator("delimiter", "multi_separator")
    @classmethod
    def _one_char(cls, value: str) -> str:
        if len(value) != 1 or value in "\n\r\"":
            raise ValueError("must be one character other than a line break or '\"'")
        return value

    @field_validator("label_map")
    @classmethod
    def _zero_one(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is not None and (not value or any(v not in (0, 1) for v in value.values())):
            raise ValueError("map each label text to 0 or 1 (at least one entry)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ColumnsConfig:
        if not self.sparse and not self.multi:
            raise ValueError("sparse / multi: name at least one sparse or multi-valued column")
        features = [*self.sparse, *self.multi]
        repeated = sorted({str(c) for c in features if features.count(c) > 1})
        if repeated:
            raise ValueError(f"sparse / multi: columns {repeated} are named twice")
        if self.multi and self.multi_separator == self.delimiter:
            raise ValueError(f"multi_separator: {self.multi_separator!r} is also the "
                             "delimiter; choose another separator")
        if self.label_map is not None and self.label_positive is not None:
            raise ValueError("label_map and label_positive: set one of them, not both")
        if self.label_negative is not None and self.label_positive is None:
            raise ValueError("label_negative: only used with label_positive")
        check_dense_transform(self.dense_transform, self.dense_mean, self.dense_std,
                              len(self.dense))
        return self


class ColumnarParser:
    """Parser of delimited text (``kind='text'``) or Parquet (``kind='parquet'``).

    Args:
        config: the columns.
        kind: ``text`` for CSV/TSV, ``parquet`` for Parquet files.

    Raises:
        ParserConfigError: (when parsing) a named column is not in the header / schema, or a
            position is past the last column; names the column and lists the known ones.
    """

    def __init__(self, config: ColumnsConfig, kind: Literal["text", "parquet"]) -> None:
        self.config = config
        self.kind: Literal["text", "parquet"] = kind
        self.header = config.header and kind == "text"
        self.quoted_records = kind == "text"  # a quoted field may hold line breaks
        self.schema = FeatureSchema(dense=tuple(map(str, config.dense)),
                                    sparse=tuple(map(str, config.sparse)),
                                    multi=tuple(map(str, config.multi)))
        self.num_dense = len(config.dense)
        self.num_slots = len(config.sparse)
        self.num_multi = len(config.multi)
        self.prefixes = slot_prefixes(self.num_slots + self.num_multi)  # keys' slot bits
        self.labels = LabelRule(config.label_positive, config.label_negative, config.label_map)

    # -- column resolution ------------------------------------------------------------
    def _positions(self, names: list[str] | None, width: int, source: str
                   ) -> tuple[int, list[int], list[int], list[int]]:
        def find(column: Column | None, key: str) -> int:
            if column is None:  # no label column: labels are NaN
                return -1
            if isinstance(column, int):
                if not 0 <= column < width:
                    raise ParserConfigError(f"columns.{key}: position {column} is past the "
                                            f"last column ({width} columns) of {source}")
                return column
            if names is None:
                raise ParserConfigError(f"columns.{key}: {column!r} is a name but {source} "
                                        "has no header; set columns.header: true or use "
                                        "0-based positions")
            if column not in names:
                raise ParserConfigError(f"columns.{key}: {column!r} is not a column of "
                                        f"{source}; its columns are {names}")
            return names.index(column)

        config = self.config
        return (find(config.label, "label"),
                [find(c, f"dense[{i}]") for i, c in enumerate(config.dense)],
                [find(c, f"sparse[{i}]") for i, c in enumerate(config.sparse)],
                [find(c, f"multi[{i}]") for i, c in enumerate(config.multi)])

    # -- parsing ----------------------------------------------------------------------
    def parse(self, chunk: RawChunk, strict: bool) -> ParsedChunk:
        if isinstance(chunk.payload, pa.Table):
            return self._parse_table(chunk.payload, chunk, strict)
        delimiter = self.config.delimiter
        names = (split_line(chunk.header.decode("utf-8", errors="replace").rstrip("\r"),
                            delimiter)[0] if chunk.header is not None else None)
        if not chunk.payload:
            return ParsedChunk.empty(self.schema)
        records = split_records(chunk.payload)
        if names is not None:
            width = len(names)
        else:
            first = records[0].decode("utf-8", errors="replace")
            width = len(split_line(first.rstrip("\r"), delimiter)[0])
        positions = self._positions(names, width, chunk.source)
        if chunk.payload.count(_QUOTE) % 2 == 0:  # every quoted field is closed
            spans = len(records) != chunk.payload.count(b"\n")
            table = self._read_text(chunk.payload, width, spans)
            if table is not None and table.num_rows == len(records):
                result = self._convert(table, *positions)
                if result is not None:
                    return result
        return parse_lines_slowly(self, chunk, records, width, positions, strict, _warner)

    def _read_text(self, data: bytes, width: int, spans: bool) -> pa.Table | None:
        names = [f"f{i}" for i in range(width)]
        try:
            return pa_csv.read_csv(
                pa.py_buffer(data),
                read_options=pa_csv.ReadOptions(column_names=names, use_threads=False,
                                                 block_size=max(1 << 20, len(data) + 1)),
                parse_options=pa_csv.ParseOptions(delimiter=self.config.delimiter,
                                                  quote_char='"', double_quote=True,
                                                  escape_char=False,
                                                  newlines_in_values=spans,
                                                  ignore_empty_lines=False),
                convert_options=pa_csv.ConvertOptions(
                    column_types={n: pa.binary() for n in names}, strings_can_be_null=False))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None

    @staticmethod
    def _numbers(array: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.float64] | None:
        """Float values of a column (empty / null -> 0); None if one is not a number."""
        if pa.types.is_binary(array.type) or pa.types.is_string(array.type):
            try:
                array = pc.cast(array, pa.string())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None
            array = pc.if_else(pc.equal(pc.utf8_trim_whitespace(array), ""), None, array)
        try:
            values = pc.cast(array, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        return np.asarray(pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False),
                          dtype=np.float64)

    def _label_values(self, table: pa.Table, label: int
                      ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]] | None:
        """(labels [N], valid [N]) of the label column (position ``label``; -1: no label
        column, every label NaN), or None (read it line by line)."""
        if label < 0:
            return (np.full(table.num_rows, np.nan), np.ones(table.num_rows, dtype=np.bool_))
        array = table.column(label)
        if self.labels.numeric:
            values = self._numbers(array)
            if values is None:
                return None
            return values, (values == 0.0) | (values == 1.0)
        if not (pa.types.is_binary(array.type) or pa.types.is_string(array.type)):
            array = pc.cast(array, pa.string())
        return self.labels.column(array)

    def finish(self, labels: npt.NDArray[np.float64], dense: npt.NDArray[np.float64],
               sparse: npt.NDArray[np.uint64], jagged: JaggedRows | None, malformed: int,
               lines: int) -> ParsedChunk:
        """The ParsedChunk of converted columns (applies the dense transform)."""
        config = self.config
        return ParsedChunk(labels.astype(np.float32),
                           transform_dense(dense, config.dense_transform, config.dense_mean,
                                           config.dense_std),
                           sparse, malformed, lines, jagged)

    def _convert(self, table: pa.Table, label: int, dense: list[int], sparse: list[int],
                 multi: list[int]) -> ParsedChunk | None:
        count = table.num_rows
        labels = self._label_values(table, label)
        if labels is None or not labels[1].all():
            return None
        dense_values = np.zeros((count, len(dense)), dtype=np.float64)
        for i, column in enumerate(dense):
            values = self._numbers(table.column(column))
            if values is None:
                return None
            dense_values[:, i] = values
        keys = np.empty((count, len(sparse)), dtype=np.uint64)
        for i, column in enumerate(sparse):
            keys[:, i] = binary_keys(table.column(column), self.prefixes[i])
        jagged = self._multi_columns(table, multi)
        return self.finish(labels[0], dense_values, keys, jagged, 0, count)

    def _multi_columns(self, table: pa.Table, multi: list[int]) -> JaggedRows | None:
        """The multi-valued columns as example-major bags (vectorised with Arrow)."""
        if not multi:
            return None
        count = table.num_rows
        rows, features, keys = [], [], []
        for m, column in enumerate(multi):
            array = table.column(column)
            if isinstance(array, pa.ChunkedArray):
                array = array.combine_chunks()
            if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
                if not (pa.types.is_binary(array.type) or pa.types.is_string(array.type)):
                    array = pc.cast(array, pa.string())
                array = pc.split_pattern(pc.fill_null(array, ""), self.config.multi_separator)
            lengths = np.asarray(pc.fill_null(pc.list_value_length(array), 0).to_numpy(
                zero_copy_only=False), dtype=np.int64)
            items = pc.list_flatten(array)
            if not (pa.types.is_binary(items.type) or pa.types.is_string(items.type)):
                items = pc.cast(items, pa.string())
            items = pc.cast(pc.fill_null(items, ""), pa.binary())
            keep = np.asarray(pc.binary_length(items).to_numpy(zero_copy_only=False)) > 0
            row = np.repeat(np.arange(count, dtype=np.int64), lengths)[keep]
            rows.append(row)
            features.append(np.full(len(row), m, dtype=np.int64))
            keys.append(binary_keys(items.filter(pa.array(keep)),
                                    self.prefixes[self.num_slots + m]))
        return bags_to_rows(np.concatenate(rows), np.concatenate(features),
                            np.concatenate(keys), count, len(multi))

    def _parse_table(self, table: pa.Table, chunk: RawChunk, strict: bool) -> ParsedChunk:
        label, dense, sparse, multi = self._positions(table.column_names, table.num_columns,
                                                      chunk.source)
        count = table.num_rows
        labels = self._label_values(table, label)
        problem = None
        if labels is None:
            problem = f"label column {self.config.label!r} is not numeric or text"
        dense_values = np.zeros((count, len(dense)), dtype=np.float64)
        for i, column in enumerate(dense):
            values = self._numbers(table.column(column))
            if values is None:
                problem = f"dense column {self.config.dense[i]!r} is not numeric"
                break
            dense_values[:, i] = values
        if problem is not None or labels is None:
            raise DataError(f"{chunk.source}: rows {chunk.line_no(0)}..: {problem}; fix "
                            "the Parquet file's column types or the columns config")
        keys = np.empty((count, len(sparse)), dtype=np.uint64)
        for i, column in enumerate(sparse):
            text = pc.cast(pc.fill_null(pc.cast(table.column(column), pa.string()), ""),
                           pa.binary())
            keys[:, i] = binary_keys(text, self.prefixes[i])
        jagged = self._multi_columns(table, multi)
        values, good = labels
        bad = np.flatnonzero(~good)
        if len(bad):
            raw = table.column(label).take(pa.array(bad)).to_pylist()
            reasons = [(chunk.line_no(int(row)),
                        f"label is {value!r}, expected {self.labels.describe()}")
                       for row, value in zip(bad.tolist(), raw, strict=True)]
            if strict:
                line_no, reason = reasons[0]
                raise DataError(f"{chunk.source}: row {line_no}: {reason}. Fix the row or "
                                "the label keys, or set strict: false to skip it")
            for line_no, reason in reasons:
                _warner.warn(chunk.source, line_no, f"(row) {reason}")
            index = np.flatnonzero(good)
            values, dense_values, keys = values[index], dense_values[index], keys[index]
            jagged = None if jagged is None else jagged.take(index)
        return self.finish(values, dense_values, keys, jagged, len(bad), count)


def has_label_column(path: Path, config: ColumnsConfig, kind: Literal["text", "parquet"]
                     ) -> bool:
    """Whether the file at ``path`` holds ``config.label``: a named label must be in the
    header (text with ``header: true``) or the Parquet schema; a positional label (or
    text without a header) cannot be told apart from a feature, so it counts as present.

    Raises:
        DataError: the file cannot be opened or its header / schema read (names it).
    """
    label = config.label
    if label is None:
        return False
    if isinstance(label, int):
        return True
    if kind == "parquet":
        try:
            return label in pq.read_schema(path).names
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataError(f"data file {str(path)!r}: its Parquet schema cannot be read: "
                            f"{exc}") from None
    if not config.header:
        return True
    with open_data_file(path) as stream:
        first = stream.readline().decode("utf-8", errors="replace").rstrip("\r\n")
    return label in split_line(first, config.delimiter)[0]


def _make(kind: Literal["text", "parquet"]) -> object:
    def factory(options: object) -> Parser:
        if not isinstance(options, ColumnsConfig):
            name = "csv" if kind == "text" else "parquet"
            raise ConfigError(f"parser {name!r} needs runner.columns (label, dense, sparse "
                              "columns)")
        return ColumnarParser(options, kind)

    return factory


register_parser("csv", _make("text"))  # type: ignore[arg-type]
register_parser("parquet", _make("parquet"))  # type: ignore[arg-type]
