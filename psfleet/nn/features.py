"""FeatureEmbeddings: every sparse feature of a schema looked up in its table.

A model with several embedding tables of different widths, some read by
multi-valued (jagged) features, declares them once::

    schema = FeatureSchema(dense=("d0",), sparse=("user", "item"), multi=("history",))
    features = FeatureEmbeddings(schema, [
        EmbeddingTableSpec("user", 8, ("user",)),
        EmbeddingTableSpec("items", 16, ("item", "history"), pooling="mean",
                           shared_ids=True),
    ])
    user, items = features(batch.sparse, batch.jagged)  # [B, 1, 8], [B, 2, 16]

One module per table (:attr:`FeatureEmbeddings.embeddings`, table name = spec name),
so each table is one pull and one push per step, and ``fleet.init_worker`` binds them
like any :class:`~psfleet.nn.SparseEmbedding`:

- a table read only by single-valued features is a plain SparseEmbedding over
  ``sparse[:, cols]`` (one gather ``rows[inverse]``, the path of the Criteo models);
- a table read by a multi-valued feature is a :class:`~psfleet.nn.SparseEmbeddingBag`
  over the bags of all its features, feature-major (bag ``f * B + b``); a
  single-valued feature's id is a bag of one (weight 1). Its ``[F_t * B, D]`` output
  is viewed ``[F_t, B, D]`` and permuted to ``[B, F_t, D]``.

Keys: the parsers put a per-slot prefix into every key (``(slot + 1) << 33``,
:func:`psfleet.data.criteo.slot_prefixes`), so two features never share a row. A
table with ``shared_ids`` keeps the low 33 bits of each key (the raw id) and gives
them one prefix of its own, the prefix of slot ``i`` where ``i`` is its first
feature's position in ``schema.features``: the same raw id in two of its features is
one row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from psfleet.data.batch import Batch
from psfleet.data.criteo import slot_prefixes
from psfleet.data.jagged import KeyedJagged
from psfleet.data.types import FeatureSchema
from psfleet.errors import ConfigError
from psfleet.nn.embedding_bag import SparseEmbeddingBag
from psfleet.nn.sparse_embedding import SparseEmbedding
from psfleet.nn.table_checks import check_table_features
from psfleet.nn.types import EmbeddingTableSpec, Prefetch

__all__ = ["FeatureEmbeddings", "pass_ids"]

_ID_MASK = int(slot_prefixes(1)[0]) - 1  # the low 33 bits: the id without its slot prefix


def _table_prefix(slot: int) -> int:
    """``slot``'s key prefix as the int64 of its uint64 bits."""
    return int(slot_prefixes(slot + 1)[slot:].view("int64")[0])


class FeatureEmbeddings(nn.Module):
    """The embedding tables of a schema's sparse features (module docstring).

    Args:
        schema: the parser's features (``sparse`` single-valued, ``multi``
            multi-valued).
        tables: one spec per table; every feature of ``schema.features`` in exactly one.
        num_buckets: virtual buckets of each table.

    Raises:
        ConfigError: a schema feature is in no table or in two, a table names a feature
            not in the schema, two tables share a name, or a spec is invalid (names it).
    """

    def __init__(self, schema: FeatureSchema, tables: Sequence[EmbeddingTableSpec],
                 num_buckets: int = 4096) -> None:
        super().__init__()
        self.schema = schema
        self.tables: tuple[EmbeddingTableSpec, ...] = tuple(tables)
        try:
            check_table_features(schema, self.tables)
        except ConfigError as exc:
            raise ConfigError(f"FeatureEmbeddings: {exc}") from None
        self.output_dim = sum(len(t.features) * t.dim for t in self.tables)
        single = {name: i for i, name in enumerate(schema.sparse)}
        modules: list[SparseEmbedding] = []
        self._columns: list[Tensor | None] = []  # single-valued tables: sparse columns
        self._plans: list[list[int | str]] = []  # bag tables: a column or a jagged key
        self._prefixes: list[int | None] = []  # shared_ids: the table's key prefix
        for spec in self.tables:
            plan = [single.get(f, f) for f in spec.features]
            if all(isinstance(step, int) for step in plan):
                modules.append(SparseEmbedding(
                    spec.dim, name=spec.name, rule=spec.rule, initializer=spec.initializer,
                    initial_range=spec.initial_range, num_buckets=num_buckets,
                    accessor=spec.accessor))
                self._columns.append(None if plan == list(range(len(schema.sparse)))
                                     else torch.tensor(plan, dtype=torch.int64))
            else:
                modules.append(SparseEmbeddingBag(
                    spec.dim, name=spec.name, pooling=spec.pooling, rule=spec.rule,
                    initializer=spec.initializer, initial_range=spec.initial_range,
                    num_buckets=num_buckets, accessor=spec.accessor))
                self._columns.append(None)
            self._plans.append(plan)
            self._prefixes.append(_table_prefix(schema.features.index(spec.features[0]))
                                  if spec.shared_ids else None)
        self.embeddings = nn.ModuleList(modules)
        self._per_table: tuple[SparseEmbedding, ...] = tuple(modules)  # typed view
        self._columns_only = [not isinstance(m, SparseEmbeddingBag) for m in modules]

    def forward(self, sparse: Tensor, jagged: KeyedJagged | None = None) -> list[Tensor]:
        """Each table's rows of the batch.

        Args:
            sparse (Tensor[B, S], int64): keys of the single-valued features
                (``schema.sparse`` order).
            jagged: the multi-valued features (stride B, keys including every
                ``schema.multi`` a table reads); None when the schema has none.

        Returns:
            One Tensor[B, F_t, D_t], float32 per table (spec order), its features in the
            spec's order; multi-valued ones pooled.

        Raises:
            ConfigError: the inputs do not match the schema (names what differs).
            FatalError: the tables are not bound (``fleet.init_worker``).
        """
        batch = int(sparse.shape[0])
        out: list[Tensor] = []
        for spec, module, (ids, offsets, weights) in zip(
                self.tables, self._per_table, self.table_inputs(sparse, jagged), strict=True):
            if offsets is None:
                out.append(module(ids))  # [B, F_t, D]
            else:
                pooled = module(ids, offsets, weights, batch_size=batch)  # [F_t * B, D]
                out.append(pooled.view(len(spec.features), batch, spec.dim).permute(1, 0, 2))
        return out

    def table_inputs(self, sparse: Tensor, jagged: KeyedJagged | None = None
                     ) -> list[tuple[Tensor, Tensor | None, Tensor | None]]:
        """What each table's module reads from the batch (its keys, shared ids applied):
        for serving and export, which pull or gather the same rows.

        Args:
            sparse, jagged: as in :meth:`forward`.

        Returns:
            Per table (spec order), ``(ids, None, None)`` for a single-valued table:
            ids Tensor[B, F_t] int64; or ``(values, offsets, weights)`` for a pooled one,
            its bags feature-major (bag ``f * B + b``): values Tensor[N] int64, offsets
            Tensor[F_t * B + 1] int64, weights Tensor[N] float32 or None.

        Raises:
            ConfigError: as :meth:`forward`.
        """
        self._check_inputs(sparse, jagged)
        return [(self._single_ids(t, sparse), None, None)
                if self._columns_only[t] else self._bags(t, sparse, jagged)
                for t in range(len(self.tables))]

    def prefetch(self, sparse: Tensor, jagged: KeyedJagged | None = None
                 ) -> list[Prefetch | None]:
        """Start pulling every table's rows of a coming batch (async mode only; see
        :meth:`SparseEmbedding.prefetch`). Run the forward over that batch inside
        ``psfleet.nn.use_prefetched(handles)``.

        Returns:
            One handle (or None: nothing pulled) per table, spec order.

        Raises:
            ConfigError: as :meth:`forward`.
        """
        return [module.prefetch(ids) for module, (ids, _, _) in zip(
            self._per_table, self.table_inputs(sparse, jagged), strict=True)]

    def batch_ids(self, sparse: Tensor, jagged: KeyedJagged | None = None
                  ) -> dict[str, Tensor]:
        """Every table's keys of a batch, by table name: Tensor[N_t], int64, repeats
        kept (what pass mode's ``fleet.begin_pass`` caches; no rows are read).

        Raises:
            ConfigError: as :meth:`forward`.
        """
        return {spec.name: ids.reshape(-1) for spec, (ids, _, _)
                in zip(self.tables, self.table_inputs(sparse, jagged), strict=True)}

    @staticmethod
    def flatten(parts: Sequence[Tensor]) -> Tensor:
        """The tables' outputs (Tensor[B, F_t, D_t] each) side by side:
        Tensor[B, sum F_t * D_t], float32 (a view, no copy, for one contiguous part)."""
        flat = [p.reshape(p.shape[0], p.shape[1] * p.shape[2]) for p in parts]
        return flat[0] if len(flat) == 1 else torch.cat(flat, dim=1)

    @staticmethod
    def stack(parts: Sequence[Tensor]) -> Tensor:
        """The tables' outputs (Tensor[B, F_t, D] each) as one Tensor[B, F, D] (F every
        feature, spec order), for models that need one width (DeepFM, DCN).

        Raises:
            ConfigError: the tables' dims differ (names them, in spec order).
        """
        dims = [int(p.shape[-1]) for p in parts]
        if len(set(dims)) > 1:
            raise ConfigError(f"FeatureEmbeddings.stack: the tables have different dims "
                              f"{dims}; use flatten(), or give every table the same dim")
        return parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=1)

    # -- the ids of each table ---------------------------------------------------------
    def _shared(self, t: int, ids: Tensor) -> Tensor:
        prefix = self._prefixes[t]
        return ids if prefix is None else (ids & _ID_MASK) | prefix

    def _single_ids(self, t: int, sparse: Tensor) -> Tensor:
        """Table t's keys Tensor[B, F_t], int64 (single-valued features only)."""
        cols = self._columns[t]
        ids = sparse if cols is None else sparse.index_select(1, cols)
        return self._shared(t, ids)

    def _bags(self, t: int, sparse: Tensor, jagged: KeyedJagged | None
              ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Table t's bags, feature-major (bag ``f * B + b``): values Tensor[N] int64,
        offsets Tensor[F_t * B + 1] int64, weights Tensor[N] float32 or None."""
        batch = sparse.shape[0]
        values: list[Tensor] = []
        lengths: list[Tensor] = []
        weights: list[Tensor] = []
        weighted = jagged is not None and jagged.weights is not None
        starts: list[int] = []
        if jagged is not None:
            per_key = jagged.lengths.view(len(jagged.keys), batch).sum(1, dtype=torch.int64)
            starts = [0, *torch.cumsum(per_key, 0).tolist()]
        ones = torch.ones(batch, dtype=torch.int64)
        for step in self._plans[t]:
            if isinstance(step, int):  # a single-valued feature: bags of one id
                values.append(sparse[:, step])
                lengths.append(ones)
                if weighted:
                    weights.append(torch.ones(batch, dtype=torch.float32))
                continue
            if jagged is None:
                raise ConfigError(f"FeatureEmbeddings: table {self.tables[t].name!r} reads "
                                  f"the multi-valued feature {step!r}; pass batch.jagged")
            k = jagged.keys.index(step)
            values.append(jagged.values[starts[k]:starts[k + 1]])
            lengths.append(jagged.lengths[k * batch:(k + 1) * batch].to(torch.int64))
            if jagged.weights is not None:
                weights.append(jagged.weights[starts[k]:starts[k + 1]])
        flat_lengths = torch.cat(lengths)
        offsets = torch.zeros(flat_lengths.numel() + 1, dtype=torch.int64)
        torch.cumsum(flat_lengths, 0, out=offsets[1:])
        return (self._shared(t, torch.cat(values)), offsets,
                torch.cat(weights) if weighted else None)

    def _check_inputs(self, sparse: Tensor, jagged: KeyedJagged | None) -> int:
        """The batch size B; ConfigError when the inputs do not fit the schema."""
        if sparse.dtype != torch.int64 or sparse.dim() != 2 or sparse.shape[1] != len(
                self.schema.sparse):
            raise ConfigError(f"FeatureEmbeddings: sparse must be int64 [B, "
                              f"{len(self.schema.sparse)}] (schema.sparse "
                              f"{list(self.schema.sparse)}), got {tuple(sparse.shape)} "
                              f"{sparse.dtype}")
        batch = int(sparse.shape[0])
        if not self.schema.multi:
            return batch
        if jagged is None:
            raise ConfigError(f"FeatureEmbeddings: the schema has multi-valued features "
                              f"{list(self.schema.multi)} but jagged is None; pass "
                              "batch.jagged")
        missing = [k for k in self.schema.multi if k not in jagged.keys]
        if missing or jagged.stride != batch:
            raise ConfigError(f"FeatureEmbeddings: jagged must carry {list(self.schema.multi)}"
                              f" for {batch} examples; got keys {list(jagged.keys)}, "
                              f"stride {jagged.stride}")
        return batch

    def extra_repr(self) -> str:
        return f"tables={[t.name for t in self.tables]}, output_dim={self.output_dim}"


def pass_ids(model: nn.Module, batches: Iterable[Batch]) -> dict[str, np.ndarray]:
    """The distinct keys each table of ``model`` reads in ``batches``, by table name:
    uint64[P_t] sorted (pass mode's ``fleet.begin_pass(ids)``). Reads the ids of every
    :class:`FeatureEmbeddings` in ``model`` (the runner's models); a model calling
    SparseEmbeddings itself collects its ids by hand.

    Raises:
        ConfigError: ``model`` has no FeatureEmbeddings, or a batch does not match its
            schema.
    """
    modules = [m for m in model.modules() if isinstance(m, FeatureEmbeddings)]
    if not modules:
        raise ConfigError(f"pass_ids: {type(model).__name__} has no FeatureEmbeddings; "
                          "give fleet.begin_pass the ids of each table by name")
    parts: dict[str, list[np.ndarray]] = {}
    for batch in batches:
        for module in modules:
            for name, ids in module.batch_ids(batch.sparse, batch.jagged).items():
                parts.setdefault(name, []).append(ids.numpy().view(np.uint64))
    return {name: np.unique(np.concatenate(p)) for name, p in parts.items()}
