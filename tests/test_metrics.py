"""Tests of psfleet.metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from psfleet.errors import ConfigError
from psfleet.metrics import StreamingAuc, auc, log_loss

pytestmark = pytest.mark.unit


def pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    pos = scores[labels == 1][:, None]
    neg = scores[labels == 0][None, :]
    return float(((pos > neg) + 0.5 * (pos == neg)).mean())


def test_auc_hand_computed_example_with_ties() -> None:
    # Positives 0.9, 0.5, 0.1; negatives 0.9, 0.3. Pairs: tie 0.5, win 1, loss 0,
    # win 1, loss 0, loss 0 -> 2.5 / 6.
    labels = [1, 0, 1, 0, 1]
    scores = [0.9, 0.9, 0.5, 0.3, 0.1]

    assert auc(labels, scores) == pytest.approx(2.5 / 6, abs=1e-12)


def test_auc_perfect_inverse_and_all_tied() -> None:
    assert auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert auc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    assert auc([1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5]) == 0.5


def test_auc_equals_pairwise_count_on_heavily_tied_scores() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=2000)
    scores = np.round(rng.normal(size=2000) + labels, 1)  # many ties

    assert auc(labels, scores) == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)


def test_auc_with_one_class_is_nan() -> None:
    assert math.isnan(auc([1, 1, 1], [0.1, 0.2, 0.3]))
    assert math.isnan(auc([], []))


def test_bad_inputs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="labels: must be 0 or 1"):
        auc([0, 2], [0.1, 0.2])
    with pytest.raises(ConfigError, match="same length"):
        auc([0, 1], [0.1])
    with pytest.raises(ConfigError, match="NaN"):
        log_loss([0, 1], [0.1, float("nan")])


def test_log_loss_hand_computed_and_clipped() -> None:
    assert log_loss([1, 0], [0.8, 0.4]) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)
    assert log_loss([0], [1.0]) == pytest.approx(-math.log(1e-7), rel=1e-6)
    assert math.isnan(log_loss([], []))


def test_log_loss_matches_torch_bce() -> None:
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(500, generator=generator, dtype=torch.float64) * 0.98 + 0.01
    labels = (torch.rand(500, generator=generator) < 0.3).double()

    expected = torch.nn.functional.binary_cross_entropy(probs, labels).item()

    assert log_loss(labels, probs) == pytest.approx(expected, rel=1e-12)


def test_streaming_auc_matches_exact_auc_within_1e_3() -> None:
    rng = np.random.default_rng(1)
    labels = (rng.random(100_000) < 0.22).astype(np.float32)  # Criteo's click rate
    logits = rng.normal(size=100_000) + 1.2 * labels - 1.3
    probs = 1.0 / (1.0 + np.exp(-logits))
    metric = StreamingAuc()

    for begin in range(0, len(labels), 1000):
        metric.update(labels[begin : begin + 1000], torch.from_numpy(probs[begin : begin + 1000]))

    assert metric.num_examples == 100_000
    assert metric.compute() == pytest.approx(auc(labels, probs), abs=1e-3)


def test_streaming_auc_buckets_count_as_ties_merge_and_reset() -> None:
    metric = StreamingAuc(num_buckets=4)
    metric.update([1, 0, 1, 0, 1], [0.9, 0.9, 0.5, 0.3, 0.26])  # 0.26, 0.3: one bucket
    assert metric.compute() == pytest.approx(auc([1, 0, 1, 0, 1], [3, 3, 2, 1, 1]))

    other = StreamingAuc(num_buckets=4)
    other.update([0], [0.0])
    metric.merge(other)
    assert metric.num_examples == 6

    metric.reset()
    assert metric.num_examples == 0 and math.isnan(metric.compute())


def test_streaming_auc_rejects_logits() -> None:
    with pytest.raises(ConfigError, match="sigmoid"):
        StreamingAuc().update([0, 1], [-2.0, 3.0])
