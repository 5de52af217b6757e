"""What the schema-sized CTR models share: the embeddings check, the batch checks and
the dim-1 ``wide`` table (first-order / linear term over every sparse feature)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from psfleet.data.jagged import KeyedJagged
from psfleet.data.types import FeatureSchema
from psfleet.errors import ConfigError
from psfleet.nn.features import FeatureEmbeddings
from psfleet.nn.types import EmbeddingTableSpec

__all__ = ["WIDE_TABLE", "LinearTerm", "SchemaModel", "check_batch", "check_wide_name",
           "require_embeddings", "resolve_num_dense"]

WIDE_TABLE = "wide"


def require_embeddings(model: str, embeddings: object) -> FeatureEmbeddings:
    """``embeddings`` if it is a FeatureEmbeddings.

    Raises:
        ConfigError: it is not (names the model and the type given).
    """
    if not isinstance(embeddings, FeatureEmbeddings):
        raise ConfigError(f"{model}: embeddings must be a psfleet.nn.FeatureEmbeddings, got "
                          f"{type(embeddings).__name__}")
    return embeddings


def resolve_num_dense(model: str, schema: FeatureSchema, num_dense: int | None) -> int:
    """The dense width: the schema's, which ``num_dense`` (when given) must equal.

    Raises:
        ConfigError: ``num_dense`` differs from the schema's dense features.
    """
    if num_dense is not None and num_dense != len(schema.dense):
        raise ConfigError(f"{model}: num_dense {num_dense!r} differs from the schema's "
                          f"{len(schema.dense)} dense features {list(schema.dense)}")
    return len(schema.dense)


def check_batch(schema: FeatureSchema, sparse: Tensor, dense: Tensor,
                jagged: KeyedJagged | None) -> int:
    """The batch size B of a forward's inputs, checked against ``schema``.

    Args:
        sparse (Tensor[B, len(schema.sparse)], int64): single-valued feature keys.
        dense (Tensor[B, len(schema.dense)], float32): dense features.
        jagged: the multi-valued features (stride B); required when the schema has any.

    Raises:
        ConfigError: a shape differs (names the input, the expected and the actual shape)
            or the multi-valued features are missing.
    """
    width = len(schema.sparse)
    if sparse.dim() != 2 or sparse.shape[1] != width:
        raise ConfigError(f"sparse_ids: expected shape [B, {width}], got {tuple(sparse.shape)}")
    batch_size = int(sparse.shape[0])
    if dense.shape != (batch_size, len(schema.dense)):
        raise ConfigError(f"dense: expected shape [{batch_size}, {len(schema.dense)}], got "
                          f"{tuple(dense.shape)}")
    if schema.multi:
        if jagged is None:
            raise ConfigError(f"jagged: the schema has multi-valued features "
                              f"{list(schema.multi)}; pass the batch's jagged")
        if jagged.stride != batch_size:
            raise ConfigError(f"jagged: stride {jagged.stride} differs from the batch size "
                              f"{batch_size}")
    return batch_size


class LinearTerm(nn.Module):
    """The first-order (linear) term: a weight per sparse id plus a linear map of the
    dense features (Cheng et al. 2016's wide part without crossed columns; the
    first-order part of Guo et al. 2017's FM component)::

        linear = sum_f w[id_f] + dense @ v + c          # Tensor[B]

    ``w`` is a dim-1 table named ``wide`` over every sparse feature of the schema
    (multi-valued features sum-pooled, as one-hot / multi-hot inputs times weights),
    ``v`` a Linear(num_dense, 1) that starts at zero (weights and bias), as a logistic
    regression does: its optimum does not depend on the start, and a random start over
    unnormalised dense features (log1p counts reach ~15) put the first logits at +-5
    and cost the short runs of a small data set their AUC (0.43 instead of 0.65 on 7,200
    rows); without dense features, no Linear and no bias.

    Args:
        schema: the features (the deep embeddings' schema).
    """

    def __init__(self, schema: FeatureSchema) -> None:
        super().__init__()
        self.wide = FeatureEmbeddings(schema, [EmbeddingTableSpec(
            name=WIDE_TABLE, dim=1, features=schema.features, pooling="sum", rule=None)])
        self.dense = nn.Linear(len(schema.dense), 1) if schema.dense else None
        if self.dense is not None:
            with torch.no_grad():
                self.dense.weight.zero_()
                self.dense.bias.zero_()

    def forward(self, sparse: Tensor, dense: Tensor, jagged: KeyedJagged | None) -> Tensor:
        """Tensor[B] float32: the linear term of a checked batch (see :func:`check_batch`)."""
        (weights,) = self.wide(sparse, jagged)  # [B, F, 1]
        linear = weights.sum(dim=(1, 2))  # [B]
        if self.dense is not None:
            linear = linear + self.dense(dense).squeeze(1)
        return linear


def check_wide_name(model: str, embeddings: FeatureEmbeddings) -> None:
    """Raises ConfigError if a deep table is named ``wide`` (the model's own table)."""
    if any(t.name == WIDE_TABLE for t in embeddings.tables):
        raise ConfigError(f"{model}: the table name {WIDE_TABLE!r} is the model's first-order "
                          "table; rename the embeddings table")


class SchemaModel(nn.Module):
    """What the schema-sized models (wide_deep, deepfm, dcn_v2) share: their deep
    embeddings, sizes and the embedded input of the dense layers.

    Args:
        model: the model's registered name (for messages).
        embeddings: the deep part's embeddings.
        num_dense: dense features per example; must equal the schema's (None: the
            schema's).

    Attributes:
        embeddings: the FeatureEmbeddings.
        num_dense, num_slots: the schema's dense and single-valued sparse widths.
        input_width: ``embeddings.output_dim + num_dense``, the width of :meth:`embed`'s
            ``x``.

    Raises:
        ConfigError: ``embeddings`` is not a FeatureEmbeddings or ``num_dense`` differs
            from the schema.
    """

    def __init__(self, model: str, embeddings: FeatureEmbeddings,
                 num_dense: int | None) -> None:
        super().__init__()
        self.embeddings = require_embeddings(model, embeddings)
        self.num_dense = resolve_num_dense(model, embeddings.schema, num_dense)
        self.num_slots = len(embeddings.schema.sparse)
        self.input_width = embeddings.output_dim + self.num_dense

    @property
    def schema(self) -> FeatureSchema:
        """The features the model reads, by name."""
        return self.embeddings.schema

    def embed(self, sparse: Tensor, dense: Tensor, jagged: KeyedJagged | None
              ) -> tuple[list[Tensor], Tensor]:
        """The checked batch's table outputs (Tensor[B, F_t, D_t] each) and the dense
        layers' input ``x = concat(flatten(parts), dense)`` (Tensor[B, input_width]).

        Raises:
            ConfigError: an input has the wrong shape (names it).
        """
        check_batch(self.schema, sparse, dense, jagged)
        parts = self.embeddings(sparse, jagged)
        return parts, torch.cat([self.embeddings.flatten(parts), dense], dim=1)
