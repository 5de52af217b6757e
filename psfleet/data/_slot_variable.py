"""Vectorised path of the slot text format for lines of any layout, multi-valued slots
included (:mod:`psfleet.data.slot_format`).

:func:`parse_variable` parses every line of a chunk with whole-chunk numpy operations,
whatever the order and count of its tokens: the tokens of all lines are found at once
(:func:`~psfleet.data._tokens.split_tokens`), their slot names looked up 8 bytes per
comparison (:class:`~psfleet.data._tokens.NameTable`), and the values converted per
kind: the label (the last label token of a line, ``0`` or ``1``), dense floats (Arrow's
correctly rounded cast, as in :mod:`psfleet.data._slot_fast`), fixed sparse ids and
multi-valued ids (decimal, :func:`~psfleet.data._fields.decimal_low_bits`). A dense or
fixed sparse value's column is its slot's first column plus how many values of that
slot came before it on the line.

Lines this path does not take (non-ASCII or control bytes, a token without ``:``, no
or a bad label, a bad value, more values than a slot's width, ids of more than 20
digits) are returned as not parsed; the caller parses them with the per-line
reference code, which also names the malformed ones. The result of a line never
depends on which path took it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from psfleet.data._ids import decimal_low_bits
from psfleet.data._slot_fast import _dense_floats
from psfleet.data._tokens import NameTable, first_per_group, rank_in_group, split_tokens

__all__ = ["SlotLayout", "VariableRows", "parse_variable"]

LABEL, DENSE, SPARSE, MULTI = 0, 1, 2, 3


@dataclass(frozen=True)
class SlotLayout:
    """The declared slots, as the vectorised path needs them.

    Attributes:
        table: label, dense, sparse and multi-valued slot names, in that order.
        kind (ndarray[K], int64): LABEL / DENSE / SPARSE / MULTI per name.
        sub (ndarray[K], int64): index of the name within its kind.
        dense_start, dense_width (ndarray[Kd], int64): first column and width per dense
            slot; sparse_start, sparse_width likewise per fixed sparse slot.
        num_multi: multi-valued slots M.
        value_first: tokens are ``value:slot``.
    """

    table: NameTable
    kind: npt.NDArray[np.int64]
    sub: npt.NDArray[np.int64]
    dense_start: npt.NDArray[np.int64]
    dense_width: npt.NDArray[np.int64]
    sparse_start: npt.NDArray[np.int64]
    sparse_width: npt.NDArray[np.int64]
    num_multi: int
    value_first: bool

    @classmethod
    def build(cls, label: str, dense: dict[str, int], sparse: dict[str, int],
              multi: list[str], value_first: bool) -> SlotLayout:
        """The layout of these slots (names distinct)."""
        names = [label, *dense, *sparse, *multi]
        kind = [LABEL] + [DENSE] * len(dense) + [SPARSE] * len(sparse) + [MULTI] * len(multi)
        sub = [0, *range(len(dense)), *range(len(sparse)), *range(len(multi))]

        def starts(widths: dict[str, int]) -> npt.NDArray[np.int64]:
            return np.cumsum([0, *widths.values()])[:-1].astype(np.int64)

        return cls(NameTable(names), np.array(kind, dtype=np.int64),
                   np.array(sub, dtype=np.int64), starts(dense),
                   np.array(list(dense.values()), dtype=np.int64), starts(sparse),
                   np.array(list(sparse.values()), dtype=np.int64), len(multi), value_first)


@dataclass(frozen=True)
class VariableRows:
    """A chunk parsed by :func:`parse_variable` (rows not ``parsed`` are all zeros).

    Attributes:
        parsed (ndarray[N], bool): lines parsed here.
        labels (ndarray[N], float32), dense (ndarray[N, D], float32): values.
        sparse (ndarray[N, S], uint64): fixed slots' low key bits (no slot prefix).
        multi_row, multi_feature (ndarray[V], int64): line and multi-valued slot of each
            id of the parsed lines, in line order.
        multi_low (ndarray[V], uint64): the ids' low key bits (no slot prefix).
    """

    parsed: npt.NDArray[np.bool_]
    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]
    sparse: npt.NDArray[np.uint64]
    multi_row: npt.NDArray[np.int64]
    multi_feature: npt.NDArray[np.int64]
    multi_low: npt.NDArray[np.uint64]


def parse_variable(data: bytes, layout: SlotLayout, num_dense: int, num_slots: int
                   ) -> VariableRows:
    """Parse the lines of ``data`` (module docstring). Blocks; thread safe.

    Args:
        data: ``\\n``-separated lines (a trailing ``\\n`` is optional).
        layout: the declared slots.
        num_dense: dense columns D; num_slots: fixed sparse columns S.
    """
    tokens = split_tokens(data)
    count, line, padded = tokens.lines, tokens.line, tokens.padded
    good = tokens.usable.copy()
    has_colon = tokens.colon >= 0
    good[line[~has_colon]] = False
    colon = np.where(has_colon, tokens.colon, tokens.starts)
    if layout.value_first:
        name_starts, name_ends, value_starts, value_ends = (colon + 1, tokens.ends,
                                                            tokens.starts, colon)
    else:
        name_starts, name_ends, value_starts, value_ends = (tokens.starts, colon, colon + 1,
                                                            tokens.ends)
    value_lengths = value_ends - value_starts
    found = layout.table.lookup(padded, name_starts, name_ends - name_starts)
    found = np.where(has_colon, found, -1)
    kind = np.where(found >= 0, layout.kind[found], -1)
    sub = layout.sub[found]

    # the label: the last label token of the line, '0' or '1'
    at = np.flatnonzero(kind == LABEL)
    at = at[first_per_group(line[at], last=True)]
    label_line = line[at]
    has_label = np.zeros(count, dtype=bool)
    has_label[label_line] = True
    good &= has_label
    byte = padded[value_starts[at]]
    label_ok = (value_lengths[at] == 1) & ((byte == ord("0")) | (byte == ord("1")))
    good[label_line[~label_ok]] = False

    def positions(which: int, widths: npt.NDArray[np.int64]
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Tokens of a kind and each one's rank among its slot's tokens on its line."""
        picked = np.flatnonzero(kind == which)
        rank = rank_in_group(line[picked] * max(len(widths), 1) + sub[picked])
        good[line[picked[rank >= widths[sub[picked]]]]] = False
        return picked, rank

    dense_at, dense_rank = positions(DENSE, layout.dense_width)
    floats, floats_ok = _dense_floats(padded, value_starts[dense_at, None],
                                      value_lengths[dense_at, None])
    good[line[dense_at[~floats_ok]]] = False
    sparse_at, sparse_rank = positions(SPARSE, layout.sparse_width)
    ids, ids_ok = decimal_low_bits(padded, value_starts[sparse_at], value_lengths[sparse_at])
    good[line[sparse_at[~ids_ok]]] = False
    multi_at = np.flatnonzero(kind == MULTI)
    bag_ids, bag_ok = decimal_low_bits(padded, value_starts[multi_at], value_lengths[multi_at])
    good[line[multi_at[~bag_ok]]] = False

    labels = np.zeros(count, dtype=np.float32)
    keep = good[label_line]
    labels[label_line[keep]] = byte[keep] == ord("1")
    dense = np.zeros((count, num_dense), dtype=np.float32)
    keep = good[line[dense_at]]
    dense[line[dense_at[keep]], (layout.dense_start[sub[dense_at]] + dense_rank)[keep]] = (
        floats[keep, 0])
    sparse = np.zeros((count, num_slots), dtype=np.uint64)
    keep = good[line[sparse_at]]
    sparse[line[sparse_at[keep]], (layout.sparse_start[sub[sparse_at]] + sparse_rank)[keep]] = (
        ids[keep])
    keep = good[line[multi_at]]
    return VariableRows(good, labels, dense, sparse, line[multi_at[keep]],
                        sub[multi_at[keep]], bag_ids[keep])
