"""Synthetic multi-hot CSV with a known optimum AUC, for exact AUC comparisons.

:func:`generate_multihot` writes CSV rows with numeric, single-valued and
**multi-valued** (variable-length, ``|``-joined) columns drawn from a hidden logistic
model over mean-pooled weights, so an embedding-bag model can express it, and reports
the **optimum AUC**: the AUC of the true click probabilities on the rows written, the
best any model can reach on that file. Command line::

    psfleet datagen multihot --rows N --seed S --out FILE.csv [--test_rows M --test_out FILE2]

The file (RFC 4180, no quoting needed, LF line ends)
    A header, then one row per line: ``label,n1,n2,n3,n4,c1,...,c6,hist,tags,genres``
    (:data:`MULTIHOT_COLUMNS` names them by role, so configs and tests need not retype
    them)::

        label,n1,n2,n3,n4,c1,c2,c3,c4,c5,c6,hist,tags,genres
        0,2.3026,4.2767,4.8598,0.4021,1,0,73,2023,5669,78828,9313|24160|31211,775|960,13|7

    - ``label``: ``0`` or ``1``.
    - ``n1`` .. ``n3``: ``log1p`` of log-normal counts ``floor(exp(mu + sigma z))``
      (medians about 3, 20 and 200), ``n4`` uniform on [0, 1]; all written with 4
      decimals and already on a sane scale (0 .. ~12): use them as they are, no
      further transform.
    - ``c1`` .. ``c6``: one id each, a decimal int in ``0 .. V - 1`` with ``V`` 10, 63,
      398, 2512, 15849, 100000 (log-spaced). Value ranks are Zipf-like,
      ``P(k) ∝ (k + 1) ** -1.1``; a fixed random permutation maps ranks to ids.
    - ``hist`` (a user history): ids of a 10**5 Zipf vocabulary, drawn with
      replacement, length geometric with mean 20 (about 4.8 % empty), capped at 200.
      ``tags``: 10**3 Zipf vocabulary, with replacement, length Poisson(4) capped at
      30 (about 1.8 % empty). ``genres``: 1..3 (uniform) distinct ids of 20, drawn
      without replacement in proportion to Zipf weights. Ids are joined by ``|``; an
      empty bag is an empty cell.

The hidden model (all of it is fixed by ``seed``)
    ::

        logit = b + sum_f w_f[c_f] + sum_m s_m * mean_{id in bag m} w_m[id] + d . x
                + sum_(m,f) <mean_{id in bag m} U_m[id], V_f[c_f]>

    - ``w_f``: ``N(0, 1)`` per id, centred and scaled exactly (under the column's own
      Zipf distribution) to standard deviation ``SINGLE_SCALES[f] * LOGIT_SCALE``.
    - ``w_m``: ``N(0, 1)`` per id, standardised exactly under the bag's Zipf
      distribution; ``s_m`` makes the pooled term's standard deviation on the
      calibration sample ``BAG_SCALES[m] * LOGIT_SCALE``. The mean over an empty bag
      is 0, as ``torch.nn.EmbeddingBag(mode="mean")``.
    - ``d``: ``N(0, 1)``, scaled to ``DENSE_SCALE * LOGIT_SCALE`` on the calibration
      sample; ``x`` is n1..n4 **as written** (so the file alone fixes the logit).
    - ``U_m, V_f``: rank-4 factors of a factorization-machine term (Rendle 2010) between
      a mean-pooled bag and a single-valued column, for :data:`INTERACTIONS`
      (hist x c1, tags x c2, genres x c3), each scaled to standard deviation
      ``INTERACTION_SCALE * LOGIT_SCALE`` on the calibration sample. A linear model
      cannot express it; a DNN, DeepFM or DCN-v2 over mean-pooled bags can.
    - ``b``: solved on the calibration sample so that the expected positive rate is
      :data:`TARGET_POSITIVE_RATE` (0.25).

    ``label ~ Bernoulli(sigmoid(logit))``. With these constants the optimum AUC is
    about 0.79 and the positive rate about 0.25; each interaction is worth about
    0.015 AUC, and the true model without them scores about 0.743 (the ceiling of any
    model linear in the pooled features). Measured once (seed 7, 10**6 train rows,
    200k test rows, Adam 3e-3, batch 1024): logistic regression over every column
    (mean-pooled bags) 0.733 after one epoch; a DeepFM (dim 8, one 64-unit hidden
    layer) 0.746 after one epoch, then overfits; the linear terms plus the three
    pooled factor products (the model's own form, dim 4) 0.757 and 0.763 after one
    and two epochs; optimum 0.787.

Streams
    The hidden model, the calibration sample (100k rows), the ``"train"`` rows and the
    ``"test"`` rows come from four independent streams of
    ``numpy.random.SeedSequence(seed)`` (keyed apart from ``datagen criteo``'s); rows
    are drawn in chunks of :data:`CHUNK_ROWS`, chunk ``c`` from its own child stream.
    So a train and a test file of one seed share the hidden model and have independent
    rows, and the bytes depend only on ``(rows, seed, split)`` and numpy's generators.

Speed and memory
    Sampling and formatting are vectorised numpy, one chunk at a time (see
    :mod:`psfleet.data._multihot_format` for the byte assembly): about 8 s of CPU per
    10**6 rows (~190 MB of CSV; 5 s sampling, 3 s formatting) on one core of a 2-core
    machine, plus ~1 s to build the hidden model; the CLI's peak resident memory is
    about 0.5 GB whatever ``rows`` is (plus 9 bytes per row for the AUC).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from psfleet.data._multihot_format import format_rows
from psfleet.data._multihot_model import (
    BAG_MAX_LENGTHS,
    BAG_MEAN_LENGTHS,
    BAG_NAMES,
    BAG_SCALES,
    BAG_VOCAB_SIZES,
    CHUNK_ROWS,
    DENSE_SCALE,
    INTERACTION_SCALE,
    INTERACTIONS,
    LOGIT_SCALE,
    NUMERIC_NAMES,
    NUMERIC_TICKS,
    SINGLE_NAMES,
    SINGLE_SCALES,
    SINGLE_VOCAB_SIZES,
    TARGET_POSITIVE_RATE,
    MultihotChunk,
    MultihotModel,
)
from psfleet.data.synthetic import DatagenResult, check_generator_args, write_data_file
from psfleet.errors import ConfigError, DataError
from psfleet.metrics import auc

__all__ = [
    "BAG_MAX_LENGTHS",
    "BAG_MEAN_LENGTHS",
    "BAG_SCALES",
    "CHUNK_ROWS",
    "DENSE_SCALE",
    "INTERACTIONS",
    "INTERACTION_SCALE",
    "LOGIT_SCALE",
    "MULTIHOT_COLUMNS",
    "NUMERIC_TICKS",
    "SINGLE_SCALES",
    "TARGET_POSITIVE_RATE",
    "MultihotColumns",
    "MultihotModel",
    "generate_multihot",
    "multihot_probabilities",
    "multihot_true_probabilities",
]


@dataclass(frozen=True)
class MultihotColumns:
    """The columns of a :func:`generate_multihot` file, by role.

    Attributes:
        label: the 0/1 label column.
        numeric: float columns (4 decimals, use as they are).
        single: single-valued id columns (decimal ints).
        multi: multi-valued id columns (ids joined by ``separator``; empty cell: none).
        separator: joins the ids of a multi-valued cell.
        delimiter: between cells.
        vocab_sizes: ids of column ``name`` are ``0 .. vocab_sizes[name] - 1``.
    """

    label: str = "label"
    numeric: tuple[str, ...] = NUMERIC_NAMES
    single: tuple[str, ...] = SINGLE_NAMES
    multi: tuple[str, ...] = BAG_NAMES
    separator: str = "|"
    delimiter: str = ","
    vocab_sizes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict(
        zip(SINGLE_NAMES + BAG_NAMES, SINGLE_VOCAB_SIZES + BAG_VOCAB_SIZES, strict=True))))

    @property
    def names(self) -> tuple[str, ...]:
        """Every column in file order (the header)."""
        return (self.label, *self.numeric, *self.single, *self.multi)


MULTIHOT_COLUMNS = MultihotColumns()
"""The layout every :func:`generate_multihot` file has."""

_VOCAB_SIZES = SINGLE_VOCAB_SIZES + BAG_VOCAB_SIZES


def _chunks(model: MultihotModel, rows: int, split: str) -> Iterator[MultihotChunk]:
    for chunk, first in enumerate(range(0, rows, CHUNK_ROWS)):
        yield model.draw_chunk(split, chunk, min(CHUNK_ROWS, rows - first))


def multihot_probabilities(
    seed: int,
    numeric: npt.NDArray[np.float64],
    single: npt.NDArray[np.int64],
    bag_ids: Sequence[npt.NDArray[np.int64]],
    bag_lengths: Sequence[npt.NDArray[np.int64]],
) -> npt.NDArray[np.float64]:
    """True click probabilities of rows read back from a file (vectorised).

    Builds the hidden model of ``seed`` (~2 s) and applies it to parsed columns, so a
    reader can check a file, or score it with the optimum, without redrawing rows.

    Args:
        seed: the seed the file was generated with.
        numeric (ndarray[N, 4], float64): n1..n4 as parsed (``float(cell)``).
        single (ndarray[N, 6], int64): c1..c6.
        bag_ids (3 x ndarray[T_m], int64): the ids of hist, tags, genres, row after row.
        bag_lengths (3 x ndarray[N], int64): ids per row of each bag (0: empty cell).

    Returns:
        ndarray[N] float64: ``sigmoid(logit)`` (module docstring).

    Raises:
        ConfigError: if ``seed`` < 0 or the shapes do not agree.
        DataError: if an id is outside its column's vocabulary.
    """
    check_generator_args(1, seed, "train")
    rows = len(single)
    if (numeric.shape != (rows, len(NUMERIC_NAMES)) or single.shape != (rows, len(SINGLE_NAMES))
            or len(bag_ids) != len(BAG_NAMES) or len(bag_lengths) != len(BAG_NAMES)
            or any(len(ln) != rows or int(np.sum(ln)) != len(ids)
                   for ids, ln in zip(bag_ids, bag_lengths, strict=True))):
        raise ConfigError("multihot_probabilities: expected numeric [N, 4], single [N, 6] and "
                          "3 bags whose lengths [N] sum to their ids")
    for name, size, ids in zip(SINGLE_NAMES + BAG_NAMES, _VOCAB_SIZES,
                               [*single.T, *bag_ids], strict=True):
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise DataError(f"{name}: ids must be in 0 .. {size - 1}, found "
                            f"{int(ids.min())} .. {int(ids.max())}")
    logit = MultihotModel(seed).logits(numeric, single, bag_ids, bag_lengths)
    return np.asarray(1.0 / (1.0 + np.exp(-logit)), dtype=np.float64)


def multihot_true_probabilities(
    rows: int, seed: int, split: str = "train"
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float64]]:
    """Labels and true click probabilities of the rows :func:`generate_multihot` writes.

    Blocks (redraws the rows; nothing is written). Row ``r`` here is line ``r + 2`` of
    ``generate_multihot(rows, seed, ..., split=split)`` (line 1 is the header).

    Returns:
        ``(labels (ndarray[rows], int8), probs (ndarray[rows], float64))``.

    Raises:
        ConfigError: if ``rows`` < 1, ``seed`` < 0 or ``split`` is unknown.
    """
    check_generator_args(rows, seed, split)
    drawn = list(_chunks(MultihotModel(seed), rows, split))
    return (np.concatenate([c.labels for c in drawn]), np.concatenate([c.probs for c in drawn]))


def generate_multihot(rows: int, seed: int, out: Path, *, split: str = "train"
                      ) -> DatagenResult:
    """Write ``rows`` synthetic multi-hot CSV rows to ``out`` and their metadata beside it.

    The layout and model are the module docstring's. Blocks; about 8 s per 10**6 rows.
    The file is written to ``out + ".tmp"`` and renamed, so ``out`` is either whole or
    untouched; then ``out + ".json"`` gets ``rows``, ``seed``, ``split``,
    ``optimum_auc``, ``positive_rate``, ``vocab_sizes`` (c1..c6, hist, tags, genres),
    ``columns`` (:data:`MULTIHOT_COLUMNS` by role), ``mean_lengths`` and
    ``empty_rates`` of the bags in this file, and ``sha256``. Same arguments, same bytes.

    Args:
        rows: number of data rows (the header is extra), >= 1.
        seed: the hidden model's seed, >= 0; a train and a test file share the model
            when they share the seed.
        out: the CSV path; its directory must exist.
        split: the row stream: ``"train"`` or ``"test"`` (independent rows).

    Returns:
        The file's :class:`~psfleet.data.synthetic.DatagenResult`; its ``vocab_sizes``
        are those of c1..c6, hist, tags, genres.

    Raises:
        ConfigError: if ``rows`` < 1, ``seed`` < 0 or ``split`` is unknown.
        DataError: if ``out`` or its ``.json`` cannot be written (names the path).
    """
    check_generator_args(rows, seed, split)
    out = Path(out)
    meta_path = Path(f"{out}.json")
    labels: list[npt.NDArray[np.int8]] = []
    probs: list[npt.NDArray[np.float64]] = []
    id_counts = np.zeros(len(BAG_NAMES), dtype=np.int64)
    empty_counts = np.zeros(len(BAG_NAMES), dtype=np.int64)
    with write_data_file(out) as writer:  # fails fast, before the model is built
        writer.write((MULTIHOT_COLUMNS.delimiter.join(MULTIHOT_COLUMNS.names) + "\n").encode())
        model = MultihotModel(seed)
        for chunk in _chunks(model, rows, split):
            writer.write(format_rows(chunk.labels, chunk.numeric_ticks, chunk.single,
                                     chunk.bag_ids, chunk.bag_lengths))
            labels.append(chunk.labels)
            probs.append(chunk.probs)
            id_counts += [int(lengths.sum()) for lengths in chunk.bag_lengths]
            empty_counts += [int((lengths == 0).sum()) for lengths in chunk.bag_lengths]
    all_labels = np.concatenate(labels)
    result = DatagenResult(path=out, rows=rows, seed=seed, split=split,
                           optimum_auc=auc(all_labels, np.concatenate(probs)),
                           positive_rate=float(all_labels.mean()),
                           vocab_sizes=_VOCAB_SIZES, sha256=writer.digest.hexdigest())
    columns = MULTIHOT_COLUMNS
    meta = {"rows": rows, "seed": seed, "split": split, "optimum_auc": result.optimum_auc,
            "positive_rate": result.positive_rate, "vocab_sizes": list(_VOCAB_SIZES),
            "columns": {"label": columns.label, "numeric": list(columns.numeric),
                        "single": list(columns.single), "multi": list(columns.multi),
                        "separator": columns.separator, "delimiter": columns.delimiter},
            "mean_lengths": dict(zip(BAG_NAMES, (id_counts / rows).tolist(), strict=True)),
            "empty_rates": dict(zip(BAG_NAMES, (empty_counts / rows).tolist(), strict=True)),
            "sha256": result.sha256, "generator": "psfleet.data.synthetic_multihot"}
    try:
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as exc:
        raise DataError(f"cannot write {str(meta_path)!r}: {exc.strerror or exc}") from exc
    return result
