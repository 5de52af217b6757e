"""Delimited text (CSV, TSV, space-separated) and Parquet with a declared schema.

The config (:class:`ColumnsConfig`) names the label column, the dense columns and the
sparse columns, by header name or by 0-based position, so a user brings their own
schema without writing code::

    parser: csv
    columns: {delimiter: ",", header: true, label: clicked,
              dense: [price, age], sparse: [user_id, item_id, city]}

- label: ``0``/``1`` (numbers 0.0 / 1.0 accepted).
- dense: numbers; empty / null -> 0.0; ``dense_transform: log1p`` applies
  ``log(1 + max(x, 0))`` (raw counts), ``none`` keeps them.
- sparse: any text (or integers in Parquet); keys as :func:`psfleet.data.criteo.hash_feature`
  with slot = the column's position in ``sparse``: values of up to 8 hex digits are
  read as numbers (decimal ids like ``737395`` included), others hashed (crc32).

Text is split by Arrow's CSV reader (no quoting: a delimiter inside a value is not
supported). A chunk with a malformed line (wrong field count, non-numeric dense or
label) is re-read line by line to name each bad line (rate-limited warnings, or
:class:`~psfleet.errors.DataError` with ``strict``).
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
from pydantic import BaseModel, ConfigDict, field_validator

from psfleet.data.criteo import binary_keys, hash_features, slot_prefixes
from psfleet.data.malformed import RateLimitedWarner
from psfleet.data.parsers import Parser, register_parser
from psfleet.data.types import FeatureSchema, ParsedChunk, RawChunk
from psfleet.errors import ConfigError, DataError

__all__ = ["ColumnsConfig", "ColumnarParser"]

logger = logging.getLogger(__name__)
_warner = RateLimitedWarner(log=logger)

Column = str | int


class ColumnsConfig(BaseModel):
    """Which columns hold the label, dense and sparse features (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: Column
    dense: list[Column] = []
    sparse: list[Column]
    delimiter: str = ","
    header: bool = True
    dense_transform: Literal["none", "log1p"] = "none"

    @field_validator("delimiter")
    @classmethod
    def _one_char(cls, value: str) -> str:
        if len(value) != 1 or value in "\n\r":
            raise ValueError("must be one character other than a line break")
        return value

    @field_validator("sparse")
    @classmethod
    def _some_sparse(cls, value: list[Column]) -> list[Column]:
        if not value:
            raise ValueError("name at least one sparse column")
        return value


class ColumnarParser:
    """Parser of delimited text (``kind='text'``) or Parquet (``kind='parquet'``).

    Args:
        config: the columns.
        kind: ``text`` for CSV/TSV, ``parquet`` for Parquet files.

    Raises:
        ConfigError: (when parsing) a named column is not in the header / schema, or a
            position is past the last column; names the column and lists the known ones.
    """

    def __init__(self, config: ColumnsConfig, kind: Literal["text", "parquet"]) -> None:
        self.config = config
        self.kind: Literal["text", "parquet"] = kind
        self.header = config.header and kind == "text"
        self.schema = FeatureSchema(dense=tuple(map(str, config.dense)),
                                    sparse=tuple(map(str, config.sparse)))
        self.num_dense = len(config.dense)
        self.num_slots = len(config.sparse)
        self._prefixes = slot_prefixes(self.num_slots)

    # -- column resolution ------------------------------------------------------------
    def _positions(self, names: list[str] | None, width: int, source: str
                   ) -> tuple[int, list[int], list[int]]:
        def find(column: Column) -> int:
            if isinstance(column, int):
                if not 0 <= column < width:
                    raise ConfigError(f"columns: position {column} is past the last column "
                                      f"({width} columns) of {source}")
                return column
            if names is None:
                raise ConfigError(f"columns: {column!r} is a name but {source} has no header;"
                                  " set columns.header: true or use 0-based positions")
            if column not in names:
                raise ConfigError(f"columns: {column!r} is not a column of {source}; its "
                                  f"columns are {names}")
            return names.index(column)

        config = self.config
        return find(config.label), [find(c) for c in config.dense], [
            find(c) for c in config.sparse]

    # -- parsing ----------------------------------------------------------------------
    def parse(self, chunk: RawChunk, strict: bool) -> ParsedChunk:
        if isinstance(chunk.payload, pa.Table):
            return self._parse_table(chunk.payload, chunk, strict)
        names = (chunk.header.decode("utf-8", errors="replace").split(self.config.delimiter)
                 if chunk.header is not None else None)
        if not chunk.payload:
            return self._empty()
        width = len(names) if names is not None else chunk.payload.split(b"\n", 1)[0].count(
            self.config.delimiter.encode()) + 1
        label, dense, sparse = self._positions(names, width, chunk.source)
        table = self._read_text(chunk.payload, width)
        if table is not None:
            result = self._convert(table, label, dense, sparse, chunk, strict)
            if result is not None:
                return result
        return self._parse_slow(chunk, width, label, dense, sparse, strict)

    def _empty(self) -> ParsedChunk:
        return ParsedChunk.empty(self.schema)

    def _read_text(self, data: bytes, width: int) -> pa.Table | None:
        names = [f"f{i}" for i in range(width)]
        try:
            return pa_csv.read_csv(
                pa.py_buffer(data),
                read_options=pa_csv.ReadOptions(column_names=names, use_threads=False,
                                                 block_size=max(1 << 20, len(data) + 1)),
                parse_options=pa_csv.ParseOptions(delimiter=self.config.delimiter,
                                                  quote_char=False, ignore_empty_lines=False),
                convert_options=pa_csv.ConvertOptions(
                    column_types={n: pa.binary() for n in names}, strings_can_be_null=False))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None

    def _numbers(self, array: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.float64] | None:
        """Float values of a column (empty / null -> 0); None if one is not a number."""
        if pa.types.is_binary(array.type) or pa.types.is_string(array.type):
            array = pc.cast(array, pa.string())
            array = pc.if_else(pc.equal(pc.utf8_trim_whitespace(array), ""), None, array)
        try:
            values = pc.cast(array, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        return np.asarray(pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False),
                          dtype=np.float64)

    def _finish(self, labels: npt.NDArray[np.float64], dense: npt.NDArray[np.float64],
                sparse: npt.NDArray[np.uint64], lines: int) -> ParsedChunk:
        if self.config.dense_transform == "log1p":
            dense = np.log1p(np.maximum(dense, 0.0))
        return ParsedChunk(labels.astype(np.float32), dense.astype(np.float32), sparse, 0,
                           lines)

    def _convert(self, table: pa.Table, label: int, dense: list[int], sparse: list[int],
                 chunk: RawChunk, strict: bool) -> ParsedChunk | None:
        count = table.num_rows
        labels = self._numbers(table.column(label))
        if labels is None or not np.all((labels == 0.0) | (labels == 1.0)):
            return None
        dense_values = np.zeros((count, len(dense)), dtype=np.float64)
        for i, column in enumerate(dense):
            values = self._numbers(table.column(column))
            if values is None:
                return None
            dense_values[:, i] = values
        keys = np.empty((count, len(sparse)), dtype=np.uint64)
        for i, column in enumerate(sparse):
            keys[:, i] = binary_keys(table.column(column), self._prefixes[i])
        return self._finish(labels, dense_values, keys, count)

    def _parse_table(self, table: pa.Table, chunk: RawChunk, strict: bool) -> ParsedChunk:
        label, dense, sparse = self._positions(table.column_names, table.num_columns,
                                               chunk.source)
        count = table.num_rows
        labels = self._numbers(table.column(label))
        problem = None
        if labels is None or not np.all((labels == 0.0) | (labels == 1.0)):
            problem = f"label column {self.config.label!r} holds values other than 0 and 1"
        dense_values = np.zeros((count, len(dense)), dtype=np.float64)
        for i, column in enumerate(dense):
            values = self._numbers(table.column(column))
            if values is None:
                problem = f"dense column {self.config.dense[i]!r} is not numeric"
                break
            dense_values[:, i] = values
        if problem is not None or labels is None:
            raise DataError(f"{chunk.source}: rows {chunk.first_line_no}..: {problem}; fix "
                            "the Parquet file's column types or the columns config")
        keys = np.empty((count, len(sparse)), dtype=np.uint64)
        for i, column in enumerate(sparse):
            text = pc.cast(pc.fill_null(pc.cast(table.column(column), pa.string()), ""),
                           pa.binary())
            keys[:, i] = binary_keys(text, self._prefixes[i])
        return self._finish(labels, dense_values, keys, count)

    def _parse_slow(self, chunk: RawChunk, width: int, label: int, dense: list[int],
                    sparse: list[int], strict: bool) -> ParsedChunk:
        """Line by line, to name each malformed line."""
        assert isinstance(chunk.payload, bytes)  # noqa: S101 (only called for text)
        lines = chunk.payload.decode("utf-8", errors="replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        labels: list[float] = []
        dense_rows: list[list[float]] = []
        raw: list[str] = []
        bad: list[tuple[int, str]] = []
        for row, line in enumerate(lines):
            line_no = chunk.first_line_no + row * chunk.line_step
            fields = line.rstrip("\r").split(self.config.delimiter)
            if len(fields) != width:
                bad.append((line_no, f"has {len(fields)} fields, expected {width}"))
                continue
            try:
                value = float(fields[label])
                numbers = [float(fields[c]) if fields[c].strip() else 0.0 for c in dense]
            except ValueError:
                bad.append((line_no, "a label or dense field is not a number"))
                continue
            if value not in (0.0, 1.0):
                bad.append((line_no, f"label is {fields[label]!r}, expected 0 or 1"))
                continue
            labels.append(value)
            dense_rows.append(numbers)
            raw.extend(fields[c] for c in sparse)
        if bad:
            if strict:
                line_no, reason = bad[0]
                raise DataError(f"{chunk.source}:{line_no}: malformed line: {reason}. Fix or "
                                "remove the line, or set strict: false to skip it")
            for line_no, reason in bad:
                _warner.warn(chunk.source, line_no, reason)
        keys = (hash_features(raw, self.num_slots) if raw
                else np.zeros((0, self.num_slots), dtype=np.uint64))
        dense_array = np.array(dense_rows, dtype=np.float64).reshape(len(labels), self.num_dense)
        result = self._finish(np.array(labels), dense_array, keys, len(lines))
        return ParsedChunk(result.labels, result.dense, result.sparse, len(bad), len(lines))


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
