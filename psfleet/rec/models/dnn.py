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
passed in, in one of two forms:

- fixed-width slots: :class:`psfleet.nn.SparseEmbedding` (rows on the servers) or any
  module mapping ids (Tensor[B, S], int64) to Tensor[B, S, D] float32, sized by
  ``num_slots`` and ``embedding_dim``; ``forward(sparse_ids, dense)``.
- a schema: :class:`psfleet.nn.FeatureEmbeddings` (several tables, multi-valued
  features pooled), as ``embedding=`` or ``embeddings=``; the MLP input is its
  ``flatten``-ed output, ``output_dim = sum_t F_t * D_t`` floats, then the dense
  features; ``forward(sparse_ids, dense, jagged)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from psfleet.data.jagged import KeyedJagged
from psfleet.data.types import FeatureSchema
from psfleet.errors import ConfigError
from psfleet.nn.features import FeatureEmbeddings
from psfleet.rec.models._features import check_batch, resolve_num_dense
from psfleet.rec.models.mlp import check_fc_sizes, mlp_tower
from psfleet.rec.models.registry import register_model

__all__ = ["DNN"]


@register_model("dnn")
class DNN(nn.Module):
    """PaddleRec's rank/dnn: embeddings and dense features through an MLP to a logit.

    Args:
        embedding: module mapping ids (Tensor[B, num_slots], int64) to
            Tensor[B, num_slots, embedding_dim], float32; or a FeatureEmbeddings.
        num_slots: sparse slots S per example (default 26, Criteo's); not with a
            FeatureEmbeddings (its schema says).
        num_dense: dense features per example (default 13, Criteo's; with a
            FeatureEmbeddings, its schema's, which a given value must equal).
        embedding_dim: embedding width D (PaddleRec's ``sparse_feature_dim``, default 9);
            not with a FeatureEmbeddings (its tables say).
        fc_sizes: hidden layer widths (PaddleRec's ``fc_sizes``).
        embeddings: a FeatureEmbeddings (instead of ``embedding``).
        generator: random generator for the weight initialisation; ``None`` uses
            torch's global generator (seed it with ``torch.manual_seed``).
        dropout: the deep tower's dropout rate while training, one for every hidden
            layer or one per ``fc_sizes`` entry (``hyper_parameters.dropout``; 0: none).
        dropout_seed: seed of the dropout masks' generator (None: torch's global one).

    Attributes:
        schema: the features the model reads (fixed-width form: dense ``I1..``,
            sparse ``C1..``, Criteo's names).

    Raises:
        ConfigError: if a size is < 1 (``num_dense`` may be 0), both or neither of
            ``embedding`` / ``embeddings`` are given, or ``num_slots`` /
            ``embedding_dim`` are given with a FeatureEmbeddings.
    """

    def __init__(
        self,
        embedding: nn.Module | None = None,
        num_slots: int | None = None,
        num_dense: int | None = None,
        embedding_dim: int | None = None,
        fc_sizes: Sequence[int] = (512, 256, 128, 32),
        *,
        embeddings: FeatureEmbeddings | None = None,
        generator: torch.Generator | None = None,
        dropout: float | Sequence[float] = 0.0,
        dropout_seed: int | None = None,
    ) -> None:
        super().__init__()
        module = embedding if embeddings is None else embeddings
        if module is None or (embedding is not None and embeddings is not None):
            raise ConfigError("dnn: give exactly one of embedding= (a module over fixed-width "
                              "slots) or embeddings= (a FeatureEmbeddings)")
        self.embedding = module
        self.features = isinstance(module, FeatureEmbeddings)
        if isinstance(module, FeatureEmbeddings):
            given = [k for k, v in (("num_slots", num_slots), ("embedding_dim", embedding_dim))
                     if v is not None]
            if given:
                raise ConfigError(f"dnn: {', '.join(given)} come from the FeatureEmbeddings "
                                  "(its schema and tables); drop them")
            self._schema = module.schema
            self.num_slots = len(module.schema.sparse)
            self.num_dense = resolve_num_dense("dnn", module.schema, num_dense)
            self.embedding_dim: int | None = None
            width = module.output_dim
        else:
            num_slots = 26 if num_slots is None else num_slots
            num_dense = 13 if num_dense is None else num_dense
            embedding_dim = 9 if embedding_dim is None else embedding_dim
            for name, value, minimum in (
                ("num_slots", num_slots, 1),
                ("num_dense", num_dense, 0),
                ("embedding_dim", embedding_dim, 1),
            ):
                if value < minimum:
                    raise ConfigError(f"{name}: {value!r} must be >= {minimum}")
            self._schema = FeatureSchema(dense=tuple(f"I{i + 1}" for i in range(num_dense)),
                                         sparse=tuple(f"C{i + 1}" for i in range(num_slots)))
            self.num_slots, self.num_dense = num_slots, num_dense
            self.embedding_dim = embedding_dim
            width = num_slots * embedding_dim
        sizes = [width + self.num_dense, *check_fc_sizes(fc_sizes), 1]
        # no ReLU after the output layer
        self.mlp = mlp_tower(sizes, generator, dropout, dropout_seed)

    @property
    def schema(self) -> FeatureSchema:
        """The features the model reads, by name."""
        return self._schema

    def forward(self, sparse_ids: Tensor, dense: Tensor,
                jagged: KeyedJagged | None = None) -> Tensor:
        """Compute click logits.

        Args:
            sparse_ids (Tensor[B, num_slots], int64): feature keys of the single-valued
                slots.
            dense (Tensor[B, num_dense], float32): dense features.
            jagged: the multi-valued features (FeatureEmbeddings form; stride B), or
                None.

        Returns:
            Tensor[B], float32: logits (``sigmoid`` gives the click probability).

        Raises:
            ConfigError: if an input or the embedding output has the wrong shape, or
                ``jagged`` is given to the fixed-width form.
        """
        if isinstance(self.embedding, FeatureEmbeddings):
            check_batch(self._schema, sparse_ids, dense, jagged)
            parts = self.embedding(sparse_ids, jagged)
            flat = self.embedding.flatten(parts)  # [B, sum_t F_t * D_t]
            return self.mlp(torch.cat([flat, dense], dim=1)).squeeze(1)  # [B]
        if jagged is not None:
            raise ConfigError("jagged: this dnn reads fixed-width slots only; build it with "
                              "embeddings=FeatureEmbeddings(...) for multi-valued features")
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
