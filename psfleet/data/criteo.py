"""Parser of the raw Criteo Kaggle TSV layout.

Each line is 40 TAB-separated fields (no header)::

    label \\t I1 .. I13 \\t C1 .. C26

- ``label``: ``0`` or ``1`` (click).
- ``I1..I13``: integers (``-`` allowed, ASCII digits only); empty means missing.
- ``C1..C26``: categorical values, 8 lower-case hex digits; empty means missing.

This is the layout PaddleRec's Criteo readers consume (``line.rstrip('\\n').split('\\t')``;
column 0 label, 1..13 dense, 14..39 categorical).

Dense transform
    ``log(1 + max(x, 0))`` as float32, missing -> 0. This is the common Criteo DNN
    preprocessing (log-transform of counts, as in the Kaggle winners' and DLRM's
    ``log(x + 1)``). PaddleRec's criteo reader instead min-max normalises with fixed
    per-column ranges; we log-transform because it needs no data-set statistics.

Feature keys (uint64), exact and collision-free for Criteo's values
    For categorical slot ``s`` (0 for C1 .. 25 for C26) and raw value ``v``::

        1..8 hex digits : ((s + 1) << 33) | int(v, 16)
        empty (missing) : ((s + 1) << 33) | (1 << 32)
        anything else   : ((s + 1) << 33) | (1 << 32) | (1 + crc31(v))

    where ``crc31(v) = zlib.crc32(v.encode("utf-8")) & 0x7FFFFFFF``. Bits 0..31 hold
    the 32-bit value, bit 32 marks "not a hex value", bits 33.. hold ``s + 1`` (so no
    key is 0 and slots never share a key). Hex values are read as numbers: case and
    leading zeros do not matter. Generic strings may collide with each other (31-bit
    hash) but never with hex values, missing values or other slots. Keys never depend
    on Python's salted ``hash()`` and are identical in every process and run.

Malformed lines (wrong field count, a non-integer I field, a label other than 0/1, a
NUL character) are counted and skipped with a rate-limited warning naming ``file:line``
(at most one per :data:`WARN_INTERVAL_S` per file, with the number suppressed since);
``strict=True`` raises :class:`~psfleet.errors.DataError` instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pa_csv

from psfleet.data._fields import (
    MAX_HEX_CHARS,
    MAX_INT_CHARS,
    NOT_HEX_BIT,
    SLOT_SHIFT,
    binary_matrix,
    binary_words,
    generic_low_bits,
    hex_low_bits,
    hex_word_low_bits,
    int_fields,
    int_word_values,
    word_chars,
)
from psfleet.data._ids import generic_low_bits_at
from psfleet.data.malformed import WARN_INTERVAL_S, RateLimitedWarner
from psfleet.data.types import ParsedChunk
from psfleet.errors import ConfigError, DataError

__all__ = [
    "NUM_DENSE",
    "NUM_SLOTS",
    "NUM_FIELDS",
    "WARN_INTERVAL_S",
    "binary_keys",
    "ParsedChunk",
    "hash_feature",
    "hash_features",
    "parse_criteo_bytes",
    "parse_lines",
    "slot_prefixes",
]

logger = logging.getLogger(__name__)

NUM_DENSE = 13
NUM_SLOTS = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SLOTS

_MAX_SLOT = (1 << (64 - SLOT_SHIFT)) - 2  # (slot + 1) << 33 must fit in 64 bits


def _slot_prefix(slot: int) -> int:
    if not 0 <= slot <= _MAX_SLOT:
        raise ConfigError(f"slot: {slot!r} is out of range; allowed 0..{_MAX_SLOT}")
    return (slot + 1) << SLOT_SHIFT


def slot_prefixes(num_slots: int) -> npt.NDArray[np.uint64]:
    """``(slot + 1) << 33`` for slots ``0 .. num_slots-1`` (ndarray[num_slots], uint64)."""
    return np.array([_slot_prefix(s) for s in range(num_slots)], dtype=np.uint64)


def _is_hex(raw: str) -> bool:
    return 1 <= len(raw) <= MAX_HEX_CHARS and all(c in "0123456789abcdefABCDEF" for c in raw)


def hash_feature(slot: int, raw: str) -> int:
    """Return the uint64 feature key of one categorical value (module docstring scheme).

    Args:
        slot: categorical slot index, 0 for C1 .. 25 for C26 (any 0..2**31-2 works).
        raw: the raw field text; ``""`` means missing.

    Returns:
        The key as a Python int in ``[0, 2**64)``.

    Raises:
        ConfigError: if ``slot`` is out of range.
    """
    prefix = _slot_prefix(slot)
    if raw == "":
        return prefix | NOT_HEX_BIT
    if _is_hex(raw):
        return prefix | int(raw, 16)
    return prefix | generic_low_bits(raw)


def hash_features(values: Sequence[str], num_slots: int = NUM_SLOTS) -> npt.NDArray[np.uint64]:
    """Vectorised :func:`hash_feature` over a row-major table of raw values.

    Args:
        values: ``N * num_slots`` raw strings, row-major (``values[r * num_slots + s]``
            is slot ``s`` of row ``r``). Must not contain NUL characters.
        num_slots: slots per row.

    Returns:
        ndarray[N, num_slots], uint64: the keys, equal to :func:`hash_feature` per value.

    Raises:
        ConfigError: if ``len(values)`` is not a multiple of ``num_slots``.
    """
    if num_slots < 1 or len(values) % num_slots:
        raise ConfigError(
            f"num_slots: {num_slots!r} must be >= 1 and divide len(values) = {len(values)}"
        )
    count = len(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=count)
    chars = np.array(values, dtype=f"<U{MAX_HEX_CHARS}").view(np.uint32)
    low, is_hex = hex_low_bits(chars.reshape(count, MAX_HEX_CHARS), lengths)
    for index in np.flatnonzero(~is_hex & (lengths > 0)).tolist():
        low[index] = generic_low_bits(values[index])
    return (low.reshape(-1, num_slots) | slot_prefixes(num_slots)).astype(np.uint64)


def _parse_dense(
    values: Sequence[str],
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """Parse and transform I fields; returns (log1p(max(x, 0)) [M], invalid [M])."""
    count = len(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=count)
    width = max(1, min(int(lengths.max(initial=0)), MAX_INT_CHARS))
    chars = np.array(values, dtype=f"<U{width}").view(np.uint32).reshape(count, width)
    value, valid = int_fields(chars, lengths)
    return np.log1p(np.maximum(value, 0.0)).astype(np.float32), ~valid


class _RateLimitedWarner(RateLimitedWarner):
    """The malformed-line warner of this module (logs to ``psfleet.data.criteo``)."""

    def __init__(self, interval_s: float = WARN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(interval_s, clock, logger)


_warner = _RateLimitedWarner()


def parse_lines(
    lines: Iterable[str],
    source: str,
    first_line_no: int = 1,
    *,
    line_step: int = 1,
    strict: bool = False,
) -> ParsedChunk:
    """Parse raw Criteo lines into label, dense and sparse arrays.

    Blocks; thread safe. One Python step per line, the fields are converted with numpy.

    Args:
        lines: the lines, with or without their trailing ``\\n`` / ``\\r\\n``.
        source: file name used in messages (``source:line``).
        first_line_no: 1-based line number of the first line, for messages.
        line_step: line-number distance between consecutive lines (a worker reading
            every ``worker_num``-th line passes ``worker_num``).
        strict: raise on the first malformed line instead of skipping it.

    Returns:
        The well-formed lines' arrays, in input order, and the count of skipped lines.

    Raises:
        DataError: if ``strict`` and a line is malformed (names ``source:line`` and why).
    """
    labels: list[float] = []
    dense_raw: list[str] = []
    sparse_raw: list[str] = []
    line_nos: list[int] = []
    bad: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        line_no = first_line_no + index * line_step
        fields = line.rstrip("\r\n").split("\t")
        label = fields[0]
        if len(fields) != NUM_FIELDS:
            bad.append(
                (
                    line_no,
                    f"has {len(fields)} tab-separated fields, expected "
                    f"{NUM_FIELDS} (label, I1..I13, C1..C26)",
                )
            )
        elif label != "0" and label != "1":
            bad.append((line_no, f"label is {label!r}, expected '0' or '1'"))
        elif "\x00" in line:
            bad.append((line_no, "contains a NUL character"))
        else:
            labels.append(1.0 if label == "1" else 0.0)
            dense_raw.extend(fields[1 : 1 + NUM_DENSE])
            sparse_raw.extend(fields[1 + NUM_DENSE :])
            line_nos.append(line_no)

    dense, dense_invalid = _parse_dense(dense_raw)
    bad_rows = dense_invalid.reshape(-1, NUM_DENSE)
    keep = ~bad_rows.any(axis=1)
    for row in np.flatnonzero(~keep).tolist():
        column = int(np.argmax(bad_rows[row]))
        value = dense_raw[row * NUM_DENSE + column]
        bad.append((line_nos[row], f"I{column + 1} is {value!r}, expected an integer or empty"))

    if bad:
        bad.sort()
        if strict:
            line_no, reason = bad[0]
            raise DataError(
                f"{source}:{line_no}: malformed Criteo line: {reason}. Fix or remove the "
                "line, or read with strict=False to skip malformed lines"
            )
        for line_no, reason in bad:
            _warner.warn(source, line_no, reason)

    sparse = hash_features(sparse_raw, NUM_SLOTS)
    return ParsedChunk(
        labels=np.asarray(labels, dtype=np.float32)[keep],
        dense=dense.reshape(-1, NUM_DENSE)[keep],
        sparse=sparse[keep],
        malformed=len(bad),
        lines=len(labels) + len(bad) - int((~keep).sum()),
    )


_COLUMN_NAMES = [f"f{i}" for i in range(NUM_FIELDS)]
_ARROW_PARSE = pa_csv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                                   double_quote=False, newlines_in_values=False,
                                   ignore_empty_lines=False)
_ARROW_CONVERT = pa_csv.ConvertOptions(
    column_types={name: pa.binary() for name in _COLUMN_NAMES}, strings_can_be_null=False)


def _arrow_fields(data: bytes) -> pa.Table | None:
    """All 40 fields of every line as binary columns; None if a line is not 40 fields."""
    read = pa_csv.ReadOptions(column_names=_COLUMN_NAMES, use_threads=False,
                              block_size=max(1 << 20, len(data) + 1))
    try:
        return pa_csv.read_csv(pa.py_buffer(data), read_options=read,
                               parse_options=_ARROW_PARSE, convert_options=_ARROW_CONVERT)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def parse_criteo_bytes(
    data: bytes,
    source: str,
    first_line_no: int = 1,
    *,
    line_step: int = 1,
    strict: bool = False,
) -> ParsedChunk:
    """Parse raw Criteo lines given as bytes; same result as :func:`parse_lines`.

    The fields are split by Arrow's CSV reader (C++, releases the GIL) and converted
    with numpy, so several threads can parse chunks in parallel. A chunk holding any
    malformed line (or a NUL byte, or a ``\\r`` that is not part of a line ending) is
    handed to :func:`parse_lines` instead, which names each bad line; so results,
    warnings and errors are those of :func:`parse_lines` on the decoded text.

    Args:
        data: whole lines, UTF-8, ``\\n``-separated (a trailing ``\\n`` is optional).
        source: file name used in messages (``source:line``).
        first_line_no: 1-based line number of the first line, for messages.
        line_step: line-number distance between consecutive lines.
        strict: raise on the first malformed line instead of skipping it.

    Returns:
        The well-formed lines' arrays in input order, the malformed count and the
        number of lines.

    Raises:
        DataError: if ``strict`` and a line is malformed (names ``source:line`` and why).
    """
    table = None if b"\x00" in data or b"\r" in data else _arrow_fields(data)
    if table is not None and table.num_rows:
        chunk = _convert_fields(table)
        if chunk is not None:
            return chunk
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return parse_lines(lines, source, first_line_no, line_step=line_step, strict=strict)


def binary_keys(array: pa.Array | pa.ChunkedArray, prefix: np.uint64
                ) -> npt.NDArray[np.uint64]:
    """Feature keys (ndarray[M], uint64) of the values of one Arrow binary column of one
    slot, as :func:`hash_feature` (``prefix`` = ``slot_prefixes(n)[slot]``)."""
    words, lengths, _ = binary_words(array)
    low, is_hex = hex_word_low_bits(words, lengths)
    todo = np.flatnonzero(~is_hex & (lengths > 0))
    if len(todo):
        low[todo] = _generic_keys(array, todo)
    return (low | prefix).astype(np.uint64)


def _generic_keys(array: pa.Array | pa.ChunkedArray, index: npt.NDArray[np.int64]
                  ) -> npt.NDArray[np.uint64]:
    """:func:`generic_low_bits` of values ``index`` of a binary column: vectorised
    (:func:`generic_low_bits_at`) when the column is valid UTF-8, else one by one on the
    text decoded with replacement characters."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    try:
        array.cast(pa.string())  # validates UTF-8
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return np.array([generic_low_bits(_text(array[i].as_py())) for i in index.tolist()],
                        dtype=np.uint64)
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32, count=len(array) + 1,
                            offset=array.offset * 4).astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8)
    return generic_low_bits_at(data, offsets[index], offsets[index + 1] - offsets[index])


def _text(raw: object) -> str:
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)


def _matrix(array: pa.ChunkedArray, max_width: int
            ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    words, lengths, fits = binary_words(array)
    return (word_chars(words), lengths) if fits else binary_matrix(array, max_width)


def _convert_fields(table: pa.Table) -> ParsedChunk | None:
    """Arrays of a table of 40 binary columns; None if any label or I field is invalid."""
    count = table.num_rows
    label_chars, label_lengths = _matrix(table.column(0), 1)
    label = label_chars[:, 0]
    if not np.all((label_lengths == 1) & ((label == ord("0")) | (label == ord("1")))):
        return None
    dense = np.empty((count, NUM_DENSE), dtype=np.float32)
    for column in range(NUM_DENSE):
        array = table.column(1 + column)
        words, lengths, fits = binary_words(array)
        value, valid = (int_word_values(words, lengths) if fits
                        else int_fields(*binary_matrix(array, MAX_INT_CHARS)))
        if not valid.all():
            return None
        dense[:, column] = np.log1p(np.maximum(value, 0.0))
    sparse = np.empty((count, NUM_SLOTS), dtype=np.uint64)
    prefixes = slot_prefixes(NUM_SLOTS)
    for slot in range(NUM_SLOTS):
        sparse[:, slot] = binary_keys(table.column(1 + NUM_DENSE + slot), prefixes[slot])
    return ParsedChunk(labels=(label == ord("1")).astype(np.float32), dense=dense,
                       sparse=sparse, malformed=0, lines=count)
