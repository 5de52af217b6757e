"""Vectorised fast path of the slot text format (:mod:`psfleet.data.slot_format`).

Most slot-format files repeat one token layout on every line: the same slot names in
the same order (PaddleRec's Criteo files: ``click``, 13 x ``dense_feature``, ``1`` ..
``26``). :func:`parse_layout` parses a chunk of such lines with whole-chunk numpy
operations instead of a Python step per token:

1. find every separator byte (space, ``:``, ``\\n``, and any control or non-ASCII byte)
   of the chunk at once; a line matches when its separators are ``:`` and a space in
   turn, ending with ``:`` and ``\\n`` (one ``:`` per token, single spaces);
2. check every token's slot name against the layout, 8 bytes per comparison;
3. convert the values column-wise: labels must be ``0`` / ``1``, sparse ids 1..8 ASCII
   digits (SWAR, :func:`~psfleet.data._fields.digit_word_values`), dense values are
   gathered into one Arrow string column and cast to float64 by Arrow (correctly
   rounded, as Python's ``float``), restricted to the characters ``0-9 . + - e E``;
   a value Arrow rejects is retried with Python's ``float``.

If some lines do not match, the chunk is matched once more without a ``\\r`` or a space
at the end of lines (Windows line ends, a trailing separator). Lines that still do not
match (another layout, missing or extra tokens, other whitespace, non-ASCII, a value of
another form) are reported as not parsed; the caller parses them with the per-line
reference code, which also names the malformed ones. So the result of a chunk never
depends on which path a line took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from psfleet.data._fields import byte_windows, digit_word_values

__all__ = ["LayoutRows", "TokenLayout", "parse_layout"]

_SPACE, _COLON, _NEWLINE = ord(" "), ord(":"), ord("\n")
_NAME_BYTES = frozenset(range(33, 127)) - {_COLON}
# characters of the decimal floats handed to Arrow (no inf / nan / '_' / whitespace)
_FLOAT_CHARS = b"0123456789.+-eE"


@dataclass(frozen=True)
class TokenLayout:
    """The token layout of a line: which slot each token is and where its value goes.

    Attributes:
        names: the slot name of each token, in line order (ASCII, no ``:`` or space).
        value_first: tokens are ``value:slot`` instead of ``slot:value``.
        label_token: index of the token whose value is the label (the last label token).
        dense_tokens, dense_columns: token indices of dense values and their columns.
        sparse_tokens, sparse_columns: token indices of sparse ids and their columns.
        Tokens of no list are of undeclared slots (ignored).
    """

    names: tuple[bytes, ...]
    value_first: bool
    label_token: int
    dense_tokens: tuple[int, ...]
    dense_columns: tuple[int, ...]
    sparse_tokens: tuple[int, ...]
    sparse_columns: tuple[int, ...]

    def usable(self) -> bool:
        """Whether every name is non-empty printable ASCII without ``:`` (else a line of
        this layout cannot be recognised by its separators)."""
        return all(name and set(name) <= _NAME_BYTES for name in self.names)


@dataclass(frozen=True)
class LayoutRows:
    """A chunk parsed by :func:`parse_layout`.

    Attributes:
        parsed (ndarray[N], bool): lines of the layout with well-formed values; the other
            rows are all zeros and must be parsed by the reference code.
        labels (ndarray[N], float32), dense (ndarray[N, D], float32): values; dense
            columns the layout does not fill are 0.0.
        sparse (ndarray[N, S], uint64): ids (without slot prefixes); unfilled columns 0.
    """

    parsed: npt.NDArray[np.bool_]
    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]
    sparse: npt.NDArray[np.uint64]


def parse_layout(data: bytes, layout: TokenLayout, num_dense: int, num_slots: int
                 ) -> LayoutRows:
    """Parse the lines of ``data`` that follow ``layout`` (module docstring).

    Blocks; thread safe; numpy and Arrow work on whole columns.

    Args:
        data: ``\\n``-separated lines (a trailing ``\\n`` is optional), as the reference
            parser splits them: N = number of ``\\n`` (+1 if the last line has none).
        layout: the token layout (its names must pass :meth:`TokenLayout.usable`).
        num_dense: dense columns D.
        num_slots: sparse columns S.

    Returns:
        Rows for all N lines, ``parsed`` saying which ones were parsed here.
    """
    padded, text = _padded(data)
    ascii_only = data.isascii()
    count, rows, line_starts, colons, ends = _token_bounds(text, len(layout.names), ascii_only)
    if len(rows) < count:
        trimmed = _drop_line_end_whitespace(data)
        if len(trimmed) < len(data):
            padded, text = _padded(trimmed)
            count, rows, line_starts, colons, ends = _token_bounds(text, len(layout.names),
                                                                   ascii_only)
    labels = np.zeros(count, dtype=np.float32)
    parsed = np.zeros(count, dtype=bool)
    if not len(rows):
        return LayoutRows(parsed, labels, np.zeros((count, num_dense), dtype=np.float32),
                          np.zeros((count, num_slots), dtype=np.uint64))

    starts = np.empty(colons.shape, dtype=np.int64)  # [R, T] token starts
    starts[:, 0] = line_starts[rows]
    starts[:, 1:] = ends[:, :-1] + 1
    # A name is checked with the separator after it: then its length is right too (the
    # token's only ':' / the token's end follows it).
    if layout.value_first:
        value_starts, value_ends = starts, colons
        good = _names_match(padded, colons + 1, tuple(
            name + (b"\n" if k == len(layout.names) - 1 else b" ")
            for k, name in enumerate(layout.names)))
    else:
        value_starts, value_ends = colons + 1, ends
        good = _names_match(padded, starts, tuple(name + b":" for name in layout.names))
    value_lengths = value_ends - value_starts

    label_byte = padded[value_starts[:, layout.label_token]]
    good &= (value_lengths[:, layout.label_token] == 1) & (
        (label_byte == ord("0")) | (label_byte == ord("1")))
    sparse_at = _columns(layout.sparse_tokens)
    ids, ids_good = _sparse_ids(padded, value_starts[:, sparse_at], value_lengths[:, sparse_at])
    good &= ids_good
    dense_at = _columns(layout.dense_tokens)
    floats, floats_good = _dense_floats(padded, value_starts[:, dense_at],
                                        value_lengths[:, dense_at])
    good &= floats_good

    if not good.all():
        rows, label_byte, ids, floats = rows[good], label_byte[good], ids[good], floats[good]
    parsed[rows] = True
    labels[rows] = label_byte == ord("1")
    return LayoutRows(parsed, labels,
                      _place(floats, rows, count, layout.dense_columns, num_dense),
                      _place(ids, rows, count, layout.sparse_columns, num_slots))


def _padded(data: bytes) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """(padded, text): the bytes with a final ``\\n`` if missing (``text``), followed by
    16 zero bytes (``padded``, for 8-byte windows at any position of ``text``)."""
    size = len(data)
    padded = np.zeros(size + 17, dtype=np.uint8)
    padded[:size] = np.frombuffer(data, dtype=np.uint8)
    end = size
    if size and data[-1] != _NEWLINE:
        padded[size] = _NEWLINE
        end += 1
    return padded, padded[:end]


def _drop_line_end_whitespace(data: bytes) -> bytes:
    """``data`` without a ``\\r`` or a space just before a ``\\n`` (Windows line ends, a
    trailing separator): the reference splits lines on any whitespace, so this changes
    no line's tokens, nor the number of lines."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    return data.replace(b" \n", b"\n")


def _token_bounds(text: npt.NDArray[np.uint8], tokens: int, ascii_only: bool) -> tuple[
        int, npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64],
        npt.NDArray[np.int64]]:
    """Find the lines of ``tokens`` tokens ``a:b`` separated by single spaces.

    Separators are ``:`` and the "ends": space, ``\\n`` and every control or non-ASCII
    byte (so a line with any other whitespace does not match).

    Args:
        text (ndarray[B], uint8): the lines, the last one ending with ``\\n``.
        ascii_only: no byte of ``text`` is >= 128 (a shortcut; DEL is no separator).

    Returns:
        (N lines, rows [R] of the matching lines, line_starts [N], colons [R, T],
        ends [R, T]): byte positions of each token's ``:`` and of the byte after it.
    """
    colons = np.flatnonzero(text == _COLON)
    ends = np.flatnonzero(text <= 32 if ascii_only else (text - np.uint8(33)) >= 94)
    end_kinds = text[ends]
    newlines = np.flatnonzero(end_kinds == _NEWLINE)  # [N] indices into ends
    count = len(newlines)
    line_starts = np.zeros(count, dtype=np.int64)
    line_starts[1:] = ends[newlines[:-1]] + 1
    pattern = np.full(tokens, _SPACE, dtype=np.uint8)
    pattern[-1] = _NEWLINE
    if (len(colons) == len(ends) == count * tokens
            and np.array_equal(end_kinds.reshape(count, tokens),
                               np.broadcast_to(pattern, (count, tokens)))
            and bool(np.all(colons < ends)) and bool(np.all(colons[1:] > ends[:-1]))):
        return (count, np.arange(count), line_starts, colons.reshape(count, tokens),
                ends.reshape(count, tokens))
    # Some lines differ: find the matching ones on the merged separators.
    seps = np.sort(np.concatenate([colons, ends]))
    kinds = text[seps]
    newlines = np.flatnonzero(kinds == _NEWLINE)
    both = np.full(2 * tokens, _SPACE, dtype=np.uint8)
    both[0::2] = _COLON
    both[-1] = _NEWLINE
    rows = np.flatnonzero(np.diff(newlines, prepend=-1) == 2 * tokens)
    index = newlines[rows, None] + np.arange(1 - 2 * tokens, 1)  # [R, 2T]
    same = np.all(kinds[index] == both, axis=1)
    positions = seps[index[same]]
    return count, rows[same], line_starts, positions[:, 0::2], positions[:, 1::2]


def _columns(indices: tuple[int, ...]) -> slice | npt.NDArray[np.intp]:
    """``indices`` as an index: a slice when they are consecutive (no copy)."""
    if indices and indices == tuple(range(indices[0], indices[0] + len(indices))):
        return slice(indices[0], indices[0] + len(indices))
    return np.array(indices, dtype=np.intp)


def _place(values: npt.NDArray[np.generic], rows: npt.NDArray[np.int64], count: int,
           columns: tuple[int, ...], width: int) -> npt.NDArray[Any]:
    """[count, width]: ``values`` [len(rows), len(columns)] at ``rows`` x ``columns``, 0
    elsewhere (``values`` itself when it already is that)."""
    if len(rows) == count and columns == tuple(range(width)):
        return values
    out = np.zeros((count, width), dtype=values.dtype)
    if len(rows) == count:
        out[:, _columns(columns)] = values
    elif len(rows):
        out[rows[:, None], np.array(columns, dtype=np.intp)] = values
    return out


def _names_match(padded: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64],
                 names: tuple[bytes, ...]) -> npt.NDArray[np.bool_]:
    """[R] bool: the bytes at ``starts`` [R, T] are ``names`` (column-wise, one 8-byte
    window per comparison). Each name includes the separator that must follow it, so a
    longer name in the data does not match."""
    lengths = np.array([len(name) for name in names], dtype=np.int64)
    good = np.ones(len(starts), dtype=bool)
    windows = byte_windows(padded)
    for offset in range(0, int(lengths.max()), 8):
        columns = np.flatnonzero(lengths > offset)
        parts = [name[offset:offset + 8] for name in names]
        expected = np.array([int.from_bytes(parts[c], "little") for c in columns],
                            dtype=np.uint64)
        keep = np.array([(1 << (8 * len(parts[c]))) - 1 for c in columns], dtype=np.uint64)
        at = starts if len(columns) == len(names) else starts[:, columns]
        good &= np.all((windows[at + offset if offset else at] & keep) == expected, axis=1)
    return good


def _sparse_ids(padded: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64],
                lengths: npt.NDArray[np.int64]
                ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
    """([R, K] uint64 ids, [R] bool all ids of the row are 1..8 ASCII digits)."""
    values, valid = digit_word_values(byte_windows(padded)[starts], lengths)
    return values, np.all(valid, axis=1)


def _dense_floats(padded: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64],
                  lengths: npt.NDArray[np.int64]
                  ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """([R, K] float32 values, [R] bool all values of the row are numbers, as Python's
    ``float`` reads them)."""
    shape = starts.shape
    if not starts.size:
        return np.zeros(shape, dtype=np.float32), np.ones(shape[0], dtype=bool)
    starts, lengths = starts.ravel(), lengths.ravel()
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    chars = padded[np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])]
    values: npt.NDArray[np.float64] | None = None
    if offsets[-1] < 2**31 and lengths.all() and not chars.tobytes().translate(
            None, _FLOAT_CHARS):
        column = pa.Array.from_buffers(pa.string(), len(lengths), [
            None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(chars)])
        try:
            values = pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)
            valid = np.ones(len(lengths), dtype=bool)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            values = None  # e.g. '1e' or '+.': Python decides below
    if values is None:
        values, valid = _python_floats(chars.tobytes().decode("ascii"), offsets)
    with np.errstate(over="ignore"):  # as numpy stores a float beyond float32 range: inf
        single = values.astype(np.float32)
    return single.reshape(shape), np.all(valid.reshape(shape), axis=1)


def _python_floats(text: str, offsets: npt.NDArray[np.int64]
                   ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """``float(value)`` of each value ``text[offsets[i]:offsets[i + 1]]``; 0.0 and
    invalid where Python rejects it."""
    bounds = offsets.tolist()
    values = np.zeros(len(bounds) - 1, dtype=np.float64)
    valid = np.ones(len(bounds) - 1, dtype=bool)
    for index in range(len(bounds) - 1):
        try:
            values[index] = float(text[bounds[index]:bounds[index + 1]])
        except ValueError:
            valid[index] = False
    return values, valid
