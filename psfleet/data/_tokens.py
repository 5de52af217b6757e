"""Whitespace-separated ``name:value`` tokens of a whole chunk, found at once with numpy
(the variable-length path of the ``slot`` parser and the ``libsvm`` parser).

:func:`split_tokens` finds every token of every line of a chunk with a few
whole-buffer operations (no Python step per line or token): token bounds from the
whitespace bytes, each token's line from the ``\\n`` positions, each token's first and
second ``:``. Only lines of printable ASCII, spaces, tabs and ``\\r`` are tokenised
(``usable``); the caller parses the other lines with its per-line reference code,
which splits on Python's ``str.split()`` whitespace, so the tokens agree.

:class:`NameTable` maps token names (byte spans) to declared names, 8 bytes per
comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from psfleet.data._fields import byte_windows
from psfleet.data.jagged_rows import JaggedRows

__all__ = ["ChunkTokens", "NameTable", "bags_to_rows", "first_per_group", "rank_in_group",
           "split_tokens"]

_COLON, _NEWLINE = ord(":"), ord("\n")
_PAD = 64  # zero bytes after the text: 8-byte windows up to 56 bytes past any byte


@dataclass(frozen=True)
class ChunkTokens:
    """The tokens of a chunk's usable lines.

    Attributes:
        padded (ndarray[B + 65], uint8): the chunk, a final ``\\n`` added if missing,
            then zero bytes (for :func:`~psfleet.data._fields.byte_windows`).
        lines: N, the chunk's lines (as ``bytes.split(b"\\n")`` without a final empty one).
        usable (ndarray[N], bool): lines tokenised here (printable ASCII, space, tab,
            ``\\r`` only).
        starts, ends (ndarray[T], int64): byte span of each token of the usable lines,
            in order (``ends`` exclusive).
        line (ndarray[T], int64): the line of each token (non-decreasing).
        colon (ndarray[T], int64): position of the token's first ``:``, or -1.
        colon2 (ndarray[T], int64): position of its second ``:``, or -1.
    """

    padded: npt.NDArray[np.uint8]
    lines: int
    usable: npt.NDArray[np.bool_]
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    line: npt.NDArray[np.int64]
    colon: npt.NDArray[np.int64]
    colon2: npt.NDArray[np.int64]


def split_tokens(data: bytes) -> ChunkTokens:
    """Tokenise a chunk of ``\\n``-separated lines (module docstring). Thread safe."""
    size = len(data)
    end = size + (1 if size and data[-1] != _NEWLINE else 0)
    padded = np.zeros(end + _PAD + 1, dtype=np.uint8)
    padded[:size] = np.frombuffer(data, dtype=np.uint8)
    if end > size:
        padded[size] = _NEWLINE
    text = padded[:end]
    spaces = np.flatnonzero(text <= 32)  # whitespace (and control bytes: unusable lines)
    kinds = text[spaces]
    newlines = spaces[kinds == _NEWLINE]
    count = len(newlines)
    odd = np.flatnonzero((text - np.uint8(32)) >= 95)  # < 32 or >= 127 ...
    odd = odd[(text[odd] != 9) & (text[odd] != 10) & (text[odd] != 13)]  # ... but \t \n \r
    usable = np.ones(count, dtype=bool)
    usable[np.searchsorted(newlines, odd)] = False
    bounds = np.empty(len(spaces) + 1, dtype=np.int64)  # -1, then every whitespace byte
    bounds[0] = -1
    bounds[1:] = spaces
    gaps = np.flatnonzero(np.diff(bounds) > 1)
    starts = bounds[gaps] + 1
    ends = bounds[gaps + 1]
    newlines_before = np.zeros(len(spaces) + 1, dtype=np.int64)
    np.cumsum(kinds == _NEWLINE, out=newlines_before[1:])
    line = newlines_before[gaps]  # the newlines before each token's start
    keep = usable[line]
    if not keep.all():
        starts, ends, line = starts[keep], ends[keep], line[keep]
    colons = np.flatnonzero(text == _COLON)
    if len(colons) == len(starts) and bool(np.all((colons >= starts) & (colons < ends))):
        colon = colons  # the usual case: one ':' per token
        colon2 = np.full(len(starts), -1, dtype=np.int64)
    else:
        first = np.searchsorted(colons, starts)
        colon = _colon_at(colons, first, ends)
        colon2 = np.where(colon >= 0, _colon_at(colons, first + 1, ends), -1)
    return ChunkTokens(padded, count, usable, starts, ends, line, colon, colon2)


def _colon_at(colons: npt.NDArray[np.int64], index: npt.NDArray[np.int64],
              ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``colons[index]`` where it lies before ``ends``, else -1."""
    if not len(colons):
        return np.full(len(index), -1, dtype=np.int64)
    at = colons[np.minimum(index, len(colons) - 1)]
    return np.where((index < len(colons)) & (at < ends), at, -1).astype(np.int64)


def rank_in_group(group: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each element, how many earlier elements have the same group (0, 1, ...)."""
    order = np.argsort(group, kind="stable")
    ordered = group[order]
    run_start = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    run_of = np.repeat(run_start, np.diff(np.r_[run_start, len(ordered)]))
    rank = np.empty(len(group), dtype=np.int64)
    rank[order] = np.arange(len(group)) - run_of
    return rank


def first_per_group(group: npt.NDArray[np.int64], last: bool = False) -> npt.NDArray[np.bool_]:
    """For a non-decreasing ``group``: True at the first (``last``: the last) element of
    each run."""
    if not len(group):
        return np.zeros(0, dtype=bool)
    if last:
        return np.r_[group[1:] != group[:-1], True]
    return np.r_[True, group[1:] != group[:-1]]


class NameTable:
    """Declared names -> their index, for byte spans of a chunk (vectorised lookup).

    Args:
        names: the declared names (distinct, non-empty).
    """

    def __init__(self, names: list[str]) -> None:
        encoded = [name.encode("utf-8", "surrogatepass") for name in names]
        self._words = max(1, -(-max((len(n) for n in encoded), default=1) // 8))
        self._max_len = 8 * self._words
        table = np.zeros((len(encoded), self._words), dtype=np.uint64)
        for row, name in enumerate(encoded):
            padded = name.ljust(self._max_len, b"\0")
            table[row] = np.frombuffer(padded, dtype="<u8")
        self._table = table
        self._lengths = np.array([len(n) for n in encoded], dtype=np.int64)
        hashes = self._hash(table, self._lengths)
        self._order = np.argsort(hashes, kind="stable")
        self._sorted = hashes[self._order]
        self.unique = len(np.unique(hashes)) == len(names)

    @staticmethod
    def _hash(words: npt.NDArray[np.uint64], lengths: npt.NDArray[np.int64]
              ) -> npt.NDArray[np.uint64]:
        value = lengths.astype(np.uint64)
        for column in range(words.shape[1]):
            value = (value * np.uint64(0x9E3779B97F4A7C15)) ^ words[:, column]
            value ^= value >> np.uint64(29)
        return value

    def lookup(self, padded: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64],
               lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The declared index of each span ``padded[start:start + length]``, or -1.

        Args:
            padded (ndarray[B], uint8): bytes, with at least 8 readable bytes after
                every span (:class:`ChunkTokens`.padded).
            starts, lengths (ndarray[T], int64): the spans.
        """
        windows = byte_windows(padded)
        last = len(windows) - 1
        keep = np.minimum(lengths, self._max_len)
        words = np.empty((len(starts), self._words), dtype=np.uint64)
        for column in range(self._words):
            size = np.clip(keep - 8 * column, 0, 8)
            mask = np.where(size >= 8, np.uint64(0xFFFFFFFFFFFFFFFF),
                            (np.uint64(1) << (size * 8).astype(np.uint64)) - np.uint64(1))
            words[:, column] = windows[np.minimum(starts + 8 * column, last)] & mask
        hashes = self._hash(words, lengths)
        at = np.minimum(np.searchsorted(self._sorted, hashes), max(len(self._sorted) - 1, 0))
        if not len(self._sorted):
            return np.full(len(starts), -1, dtype=np.int64)
        index = self._order[at]
        same = (self._sorted[at] == hashes) & (self._lengths[index] == lengths) & np.all(
            self._table[index] == words, axis=1)
        return np.where(same, index, -1).astype(np.int64)


def bags_to_rows(rows: npt.NDArray[np.int64], features: npt.NDArray[np.int64],
                 keys: npt.NDArray[np.uint64], count: int, num_features: int,
                 weights: npt.NDArray[np.float32] | None = None) -> JaggedRows:
    """Example-major :class:`~psfleet.data.jagged.JaggedRows` of ids given in any
    example order.

    Args:
        rows, features (ndarray[V], int64): example (0..count-1) and feature of each id;
            ids of the same (example, feature) keep their order here.
        keys (ndarray[V], uint64): the ids' keys.
        count: examples N; num_features: features M.
        weights (ndarray[V], float32) or None: a weight per id.
    """
    group = rows * num_features + features
    order = np.argsort(group, kind="stable")
    lengths = np.bincount(group, minlength=count * num_features).astype(np.int32)
    return JaggedRows(np.ascontiguousarray(keys[order], dtype=np.uint64),
                      lengths.reshape(count, num_features),
                      None if weights is None else np.ascontiguousarray(weights[order],
                                                                        dtype=np.float32))
