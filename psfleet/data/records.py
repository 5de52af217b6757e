"""Where records end in delimited text whose quoted fields may hold line breaks.

A CSV record (RFC 4180) ends at a ``\\n`` outside quotes: a quoted field may hold line
breaks (pandas and Python's :mod:`csv` write free text so). Inside a record that
starts at a record boundary, a ``\\n`` is outside quotes exactly when an even number of
``"`` bytes precede it (a doubled quote ``""`` inside a quoted field adds two), so the
record ends of a block are found by quote parity: numpy over the block's bytes, no
loop per line. A ``"`` inside an unquoted field (not RFC 4180) flips the parity: the
record then runs to the next line whose quotes flip it back, and is malformed if it
never closes (it ends at the end of the file).

Readers of a format with quoted fields (``Parser.quoted_records``) cut files into
blocks and workers' shares at record ends, count records for sync mode's equal shares,
and name a record in a message by the file line it starts on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from psfleet.data.compression import open_data_file
from psfleet.errors import DataError

__all__ = ["count_records", "record_ends", "record_start_lines"]

_NEWLINE, _QUOTE = ord("\n"), ord('"')
_COUNT_BLOCK_BYTES = 1 << 22


def record_ends(block: bytes, quoted: bool, odd_before: bool = False
                ) -> npt.NDArray[np.int64]:
    """Byte offsets of the ``\\n`` that end records in ``block``.

    Args:
        block: bytes of text.
        quoted: quoted fields may hold line breaks; False: every ``\\n`` ends one.
        odd_before: an odd number of ``"`` precede ``block`` in its record (a block
            that starts inside a quoted field).

    Returns:
        ndarray[R], int64: ascending offsets of the record-ending ``\\n``.
    """
    data = np.frombuffer(block, dtype=np.uint8)
    newlines = np.flatnonzero(data == _NEWLINE)
    if not quoted or (not odd_before and _QUOTE not in data):
        return newlines.astype(np.int64)
    quotes = np.flatnonzero(data == _QUOTE)
    before = np.searchsorted(quotes, newlines) + int(odd_before)  # quotes before each \n
    return newlines[(before & 1) == 0].astype(np.int64)


def record_start_lines(block: bytes, ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The 0-based line (within ``block``) each record of ``block`` starts on.

    Args:
        block: whole records (the last may lack its ``\\n``).
        ends: their ends (:func:`record_ends`).

    Returns:
        ndarray[R'], int64: one per record (R' = R, or R + 1 when bytes follow the
        last end).
    """
    data = np.frombuffer(block, dtype=np.uint8)
    newlines = np.flatnonzero(data == _NEWLINE)
    starts = np.searchsorted(newlines, ends) + 1  # line after each record's last \n
    first = np.zeros(1, dtype=np.int64)
    if len(ends) and int(ends[-1]) == len(block) - 1:
        starts = starts[:-1]
    return np.concatenate([first, starts]).astype(np.int64)


def count_records(path: Path, quoted: bool) -> int:
    """Records in a text file (a last one without ``\\n`` counts); with ``quoted`` a
    ``\\n`` inside a quoted field does not end one. Reads the file once, blocks;
    decompresses it (:func:`psfleet.data.compression.open_data_file`).

    Raises:
        DataError: the file cannot be read, or is corrupt compressed data.
    """
    records, last, odd = 0, b"\n", False
    try:
        with open_data_file(path) as f:
            while block := f.read(_COUNT_BLOCK_BYTES):
                if quoted:
                    records += len(record_ends(block, True, odd))
                    odd ^= bool(block.count(b'"') & 1)
                else:
                    records += block.count(b"\n")
                last = block[-1:]
    except OSError as exc:
        raise DataError(f"data file {str(path)!r} cannot be read: {exc}") from exc
    return records + (last != b"\n" or odd)  # an unclosed record ends the file
