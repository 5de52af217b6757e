"""The ``wide_deep`` CTR model: Cheng et al. 2016, "Wide & Deep Learning for
Recommender Systems" (arXiv:1606.07792), as PaddleRec's ``models/rank/wide_deep``.

Architecture (F features, tables t with F_t features of width D_t)::

    wide  = sum_f w[id_f] + Linear(dense)              # [B]   (LinearTerm)
    parts = embeddings(sparse, jagged)                 # [B, F_t, D_t] per table
    x     = concat(flatten(parts), dense)              # [B, sum_t F_t * D_t + num_dense]
    deep  = MLP(x): relu(Linear) per fc_sizes, Linear  # [B, 1] -> [B]
    logit = wide + deep                                # [B]   (paper eq. 3, before sigmoid)

The wide part is the paper's generalised linear model ``w_wide^T [x, phi(x)] + b`` on
the raw features: a dim-1 table named ``wide`` over every sparse feature of the schema
(sum-pooled: a multi-valued feature adds the weight of each of its ids), which the
model builds itself, plus a Linear over the dense features. PaddleRec's layer keeps
only the Linear over the dense features (``self.wide_part``); the dim-1 table is the
seeds' "wide table". Crossed columns ``phi(x)`` are not built: declare a crossed
feature in the data to have one. The deep part is PaddleRec's DNN tower.

The deep tower's Linear weights start as Normal(0, 1/sqrt(fan_in)), biases at 0
(PaddleRec's DNN); the wide Linear starts at zero (``LinearTerm``: PaddleRec's truncated
normal over unnormalised dense features put the first logits far from 0). The embeddings' and the
wide table's rows live in sparse tables (rule: the optimizer's, unless a table sets one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from psfleet.data.jagged import KeyedJagged
from psfleet.nn.features import FeatureEmbeddings
from psfleet.rec.models._features import (
    LinearTerm,
    SchemaModel,
    check_wide_name,
)
from psfleet.rec.models.mlp import check_fc_sizes, mlp_tower
from psfleet.rec.models.registry import register_model

__all__ = ["WideDeep"]


@register_model("wide_deep")
class WideDeep(SchemaModel):
    """Wide & Deep over a schema (module docstring).

    Args:
        embeddings: the deep part's embeddings (any tables and dims).
        num_dense: dense features per example; must equal the schema's (None: the
            schema's).
        fc_sizes: the deep tower's hidden widths (PaddleRec's ``fc_sizes``).
        generator: random generator of the dense weights (None: torch's global one).
        dropout: the deep tower's dropout rate while training, one for every hidden
            layer or one per ``fc_sizes`` entry (``hyper_parameters.dropout``; 0: none).
        dropout_seed: seed of the dropout masks' generator (None: torch's global one).

    Attributes:
        schema: the embeddings' schema.
        wide: the first-order term (its ``wide.wide`` is the dim-1 table).
        deep: the MLP tower, input ``embeddings.output_dim + num_dense`` wide.

    Raises:
        ConfigError: ``embeddings`` is not a FeatureEmbeddings, has a table named
            ``wide``, ``num_dense`` differs from the schema or a width is < 1.
    """

    def __init__(self, embeddings: FeatureEmbeddings, num_dense: int | None = None,
                 fc_sizes: Sequence[int] = (512, 256, 128, 32), *,
                 generator: torch.Generator | None = None,
                 dropout: float | Sequence[float] = 0.0,
                 dropout_seed: int | None = None) -> None:
        super().__init__("wide_deep", embeddings, num_dense)
        check_wide_name("wide_deep", embeddings)
        self.deep = mlp_tower([self.input_width, *check_fc_sizes(fc_sizes), 1], generator,
                              dropout, dropout_seed)
        self.wide = LinearTerm(embeddings.schema)

    def forward(self, sparse: Tensor, dense: Tensor, jagged: KeyedJagged | None = None
                ) -> Tensor:
        """Click logits.

        Args:
            sparse (Tensor[B, len(schema.sparse)], int64): single-valued feature keys.
            dense (Tensor[B, num_dense], float32): dense features.
            jagged: the multi-valued features (stride B); required when the schema has any.

        Returns:
            Tensor[B], float32: ``wide + deep`` logits.

        Raises:
            ConfigError: an input has the wrong shape (names it).
        """
        _, x = self.embed(sparse, dense, jagged)  # x: [B, input_width]
        return self.wide(sparse, dense, jagged) + self.deep(x).squeeze(1)  # [B]
