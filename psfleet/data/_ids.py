"""Keys of ids given as byte spans of a buffer, vectorised: zlib's CRC-32 of many
fields at once and decimal ids in the slot-format key scheme.

These give exactly what the per-value code of :mod:`psfleet.data._fields` /
:mod:`psfleet.data.slot_format` gives (``generic_low_bits``, ``int(text)``), without a
Python step per value.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from psfleet.data._fields import NOT_HEX_BIT, byte_windows, digit_word_values

__all__ = ["MAX_DECIMAL_CHARS", "crc32_fields", "decimal_low_bits", "generic_low_bits_at"]


def _crc32_tables() -> npt.NDArray[np.uint32]:
    """[4, 256] uint32: the CRC-32 (zlib) byte table and its slicing-by-4 extensions."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> np.uint32(1)) ^ np.uint32(0xEDB88320),
                         table >> np.uint32(1)).astype(np.uint32)
    tables = [table]
    for _ in range(3):
        previous = tables[-1]
        tables.append((previous >> np.uint32(8)) ^ table[previous & np.uint32(0xFF)])
    return np.stack(tables)


_CRC32 = _crc32_tables()
_BYTE = np.uint32(0xFF)


def crc32_fields(data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64],
                 lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.uint32]:
    """``zlib.crc32`` of many byte fields at once: zlib's table-driven CRC-32, four bytes
    per step (slicing-by-4, Intel's "slicing-by-N" CRC, Kounavis & Berry 2005), then
    single bytes, vectorised over the fields.

    Args:
        data (ndarray[B], uint8): the bytes.
        starts (ndarray[M], int64): where each field starts in ``data``.
        lengths (ndarray[M], int64): field lengths (``starts + lengths <= B``).

    Returns:
        ndarray[M], uint32: ``zlib.crc32(data[start:start + length])`` per field.
    """
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[:len(data)] = data
    windows = byte_windows(padded)
    order = np.argsort(-lengths, kind="stable")  # longest first: a step works on a prefix
    at, left = starts[order], lengths[order]
    negated = -left  # ascending
    crc = np.full(len(order), 0xFFFFFFFF, dtype=np.uint32)
    t0, t1, t2, t3 = _CRC32
    done = 0
    while len(order) and int(left[0]) - done >= 4:
        active = int(np.searchsorted(negated, -(done + 4), side="right"))  # left >= done + 4
        word = (windows[at[:active] + done] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        c = crc[:active] ^ word
        crc[:active] = (t3[c & _BYTE] ^ t2[(c >> np.uint32(8)) & _BYTE]
                        ^ t1[(c >> np.uint32(16)) & _BYTE] ^ t0[c >> np.uint32(24)])
        done += 4
    blocks = (left // 4) * 4  # bytes each field consumed above
    for extra in range(3):
        rows = np.flatnonzero(left - blocks > extra)
        if not len(rows):
            break
        byte = padded[at[rows] + blocks[rows] + extra].astype(np.uint32)
        part = crc[rows]
        crc[rows] = t0[(part ^ byte) & _BYTE] ^ (part >> np.uint32(8))
    out = np.empty(len(order), dtype=np.uint32)
    out[order] = crc ^ np.uint32(0xFFFFFFFF)
    return out


def generic_low_bits_at(data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64],
                        lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """:func:`generic_low_bits` of many UTF-8 fields of a byte buffer (vectorised).

    Args:
        data (ndarray[B], uint8): the bytes (valid UTF-8 in the fields, else the result
            differs from :func:`generic_low_bits` of the decoded text).
        starts, lengths (ndarray[M], int64): the fields.

    Returns:
        ndarray[M], uint64: ``NOT_HEX_BIT | (1 + crc31(field))``.
    """
    crc = crc32_fields(data, starts, lengths).astype(np.uint64) & np.uint64(0x7FFFFFFF)
    return np.uint64(NOT_HEX_BIT) | (crc + np.uint64(1))


MAX_DECIMAL_CHARS = 20  # longer decimal ids are left to the reference code
_TEN_TO_8 = np.uint64(10**8)


def decimal_low_bits(data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64],
                     lengths: npt.NDArray[np.int64]
                     ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
    """Low key bits of decimal ids (the slot-format scheme), vectorised.

    An id ``v`` (ASCII digits) gets ``v`` if ``v < 2**32``, else
    ``NOT_HEX_BIT | (1 + crc31(text))`` (:func:`generic_low_bits` of its text, leading
    zeros included), as :mod:`psfleet.data.slot_format` reads ids. The digits are read
    8 at a time from the right (:func:`digit_word_values`).

    Args:
        data (ndarray[B], uint8): the bytes, with 8 readable bytes after every field
            start (pad the end with 8 zero bytes).
        starts, lengths (ndarray[M], int64): the fields.

    Returns:
        (low [M] uint64, valid [M] bool): ``valid`` where the field is 1..20 ASCII
        digits (other fields get an unspecified value).
    """
    windows = byte_windows(data)
    ends = starts + lengths
    valid = (lengths >= 1) & (lengths <= MAX_DECIMAL_CHARS)
    parts = []
    for index in range(3):  # digits ends-8..ends-1, ends-16..ends-9, the rest (<= 4)
        size = np.clip(lengths - 8 * index, 0, 8)
        value, ok = digit_word_values(windows[np.maximum(ends - 8 * index - size, 0)], size)
        valid &= ok | (size == 0)
        parts.append(np.where(size > 0, value, np.uint64(0)))
    low = parts[1] * _TEN_TO_8 + parts[0]  # < 10**16: no overflow
    big = (parts[2] > 0) | (low >= np.uint64(1 << 32))
    if big.any():
        at = np.flatnonzero(big & valid)
        low[at] = generic_low_bits_at(data, starts[at], lengths[at])
    return low, valid
