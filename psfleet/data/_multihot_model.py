"""The hidden model of the synthetic multi-hot generator (see ``psfleet.data.synthetic_multihot``).

Its vocabularies, weights, pooled interactions and bias, the vectorised sampling of
rows (single-valued ids, numeric features, variable-length bags) and their true click
probabilities, chunk by chunk. Fixed entirely by a seed. Formatting is in
:mod:`psfleet.data._multihot_format`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from psfleet.data.synthetic_model import _solve_bias, _standardise

__all__ = [
    "BAG_MAX_LENGTHS",
    "BAG_MEAN_LENGTHS",
    "BAG_NAMES",
    "BAG_SCALES",
    "BAG_VOCAB_SIZES",
    "CHUNK_ROWS",
    "DENSE_SCALE",
    "INTERACTIONS",
    "INTERACTION_SCALE",
    "LOGIT_SCALE",
    "NUMERIC_NAMES",
    "NUMERIC_TICKS",
    "SINGLE_NAMES",
    "SINGLE_SCALES",
    "SINGLE_VOCAB_SIZES",
    "SPLITS",
    "TARGET_POSITIVE_RATE",
    "ZIPF_EXPONENT",
    "MultihotChunk",
    "MultihotModel",
]

CHUNK_ROWS = 65_536
ZIPF_EXPONENT = 1.1
TARGET_POSITIVE_RATE = 0.25
SPLITS = ("train", "test")
# Streams are keyed (namespace, stream[, chunk]) so that they never coincide with the
# synthetic Criteo generator's streams of the same seed.
_NAMESPACE = 2
_STREAM_MODEL, _STREAM_CALIBRATION, _STREAM_TRAIN, _STREAM_TEST = range(4)
_CALIBRATION_ROWS = 100_000

NUMERIC_NAMES = ("n1", "n2", "n3", "n4")
NUMERIC_TICKS = 10_000
"""Numeric values are written with 4 decimals: a value is ``ticks / NUMERIC_TICKS``."""
SINGLE_NAMES = ("c1", "c2", "c3", "c4", "c5", "c6")
SINGLE_VOCAB_SIZES: tuple[int, ...] = tuple(
    int(v) for v in np.round(np.logspace(1.0, 5.0, len(SINGLE_NAMES))))
"""Vocabulary of c1..c6: 10, 63, 398, 2512, 15849, 100000 (log-spaced)."""
BAG_NAMES = ("hist", "tags", "genres")
BAG_VOCAB_SIZES = (100_000, 1_000, 20)
BAG_MEAN_LENGTHS = (20.0, 4.0, 2.0)
BAG_MAX_LENGTHS = (200, 30, 3)

# Standard deviation (in logits, before LOGIT_SCALE) of each term.
SINGLE_SCALES = (0.40, 0.30, 0.30, 0.25, 0.30, 0.20)
BAG_SCALES = (0.50, 0.40, 0.30)
DENSE_SCALE = 0.40
INTERACTION_SCALE = 0.40
# (bag, single-valued column) pairs, 0-based: hist x c1, tags x c2, genres x c3.
INTERACTIONS: tuple[tuple[int, int], ...] = ((0, 0), (1, 1), (2, 2))
LOGIT_SCALE = 1.0
_FACTOR_DIM = 4

# n1..n3: log1p of counts floor(exp(mu + sigma z)); n4: uniform on [0, 1].
_COUNT_MU = np.log(np.array([3.0, 20.0, 200.0]))
_COUNT_SIGMA = np.array([1.0, 1.5, 1.2])


@dataclass(frozen=True)
class MultihotChunk:
    """Rows of one chunk as drawn (ids, not ranks).

    Attributes:
        labels (ndarray[N], int8): 0 / 1.
        probs (ndarray[N], float64): true click probabilities.
        numeric_ticks (ndarray[N, 4], int64): n1..n4 times :data:`NUMERIC_TICKS`.
        single (ndarray[N, 6], int64): ids of c1..c6, ``0 <= id < V``.
        bag_ids (3 x ndarray[T_m], int64): ids of hist, tags, genres, row-major.
        bag_lengths (3 x ndarray[N], int64): ids per row of each bag (0: empty).
    """

    labels: npt.NDArray[np.int8]
    probs: npt.NDArray[np.float64]
    numeric_ticks: npt.NDArray[np.int64]
    single: npt.NDArray[np.int64]
    bag_ids: tuple[npt.NDArray[np.int64], ...]
    bag_lengths: tuple[npt.NDArray[np.int64], ...]


class MultihotModel:
    """The hidden model of one seed (``psfleet.data.synthetic_multihot`` docstring).

    Attributes (all indexed by id, not rank):
        single_weights: 6 x ndarray[V_f] float64, ``w_f``.
        bag_weights: 3 x ndarray[V_m] float64, ``w_m`` (before ``bag_scales``).
        bag_scales: 3 floats, ``s_m``.
        dense_weights: ndarray[4] float64, ``d``.
        factors: per pair of :data:`INTERACTIONS`, ``(U [V_m, 4], V [V_f, 4])``.
        bias: ``b``.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        rng = np.random.default_rng(_stream(seed, _STREAM_MODEL))
        self._single_cdfs: list[npt.NDArray[np.float64]] = []
        self._single_ids: list[npt.NDArray[np.int64]] = []  # rank -> id
        self.single_weights: list[npt.NDArray[np.float64]] = []
        id_probs: list[npt.NDArray[np.float64]] = []
        for size, scale in zip(SINGLE_VOCAB_SIZES, SINGLE_SCALES, strict=True):
            probs, cdf, ids = _zipf(rng, size)
            self._single_cdfs.append(cdf)
            self._single_ids.append(ids)
            id_probs.append(probs)
            self.single_weights.append(
                _standardise(rng.standard_normal(size), probs) * scale * LOGIT_SCALE)
        self._bag_cdfs: list[npt.NDArray[np.float64]] = []
        self._bag_ids: list[npt.NDArray[np.int64]] = []
        self._bag_log_probs: list[npt.NDArray[np.float64]] = []
        self.bag_weights: list[npt.NDArray[np.float64]] = []
        for size in BAG_VOCAB_SIZES:
            probs, cdf, ids = _zipf(rng, size)
            self._bag_cdfs.append(cdf)
            self._bag_ids.append(ids)
            self._bag_log_probs.append(np.log(probs))
            self.bag_weights.append(_standardise(rng.standard_normal(size), probs))
        self.factors: list[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = [
            (rng.standard_normal((BAG_VOCAB_SIZES[bag], _FACTOR_DIM)),
             rng.standard_normal((SINGLE_VOCAB_SIZES[single], _FACTOR_DIM)))
            for bag, single in INTERACTIONS]
        dense_weights = rng.standard_normal(len(NUMERIC_NAMES))
        # Scales of the pooled and dense terms from a calibration sample of their own.
        calibration = np.random.default_rng(_stream(seed, _STREAM_CALIBRATION))
        ticks, single, bag_ids, bag_lengths = self._draw_features(calibration,
                                                                  _CALIBRATION_ROWS)
        self.bag_scales = [
            scale * LOGIT_SCALE / float(_mean_pool(weights[ids], lengths).std())
            for weights, ids, lengths, scale in zip(self.bag_weights, bag_ids, bag_lengths,
                                                    BAG_SCALES, strict=True)]
        dense_logit = (ticks / NUMERIC_TICKS) @ dense_weights
        self.dense_weights = dense_weights * (DENSE_SCALE * LOGIT_SCALE / dense_logit.std())
        for pair, ((bag, field), (u, v)) in enumerate(zip(INTERACTIONS, self.factors,
                                                          strict=True)):
            term = _pooled_dot(u, bag_ids[bag], bag_lengths[bag], v[single[:, field]])
            gain = math.sqrt(INTERACTION_SCALE * LOGIT_SCALE / float(term.std()))
            self.factors[pair] = (u * gain, v * gain)
        self.bias = 0.0
        self.bias = _solve_bias(self.logits(ticks / NUMERIC_TICKS, single, bag_ids,
                                            bag_lengths), TARGET_POSITIVE_RATE)

    def _draw_features(
        self, rng: np.random.Generator, rows: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
               tuple[npt.NDArray[np.int64], ...], tuple[npt.NDArray[np.int64], ...]]:
        uniforms = rng.random((rows, len(SINGLE_NAMES)))
        single = np.empty((rows, len(SINGLE_NAMES)), dtype=np.int64)
        for field, (cdf, ids) in enumerate(zip(self._single_cdfs, self._single_ids,
                                               strict=True)):
            single[:, field] = ids[_ranks(cdf, uniforms[:, field])]
        z = rng.standard_normal((rows, len(_COUNT_MU)))
        counts = np.floor(np.exp(_COUNT_MU + _COUNT_SIGMA * z))  # [N, 3]
        ticks = np.empty((rows, len(NUMERIC_NAMES)), dtype=np.int64)
        ticks[:, :3] = np.rint(np.log1p(counts) * NUMERIC_TICKS)
        ticks[:, 3] = rng.integers(0, NUMERIC_TICKS + 1, rows)
        hist_lengths = np.minimum(rng.geometric(1.0 / (BAG_MEAN_LENGTHS[0] + 1.0), rows) - 1,
                                  BAG_MAX_LENGTHS[0])
        tags_lengths = np.minimum(rng.poisson(BAG_MEAN_LENGTHS[1], rows), BAG_MAX_LENGTHS[1])
        bag_ids: list[npt.NDArray[np.int64]] = []
        for bag, lengths in enumerate((hist_lengths, tags_lengths)):
            ranks = _ranks(self._bag_cdfs[bag], rng.random(int(lengths.sum())))
            bag_ids.append(self._bag_ids[bag][ranks])
        # genres: 1..3 distinct ids, drawn without replacement in proportion to their
        # Zipf weights (Gumbel top-k, Kool et al. 2019).
        genre_lengths = rng.integers(1, BAG_MAX_LENGTHS[2] + 1, rows)
        keys = self._bag_log_probs[2] + rng.gumbel(size=(rows, BAG_VOCAB_SIZES[2]))
        top = np.argsort(-keys, axis=1, kind="stable")[:, :BAG_MAX_LENGTHS[2]]  # [N, 3] ranks
        keep = np.arange(BAG_MAX_LENGTHS[2]) < genre_lengths[:, None]
        bag_ids.append(self._bag_ids[2][top[keep]])
        all_lengths = (hist_lengths.astype(np.int64), tags_lengths.astype(np.int64),
                       genre_lengths.astype(np.int64))
        return ticks, single, tuple(bag_ids), all_lengths

    def logits(
        self,
        numeric: npt.NDArray[np.float64],
        single: npt.NDArray[np.int64],
        bag_ids: Sequence[npt.NDArray[np.int64]],
        bag_lengths: Sequence[npt.NDArray[np.int64]],
    ) -> npt.NDArray[np.float64]:
        """The hidden logit of N rows, from the values as written in the file.

        Args:
            numeric (ndarray[N, 4], float64): n1..n4 as parsed.
            single (ndarray[N, 6], int64): ids of c1..c6.
            bag_ids (3 x ndarray[T_m], int64): ids of hist, tags, genres, row-major.
            bag_lengths (3 x ndarray[N], int64): ids per row of each bag.

        Returns:
            ndarray[N] float64: ``b + sum_f w_f[c_f] + sum_m s_m mean(w_m[bag_m])
            + d . x + sum_pairs <mean(U[bag_m]), V[c_f]>``; an empty bag pools to 0.

        Raises:
            IndexError: if an id is outside its vocabulary.
        """
        logit = self.bias + numeric @ self.dense_weights
        for field, weights in enumerate(self.single_weights):
            logit = logit + weights[single[:, field]]
        for weights, scale, ids, lengths in zip(self.bag_weights, self.bag_scales, bag_ids,
                                                bag_lengths, strict=True):
            logit = logit + scale * _mean_pool(weights[ids], lengths)
        for (bag, field), (u, v) in zip(INTERACTIONS, self.factors, strict=True):
            logit = logit + _pooled_dot(u, bag_ids[bag], bag_lengths[bag], v[single[:, field]])
        return np.asarray(logit, dtype=np.float64)

    def draw_chunk(self, split: str, chunk: int, rows: int) -> MultihotChunk:
        """Rows ``chunk * CHUNK_ROWS ...`` of ``split`` (``rows <= CHUNK_ROWS``)."""
        stream = _STREAM_TRAIN if split == "train" else _STREAM_TEST
        rng = np.random.default_rng(_stream(self.seed, stream, chunk))
        ticks, single, bag_ids, bag_lengths = self._draw_features(rng, rows)
        logit = self.logits(ticks / NUMERIC_TICKS, single, bag_ids, bag_lengths)
        probs = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(rows) < probs).astype(np.int8)
        return MultihotChunk(labels, probs, ticks, single, bag_ids, bag_lengths)


def _stream(seed: int, stream: int, chunk: int | None = None) -> np.random.SeedSequence:
    key = (_NAMESPACE, stream) if chunk is None else (_NAMESPACE, stream, chunk)
    return np.random.SeedSequence(seed, spawn_key=key)


def _zipf(rng: np.random.Generator, size: int
          ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """(probability of each id [V], cdf over ranks [V], id of each rank [V]).

    Rank ``k`` has probability ``∝ (k + 1) ** -ZIPF_EXPONENT`` and a random id (a
    permutation of ``0 .. V - 1``, so ids are dense but frequency is not their order).
    """
    zipf = np.arange(1, size + 1, dtype=np.float64) ** -ZIPF_EXPONENT
    zipf /= zipf.sum()
    cdf = np.cumsum(zipf)
    cdf[-1] = 1.0
    ids = rng.permutation(size).astype(np.int64)
    probs = np.empty(size, dtype=np.float64)
    probs[ids] = zipf
    return probs, cdf, ids


def _ranks(cdf: npt.NDArray[np.float64], uniforms: npt.NDArray[np.float64]
           ) -> npt.NDArray[np.int64]:
    return np.minimum(np.searchsorted(cdf, uniforms, side="right"), cdf.size - 1)


def _mean_pool(values: npt.NDArray[np.float64], lengths: npt.NDArray[np.int64],
               rows: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.float64]:
    """Mean of each row's run of ``values`` [T] (runs of ``lengths`` [N]); 0 if empty,
    as ``torch.nn.EmbeddingBag(mode="mean")``. ``rows`` [T]: the row of each value, if
    the caller has it. Returns [N] float64."""
    if rows is None:
        rows = np.repeat(np.arange(lengths.size), lengths)
    sums = np.bincount(rows, weights=values, minlength=lengths.size)
    return np.asarray(sums / np.maximum(lengths, 1), dtype=np.float64)


def _pooled_dot(u: npt.NDArray[np.float64], ids: npt.NDArray[np.int64],
                lengths: npt.NDArray[np.int64], right: npt.NDArray[np.float64]
                ) -> npt.NDArray[np.float64]:
    """``<mean(u[ids of row]), right[row]>`` per row: u [V, K], right [N, K] -> [N].

    Pools ``u[ids] . right[row]`` (the mean is linear), one bincount instead of K.
    """
    rows = np.repeat(np.arange(lengths.size), lengths)
    products = np.einsum("tk,tk->t", u[ids], right[rows])  # [T]
    return _mean_pool(products, lengths, rows)
