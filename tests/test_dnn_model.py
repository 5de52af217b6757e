"""Tests of the ``dnn`` model and the model registry, trained on real Criteo rows."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import require_shared_data
from torch import Tensor, nn

from psfleet.data import CriteoReader
from psfleet.errors import ConfigError
from psfleet.metrics import auc
from psfleet.rec.models import DNN, build_model, list_models, register_model

pytestmark = pytest.mark.unit

DATA_DIR = require_shared_data()  # ../shared/data/criteo_kaggle_sample, or fail


class HashedEmbedding(nn.Module):
    """Stand-in for psfleet.nn.SparseEmbedding: ids modulo ``num_rows`` into nn.Embedding."""

    def __init__(self, num_rows: int, dim: int) -> None:
        super().__init__()
        self.num_rows = num_rows
        self.table = nn.Embedding(num_rows, dim)

    def forward(self, ids: Tensor) -> Tensor:
        return self.table(torch.remainder(ids, self.num_rows))  # [B, S, D]


def small_dnn(seed: int = 0) -> DNN:
    torch.manual_seed(seed)
    return DNN(HashedEmbedding(10_007, 9), fc_sizes=(64, 32))


def test_forward_shapes_on_a_real_batch() -> None:
    batch = next(iter(CriteoReader([DATA_DIR / "dev.csv"], batch_size=32)))
    model = small_dnn()

    logits = model(batch.sparse, batch.dense)

    assert logits.shape == (32,) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_layers_and_initialisation_follow_paddlerec() -> None:
    generator = torch.Generator().manual_seed(3)
    model = DNN(HashedEmbedding(100, 9), generator=generator)
    linears = [m for m in model.mlp if isinstance(m, nn.Linear)]

    assert [(m.in_features, m.out_features) for m in linears] == [
        (26 * 9 + 13, 512),
        (512, 256),
        (256, 128),
        (128, 32),
        (32, 1),
    ]
    assert sum(isinstance(m, nn.ReLU) for m in model.mlp) == 4
    assert not isinstance(model.mlp[-1], nn.ReLU)
    for linear in linears:
        assert torch.all(linear.bias == 0)
    first = linears[0].weight
    assert first.mean().item() == pytest.approx(0.0, abs=0.01)
    assert first.std().item() == pytest.approx(1 / math.sqrt(247), rel=0.03)
    same = DNN(HashedEmbedding(100, 9), generator=torch.Generator().manual_seed(3))
    assert all(
        torch.equal(a, b)
        for a, b in zip(same.mlp.parameters(), model.mlp.parameters(), strict=True)
    )


@pytest.mark.slow  # several seconds: the slow tier
def test_dnn_learns_on_real_rows() -> None:
    reader = CriteoReader([DATA_DIR / "train.csv"], batch_size=64, shuffle_seed=0)
    batches = list(reader)[:8]  # 512 real rows
    model = small_dnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()

    epoch_losses = []
    for _ in range(6):
        total = 0.0
        for batch in batches:
            loss = loss_fn(model(batch.sparse, batch.dense), batch.labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        epoch_losses.append(total / len(batches))

    assert epoch_losses[-1] < 0.8 * epoch_losses[0]
    with torch.no_grad():
        labels = torch.cat([b.labels for b in batches])
        probs = torch.cat([torch.sigmoid(model(b.sparse, b.dense)) for b in batches])
    assert auc(labels, probs) > 0.8  # fits the rows it trained on


def test_shape_mismatches_are_config_errors() -> None:
    model = small_dnn()
    ids = torch.zeros(4, 26, dtype=torch.int64)

    with pytest.raises(ConfigError, match="dense"):
        model(ids, torch.zeros(4, 12))
    with pytest.raises(ConfigError, match="sparse_ids"):
        model(ids[:, :25], torch.zeros(4, 13))
    wrong_dim = DNN(HashedEmbedding(100, 8), fc_sizes=(4,))
    with pytest.raises(ConfigError, match="embedding_dim"):
        wrong_dim(ids, torch.zeros(4, 13))
    with pytest.raises(ConfigError, match="fc_sizes"):
        DNN(HashedEmbedding(100, 9), fc_sizes=(8, 0))


def test_registry_builds_dnn_and_lists_known_names() -> None:
    model = build_model("dnn", embedding=HashedEmbedding(100, 9), fc_sizes=(8,))

    assert isinstance(model, DNN)
    assert "dnn" in list_models()
    with pytest.raises(ConfigError, match=r"'dnnn' is not one of .*dnn"):
        build_model("dnnn")
    with pytest.raises(ConfigError, match="already registered"):
        register_model("dnn")(HashedEmbedding)
