"""The hidden model of the synthetic Criteo generator (see ``psfleet.data.synthetic``).

Its vocabularies, weights, interactions and bias, the vectorised sampling of rows and
their true click probabilities, and their formatting as Criteo TSV, chunk by chunk.
Fixed entirely by a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from psfleet.data.criteo import NUM_DENSE, NUM_SLOTS

__all__ = ["Chunk", "HiddenModel"]

CHUNK_ROWS = 100_000
ZIPF_EXPONENT = 1.1
TARGET_POSITIVE_RATE = 0.23
SPLITS = ("train", "test")
_STREAM_MODEL, _STREAM_CALIBRATION, _STREAM_TRAIN, _STREAM_TEST = range(4)
_CALIBRATION_ROWS = 100_000

# Distinct values of C1..C26 in the full Criteo Kaggle training set (DLRM's ln_emb).
_CRITEO_DISTINCT = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683,
                    8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18,
                    15, 286181, 105, 142572)


def _vocab_sizes() -> tuple[int, ...]:
    log_spaced = np.round(np.logspace(1.0, 6.0, NUM_SLOTS)).astype(np.int64)
    sizes = np.empty(NUM_SLOTS, dtype=np.int64)
    sizes[np.argsort(_CRITEO_DISTINCT, kind="stable")] = log_spaced
    return tuple(int(s) for s in sizes)


VOCAB_SIZES: tuple[int, ...] = _vocab_sizes()
"""Vocabulary size of C1..C26 (10 .. 10**6, log-spaced, in Criteo's size order)."""

# Standard deviation (in logits, before LOGIT_SCALE) of each field's main effect.
FIELD_SCALES: tuple[float, ...] = (
    0.50, 0.40, 0.15, 0.20, 0.30, 0.40, 0.30, 0.00, 0.20, 0.30, 0.35, 0.15, 0.00,
    0.50, 0.25, 0.15, 0.40, 0.30, 0.00, 0.30, 0.15, 0.00, 0.40, 0.20, 0.30, 0.00,
)
DENSE_SCALE = 0.5
INTERACTION_SCALE = 0.3
# Field pairs (0-based: 0 is C1) with a factorization-machine interaction.
INTERACTIONS: tuple[tuple[int, int], ...] = ((0, 13), (1, 5), (4, 16), (10, 22), (6, 19),
                                             (8, 24))
LOGIT_SCALE = 0.75
_FACTOR_DIM = 4

# Missing rates of I1..I13 then C1..C26 (criteo_kaggle_sample README) and the group
# whose uniform draw decides it (columns of one group go missing together).
_MISSING_RATES = (
    0.452, 0.0, 0.203, 0.203, 0.050, 0.252, 0.050, 0.001, 0.050, 0.452, 0.050, 0.777, 0.203,
    0.0, 0.0, 0.033, 0.033, 0.0, 0.131, 0.0, 0.0, 0.0, 0.0, 0.0, 0.033, 0.0, 0.0, 0.0,
    0.033, 0.0, 0.0, 0.453, 0.453, 0.033, 0.817, 0.0, 0.033, 0.453, 0.453,
)
_MISSING_GROUPS = (
    0, 1, 2, 2, 3, 2, 3, 4, 3, 0, 3, 5, 2,
    1, 1, 6, 6, 1, 7, 1, 1, 1, 1, 1, 6, 1, 1, 1, 6, 1, 1, 0, 0, 6, 8, 1, 6, 0, 0,
)
_NUM_MISSING_GROUPS = 9
# Dense counts: floor(exp(mu + sigma z)); exp(mu) is about the median plus one.
_DENSE_MU = np.log(np.array([2.0, 4.0, 8.0, 5.0, 2800.0, 34.0, 4.0, 9.0, 40.0, 1.5, 2.0,
                             1.2, 5.0]))
_DENSE_SIGMA = np.array([1.0, 1.5, 1.2, 0.9, 1.5, 1.5, 1.2, 0.9, 1.2, 0.4, 0.8, 1.0, 1.0])
_NEGATIVE_I2_RATE = 0.03

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_HEX_SHIFTS = np.arange(28, -4, -4, dtype=np.uint32)  # most significant nibble first
_TAB, _NEWLINE, _MINUS, _ZERO = ord("\t"), ord("\n"), ord("-"), ord("0")


@dataclass(frozen=True)
class Chunk:
    labels: npt.NDArray[np.int8]  # [N]
    probs: npt.NDArray[np.float64]  # [N]
    ranks: npt.NDArray[np.int64]  # [N, 26], V_f means missing
    dense: npt.NDArray[np.int64]  # [N, 13]
    dense_missing: npt.NDArray[np.bool_]  # [N, 13]


class HiddenModel:
    """The hidden model of one seed (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        rng = np.random.default_rng(_stream(seed, _STREAM_MODEL))
        self.cdfs: list[npt.NDArray[np.float64]] = []
        self.ids: list[npt.NDArray[np.uint32]] = []  # [V_f + 1], last: missing (unused)
        self.weights: list[npt.NDArray[np.float64]] = []  # [V_f + 1], last: missing
        value_probs: list[npt.NDArray[np.float64]] = []
        for field, size in enumerate(VOCAB_SIZES):
            zipf = np.arange(1, size + 1, dtype=np.float64) ** -ZIPF_EXPONENT
            zipf /= zipf.sum()
            cdf = np.cumsum(zipf)
            cdf[-1] = 1.0
            self.cdfs.append(cdf)
            self.ids.append(np.append(_distinct_ids(rng, size), np.uint32(0)))  # [V_f + 1]
            missing = _MISSING_RATES[NUM_DENSE + field]
            probs = np.append(zipf * (1.0 - missing), missing)  # [V_f + 1]
            value_probs.append(probs)
            scale = FIELD_SCALES[field] * LOGIT_SCALE
            self.weights.append(_standardise(rng.standard_normal(size + 1), probs) * scale)
        self.factors: list[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = []
        for left, right in INTERACTIONS:
            u = rng.standard_normal((VOCAB_SIZES[left] + 1, _FACTOR_DIM))  # [V_l + 1, K]
            v = rng.standard_normal((VOCAB_SIZES[right] + 1, _FACTOR_DIM))  # [V_r + 1, K]
            std = _interaction_std(u, value_probs[left], v, value_probs[right])
            gain = math.sqrt(INTERACTION_SCALE * LOGIT_SCALE / std)
            self.factors.append((u * gain, v * gain))
        dense_weights = rng.standard_normal(NUM_DENSE)
        self.dense_weights = dense_weights
        self.bias = 0.0
        calibration = np.random.default_rng(_stream(seed, _STREAM_CALIBRATION))
        ranks, dense, dense_missing = self._draw_features(calibration, _CALIBRATION_ROWS)
        dense_logit = _dense_features(dense, dense_missing) @ dense_weights
        self.dense_weights = dense_weights * (DENSE_SCALE * LOGIT_SCALE / dense_logit.std())
        self.bias = _solve_bias(self._logits(ranks, dense, dense_missing), TARGET_POSITIVE_RATE)

    def _draw_features(
        self, rng: np.random.Generator, rows: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        groups = rng.random((rows, _NUM_MISSING_GROUPS))  # [N, G]
        missing = groups[:, _MISSING_GROUPS] < np.array(_MISSING_RATES)  # [N, 39]
        ranks = np.empty((rows, NUM_SLOTS), dtype=np.int64)
        uniforms = rng.random((rows, NUM_SLOTS))
        for field, cdf in enumerate(self.cdfs):
            ranks[:, field] = np.minimum(np.searchsorted(cdf, uniforms[:, field], side="right"),
                                         cdf.size - 1)
        ranks = np.where(missing[:, NUM_DENSE:], np.array(VOCAB_SIZES), ranks)
        z = rng.standard_normal((rows, NUM_DENSE))
        dense = np.floor(np.exp(_DENSE_MU + _DENSE_SIGMA * z)).astype(np.int64)  # [N, 13]
        negative = rng.random(rows) < _NEGATIVE_I2_RATE
        dense[:, 1] = np.where(negative, -1 - rng.integers(0, 2, rows), dense[:, 1])
        return ranks, dense, missing[:, :NUM_DENSE]

    def _logits(
        self,
        ranks: npt.NDArray[np.int64],
        dense: npt.NDArray[np.int64],
        dense_missing: npt.NDArray[np.bool_],
    ) -> npt.NDArray[np.float64]:
        logit = self.bias + _dense_features(dense, dense_missing) @ self.dense_weights
        for field, weights in enumerate(self.weights):
            logit += weights[ranks[:, field]]
        for (left, right), (u, v) in zip(INTERACTIONS, self.factors, strict=True):
            logit += np.einsum("nk,nk->n", u[ranks[:, left]], v[ranks[:, right]])
        return logit

    def draw_chunk(self, split: str, chunk: int, rows: int) -> Chunk:
        """Rows ``chunk * CHUNK_ROWS ...`` of ``split`` (``rows <= CHUNK_ROWS``)."""
        stream = _STREAM_TRAIN if split == "train" else _STREAM_TEST
        rng = np.random.default_rng(_stream(self.seed, stream, chunk))
        ranks, dense, dense_missing = self._draw_features(rng, rows)
        probs = 1.0 / (1.0 + np.exp(-self._logits(ranks, dense, dense_missing)))
        labels = (rng.random(rows) < probs).astype(np.int8)
        return Chunk(labels, probs, ranks, dense, dense_missing)

    def format_chunk(self, chunk: Chunk) -> bytes:
        """The chunk's raw Criteo lines, LF-terminated.

        Every field is laid out right-aligned in a fixed-width byte matrix (a tab before
        each of the 39 fields after the label), then one boolean mask drops the padding.
        """
        rows = chunk.labels.shape[0]
        digits, lengths = _format_ints(chunk.dense)  # [N, 13, D], [N, 13]
        lengths = np.where(chunk.dense_missing, 0, lengths)
        width = digits.shape[2]
        dense_block = np.empty((rows, NUM_DENSE, 1 + width), dtype=np.uint8)  # [N, 13, 1+D]
        dense_block[:, :, 0] = _TAB
        dense_block[:, :, 1:] = digits
        dense_keep = np.arange(-1, width) >= (width - lengths)[:, :, None]  # [N, 13, 1+D]
        dense_keep[:, :, 0] = True  # the tab
        ids = np.empty((rows, NUM_SLOTS), dtype=np.uint32)
        for field, field_ids in enumerate(self.ids):
            ids[:, field] = field_ids[chunk.ranks[:, field]]
        hex_block = np.empty((rows, NUM_SLOTS, 9), dtype=np.uint8)  # [N, 26, 1+8]
        hex_block[:, :, 0] = _TAB
        hex_block[:, :, 1:] = _HEX_DIGITS[(ids[:, :, None] >> _HEX_SHIFTS) & np.uint32(15)]
        hex_keep = np.ones((rows, NUM_SLOTS, 9), dtype=np.bool_)
        hex_keep[:, :, 1:] = (chunk.ranks != np.array(VOCAB_SIZES))[:, :, None]
        label = (chunk.labels.astype(np.uint8) + _ZERO)[:, None]  # [N, 1]
        newline = np.full((rows, 1), _NEWLINE, dtype=np.uint8)
        matrix = np.concatenate([label, dense_block.reshape(rows, -1),
                                 hex_block.reshape(rows, -1), newline], axis=1)
        keep = np.concatenate([np.ones((rows, 1), np.bool_), dense_keep.reshape(rows, -1),
                               hex_keep.reshape(rows, -1), np.ones((rows, 1), np.bool_)],
                              axis=1)
        return matrix[keep].tobytes()


def _stream(seed: int, stream: int, chunk: int | None = None) -> np.random.SeedSequence:
    key = (stream,) if chunk is None else (stream, chunk)
    return np.random.SeedSequence(seed, spawn_key=key)


def _distinct_ids(rng: np.random.Generator, size: int) -> npt.NDArray[np.uint32]:
    """Random-looking uint32 ids of ranks ``0 .. size - 1``, distinct (a keyed bijection).

    Each step maps 32-bit words one-to-one: xor with a key, multiply by an odd key,
    xor-shift right, add a key (all mod 2**32), so distinct ranks get distinct ids.
    """
    xor_key, add_key = (int(k) for k in rng.integers(0, 2**32, size=2, dtype=np.uint64))
    odd_keys = (rng.integers(0, 2**31, size=2, dtype=np.uint64) * 2 + 1).tolist()
    x = np.arange(size, dtype=np.uint64) ^ np.uint64(xor_key)
    for odd in odd_keys:
        x = (x * np.uint64(odd)) & np.uint64(0xFFFFFFFF)
        x ^= x >> np.uint64(15)
    return ((x + np.uint64(add_key)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _standardise(
    values: npt.NDArray[np.float64], probs: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """``values`` shifted and scaled to mean 0, standard deviation 1 under ``probs``."""
    centred = values - probs @ values
    return centred / math.sqrt(float(probs @ (centred * centred)))


def _interaction_std(
    u: npt.NDArray[np.float64],
    p: npt.NDArray[np.float64],
    v: npt.NDArray[np.float64],
    q: npt.NDArray[np.float64],
) -> float:
    """Std of ``<u[a], v[b]>`` for independent ``a ~ p``, ``b ~ q`` (exact)."""
    second_u = (u * p[:, None]).T @ u  # [K, K] E[u u^T]
    second_v = (v * q[:, None]).T @ v  # [K, K]
    mean = float((p @ u) @ (q @ v))
    return math.sqrt(float(np.sum(second_u * second_v)) - mean * mean)


def _dense_features(
    dense: npt.NDArray[np.int64], missing: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """The parser's transform: ``log1p(max(x, 0))``, 0 when missing. [N, 13] float64."""
    return np.where(missing, 0.0, np.log1p(np.maximum(dense, 0).astype(np.float64)))


def _solve_bias(logits: npt.NDArray[np.float64], rate: float) -> float:
    """``b`` with ``mean(sigmoid(logits + b)) == rate`` (bisection; the mean is monotone)."""
    low, high = -30.0, 30.0
    for _ in range(60):
        mid = (low + high) / 2
        if float(np.mean(1.0 / (1.0 + np.exp(-(logits + mid))))) < rate:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _format_ints(
    values: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """ASCII decimal of each int: (chars [..., D] right-aligned, lengths [...]).

    ``D`` is the widest magnitude's length plus one (room for ``-``); ``lengths``
    count the sign.
    """
    magnitude = np.abs(values)
    width = len(str(int(magnitude.max(initial=0)))) + 1
    chars = np.empty(values.shape + (width,), dtype=np.uint8)
    digits = np.ones(values.shape, dtype=np.int64)
    rest = magnitude
    for position in range(width - 1, -1, -1):
        chars[..., position] = rest % 10 + _ZERO
        rest = rest // 10
        digits += rest > 0
    negative = values < 0
    lengths = digits + negative
    where = np.nonzero(negative)
    chars[where + (width - lengths[where],)] = _MINUS
    return chars, lengths
