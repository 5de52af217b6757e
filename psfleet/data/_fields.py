"""Vectorised conversion of text fields held as fixed-width character matrices.

Both the per-line Python parser (fields as ``str``) and the Arrow fast paths (fields
as the bytes of an Arrow binary column) turn their fields into a matrix of character
codes ``[M, width]`` (0 = padding) plus the field lengths ``[M]``, and convert it here,
so the two paths give bit-identical results.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = [
    "MAX_HEX_CHARS",
    "MAX_INT_CHARS",
    "NOT_HEX_BIT",
    "SLOT_SHIFT",
    "binary_matrix",
    "binary_words",
    "generic_low_bits",
    "hex_low_bits",
    "hex_word_low_bits",
    "byte_windows",
    "digit_word_values",
    "word_chars",
    "words_at",
    "int_fields",
    "int_word_values",
]

SLOT_SHIFT = 33
NOT_HEX_BIT = 1 << 32
MAX_HEX_CHARS = 8
MAX_INT_CHARS = 20  # '-' and 19 digits; longer integer fields are malformed

# character code -> nibble value; 16 = NUL padding, 17 = not a hex digit.
_HEX_TABLE = np.full(256, 17, dtype=np.uint64)
_HEX_TABLE[0] = 16
for _i, _c in enumerate("0123456789abcdef"):
    _HEX_TABLE[ord(_c)] = _i
    _HEX_TABLE[ord(_c.upper())] = _i


_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_HIGH_BITS = np.uint64(0x8080808080808080)
_ONES = np.uint64(0x0101010101010101)
_LOWER = np.uint64(0x2020202020202020)


def _at_least(words: npt.NDArray[np.uint64], n: int) -> npt.NDArray[np.uint64]:
    """Per byte of 7-bit bytes: 0x80 where the byte is >= n, else 0 (SWAR compare)."""
    return ((words | _HIGH_BITS) - np.uint64(n) * _ONES) & _HIGH_BITS


def _in_range(words: npt.NDArray[np.uint64], low: int, high: int) -> npt.NDArray[np.uint64]:
    """Per byte: 0x80 where ``low <= byte <= high`` (7-bit bytes), else 0."""
    return _at_least(words, low) & (_at_least(words, high + 1) ^ _HIGH_BITS)


def _bytes_valid(words: npt.NDArray[np.uint64], hex_digits: bool) -> npt.NDArray[np.bool_]:
    """True where every byte of the word is 0 (padding) or a digit (hex digit)."""
    ok = _in_range(words, ord("0"), ord("9")) | (_at_least(words, 1) ^ _HIGH_BITS)
    if hex_digits:
        ok |= _in_range(words | _LOWER, ord("a"), ord("f"))
    return (ok == _HIGH_BITS) & ((words & _HIGH_BITS) == 0)
_LETTER_BITS = np.uint64(0x0101010101010101)


def generic_low_bits(raw: str) -> int:
    """Low 33 bits of the key of a non-hex value: ``NOT_HEX_BIT | (1 + crc31(raw))``."""
    return NOT_HEX_BIT | (1 + (zlib.crc32(raw.encode("utf-8", "surrogatepass")) & 0x7FFFFFFF))


def hex_low_bits(chars: npt.NDArray[np.integer], lengths: npt.NDArray[np.int64]
                 ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
    """Values of hex fields.

    Args:
        chars (ndarray[M, W>=8], integer): character codes, 0-padded on the right.
        lengths (ndarray[M], int64): field lengths in characters.

    Returns:
        (low [M] uint64, is_hex [M] bool): ``int(field, 16)`` where the field is 1..8
        hex digits; ``NOT_HEX_BIT`` for empty fields; 0 where ``is_hex`` is False and
        the field is not empty (the caller hashes those with :func:`generic_low_bits`).
    """
    count = lengths.shape[0]
    codes = np.minimum(chars[:, :MAX_HEX_CHARS], 255).astype(np.intp)
    nibbles = _HEX_TABLE[codes]  # [M, 8]
    positions = np.arange(MAX_HEX_CHARS)
    inside = positions < lengths[:, None]  # [M, 8]
    is_hex = (lengths >= 1) & (lengths <= MAX_HEX_CHARS) & np.all((nibbles < 16) == inside,
                                                                   axis=1)
    shifts = (4 * np.maximum(lengths[:, None] - 1 - positions, 0)).astype(np.uint64)
    low = np.bitwise_or.reduce(np.where(inside, nibbles << shifts, np.uint64(0)), axis=1)
    low = np.where(lengths == 0, np.uint64(NOT_HEX_BIT), np.where(is_hex, low, np.uint64(0)))
    return low.astype(np.uint64).reshape(count), is_hex


def int_fields(chars: npt.NDArray[np.integer], lengths: npt.NDArray[np.int64]
               ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Integers in decimal text (an optional leading ``-``); empty fields are 0.

    Args:
        chars (ndarray[M, W], integer): character codes, 0-padded on the right.
        lengths (ndarray[M], int64): field lengths.

    Returns:
        (value [M] float64, valid [M] bool): the value (exact up to 2**53) and whether
        the field is empty or a well-formed integer of at most 20 characters.
    """
    codes = chars.astype(np.int64)
    width = codes.shape[1]
    digits = codes - ord("0")
    is_digit = (digits >= 0) & (digits <= 9)
    negative = codes[:, 0] == ord("-") if width else np.zeros(len(lengths), dtype=bool)
    positions = np.arange(width)
    expected_digit = (positions < lengths[:, None]) & ~((positions == 0) & negative[:, None])
    valid = (lengths <= MAX_INT_CHARS) & np.all(is_digit == expected_digit, axis=1)
    valid &= (lengths == 0) | (lengths > negative)  # '-' alone is not a number
    magnitude = np.zeros(len(lengths), dtype=np.float64)
    for column in range(width):  # Horner; float64 cannot overflow at 20 characters
        magnitude = np.where(is_digit[:, column], magnitude * 10 + digits[:, column], magnitude)
    return np.where(negative, -magnitude, magnitude), valid


def _binary_layout(array: pa.Array | pa.ChunkedArray
                   ) -> tuple[int, list[Any], npt.NDArray[np.int64]]:
    """(value count, Arrow buffers, offsets [M+1] int64) of a binary/string column."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    count = len(array)
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32, count=count + 1,
                            offset=array.offset * 4).astype(np.int64)
    return count, buffers, offsets


def binary_matrix(array: pa.Array | pa.ChunkedArray, max_width: int
                  ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """The bytes of an Arrow binary/string column as a 0-padded matrix.

    Args:
        array: a ``binary`` or ``string`` column (no nulls; Arrow's CSV reader gives
            empty values, not nulls, for these types).
        max_width: matrix width; longer fields are cut (their length is kept, so a
            caller can tell them apart).

    Returns:
        (chars [M, width] uint8, lengths [M] int64) with ``width = min(longest, max_width)``
        (at least 1).
    """
    count, buffers, offsets = _binary_layout(array)
    data = (np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None
            else np.zeros(0, dtype=np.uint8))
    lengths = np.diff(offsets)
    width = max(1, min(int(lengths.max(initial=0)), max_width))
    if data.size == 0:
        return np.zeros((count, width), dtype=np.uint8), lengths
    index = offsets[:-1, None] + np.arange(width)  # [M, width]
    inside = np.arange(width) < lengths[:, None]
    chars = np.where(inside, data[np.minimum(index, data.size - 1)], np.uint8(0))
    return chars.astype(np.uint8), lengths


def binary_words(array: pa.Array | pa.ChunkedArray
                 ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64], bool]:
    """The first 8 bytes of every value of an Arrow binary column, as one uint64 each.

    Byte ``i`` of a value is byte ``i`` (little-endian) of its word; bytes past the
    value's end are 0. One gather per column instead of one per character: this is the
    fast path of the Arrow parsers.

    Returns:
        (words [M] uint64, lengths [M] int64, fits) where ``fits`` says that no value is
        longer than 8 bytes (otherwise use :func:`binary_matrix`).
    """
    count, buffers, offsets = _binary_layout(array)
    lengths = np.diff(offsets)
    fits = bool(lengths.max(initial=0) <= 8)
    padded = np.zeros(offsets[-1] - offsets[0] + 8 if count else 8, dtype=np.uint8)
    if buffers[2] is not None and offsets[-1] > offsets[0]:
        padded[: offsets[-1] - offsets[0]] = np.frombuffer(
            buffers[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    return words_at(padded, offsets[:-1] - offsets[0], lengths), lengths, fits


def byte_windows(padded: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
    """An overlapping view of a byte buffer: element ``i`` is the 8 bytes starting at byte
    ``i`` as one little-endian uint64 (ndarray[B - 7]; index it with field starts).

    Args:
        padded (ndarray[B], uint8, C-contiguous): the bytes; pad the end with 8 zero
            bytes so that every field start has a full window.
    """
    return np.ndarray(shape=(padded.size - 7,), dtype="<u8", buffer=padded.data, strides=(1,))


# KEEP_MASKS[n]: the low n bytes of a word (n = 0..8).
_KEEP_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)
# _LEADING_ZERO_SHIFTS[n]: bits to shift n digits to the high end of a word (n = 0..8).
_LEADING_ZERO_SHIFTS = np.array([8 * (8 - n) for n in range(9)], dtype=np.uint64)


def words_at(padded: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64],
             lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """The first 8 bytes of fields of a byte buffer, one uint64 each (as :func:`binary_words`).

    Args:
        padded (ndarray[B], uint8, C-contiguous): the bytes, with at least 8 readable
            bytes from every start (pad the end with 8 zero bytes).
        starts (ndarray[...], int64): where the fields start (any shape).
        lengths (ndarray[...], int64): field lengths (>= 0), same shape as ``starts``.

    Returns:
        ndarray[...], uint64: byte ``i`` (little-endian) of a word is byte ``i`` of the
        field; bytes past the field's end (or past byte 8) are 0.
    """
    return byte_windows(padded)[starts] & _KEEP_MASKS[np.minimum(lengths, 8)]


def digit_word_values(words: npt.NDArray[np.uint64], lengths: npt.NDArray[np.int64]
                      ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
    """Non-negative decimal integers of 1..8 ASCII digits given as words (:func:`words_at`).

    SWAR: ``'0'`` is removed from every byte of the field, a byte is a digit when it is
    then <= 9 (``(x + 0x76) | x`` has no high bit), and the digits are combined with
    three multiply-shift steps (pairs, quads, halves; the eight-digit parse of
    simdjson, Lemire et al.).

    Args:
        words (ndarray[...], uint64): the 8 bytes from each field's start (bytes past the
            field's end are ignored: :func:`byte_windows` indexed by the starts will do).
        lengths (ndarray[...], int64): field lengths.

    Returns:
        (value [...] uint64, valid [...] bool): ``int(field)`` where the field is 1..8
        ASCII digits (``valid``), otherwise an unspecified value.
    """
    clipped = np.minimum(lengths, 8)
    x = (words ^ np.uint64(0x3030303030303030)) & _KEEP_MASKS[clipped]
    valid = (((x + np.uint64(0x7676767676767676)) | x) & _HIGH_BITS) == 0
    valid &= (lengths >= 1) & (lengths <= 8)
    x <<= _LEADING_ZERO_SHIFTS[clipped]  # digits in the high bytes, zeros before them
    x = (x * np.uint64(10 * 256 + 1)) >> np.uint64(8)
    x = ((x & np.uint64(0x00FF00FF00FF00FF)) * np.uint64(100 * 2**16 + 1)) >> np.uint64(16)
    x = ((x & np.uint64(0x0000FFFF0000FFFF)) * np.uint64(10000 * 2**32 + 1)) >> np.uint64(32)
    return x, valid


def hex_word_low_bits(words: npt.NDArray[np.uint64], lengths: npt.NDArray[np.int64]
                      ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
    """:func:`hex_low_bits` on values given as words (:func:`binary_words`).

    Decodes 8 hex digits per word with shifts and masks (SWAR): a digit's value is
    ``(c & 0xF) + 9 * (c >> 6 & 1)`` for ``0-9``, ``a-f`` and ``A-F``.

    Args:
        words (ndarray[M], uint64): value bytes, 0-padded past the value's end.
        lengths (ndarray[M], int64): value lengths (values longer than 8 are not hex).

    Returns:
        (low [M] uint64, is_hex [M] bool) as :func:`hex_low_bits`.
    """
    right = (np.maximum(8 - lengths, 0) * 8).astype(np.uint64)
    aligned = np.where(lengths >= 8, words, words << right)  # digits in the high bytes
    is_hex = (lengths >= 1) & (lengths <= MAX_HEX_CHARS) & _bytes_valid(aligned, True)
    nib = (aligned & _LOW_NIBBLES) + ((aligned >> np.uint64(6)) & _LETTER_BITS) * np.uint64(9)
    # byte i holds the digit i places from the left; pack pairs, then 16-, then 32-bit.
    m8, m16, m32 = (np.uint64(0x000F000F000F000F), np.uint64(0x000000FF000000FF),
                    np.uint64(0xFFFF))
    pairs = ((nib & m8) << np.uint64(4)) | ((nib >> np.uint64(8)) & m8)
    quads = ((pairs & m16) << np.uint64(8)) | ((pairs >> np.uint64(16)) & m16)
    value = ((quads & m32) << np.uint64(16)) | ((quads >> np.uint64(32)) & m32)
    low = np.where(lengths == 0, np.uint64(NOT_HEX_BIT), np.where(is_hex, value, np.uint64(0)))
    return low.astype(np.uint64), is_hex


def word_chars(words: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint8]:
    """The bytes of :func:`binary_words` words as a matrix (ndarray[M, 8], uint8; a view)."""
    return words.view(np.uint8).reshape(words.shape[0], 8)


def int_word_values(words: npt.NDArray[np.uint64], lengths: npt.NDArray[np.int64]
                    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """:func:`int_fields` on values of at most 8 bytes given as words (:func:`binary_words`).

    Eight decimal digits per word with three multiply-shift steps (SWAR): pairs of
    digits, then pairs of pairs, then the two halves.

    Returns:
        (value [M] float64, valid [M] bool) as :func:`int_fields`.
    """
    first = words & np.uint64(0xFF)
    negative = (first == np.uint64(ord("-"))) & (lengths > 0)
    digits_only = np.where(negative, words & ~np.uint64(0xFF), words)  # '-' -> padding
    right = (np.maximum(8 - lengths, 0) * 8).astype(np.uint64)
    aligned = np.where(lengths >= 8, digits_only, digits_only << right)
    valid = _bytes_valid(aligned, False) & (lengths <= 8) & ((lengths == 0) | (lengths > negative))
    x = aligned & _LOW_NIBBLES
    x = ((x * np.uint64(10)) + (x >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    x = ((x * np.uint64(100)) + (x >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    x = ((x * np.uint64(10000)) + (x >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    value = x.astype(np.float64)
    return np.where(negative, -value, value), valid
