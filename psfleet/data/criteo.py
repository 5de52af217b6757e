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
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from psfleet.errors import ConfigError, DataError

__all__ = [
    "NUM_DENSE",
    "NUM_SLOTS",
    "NUM_FIELDS",
    "WARN_INTERVAL_S",
    "ParsedChunk",
    "hash_feature",
    "hash_features",
    "parse_lines",
]

logger = logging.getLogger(__name__)

NUM_DENSE = 13
NUM_SLOTS = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SLOTS
WARN_INTERVAL_S = 5.0

_SLOT_SHIFT = 33
_MAX_SLOT = (1 << (64 - _SLOT_SHIFT)) - 2  # (slot + 1) << 33 must fit in 64 bits
_NOT_HEX_BIT = 1 << 32
_MAX_HEX_CHARS = 8
_MAX_INT_CHARS = 20  # '-' and 19 digits; longer I fields are malformed

# ASCII code point -> nibble value; 16 = NUL padding, 17 = not a hex digit.
_HEX_TABLE = np.full(129, 17, dtype=np.uint64)
_HEX_TABLE[0] = 16
for _i, _c in enumerate("0123456789abcdef"):
    _HEX_TABLE[ord(_c)] = _i
    _HEX_TABLE[ord(_c.upper())] = _i


@dataclass(frozen=True)
class ParsedChunk:
    """The well-formed examples of a run of lines.

    Attributes:
        labels (ndarray[N], float32): 0.0 / 1.0.
        dense (ndarray[N, 13], float32): ``log1p(max(x, 0))``, missing -> 0.
        sparse (ndarray[N, 26], uint64): feature keys (see the module docstring).
        malformed (int): lines skipped as malformed.
    """

    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]
    sparse: npt.NDArray[np.uint64]
    malformed: int

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _slot_prefix(slot: int) -> int:
    if not 0 <= slot <= _MAX_SLOT:
        raise ConfigError(f"slot: {slot!r} is out of range; allowed 0..{_MAX_SLOT}")
    return (slot + 1) << _SLOT_SHIFT


def _generic_low_bits(raw: str) -> int:
    return _NOT_HEX_BIT | (1 + (zlib.crc32(raw.encode("utf-8", "surrogatepass")) & 0x7FFFFFFF))


def _is_hex(raw: str) -> bool:
    return 1 <= len(raw) <= _MAX_HEX_CHARS and all(c in "0123456789abcdefABCDEF" for c in raw)


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
        return prefix | _NOT_HEX_BIT
    if _is_hex(raw):
        return prefix | int(raw, 16)
    return prefix | _generic_low_bits(raw)


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
    prefixes = np.array([_slot_prefix(s) for s in range(num_slots)], dtype=np.uint64)
    count = len(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=count)
    chars = np.array(values, dtype=f"<U{_MAX_HEX_CHARS}").view(np.uint32)
    nibbles = _HEX_TABLE[np.minimum(chars.reshape(count, _MAX_HEX_CHARS), 128)]  # [M, 8]
    positions = np.arange(_MAX_HEX_CHARS)
    inside = positions < lengths[:, None]  # [M, 8]
    is_hex = (lengths >= 1) & (lengths <= _MAX_HEX_CHARS) & np.all((nibbles < 16) == inside, axis=1)
    shifts = (4 * np.maximum(lengths[:, None] - 1 - positions, 0)).astype(np.uint64)
    low = np.bitwise_or.reduce(np.where(inside, nibbles << shifts, 0).astype(np.uint64), axis=1)
    low = np.where(lengths == 0, np.uint64(_NOT_HEX_BIT), low).astype(np.uint64)
    for index in np.flatnonzero(~is_hex & (lengths > 0)).tolist():
        low[index] = _generic_low_bits(values[index])
    return (low.reshape(-1, num_slots) | prefixes).astype(np.uint64)


def _parse_dense(
    values: Sequence[str],
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """Parse and transform I fields; returns (log1p(max(x, 0)) [M], invalid [M])."""
    count = len(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=count)
    width = max(1, min(int(lengths.max(initial=0)), _MAX_INT_CHARS))
    chars = np.array(values, dtype=f"<U{width}").view(np.uint32)
    chars = chars.reshape(count, width).astype(np.int64)  # [M, width]
    digits = chars - ord("0")
    is_digit = (digits >= 0) & (digits <= 9)
    negative = chars[:, 0] == ord("-")
    positions = np.arange(width)
    expected_digit = (positions < lengths[:, None]) & ~((positions == 0) & negative[:, None])
    valid = (lengths <= _MAX_INT_CHARS) & np.all(is_digit == expected_digit, axis=1)
    valid &= (lengths == 0) | (lengths > negative)  # '-' alone is not a number
    magnitude = np.zeros(count, dtype=np.float64)
    for column in range(width):  # Horner; float64 cannot overflow here
        magnitude = np.where(is_digit[:, column], magnitude * 10 + digits[:, column], magnitude)
    value = np.where(negative, 0.0, magnitude)  # max(x, 0); missing parses as 0
    return np.log1p(value).astype(np.float32), ~valid


class _RateLimitedWarner:
    """Logs at most one malformed-line warning per ``interval_s`` per file (thread safe)."""

    def __init__(
        self, interval_s: float = WARN_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, int]] = {}  # source -> (last warning, suppressed)

    def warn(self, source: str, line_no: int, reason: str) -> None:
        now = self._clock()
        with self._lock:
            last, suppressed = self._state.get(source, (-math.inf, 0))
            if now - last < self._interval_s:
                self._state[source] = (last, suppressed + 1)
                return
            self._state[source] = (now, 0)
        if suppressed:
            logger.warning(
                "%s:%d: skipping malformed line: %s (%d more malformed lines in %s were not "
                "logged in the last %.0f s)",
                source,
                line_no,
                reason,
                suppressed,
                source,
                self._interval_s,
            )
        else:
            logger.warning("%s:%d: skipping malformed line: %s", source, line_no, reason)


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
    )
