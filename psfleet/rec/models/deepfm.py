"""The ``deepfm`` CTR model: Guo et al. 2017, "DeepFM: A Factorization-Machine based
Neural Network for CTR Prediction" (IJCAI 2017, arXiv:1703.04247), as PaddleRec's
``models/rank/deepfm``.

Architecture (F features, every table of width D)::

    first  = sum_f w[id_f] + Linear(dense)                      # [B]   (LinearTerm)
    parts  = embeddings(sparse, jagged)                          # [B, F_t, D] per table
    e      = stack(parts)                                        # [B, F, D]
    second = 0.5 * sum_d((sum_f e[:, f, d])^2 - sum_f e[:, f, d]^2)   # [B]
    deep   = MLP(concat(flatten(parts), dense))                  # [B]
    logit  = first + second + deep                               # [B]  (paper eq. 1)

``second`` is the FM's pairwise term ``sum_{i<j} <e_i, e_j>`` computed in O(F * D)
(Rendle 2010, "Factorization Machines", lemma 3.1); the FM and the deep part share the
embeddings (the paper's point). A multi-valued feature enters as its pooled vector
(the table's pooling), i.e. one field of the FM.

Differences from PaddleRec's ``FM`` layer: the dense features enter the first-order
term through a Linear (a weight per dense feature, as PaddleRec's, plus a bias) and
stay out of the FM (PaddleRec also gives each dense feature a ``sparse_feature_dim``
vector scaled by its value, a field of the FM and of the deep input); the deep
tower's input is the embeddings then the raw dense features, as in ``dnn``.

Every Linear weight starts as Normal(0, 1/sqrt(fan_in)), every bias at 0 (PaddleRec).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from psfleet.data.jagged import KeyedJagged
from psfleet.errors import ConfigError
from psfleet.nn.features import FeatureEmbeddings
from psfleet.rec.models._features import (
    LinearTerm,
    SchemaModel,
    check_wide_name,
)
from psfleet.rec.models.mlp import check_fc_sizes, mlp_tower
from psfleet.rec.models.registry import register_model

__all__ = ["DeepFM", "fm_second_order"]


def fm_second_order(embedded: Tensor) -> Tensor:
    """The FM pairwise interaction ``sum_{i<j} <e_i, e_j>`` per example (Rendle 2010).

    Args:
        embedded (Tensor[B, F, D], float32): one vector per field.

    Returns:
        Tensor[B], float32: ``0.5 * sum_d((sum_f e)^2 - sum_f e^2)``.
    """
    square_of_sum = embedded.sum(dim=1).square()  # [B, D]
    sum_of_squares = embedded.square().sum(dim=1)  # [B, D]
    return 0.5 * (square_of_sum - sum_of_squares).sum(dim=1)  # [B]


@register_model("deepfm")
class DeepFM(SchemaModel):
    """DeepFM over a schema (module docstring).

    Args:
        embeddings: the FM and deep part's embeddings; every table of one dim D.
        num_dense: dense features per example; must equal the schema's (None: the
            schema's).
        fc_sizes: the deep tower's hidden widths (PaddleRec's ``fc_sizes``).
        generator: random generator of the dense weights (None: torch's global one).
        dropout: the deep tower's dropout rate while training, one for every hidden
            layer or one per ``fc_sizes`` entry (``hyper_parameters.dropout``; 0: none).
        dropout_seed: seed of the dropout masks' generator (None: torch's global one).

    Attributes:
        schema: the embeddings' schema.
        first_order: the linear term (its ``first_order.wide`` is the dim-1 table).
        deep: the MLP tower, input ``embeddings.output_dim + num_dense`` wide.

    Raises:
        ConfigError: ``embeddings`` is not a FeatureEmbeddings, its tables differ in
            dim (names each table's), one is named ``wide``, ``num_dense`` differs from
            the schema or a width is < 1.
    """

    def __init__(self, embeddings: FeatureEmbeddings, num_dense: int | None = None,
                 fc_sizes: Sequence[int] = (512, 256, 128, 32), *,
                 generator: torch.Generator | None = None,
                 dropout: float | Sequence[float] = 0.0,
                 dropout_seed: int | None = None) -> None:
        super().__init__("deepfm", embeddings, num_dense)
        check_wide_name("deepfm", embeddings)
        dims = {t.dim for t in embeddings.tables}
        if len(dims) != 1:
            raise ConfigError("deepfm: the FM term needs every table of one dim; got "
                              + ", ".join(f"{t.name}: {t.dim}" for t in embeddings.tables)
                              + " (set each hyper_parameters.tables entry's dim alike)")
        self.deep = mlp_tower([self.input_width, *check_fc_sizes(fc_sizes), 1], generator,
                              dropout, dropout_seed)
        self.first_order = LinearTerm(embeddings.schema)

    def forward(self, sparse: Tensor, dense: Tensor, jagged: KeyedJagged | None = None
                ) -> Tensor:
        """Click logits.

        Args:
            sparse (Tensor[B, len(schema.sparse)], int64): single-valued feature keys.
            dense (Tensor[B, num_dense], float32): dense features.
            jagged: the multi-valued features (stride B); required when the schema has any.

        Returns:
            Tensor[B], float32: ``first + second + deep`` logits.

        Raises:
            ConfigError: an input has the wrong shape (names it).
        """
        parts, x = self.embed(sparse, dense, jagged)  # x: [B, input_width]
        second = fm_second_order(self.embeddings.stack(parts))  # [B]
        deep = self.deep(x).squeeze(1)  # [B]
        return self.first_order(sparse, dense, jagged) + second + deep
