"""CSV bytes of synthetic multi-hot rows, assembled with numpy (no Python step per row).

Every line is a run of **tokens**: the label, n1..n4, c1..c6, then one token per id of
each bag (one empty token for an empty bag). A token is a lead byte (none, ``,`` or
``|``), a right-aligned body (decimal digits; numeric tokens get a ``.`` before their
last 4 digits) and a trailing newline on the last token of a line. All tokens of a
chunk sit in one fixed-width byte matrix in line order; one boolean mask drops the
padding and ``tobytes`` gives the chunk's text. About 3 s per 10**6 rows (one core).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from psfleet.data.jagged_rows import repeat_ranges

__all__ = ["format_rows"]

_COMMA, _BAR, _DOT, _NEWLINE, _ZERO = (ord(c) for c in ",|.\n0")
_DECIMALS = 4


def format_rows(
    labels: npt.NDArray[np.int8],
    numeric_ticks: npt.NDArray[np.int64],
    single: npt.NDArray[np.int64],
    bag_ids: Sequence[npt.NDArray[np.int64]],
    bag_lengths: Sequence[npt.NDArray[np.int64]],
) -> bytes:
    """The CSV lines (no header) of N rows, LF-terminated.

    Args:
        labels (ndarray[N], int8): 0 / 1, written as ``0`` / ``1``.
        numeric_ticks (ndarray[N, D], int64, >= 0): numeric values times 10**4, written
            with 4 decimals (``12345`` -> ``1.2345``, ``7`` -> ``0.0007``).
        single (ndarray[N, S], int64, >= 0): single-valued ids, written in decimal.
        bag_ids (M x ndarray[T_m], int64, >= 0): ids of each bag, row-major.
        bag_lengths (M x ndarray[N], int64): ids per row of each bag; a bag's ids are
            joined by ``|``, an empty bag is an empty cell.

    Returns:
        ASCII bytes: ``label,n...,c...,bag...\\n`` per row.
    """
    rows = labels.shape[0]
    fixed = 1 + numeric_ticks.shape[1] + single.shape[1]
    cells = [np.maximum(lengths, 1) for lengths in bag_lengths]  # tokens per bag and row
    counts = fixed + np.sum(cells, axis=0, dtype=np.int64) if cells else np.full(rows, fixed)
    starts = np.cumsum(counts) - counts  # [N] first token of each row
    total = int(counts.sum())
    values = np.zeros(total, dtype=np.int64)
    lead = np.full(total, _COMMA, dtype=np.uint8)
    present = np.ones(total, dtype=np.bool_)  # False: an empty bag's cell
    is_numeric = np.zeros(total, dtype=np.bool_)
    values[starts] = labels
    lead[starts] = 0
    fixed_positions = starts[:, None] + np.arange(1, fixed)  # [N, fixed - 1]
    values[fixed_positions] = np.concatenate([numeric_ticks, single], axis=1)
    is_numeric[fixed_positions[:, :numeric_ticks.shape[1]]] = True
    first = starts + fixed  # [N] first token of the current bag
    for ids, lengths, cell in zip(bag_ids, bag_lengths, cells, strict=True):
        positions = repeat_ranges(first, lengths)
        values[positions] = ids
        lead[positions] = _BAR
        lead[first] = _COMMA
        present[first[lengths == 0]] = False
        first = first + cell
    body, keep_body = _format_bodies(values, present, is_numeric)  # [T, W]
    matrix = np.empty((total, body.shape[1] + 2), dtype=np.uint8)  # [T, 1 + W + 1]
    matrix[:, 0] = lead
    matrix[:, 1:-1] = body
    matrix[:, -1] = _NEWLINE
    keep = np.empty(matrix.shape, dtype=np.bool_)
    keep[:, 0] = lead != 0
    keep[:, 1:-1] = keep_body
    keep[:, -1] = False
    keep[starts + counts - 1, -1] = True
    return matrix[keep].tobytes()


def _format_bodies(
    values: npt.NDArray[np.int64],
    present: npt.NDArray[np.bool_],
    is_numeric: npt.NDArray[np.bool_],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Right-aligned token bodies [T, W] (uint8 ASCII) and which bytes to keep [T, W].

    Values must be below 2**31. Digits are computed position by position into a
    ``[W, T]`` array (contiguous rows, int32 arithmetic) and returned transposed.
    """
    digits = max(len(str(int(values.max(initial=0)))), _DECIMALS + 1)
    width = digits + 1  # room for a numeric token's dot
    body = np.empty((width, values.size), dtype=np.uint8)  # [W, T], zero-padded digits
    lengths = np.ones(values.size, dtype=np.int32)
    rest = values.astype(np.int32)
    for position in range(width - 1, 0, -1):
        quotient = rest // 10
        body[position] = rest - quotient * 10
        rest = quotient
        lengths += rest > 0
    body[0] = 0
    body += _ZERO
    # numeric tokens: shift the whole part one to the left and put the dot before the
    # last 4 digits; they show at least one whole digit, the dot and 4 decimals
    whole = digits - _DECIMALS
    numeric = np.flatnonzero(is_numeric)
    body[:whole, numeric] = body[1:whole + 1, numeric]
    body[whole, numeric] = _DOT
    lengths[numeric] = np.maximum(lengths[numeric], _DECIMALS + 1) + 1
    lengths[~present] = 0
    keep = np.arange(width)[:, None] >= (width - lengths)  # [W, T]
    return body.T, keep.T
