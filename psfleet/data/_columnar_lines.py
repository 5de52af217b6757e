"""The record-by-record path of the ``csv`` parser (:mod:`psfleet.data.columnar`):
fields split by Python's :mod:`csv` module (RFC 4180 quoting, as Arrow's reader on the
fast path; a record may span lines in a quoted field), one malformed-line reason per
bad record, named by the line it starts on. Used for chunks the fast path rejects, so
that every bad record is named; gives the same examples as the fast path.
"""

from __future__ import annotations

import csv
from typing import TYPE_CHECKING

import numpy as np

from psfleet.data._tokens import bags_to_rows
from psfleet.data.criteo import hash_features
from psfleet.data.malformed import RateLimitedWarner
from psfleet.data.records import record_ends
from psfleet.data.types import ParsedChunk, RawChunk

if TYPE_CHECKING:
    from psfleet.data.columnar import ColumnarParser

__all__ = ["parse_lines_slowly", "split_line", "split_records"]

_STRAY_QUOTE = ("a '\"' inside an unquoted field opened quoting, so this record ran over "
                "the next lines up to the next such quote; quote that field (\"5\"\" "
                "screen\") or remove the '\"'")
_UNCLOSED = ("a quoted field is not closed (its record runs to the end of the file); "
             "close the quote, or double a quote that is part of the text (\"\")")


def split_records(payload: bytes) -> list[bytes]:
    """The records of a chunk's payload (without their ``\\n``): cut at line breaks
    outside quotes (:func:`psfleet.data.records.record_ends`); bytes after the last
    one (an unclosed quote) are one more record."""
    ends = record_ends(payload, True).tolist()
    starts = [0, *(end + 1 for end in ends)]
    records = [payload[a:b] for a, b in zip(starts, ends, strict=False)]
    if starts[-1] < len(payload):
        records.append(payload[starts[-1]:])
    return records


def split_line(line: str, delimiter: str) -> tuple[list[str], str | None]:
    """The fields of one record (without its line end; line breaks inside quoted
    fields are kept in them), RFC 4180 quoting with ``"``.

    Returns:
        (fields, None), or ([], reason) when a quoted field is not closed, or the record
        holds a line break outside quotes (a ``"`` inside an unquoted field, which
        :mod:`psfleet.data.records` read as opening a quoted one, ran it over lines).
        A quote inside a field that did not start with one is kept as a character; a
        quoted field followed by more text is joined with it (as Arrow's reader does).
    """
    try:
        rows = list(csv.reader([line], delimiter=delimiter, quotechar='"',
                               doublequote=True, strict=True))
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):
            return [], _UNCLOSED
        try:
            rows = list(csv.reader([line], delimiter=delimiter, quotechar='"',
                                   doublequote=True))
        except csv.Error:
            return [], _STRAY_QUOTE
    return (rows[0] if rows else []), None


def parse_lines_slowly(parser: ColumnarParser, chunk: RawChunk, records: list[bytes],
                       width: int, positions: tuple[int, list[int], list[int], list[int]],
                       strict: bool, warner: RateLimitedWarner) -> ParsedChunk:
    """Parse a text chunk record by record, naming each malformed record.

    Args:
        parser: the csv parser (its config, label rule and key prefixes).
        chunk: the raw chunk (bytes).
        records: its records (:func:`split_records`).
        width: fields per line.
        positions: (label, dense, sparse, multi) column positions.
        strict: raise on the first malformed line.
        warner: where skipped lines are reported.

    Raises:
        DataError: if ``strict`` and a line is malformed (names ``file:line`` and why).
    """
    label, dense, sparse, multi = positions
    config = parser.config
    lines = [record.decode("utf-8", errors="replace") for record in records]
    labels: list[float] = []
    dense_rows: list[list[float]] = []
    raw: list[str] = []
    bag_rows: list[int] = []
    bag_features: list[int] = []
    bag_raw: list[str] = []
    bad: list[tuple[int, str]] = []
    for row, line in enumerate(lines):
        line_no = chunk.line_no(row)
        value: float | None = None
        numbers: list[float] = []
        fields, problem = split_line(line.rstrip("\r"), config.delimiter)
        if problem is None and len(fields) != width:
            problem = f"has {len(fields)} fields, expected {width}"
        if problem is None and label < 0:  # no label column
            value = float("nan")
        elif problem is None:
            value = parser.labels.one(fields[label])
            if value is None:
                problem = (f"label is {fields[label]!r}, expected "
                           f"{parser.labels.describe()}")
        if problem is None:
            try:
                numbers = [float(fields[c]) if fields[c].strip() else 0.0 for c in dense]
            except ValueError:
                problem = "a dense field is not a number: " + repr(
                    [fields[c] for c in dense])
        if problem is not None or value is None:
            bad.append((line_no, problem or "no label"))
            continue
        example = len(labels)
        labels.append(value)
        dense_rows.append(numbers)
        raw.extend(fields[c] for c in sparse)
        for m, column in enumerate(multi):
            items = [item for item in fields[column].split(config.multi_separator) if item]
            bag_rows.extend([example] * len(items))
            bag_features.extend([m] * len(items))
            bag_raw.extend(items)
    warner.report(chunk.source, bad, strict)
    count = len(labels)
    keys = (hash_features(raw, len(sparse)) if raw
            else np.zeros((count, len(sparse)), dtype=np.uint64))
    jagged = None
    if multi:
        low = (hash_features(bag_raw, 1).reshape(-1) & np.uint64((1 << 33) - 1) if bag_raw
               else np.zeros(0, dtype=np.uint64))
        features = np.array(bag_features, dtype=np.int64)
        prefixes = parser.prefixes[len(sparse):]
        jagged = bags_to_rows(np.array(bag_rows, dtype=np.int64), features,
                              low | prefixes[features], count, len(multi))
    dense_array = np.array(dense_rows, dtype=np.float64).reshape(count, len(dense))
    return parser.finish(np.array(labels, dtype=np.float64), dense_array, keys, jagged,
                         len(bad), len(lines))
