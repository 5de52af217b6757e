"""SparseEmbeddingBag: pooled bags of ids over a sparse table (multi-valued features).

The jagged counterpart of :class:`~psfleet.nn.SparseEmbedding`, with the same table
plumbing (name, dim, rule, initializer, bind, prefetch): a forward takes K bags of ids
in CSR form (``values``, ``offsets``, optional per-id ``weights``) and returns one
pooled row per bag. As torch.nn.EmbeddingBag does, but the rows live in a table:

1. ``torch.unique`` over the N ids, one pull of the U distinct rows (a leaf
   ``[U, dim]`` recorded with the worker runtime, exactly as SparseEmbedding does, so
   the step still pushes ONE merged gradient per table);
2. ``torch.nn.functional.embedding_bag`` over the positions of the ids among those
   rows (``include_last_offset``), in ``sum`` mode with per-id weights scaled per bag
   for ``mean`` / ``sqrtn`` (unweighted ``mean`` uses torch's own ``mean`` mode).

Everything is vectorised: no Python loop over bags or ids. Poolings:
:data:`~psfleet.nn.types.Pooling`.
"""

from __future__ import annotations

import torch
from torch.nn.functional import embedding_bag

from psfleet.errors import ConfigError
from psfleet.nn.sparse_embedding import SparseEmbedding
from psfleet.nn.table_checks import AccessorSpec, Pooling, check_pooling
from psfleet.nn.types import Prefetch
from psfleet.ps.types import Initializer, RuleConfig

__all__ = ["SparseEmbeddingBag", "bag_weights"]


def bag_weights(pooling: Pooling, offsets: torch.Tensor, weights: torch.Tensor | None
                ) -> torch.Tensor | None:
    """Per-id weights that turn a weighted sum per bag into ``pooling``.

    ``mean`` scales bag k's weights by 1 / sum(w), ``sqrtn`` by 1 / sqrt(sum(w^2))
    (w = 1 without weights; a zero denominator scales by 0, TensorFlow's
    ``div_no_nan`` in ``embedding_lookup_sparse``); ``sum`` keeps ``weights``.

    Args:
        pooling: one of :data:`~psfleet.nn.types.POOLINGS`.
        offsets (Tensor[K + 1], int64): bag k is ids ``offsets[k]:offsets[k + 1]``.
        weights (Tensor[N], float32) or None: a weight per id.

    Returns:
        Tensor[N], float32, or None (``sum`` without weights: plain sum).
    """
    if pooling == "sum":
        return weights
    lengths = offsets[1:] - offsets[:-1]  # [K]
    num_ids = int(offsets[-1])
    if weights is None:
        per_bag = lengths.to(torch.float32)  # sum(w) = sum(w^2) = length
        if pooling == "sqrtn":
            per_bag = per_bag.sqrt()
        scale = torch.where(per_bag > 0, per_bag.reciprocal(), torch.zeros_like(per_bag))
        return torch.repeat_interleave(scale, lengths, output_size=num_ids)
    bag_of_id = torch.repeat_interleave(torch.arange(lengths.numel()), lengths,
                                        output_size=num_ids)  # [N]
    summed = weights if pooling == "mean" else weights * weights
    denominator = torch.zeros(lengths.numel(), dtype=torch.float32).index_add_(
        0, bag_of_id, summed)  # [K]
    if pooling == "sqrtn":
        denominator = denominator.sqrt()
    scale = torch.where(denominator != 0, denominator.reciprocal(),
                        torch.zeros_like(denominator))
    return weights * scale[bag_of_id]


class SparseEmbeddingBag(SparseEmbedding):
    """Pooled rows of bags of ids, the rows held by a sparse table.

    Args:
        dim: floats per row.
        name: table name; distinct per embedding.
        pooling: ``sum``, ``mean`` or ``sqrtn`` (:data:`~psfleet.nn.types.Pooling`).
        rule, initializer, initial_range, num_buckets, accessor: as SparseEmbedding's.

    Shapes:
        input: values (Tensor[N], int64) keys, offsets (Tensor[K + 1], int64),
        weights (Tensor[N], float32) or None.
        output: Tensor[K, dim], float32.

    ``prefetch(values)`` (inherited) pulls the rows of a coming batch's values; the
    forward over equal values uses them, whatever its offsets and weights.

    Raises:
        ConfigError: on construction, ``pooling`` or a table argument is out of range.
    """

    def __init__(self, dim: int, name: str = "embedding_bag", pooling: Pooling = "sum",
                 rule: RuleConfig | None = None, initializer: Initializer = "uniform",
                 initial_range: float = 0.01, num_buckets: int = 4096,
                 accessor: AccessorSpec = None) -> None:
        checked = check_pooling(pooling, f"SparseEmbeddingBag {name!r}")  # before registering
        super().__init__(dim, name=name, rule=rule, initializer=initializer,
                         initial_range=initial_range, num_buckets=num_buckets,
                         accessor=accessor)
        self.pooling: Pooling = checked

    def forward(self, values: torch.Tensor, offsets: torch.Tensor,  # type: ignore[override]
                weights: torch.Tensor | None = None, prefetched: Prefetch | None = None,
                batch_size: int | None = None) -> torch.Tensor:
        """The pooled row of each of K bags.

        Args:
            values (Tensor[N], int64): the ids of bag 0, then bag 1, ... (uint64 keys).
            offsets (Tensor[K + 1], int64): bag k is ``values[offsets[k]:offsets[k+1]]``;
                ``offsets[0] == 0``, ``offsets[K] == N``, non-decreasing (empty bags
                allowed; they pool to zeros).
            weights (Tensor[N], float32) or None: a weight per id (libSVM values).
            prefetched: the handle of :meth:`prefetch` over ``values`` (equal values).
            batch_size: the examples the bags belong to, bags feature-major (bag
                ``f * B + b`` is example b): only read with the ``ctr`` accessor, for
                the show and click counts; None: one bag per example (K).

        Returns:
            Tensor[K, dim], float32 (the pooling's formula in
            :data:`~psfleet.nn.types.Pooling`).

        Raises:
            FatalError: not bound to a table.
            ConfigError: a shape or dtype above does not hold, offsets do not run from
                0 to N non-decreasing, ``prefetched`` was made for other ids, or (ctr
                accessor, training) K is not a multiple of ``batch_size``.
        """
        self._check_bags(values, offsets, weights)
        rows, inverse = self.lookup(values, prefetched, offsets, batch_size)  # [U, dim], [N]
        if self.pooling == "mean" and weights is None:
            return embedding_bag(inverse, rows, offsets, mode="mean",
                                   include_last_offset=True)
        return embedding_bag(inverse, rows, offsets, mode="sum",
                               per_sample_weights=bag_weights(self.pooling, offsets, weights),
                               include_last_offset=True)

    def _check_bags(self, values: torch.Tensor, offsets: torch.Tensor,
                    weights: torch.Tensor | None) -> None:
        label = f"SparseEmbeddingBag {self.name!r}"
        if values.dim() != 1:
            raise ConfigError(f"{label}: values must be 1-D [N], got {tuple(values.shape)}")
        if offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.numel() < 1:
            raise ConfigError(f"{label}: offsets must be int64 [K + 1] (K bags), got "
                              f"{tuple(offsets.shape)} {offsets.dtype}")
        first, last = int(offsets[0]), int(offsets[-1])
        if first != 0 or last != values.numel() or bool((offsets[1:] < offsets[:-1]).any()):
            raise ConfigError(f"{label}: offsets must run non-decreasing from 0 to "
                              f"{values.numel()} (the number of values); got {first} .. "
                              f"{last}")
        if weights is not None and (weights.dtype != torch.float32
                                    or weights.shape != values.shape):
            raise ConfigError(f"{label}: weights must be float32 {tuple(values.shape)} "
                              f"like values, got {tuple(weights.shape)} {weights.dtype}")

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, pooling={self.pooling!r}"
