"""CTR metrics: exact ROC AUC, log loss, COPC and a streaming (bucketed) AUC.

A leaf module every layer may use (the runner, the data generator, user scripts).

- :func:`auc`: exact ROC AUC from ranks, ties averaged (the Mann-Whitney U statistic
  divided by ``num_pos * num_neg``).
- :func:`log_loss`: mean binary cross-entropy of probabilities.
- :func:`copc`: clicks over predicted clicks, ``sum(labels) / sum(probs)`` (calibration).
- :class:`StreamingAuc`: AUC over many batches from two fixed histograms of scores,
  as Paddle's ``auc`` op does (``stat_pos`` / ``stat_neg`` of ``num_thresholds + 1``
  buckets, area by the trapezoid rule); we use ``2**16`` buckets by default (Paddle's
  default ``num_thresholds`` is ``2**12 - 1``). Scores falling in one bucket count as
  ties, so the result is exact up to that resolution.

Inputs are 1-D array-likes (numpy arrays, lists, or CPU torch tensors). When only one
class is present AUC is undefined and these functions return ``nan`` (no exception),
so a metric over an unlucky small batch does not stop training.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import numpy.typing as npt

from psfleet.errors import ConfigError

__all__ = ["auc", "log_loss", "copc", "StreamingAuc"]


def _as_1d(name: str, values: Any) -> npt.NDArray[np.float64]:
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if torch is not None and isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ConfigError(f"{name}: expected a 1-D array, got shape {array.shape}")
    if np.isnan(array).any():
        raise ConfigError(f"{name}: contains NaN at index {int(np.argmax(np.isnan(array)))}")
    return array


def _labels_and_scores(
    labels: Any, scores: Any, scores_name: str
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
    label_array = _as_1d("labels", labels)
    score_array = _as_1d(scores_name, scores)
    if label_array.shape != score_array.shape:
        raise ConfigError(
            f"labels and {scores_name} must have the same length; got "
            f"{label_array.shape[0]} and {score_array.shape[0]}"
        )
    not_binary = (label_array != 0) & (label_array != 1)
    if not_binary.any():
        index = int(np.argmax(not_binary))
        raise ConfigError(f"labels: must be 0 or 1; got {label_array[index]!r} at index {index}")
    return label_array == 1, score_array


def auc(labels: Any, scores: Any) -> float:
    """Exact ROC AUC, with tied scores counted as half (ranks averaged over ties).

    Args:
        labels (array[N]): 0 / 1 labels.
        scores (array[N]): any real scores (logits or probabilities); higher means
            more likely positive.

    Returns:
        The probability that a random positive scores above a random negative (ties
        count 1/2); ``nan`` if there are no positives or no negatives.

    Raises:
        ConfigError: on mismatched lengths, a label other than 0/1, or NaN.
    """
    positive, score_array = _labels_and_scores(labels, scores, "scores")
    num_pos = int(positive.sum())
    num_neg = positive.size - num_pos
    if num_pos == 0 or num_neg == 0:
        return math.nan
    order = np.argsort(score_array, kind="stable")
    sorted_scores = score_array[order]
    # Average 1-based rank of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], sorted_scores.size]
    run_ranks = (starts + 1 + ends) / 2.0
    ranks = np.empty(score_array.size, dtype=np.float64)
    ranks[order] = np.repeat(run_ranks, ends - starts)
    rank_sum = float(ranks[positive].sum())
    return (rank_sum - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg)


def log_loss(labels: Any, probs: Any, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy ``-(y log p + (1 - y) log(1 - p))`` (natural log).

    Args:
        labels (array[N]): 0 / 1 labels.
        probs (array[N]): predicted click probabilities; clipped to ``[eps, 1 - eps]``.
        eps: clipping bound, ``0 < eps < 0.5``.

    Returns:
        The mean loss; ``nan`` for empty inputs.

    Raises:
        ConfigError: on mismatched lengths, a label other than 0/1, NaN, or a bad eps.
    """
    if not 0.0 < eps < 0.5:
        raise ConfigError(f"eps: {eps!r} must be in (0, 0.5)")
    positive, prob_array = _labels_and_scores(labels, probs, "probs")
    if positive.size == 0:
        return math.nan
    clipped = np.clip(prob_array, eps, 1.0 - eps)
    losses = -np.where(positive, np.log(clipped), np.log1p(-clipped))
    return float(losses.mean())


def copc(labels: Any, probs: Any) -> float:
    """COPC, clicks over predicted clicks: ``sum(labels) / sum(probs)``.

    1.0 means the predicted CTR is calibrated on average; above 1 the model
    under-predicts clicks, below 1 it over-predicts. It is the inverse of the
    "calibration" (average predicted CTR / empirical CTR) of He et al., "Practical
    Lessons from Predicting Clicks on Ads at Facebook", ADKDD 2014; ads systems
    (Baidu, PaddleRec users) report it as COPC.

    Args:
        labels (array[N]): 0 / 1 labels (clicks).
        probs (array[N]): predicted click probabilities in ``[0, 1]`` (sigmoid of the
            logits).

    Returns:
        ``sum(labels) / sum(probs)``; ``nan`` when ``sum(probs)`` is 0 (no examples, or
        every prediction exactly 0).

    Raises:
        ConfigError: on mismatched lengths, a label other than 0/1, NaN, or a
            probability outside ``[0, 1]``.
    """
    positive, prob_array = _labels_and_scores(labels, probs, "probs")
    if prob_array.size and (prob_array.min() < 0.0 or prob_array.max() > 1.0):
        raise ConfigError(f"probs: must be in [0, 1], got range [{prob_array.min()}, "
                          f"{prob_array.max()}]; pass sigmoid(logits), not logits")
    predicted = float(prob_array.sum())
    if predicted == 0.0:
        return math.nan
    return float(positive.sum()) / predicted


class StreamingAuc:
    """Running AUC from fixed score histograms (Paddle's ``auc`` op, bucketed).

    Scores (probabilities in ``[0, 1]``) fall into ``num_buckets`` equal buckets; one
    histogram counts positives, one negatives. :meth:`compute` walks the buckets from
    the top and sums the trapezoids of the ROC curve, so scores in one bucket count as
    ties. Memory is ``2 * num_buckets`` int64 whatever the number of examples. Not
    thread safe. To combine workers, add their :attr:`stat_pos` / :attr:`stat_neg`
    (e.g. an all-reduce) or use :meth:`merge`.

    Args:
        num_buckets: histogram size, >= 2 (default ``2**16``).

    Raises:
        ConfigError: if ``num_buckets < 2``.
    """

    def __init__(self, num_buckets: int = 2**16) -> None:
        if num_buckets < 2:
            raise ConfigError(f"num_buckets: {num_buckets!r} must be >= 2")
        self.num_buckets = num_buckets
        self.stat_pos = np.zeros(num_buckets, dtype=np.int64)
        self.stat_neg = np.zeros(num_buckets, dtype=np.int64)

    def reset(self) -> None:
        """Forget every example seen (in place)."""
        self.stat_pos[:] = 0
        self.stat_neg[:] = 0

    @property
    def num_examples(self) -> int:
        """Examples accumulated since construction or the last :meth:`reset`."""
        return int(self.stat_pos.sum() + self.stat_neg.sum())

    def update(self, labels: Any, probs: Any) -> None:
        """Add a batch.

        Args:
            labels (array[B]): 0 / 1 labels.
            probs (array[B]): click probabilities in ``[0, 1]`` (apply a sigmoid to
                logits first).

        Raises:
            ConfigError: on mismatched lengths, bad labels, NaN or a probability
                outside ``[0, 1]``.
        """
        positive, prob_array = _labels_and_scores(labels, probs, "probs")
        if prob_array.size and (prob_array.min() < 0.0 or prob_array.max() > 1.0):
            raise ConfigError(
                f"probs: must be in [0, 1], got range [{prob_array.min()}, "
                f"{prob_array.max()}]; pass sigmoid(logits), not logits"
            )
        buckets = np.minimum((prob_array * self.num_buckets).astype(np.int64), self.num_buckets - 1)
        self.stat_pos += np.bincount(buckets[positive], minlength=self.num_buckets)
        self.stat_neg += np.bincount(buckets[~positive], minlength=self.num_buckets)

    def merge(self, other: StreamingAuc) -> None:
        """Add another accumulator's counts to this one (in place).

        Raises:
            ConfigError: if the bucket counts differ.
        """
        if other.num_buckets != self.num_buckets:
            raise ConfigError(
                f"num_buckets: cannot merge {other.num_buckets} buckets into {self.num_buckets}"
            )
        self.stat_pos += other.stat_pos
        self.stat_neg += other.stat_neg

    def compute(self) -> float:
        """The AUC of everything accumulated; ``nan`` if one class is absent."""
        pos = self.stat_pos[::-1].astype(np.float64)  # from the highest bucket down
        neg = self.stat_neg[::-1].astype(np.float64)
        total_pos, total_neg = pos.sum(), neg.sum()
        if total_pos == 0 or total_neg == 0:
            return math.nan
        pos_above = np.cumsum(pos) - pos  # positives in strictly higher buckets
        area = float(np.sum(neg * (pos_above + pos / 2.0)))
        return area / float(total_pos * total_neg)
