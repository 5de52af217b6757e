"""Which inputs each sparse table of an exported model reads, and computing them.

A model's tables come in two kinds (layout in :mod:`psfleet.export.types`):

- **batch-keyed**: a bare :class:`~psfleet.nn.SparseEmbedding`, or every table of a
  :class:`~psfleet.nn.FeatureEmbeddings` whose tables are all single-valued without
  ``shared_ids``. They read (slices of) the batch's keys, so one ``unique`` over the
  batch serves them all, and the model's own indexing works on positions;
- **own-keyed**: every table of a FeatureEmbeddings (a *group*) with a pooled
  (multi-valued) or ``shared_ids`` table. Each reads the keys
  :meth:`FeatureEmbeddings.table_inputs` gives it (the same code as training, so the
  shared-ids rewrite and the feature-major bags are training's), deduplicated per table.

:class:`TowerPlan` finds them in a model (export); :class:`TowerInputs` turns a batch
into the dense tower's inputs (serving, and the export's check).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from psfleet.data.jagged import KeyedJagged
from psfleet.errors import ConfigError
from psfleet.export.types import FeaturesSpec, TableInputSpec, bag_mode
from psfleet.nn import FeatureEmbeddings, SparseEmbedding, SparseEmbeddingBag
from psfleet.nn.embedding_bag import bag_weights

__all__ = ["GroupInputs", "TowerPlan", "TowerInputs", "Lookup", "group_inputs"]

#: Rows of keys for table i of the plan: ``lookup(i, keys uint64[U]) -> float32[U, dim]``.
Lookup = Callable[[int, np.ndarray], np.ndarray]
#: One own-keyed table's tower inputs: positions, offsets (None: a single-valued
#: gather), per-id weights (None: none) and rows float32[U_t, dim].
GroupInputs = list[tuple[Tensor, Tensor | None, Tensor | None, Tensor]]


def _own_keyed(features: FeatureEmbeddings) -> bool:
    return any(spec.shared_ids or isinstance(module, SparseEmbeddingBag)
               for spec, module in zip(features.tables, features.embeddings, strict=True))


def group_inputs(features: FeatureEmbeddings, weighted: bool, sparse: Tensor,
                 jagged: KeyedJagged | None, lookup: Callable[[int, np.ndarray], np.ndarray]
                 ) -> GroupInputs:
    """The tower inputs of an own-keyed group's tables for a batch.

    Per table (spec order): ``uniq, positions = unique(ids)`` over the keys
    ``features.table_inputs`` gives it, ``rows = lookup(t, uniq)``; a pooled table adds
    its offsets and, when :func:`~psfleet.export.types.bag_mode` says so, the per-id
    weights ``bag_weights(pooling, offsets, weights)`` (SparseEmbeddingBag's formula).

    Args:
        features: the group.
        weighted: whether the data's multi-valued ids carry weights.
        sparse (Tensor[B, S], int64), jagged: the batch's keys.
        lookup: rows of table t (the group's index) of keys uint64[U].

    Raises:
        ConfigError: the batch does not fit the group's schema (names what differs).
    """
    out: GroupInputs = []
    for t, (ids, offsets, weights) in enumerate(features.table_inputs(sparse, jagged)):
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        rows = torch.from_numpy(lookup(t, uniq.numpy().view(np.uint64)))  # [U_t, dim]
        if offsets is None:
            out.append((inverse.reshape(ids.shape), None, None, rows))
            continue
        module = features.embeddings[t]
        assert isinstance(module, SparseEmbeddingBag)  # offsets come from bag tables only
        _, takes_weights = bag_mode(module.pooling, weighted)
        scaled = bag_weights(module.pooling, offsets, weights) if takes_weights else None
        out.append((inverse, offsets, scaled, rows))
    return out


@dataclass(frozen=True)
class TowerPlan:
    """A model's sparse tables in the dense tower's order, with what each reads.

    Attributes:
        embeddings: every table module, batch-keyed ones first (by name), then each
            group's tables in spec order.
        inputs: per table, None (batch-keyed) or its :class:`TableInputSpec`.
        groups: the own-keyed FeatureEmbeddings, in ``model.modules()`` order.
        features: their schema; None without groups.
    """

    embeddings: list[SparseEmbedding]
    inputs: list[TableInputSpec | None]
    groups: list[FeatureEmbeddings]
    features: FeaturesSpec | None

    @classmethod
    def of(cls, model: nn.Module) -> TowerPlan:
        """The plan of ``model``.

        Raises:
            ConfigError: two own-keyed FeatureEmbeddings have different schemas.
        """
        all_features = list({id(m): m for m in model.modules()
                             if isinstance(m, FeatureEmbeddings)}.values())
        groups = [f for f in all_features if _own_keyed(f)]
        inside = {id(m) for g in groups for m in g.embeddings}
        batch_keyed = sorted({id(m): m for m in model.modules() if isinstance(
            m, SparseEmbedding) and id(m) not in inside}.values(), key=lambda e: e.name)
        embeddings: list[SparseEmbedding] = list(batch_keyed)
        inputs: list[TableInputSpec | None] = [None] * len(batch_keyed)
        for g, group in enumerate(groups):
            if group.schema != groups[0].schema:
                raise ConfigError(f"export: the model's FeatureEmbeddings read different "
                                  f"schemas ({groups[0].schema} and {group.schema}); "
                                  "export a model over one schema")
            for t, (spec, module) in enumerate(zip(group.tables, group.embeddings,
                                                   strict=True)):
                assert isinstance(module, SparseEmbedding)
                embeddings.append(module)
                inputs.append(TableInputSpec(
                    group=g, table=t, features=list(spec.features), shared_ids=spec.shared_ids,
                    pooling=module.pooling if isinstance(module, SparseEmbeddingBag) else None))
        schema = groups[0].schema if groups else None
        features = None if schema is None else FeaturesSpec(
            dense=list(schema.dense), sparse=list(schema.sparse), multi=list(schema.multi),
            weighted=schema.weighted)
        return cls(embeddings, inputs, groups, features)


class TowerInputs:
    """The dense tower's inputs of a batch (order and shapes: :mod:`psfleet.export.types`).

    Args:
        inputs: per table of the tower, None (batch-keyed) or its TableInputSpec.
        groups: the own-keyed FeatureEmbeddings, indexed by ``TableInputSpec.group``.
        weighted: whether the data's multi-valued ids carry weights.
    """

    def __init__(self, inputs: Sequence[TableInputSpec | None],
                 groups: Sequence[FeatureEmbeddings], weighted: bool) -> None:
        self.inputs = list(inputs)
        self.groups = list(groups)
        self.weighted = weighted
        self._index = {(s.group, s.table): i for i, s in enumerate(self.inputs) if s}

    def _group_lookup(self, group: int, lookup: Lookup) -> Lookup:
        """``lookup`` indexed by the group's table index."""
        def rows(t: int, keys: np.ndarray) -> np.ndarray:
            return lookup(self._index[(group, t)], keys)
        return rows

    def __call__(self, sparse: Tensor, dense: Tensor, jagged: KeyedJagged | None,
                 lookup: Lookup) -> list[Tensor]:
        """``[positions, dense, <table 0's inputs>, ...]`` of a checked batch.

        Args:
            sparse (Tensor[B, S], int64): keys; dense (Tensor[B, F], float32);
            jagged: the multi-valued keys (stride B), or None.
            lookup: rows of plan table i of keys uint64[U] -> float32[U, dim].

        Raises:
            ConfigError: the batch does not fit a group's schema.
        """
        positions = torch.zeros_like(sparse)
        uniq = np.zeros(0, np.uint64)
        if any(s is None for s in self.inputs):  # batch-keyed tables: one unique
            keys, inverse = torch.unique(sparse.reshape(-1), return_inverse=True)
            positions, uniq = inverse.reshape(sparse.shape), keys.numpy().view(np.uint64)
        per_group = [group_inputs(group, self.weighted, sparse, jagged,
                                  self._group_lookup(g, lookup))
                     for g, group in enumerate(self.groups)]
        out = [positions, dense]
        for i, spec in enumerate(self.inputs):
            if spec is None:
                out.append(torch.from_numpy(lookup(i, uniq)))
                continue
            pos, offsets, weights, rows = per_group[spec.group][spec.table]
            out.extend(t for t in (pos, offsets, weights, rows) if t is not None)
        return out
