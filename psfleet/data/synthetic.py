"""Synthetic Criteo-like data with a known optimum, for exact AUC comparisons.

:func:`generate_criteo` writes raw Criteo TSV (the layout :mod:`psfleet.data.criteo`
parses) drawn from a hidden logistic model, and reports the **optimum AUC**: the AUC
of the true click probabilities on the rows written, the best any model can reach on
that file. Training modes can then be compared by their gap to the optimum instead of
against each other alone.

The hidden model (all of it is fixed by ``seed``)
    Categorical field ``f`` (C1..C26) has a vocabulary of ``V_f`` values,
    :data:`VOCAB_SIZES`: log-spaced from 10 to 10**6 and assigned to fields in the order
    of the full Criteo Kaggle distinct counts (the ``ln_emb`` list of DLRM's Kaggle
    setup: C9 smallest, C3 largest). Value ranks ``k = 0 .. V_f - 1`` are drawn Zipf-like,
    ``P(k) ∝ (k + 1) ** -ZIPF_EXPONENT``; rank ``k`` is written as a random-looking
    32-bit id (8 lower-case hex digits, a keyed bijection of ``k``, so distinct within
    the field). A field is missing (empty)
    at the rate the real data shows (README of ``criteo_kaggle_sample``); fields that
    go missing together there share one uniform draw here (e.g. C19, C20, C25, C26,
    I1, I10 at ~45 %).

    Dense field ``i`` (I1..I13) is a count ``floor(exp(mu_i + sigma_i z))``,
    ``z ~ N(0, 1)``, with medians near Criteo's; I2 is ``-1`` or ``-2`` in 3 % of rows;
    missing at Criteo's rates. Its feature is ``x_i = log1p(max(I_i, 0))`` (0 when
    missing), exactly the parser's dense transform.

    The logit of a row is::

        logit = b + sum_f w_f[v_f] + sum_i d_i x_i + sum_(f,g) <u_f[v_f], u_g[v_g]>

    - ``w_f``: one weight per value and one for "missing", drawn ``N(0, 1)``, then
      centred and scaled so that ``w_f[v_f]`` has mean 0 and standard deviation
      ``FIELD_SCALES[f] * LOGIT_SCALE`` under the field's own value distribution
      (exact, not sampled). Fields with scale 0 are pure noise.
    - ``d``: dense weights ``N(0, 1)``, scaled so that ``sum_i d_i x_i`` has standard
      deviation ``DENSE_SCALE * LOGIT_SCALE`` on a calibration sample.
    - ``u_f``: rank-4 factors (a factorization-machine term, Rendle 2010) for the
      field pairs in :data:`INTERACTIONS`, scaled so that each pair's term has
      standard deviation ``INTERACTION_SCALE * LOGIT_SCALE`` (exact); a linear model
      cannot express it, a DNN or DeepFM can.
    - ``b``: solved on a calibration sample (a row stream of its own) so that the
      expected positive rate is :data:`TARGET_POSITIVE_RATE`.

    ``label ~ Bernoulli(sigmoid(logit))``. With these constants the optimum AUC is
    about 0.79 and the positive rate about 0.23. Rare values of the large fields are
    seen a handful of times in 10**6 rows: no model learns those, which is realistic
    (zeroing the weights of values expected < 20 times in 10**6 rows costs only ~0.005
    AUC; the interactions are worth ~0.03). Measured once on 10**6 train rows, one
    epoch, 200k test rows: logistic regression 0.742, a small DNN 0.752, optimum 0.791.

Streams
    The hidden model, the calibration sample, the ``"train"`` rows and the ``"test"``
    rows come from four independent streams of ``numpy.random.SeedSequence(seed)``;
    rows are drawn in chunks of :data:`CHUNK_ROWS`, chunk ``c`` from its own child
    stream. So a train and a test file of one seed share the hidden model and have
    independent rows, and the bytes depend only on ``(rows, seed, split)`` and numpy's
    generator algorithms.

Speed and memory
    Sampling and formatting are vectorised numpy (no Python step per row), one
    :data:`CHUNK_ROWS` chunk at a time: about 11 s per 10**6 rows (242 MB of TSV) on
    one core of a 2-core machine, including about 1 s to build the hidden model; peak
    memory about 400 MB whatever ``rows`` is (plus 9 bytes per row for the AUC).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from psfleet.data.criteo import NUM_DENSE, NUM_SLOTS
from psfleet.errors import ConfigError, DataError
from psfleet.metrics import auc

__all__ = [
    "CHUNK_ROWS",
    "DENSE_SCALE",
    "FIELD_SCALES",
    "INTERACTIONS",
    "INTERACTION_SCALE",
    "LOGIT_SCALE",
    "SPLITS",
    "TARGET_POSITIVE_RATE",
    "VOCAB_SIZES",
    "ZIPF_EXPONENT",
    "DatagenResult",
    "generate_criteo",
    "true_probabilities",
]

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
class DatagenResult:
    """What :func:`generate_criteo` wrote.

    Attributes:
        path: the TSV file; its metadata is ``path + ".json"``.
        rows: lines written.
        seed: the hidden model's seed.
        split: ``"train"`` or ``"test"`` (the row stream).
        optimum_auc: ROC AUC of the true click probabilities against the labels
            written (ties averaged), the best AUC any model can reach on this file.
        positive_rate: fraction of rows with label 1.
        vocab_sizes: vocabulary size of C1..C26.
        sha256: hex digest of the file's bytes.
    """

    path: Path
    rows: int
    seed: int
    split: str
    optimum_auc: float
    positive_rate: float
    vocab_sizes: tuple[int, ...]
    sha256: str


@dataclass(frozen=True)
class _Chunk:
    labels: npt.NDArray[np.int8]  # [N]
    probs: npt.NDArray[np.float64]  # [N]
    ranks: npt.NDArray[np.int64]  # [N, 26], V_f means missing
    dense: npt.NDArray[np.int64]  # [N, 13]
    dense_missing: npt.NDArray[np.bool_]  # [N, 13]


class _HiddenModel:
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

    def draw_chunk(self, split: str, chunk: int, rows: int) -> _Chunk:
        """Rows ``chunk * CHUNK_ROWS ...`` of ``split`` (``rows <= CHUNK_ROWS``)."""
        stream = _STREAM_TRAIN if split == "train" else _STREAM_TEST
        rng = np.random.default_rng(_stream(self.seed, stream, chunk))
        ranks, dense, dense_missing = self._draw_features(rng, rows)
        probs = 1.0 / (1.0 + np.exp(-self._logits(ranks, dense, dense_missing)))
        labels = (rng.random(rows) < probs).astype(np.int8)
        return _Chunk(labels, probs, ranks, dense, dense_missing)

    def format_chunk(self, chunk: _Chunk) -> bytes:
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


def _chunks(model: _HiddenModel, rows: int, split: str) -> Iterator[_Chunk]:
    for chunk, first in enumerate(range(0, rows, CHUNK_ROWS)):
        yield model.draw_chunk(split, chunk, min(CHUNK_ROWS, rows - first))


def _check(rows: int, seed: int, split: str) -> None:
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ConfigError(f"rows: {rows!r} must be an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed: {seed!r} must be an integer >= 0")
    if split not in SPLITS:
        raise ConfigError(f"split: {split!r} is not one of {', '.join(SPLITS)}")


def true_probabilities(
    rows: int, seed: int, split: str = "train"
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float64]]:
    """The labels and true click probabilities of the rows :func:`generate_criteo` writes.

    Blocks (redraws the rows; nothing is written). Row ``r`` here is line ``r + 1`` of
    ``generate_criteo(rows, seed, ..., split=split)``.

    Args:
        rows: number of rows, >= 1.
        seed: the hidden model's seed, >= 0.
        split: the row stream, ``"train"`` or ``"test"``.

    Returns:
        ``(labels (ndarray[rows], int8, 0/1), probs (ndarray[rows], float64))`` where
        ``probs = sigmoid(logit)`` of the hidden model.

    Raises:
        ConfigError: if ``rows`` < 1, ``seed`` < 0 or ``split`` is unknown.
    """
    _check(rows, seed, split)
    model = _HiddenModel(seed)
    drawn = list(_chunks(model, rows, split))
    return (np.concatenate([c.labels for c in drawn]), np.concatenate([c.probs for c in drawn]))


def generate_criteo(rows: int, seed: int, out: Path, *, split: str = "train") -> DatagenResult:
    """Write ``rows`` synthetic raw Criteo lines to ``out`` and their metadata beside it.

    The model is the module docstring's. Blocks; about 11 s per 10**6 rows. The file is
    written to ``out + ".tmp"`` and renamed, so ``out`` is either whole or untouched;
    then ``out + ".json"`` gets ``rows``, ``seed``, ``split``, ``optimum_auc``,
    ``positive_rate``, ``vocab_sizes`` and ``sha256``. Same arguments, same bytes.

    Args:
        rows: number of lines, >= 1.
        seed: the hidden model's seed, >= 0; a train and a test file share the model
            when they share the seed.
        out: the TSV path; its directory must exist.
        split: the row stream: ``"train"`` or ``"test"`` (independent rows).

    Returns:
        The file's :class:`DatagenResult` (optimum AUC, positive rate, ...).

    Raises:
        ConfigError: if ``rows`` < 1, ``seed`` < 0 or ``split`` is unknown.
        DataError: if ``out`` or its ``.json`` cannot be written (names the path).
    """
    _check(rows, seed, split)
    out = Path(out)
    meta_path = Path(f"{out}.json")
    tmp_path = Path(f"{out}.tmp")
    digest = hashlib.sha256()
    labels: list[npt.NDArray[np.int8]] = []
    probs: list[npt.NDArray[np.float64]] = []
    try:
        with open(tmp_path, "wb") as handle:  # fails fast, before the model is built
            model = _HiddenModel(seed)
            for chunk in _chunks(model, rows, split):
                data = model.format_chunk(chunk)
                digest.update(data)
                handle.write(data)
                labels.append(chunk.labels)
                probs.append(chunk.probs)
        os.replace(tmp_path, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp_path.unlink(missing_ok=True)
        raise DataError(f"cannot write {str(out)!r}: {exc.strerror or exc}; check that "
                        "its directory exists and is writable") from exc
    all_labels = np.concatenate(labels)
    result = DatagenResult(
        path=out,
        rows=rows,
        seed=seed,
        split=split,
        optimum_auc=auc(all_labels, np.concatenate(probs)),
        positive_rate=float(all_labels.mean()),
        vocab_sizes=VOCAB_SIZES,
        sha256=digest.hexdigest(),
    )
    meta = {"rows": rows, "seed": seed, "split": split, "optimum_auc": result.optimum_auc,
            "positive_rate": result.positive_rate, "vocab_sizes": list(VOCAB_SIZES),
            "sha256": result.sha256, "generator": "psfleet.data.synthetic"}
    try:
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as exc:
        raise DataError(f"cannot write {str(meta_path)!r}: {exc.strerror or exc}") from exc
    return result
