"""The ``dcn_v2`` CTR model: Wang et al. 2021, "DCN V2: Improved Deep & Cross Network
and Practical Lessons for Web-scale Learning to Rank Systems" (WWW 2021,
arXiv:2008.13535), as PaddleRec's ``models/rank/dcn_v2`` (``DCN_V2_Net`` with
``is_stacked=True``, ``use_low_rank_mixture=False``).

Architecture, the full-rank **stacked** structure (paper Fig. 1b)::

    parts   = embeddings(sparse, jagged)               # [B, F_t, D_t] per table
    x0      = concat(flatten(parts), dense)            # [B, d], d = sum_t F_t*D_t + num_dense
    x_{l+1} = x0 * (W_l x_l + b_l) + x_l,  l < L       # [B, d]   (paper eq. 1; W_l [d, d])
    h       = relu(Linear(.)) per fc_sizes on x_L      # [B, fc_sizes[-1]]
    logit   = Linear(h)                                # [B, 1] -> [B]

``*`` is the element-wise (Hadamard) product, ``L = cross_layers``. We take the
stacked structure, where the deep network reads the cross network's output, rather
than the parallel one (cross and deep side by side, outputs concatenated): the paper
finds neither better across data sets, the stacked one has no concatenation layer and
the deep tower is then exactly the ``dnn`` tower over the crossed input. The full-rank
``W_l`` (rather than the low-rank mixture, eq. 2) keeps the formula exact; its cost is
``L * d^2`` weights (0.18 M for Criteo's 26 x 9 + 13 inputs and 3 layers).

Every weight, cross layers included, starts as Normal(0, 1/sqrt(fan_in)) and every
bias at 0, as PaddleRec's DNN layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from psfleet.data.jagged import KeyedJagged
from psfleet.errors import ConfigError
from psfleet.nn.features import FeatureEmbeddings
from psfleet.rec.models._features import SchemaModel
from psfleet.rec.models.mlp import check_fc_sizes, mlp_tower, paddle_linear
from psfleet.rec.models.registry import register_model

__all__ = ["CrossNetwork", "DCNv2"]


class CrossNetwork(nn.Module):
    """DCN V2's full-rank cross network (Wang et al. 2021, eq. 1), ``num_layers`` deep.

    Args:
        width: d, the input (and output) width.
        num_layers: L >= 1 cross layers.
        generator: random generator of the weights (None: torch's global one).

    Shapes:
        input: x0 (Tensor[B, d], float32). output: x_L (Tensor[B, d], float32).

    Raises:
        ConfigError: ``width`` or ``num_layers`` < 1.
    """

    def __init__(self, width: int, num_layers: int,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if num_layers < 1:
            raise ConfigError(f"cross_layers: {num_layers!r} must be >= 1")
        self.layers = nn.ModuleList(paddle_linear(width, width, generator)
                                    for _ in range(num_layers))

    def forward(self, x0: Tensor) -> Tensor:
        """``x_{l+1} = x0 * (W_l x_l + b_l) + x_l`` for each layer; returns x_L [B, d]."""
        x = x0
        for layer in self.layers:
            x = x0 * layer(x) + x  # [B, d]
        return x


@register_model("dcn_v2")
class DCNv2(SchemaModel):
    """DCN V2, stacked, full rank, over a schema (module docstring).

    Args:
        embeddings: the embeddings (any tables and dims).
        num_dense: dense features per example; must equal the schema's (None: the
            schema's).
        fc_sizes: the deep tower's hidden widths (PaddleRec's ``fc_sizes``).
        cross_layers: L, the cross layers (PaddleRec's ``cross_num``; default 3).
        generator: random generator of the dense weights (None: torch's global one).
        dropout: the deep tower's dropout rate while training, one for every hidden
            layer or one per ``fc_sizes`` entry (``hyper_parameters.dropout``; 0: none).
        dropout_seed: seed of the dropout masks' generator (None: torch's global one).

    Attributes:
        schema: the embeddings' schema.
        cross: the cross network, width ``embeddings.output_dim + num_dense``.
        deep: the MLP tower on the cross output, ending in the logit layer.

    Raises:
        ConfigError: ``embeddings`` is not a FeatureEmbeddings, ``num_dense`` differs
            from the schema, ``cross_layers`` < 1 or a width is < 1.
    """

    def __init__(self, embeddings: FeatureEmbeddings, num_dense: int | None = None,
                 fc_sizes: Sequence[int] = (512, 256, 128, 32), *, cross_layers: int = 3,
                 generator: torch.Generator | None = None,
                 dropout: float | Sequence[float] = 0.0,
                 dropout_seed: int | None = None) -> None:
        super().__init__("dcn_v2", embeddings, num_dense)
        hidden = check_fc_sizes(fc_sizes)
        self.cross = CrossNetwork(self.input_width, cross_layers, generator)
        self.deep = mlp_tower([self.input_width, *hidden, 1], generator, dropout,
                              dropout_seed)

    def forward(self, sparse: Tensor, dense: Tensor, jagged: KeyedJagged | None = None
                ) -> Tensor:
        """Click logits.

        Args:
            sparse (Tensor[B, len(schema.sparse)], int64): single-valued feature keys.
            dense (Tensor[B, num_dense], float32): dense features.
            jagged: the multi-valued features (stride B); required when the schema has any.

        Returns:
            Tensor[B], float32: logits.

        Raises:
            ConfigError: an input has the wrong shape (names it).
        """
        _, x0 = self.embed(sparse, dense, jagged)  # [B, input_width]
        return self.deep(self.cross(x0)).squeeze(1)  # [B]
