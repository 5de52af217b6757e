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
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from psfleet.data.synthetic_model import (
    CHUNK_ROWS,
    DENSE_SCALE,
    FIELD_SCALES,
    INTERACTION_SCALE,
    INTERACTIONS,
    LOGIT_SCALE,
    SPLITS,
    TARGET_POSITIVE_RATE,
    VOCAB_SIZES,
    ZIPF_EXPONENT,
    Chunk,
    HiddenModel,
)
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
    "check_generator_args",
    "write_data_file",
    "generate_criteo",
    "true_probabilities",
]


@dataclass(frozen=True)
class DatagenResult:
    """What a generator (:func:`generate_criteo`, ``generate_multihot``) wrote.

    Attributes:
        path: the data file; its metadata is ``path + ".json"``.
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


def _chunks(model: HiddenModel, rows: int, split: str) -> Iterator[Chunk]:
    for chunk, first in enumerate(range(0, rows, CHUNK_ROWS)):
        yield model.draw_chunk(split, chunk, min(CHUNK_ROWS, rows - first))


class HashingWriter:
    """A binary file handle that also hashes what is written (SHA-256)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> None:
        """Write ``data`` and add it to :attr:`digest`."""
        self.digest.update(data)
        self.handle.write(data)


@contextlib.contextmanager
def write_data_file(out: Path) -> Iterator[HashingWriter]:
    """Write a generated file atomically: to ``out.tmp``, renamed to ``out`` when the
    block ends; on an error the temporary file is removed and ``out`` left as it was.

    Raises:
        DataError: ``out.tmp`` cannot be written or renamed (names ``out``).
    """
    tmp_path = Path(f"{out}.tmp")
    try:
        with open(tmp_path, "wb") as handle:
            yield HashingWriter(handle)
        os.replace(tmp_path, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp_path.unlink(missing_ok=True)
        raise DataError(f"cannot write {str(out)!r}: {exc.strerror or exc}; check that "
                        "its directory exists and is writable") from exc


def check_generator_args(rows: int, seed: int, split: str) -> None:
    """Raises ConfigError naming ``rows`` (< 1), ``seed`` (< 0) or ``split`` (not one of
    the generators' splits); every generator checks its arguments with it."""
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
    check_generator_args(rows, seed, split)
    model = HiddenModel(seed)
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
    check_generator_args(rows, seed, split)
    out = Path(out)
    meta_path = Path(f"{out}.json")
    labels: list[npt.NDArray[np.int8]] = []
    probs: list[npt.NDArray[np.float64]] = []
    with write_data_file(out) as writer:  # fails fast, before the model is built
        model = HiddenModel(seed)
        for chunk in _chunks(model, rows, split):
            writer.write(model.format_chunk(chunk))
            labels.append(chunk.labels)
            probs.append(chunk.probs)
    all_labels = np.concatenate(labels)
    result = DatagenResult(
        path=out,
        rows=rows,
        seed=seed,
        split=split,
        optimum_auc=auc(all_labels, np.concatenate(probs)),
        positive_rate=float(all_labels.mean()),
        vocab_sizes=VOCAB_SIZES,
        sha256=writer.digest.hexdigest(),
    )
    meta = {"rows": rows, "seed": seed, "split": split, "optimum_auc": result.optimum_auc,
            "positive_rate": result.positive_rate, "vocab_sizes": list(VOCAB_SIZES),
            "sha256": result.sha256, "generator": "psfleet.data.synthetic"}
    try:
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as exc:
        raise DataError(f"cannot write {str(meta_path)!r}: {exc.strerror or exc}") from exc
    return result
