"""The ``dnn`` CTR model of PaddleRec's ``models/rank/dnn``.

Architecture (PaddleRec ``DNNLayer``)::

    emb   = embedding(sparse_ids)                 # [B, S, D]
    x     = concat(emb.reshape(B, S * D), dense)  # [B, S * D + num_dense]
    x     = relu(Linear(x)) for each of fc_sizes  # [B, fc_sizes[-1]]
    logit = Linear(x)                             # [B, 1] -> [B]

Every Linear weight starts as ``Normal(0, 1 / sqrt(fan_in))`` and every bias as 0, as
in PaddleRec (``paddle.nn.initializer.Normal(std=1.0 / math.sqrt(sizes[i]))``, Paddle's
default zero bias). PaddleRec ends with 2 outputs and a softmax; we output one logit:
train with ``nn.BCEWithLogitsLoss``; ``torch.sigmoid(logits)`` is the click probability.

Only the dense (fully connected) parameters live in this module. The embedding is
passed in: in production :class:`psfleet.nn.SparseEmbedding`, whose rows live on the
servers; any module mapping ids (Tensor[B, S], int64) to Tensor[B, S, D] float32 works.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from psfleet.errors import ConfigError
from psfleet.rec.models.registry import register_model

__all__ = ["DNN"]


@register_model("dnn")
class DNN(nn.Module):
    """PaddleRec's rank/dnn: embeddings and dense features through an MLP to a logit.

    Args:
        embedding: module mapping ids (Tensor[B, num_slots], int64) to
            Tensor[B, num_slots, embedding_dim], float32.
        num_slots: sparse slots S per example (26 for Criteo).
        num_dense: dense features per example (13 for Criteo).
        embedding_dim: embedding width D (PaddleRec's ``sparse_feature_dim``, 9).
        fc_sizes: hidden layer widths (PaddleRec's ``fc_sizes``).
        generator: random generator for the weight initialisation; ``None`` uses
            torch's global generator (seed it with ``torch.manual_seed``).

    Raises:
        ConfigError: if a size is < 1 (``num_dense`` may be 0).
    """

    def __init__(
        self,
        embedding: nn.Module,
        num_slots: int = 26,
        num_dense: int = 13,
        embedding_dim: int = 9,
        fc_sizes: Sequence[int] = (512, 256, 128, 32),
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        for name, value, minimum in (
            ("num_slots", num_slots, 1),
            ("num_dense", num_dense, 0),
            ("embedding_dim", embedding_dim, 1),
        ):
            if value < minimum:
                raise ConfigError(f"{name}: {value!r} must be >= {minimum}")
        if any(size < 1 for size in fc_sizes):
            raise ConfigError(f"fc_sizes: {list(fc_sizes)!r} must all be >= 1")
        self.embedding = embedding
        self.num_slots = num_slots
        self.num_dense = num_dense
        self.embedding_dim = embedding_dim
        sizes = [num_slots * embedding_dim + num_dense, *fc_sizes, 1]
        layers: list[nn.Module] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            linear = nn.Linear(fan_in, fan_out)
            with torch.no_grad():
                linear.weight.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=generator)
                linear.bias.zero_()
            layers += [linear, nn.ReLU()]
        self.mlp = nn.Sequential(*layers[:-1])  # no ReLU after the output layer

    def forward(self, sparse_ids: Tensor, dense: Tensor) -> Tensor:
        """Compute click logits.

        Args:
            sparse_ids (Tensor[B, num_slots], int64): feature keys.
            dense (Tensor[B, num_dense], float32): dense features.

        Returns:
            Tensor[B], float32: logits (``sigmoid`` gives the click probability).

        Raises:
            ConfigError: if an input or the embedding output has the wrong shape.
        """
        batch_size = sparse_ids.shape[0]
        if sparse_ids.dim() != 2 or sparse_ids.shape[1] != self.num_slots:
            raise ConfigError(
                f"sparse_ids: expected shape [B, {self.num_slots}], got {tuple(sparse_ids.shape)}"
            )
        if dense.shape != (batch_size, self.num_dense):
            raise ConfigError(
                f"dense: expected shape [{batch_size}, {self.num_dense}], got {tuple(dense.shape)}"
            )
        emb = self.embedding(sparse_ids)  # [B, S, D]
        if emb.shape != (batch_size, self.num_slots, self.embedding_dim):
            raise ConfigError(
                f"embedding output: expected shape [{batch_size}, {self.num_slots}, "
                f"{self.embedding_dim}], got {tuple(emb.shape)}; embedding_dim must match "
                "the embedding's dim"
            )
        features = torch.cat([emb.reshape(batch_size, -1), dense], dim=1)  # [B, S*D + 13]
        return self.mlp(features).squeeze(1)  # [B]
