"""The dense tower: a model with its sparse lookups factored out.

For the time of the export, every :class:`~psfleet.nn.SparseEmbedding` outside an
own-keyed group is replaced by a gather ``rows_t[positions]`` from a tensor given as an
input, and every :class:`~psfleet.nn.FeatureEmbeddings` by a module computing its
tables' outputs from given inputs (:mod:`psfleet.export.plan`: batch-keyed tables
gather rows of the batch's unique keys, own-keyed tables gather or pool,
``embedding_bag``, the rows of their own positions). The model is captured with
``torch.export`` in strict mode (TorchDynamo; in non-strict tracing the models'
``int(sparse.shape[0])`` would pin the batch size) with dynamic batch size, key and id
counts, so the exported program holds only dense parameters and ops::

    forward(positions int64[B, S], dense float32[B, F], <table 0's inputs>, ...)
        -> logits float32[B]

(inputs per table: :mod:`psfleet.export.types`). ``positions`` are the indices of each
feature key in the batch's unique keys (the ``return_inverse`` of ``unique``): any
indexing the model does on its ids (slices, reshapes) works on positions the same way.
A model over multi-valued features gets, in place of its ``jagged`` argument, a
KeyedJagged with no keys and the batch's stride. A model that computes with its key
values (or jagged values) outside its embeddings cannot be exported this way; the
export checks the program against the eager model and raises if they differ.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.functional import embedding_bag

from psfleet.data.jagged import KeyedJagged
from psfleet.errors import ConfigError, FatalError
from psfleet.export.plan import GroupInputs, Lookup, TowerInputs, TowerPlan, group_inputs
from psfleet.export.types import bag_mode
from psfleet.nn import FeatureEmbeddings, SparseEmbedding, SparseEmbeddingBag
from psfleet.ps.hashing import init_rows

__all__ = ["model_embeddings", "export_dense_tower", "tower_input_names"]

_CHECK_RTOL, _CHECK_ATOL = 1e-5, 1e-6


class _Feed:
    """The inputs of the call in progress, shared by the stand-ins (export time only).

    ``rows`` are the batch-keyed tables' rows, ``groups`` each group's table inputs.
    ``keys`` (int64[U], ascending) and ``lookup`` are set only to check the export: the
    stand-ins then take feature keys, as the model's embeddings did, and find their
    positions and rows themselves.
    """

    def __init__(self) -> None:
        self.rows: list[Tensor] = []
        self.groups: list[GroupInputs] = []
        self.keys: Tensor | None = None
        self.lookup: Lookup | None = None


class _Gather(nn.Module):
    """Stands in for a batch-keyed SparseEmbedding: ``rows[positions]`` ->
    Tensor[..., dim]."""

    def __init__(self, feed: _Feed, index: int) -> None:
        super().__init__()
        self.feed = feed
        self.index = index

    def forward(self, positions: Tensor) -> Tensor:
        if self.feed.keys is not None:  # the check: positions are feature keys here
            positions = torch.searchsorted(self.feed.keys, positions.contiguous())
        return self.feed.rows[self.index][positions]


class _BatchKeyed(nn.Module):
    """Stands in for a FeatureEmbeddings whose tables all read the batch's keys: each
    table's gather over its columns of ``sparse`` (``table_inputs``)."""

    def __init__(self, features: FeatureEmbeddings, gathers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.features = [features]  # not a submodule: its SparseEmbeddings are not exported
        self.gathers = nn.ModuleList(gathers)

    def forward(self, sparse: Tensor, jagged: KeyedJagged | None = None) -> list[Tensor]:
        inputs = self.features[0].table_inputs(sparse, None)
        return [gather(ids) for gather, (ids, _, _) in zip(self.gathers, inputs, strict=True)]


class _OwnKeyed(nn.Module):
    """Stands in for an own-keyed FeatureEmbeddings: its tables' outputs Tensor[B, F_t,
    D_t] from their given positions, offsets, weights and rows (FeatureEmbeddings.forward
    and SparseEmbeddingBag.forward with the rows given)."""

    def __init__(self, features: FeatureEmbeddings, group: int, first: int, feed: _Feed,
                 weighted: bool) -> None:
        super().__init__()
        self.features = [features]  # not a submodule (as _BatchKeyed)
        self.group = group
        self.first = first  # the plan index of the group's first table
        self.feed = feed
        self.weighted = weighted
        self.modes = [bag_mode(m.pooling, weighted)[0] if isinstance(m, SparseEmbeddingBag)
                      else None for m in features.embeddings]

    def forward(self, sparse: Tensor, jagged: KeyedJagged | None = None) -> list[Tensor]:
        features = self.features[0]
        if self.feed.lookup is not None:  # the check: keys in, inputs computed here
            lookup, first = self.feed.lookup, self.first
            inputs = group_inputs(features, self.weighted, sparse, jagged,
                                  lambda t, k: lookup(first + t, k))
        else:
            inputs = self.feed.groups[self.group]
        batch = sparse.shape[0]
        out = []
        for spec, mode, (pos, offsets, weights, rows) in zip(
                features.tables, self.modes, inputs, strict=True):
            if offsets is None or mode is None:
                out.append(rows[pos])  # [B, F_t, D]
                continue
            pooled = embedding_bag(pos, rows, offsets, mode=mode, per_sample_weights=weights,
                                   include_last_offset=True)  # [F_t * B, D]
            out.append(pooled.view(len(spec.features), batch, spec.dim).permute(1, 0, 2))
        return out


class _Tower(nn.Module):
    def __init__(self, model: nn.Module, feed: _Feed, plan: TowerPlan) -> None:
        super().__init__()
        self.model = model
        self.feed = feed
        self.plan = plan
        self.takes_jagged = plan.features is not None and bool(plan.features.multi)

    def forward(self, positions: Tensor, dense: Tensor, *inputs: Tensor) -> Tensor:
        rows: list[Tensor] = []
        groups: list[GroupInputs] = [[] for _ in self.plan.groups]
        it = iter(inputs)
        for spec in self.plan.inputs:
            if spec is None:
                rows.append(next(it))
            elif spec.pooling is None:
                groups[spec.group].append((next(it), None, None, next(it)))
            else:
                pos, offsets = next(it), next(it)
                weighted = bag_mode(spec.pooling, self._weighted)[1]
                weights = next(it) if weighted else None
                groups[spec.group].append((pos, offsets, weights, next(it)))
        self.feed.rows, self.feed.groups = rows, groups
        try:
            args: list[Any] = [positions, dense]
            if self.takes_jagged:  # no keys: the model only checks its stride
                args.append(KeyedJagged((), torch.zeros(0, dtype=torch.int64),
                                        torch.zeros(0, dtype=torch.int32), None,
                                        positions.shape[0]))
            out: Tensor = self.model(*args)
            return out
        finally:
            self.feed.rows, self.feed.groups = [], []

    @property
    def _weighted(self) -> bool:
        return self.plan.features is not None and self.plan.features.weighted


def model_embeddings(model: nn.Module) -> list[SparseEmbedding]:
    """The distinct SparseEmbeddings of ``model`` in the dense tower's table order
    (:class:`~psfleet.export.plan.TowerPlan`; sorted by name when the model has no
    pooled or ``shared_ids`` table)."""
    return TowerPlan.of(model).embeddings


def tower_input_names(plan: TowerPlan) -> list[str]:
    """The names of the dense tower's inputs (``manifest.dense_model.inputs``)."""
    weighted = plan.features is not None and plan.features.weighted
    names = ["positions", "dense"]
    for i, spec in enumerate(plan.inputs):
        if spec is not None:
            names.append(f"positions_{i}")
            if spec.pooling is not None:
                names.append(f"offsets_{i}")
                if bag_mode(spec.pooling, weighted)[1]:
                    names.append(f"weights_{i}")
        names.append(f"rows_{i}")
    return names


def _swap(model: nn.Module, replace: dict[int, nn.Module]
          ) -> list[tuple[nn.Module, str, nn.Module]]:
    """Replace submodules (matched by identity); returns (parent, name, old) to restore."""
    swapped = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            new = replace.get(id(child))
            if new is not None:
                swapped.append((parent, name, child))
                setattr(parent, name, new)
    return swapped


def _stand_ins(model: nn.Module, plan: TowerPlan, feed: _Feed
               ) -> tuple[dict[int, nn.Module], list[tuple[FeatureEmbeddings, nn.Module]]]:
    """The gather of each bare SparseEmbedding (by id, to swap in), and the stand-in
    of each FeatureEmbeddings (whose forward it takes over, so that models checking
    ``isinstance(..., FeatureEmbeddings)`` see no difference)."""
    weighted = plan.features is not None and plan.features.weighted
    # batch-keyed tables come first in the plan: plan index == index into feed.rows
    gathers: dict[int, nn.Module] = {id(e): _Gather(feed, i) for i, (e, s) in enumerate(
        zip(plan.embeddings, plan.inputs, strict=True)) if s is None}
    features: dict[int, tuple[FeatureEmbeddings, nn.Module]] = {}
    for module in model.modules():
        if not isinstance(module, FeatureEmbeddings) or id(module) in features:
            continue
        stand_in: nn.Module
        if module in plan.groups:
            group = plan.groups.index(module)
            first = next(i for i, s in enumerate(plan.inputs)
                         if s is not None and s.group == group)
            stand_in = _OwnKeyed(module, group, first, feed, weighted)
        else:
            stand_in = _BatchKeyed(module, [gathers.pop(id(e)) for e in module.embeddings])
        features[id(module)] = (module, stand_in)
    return gathers, list(features.values())


def _check_batch(plan: TowerPlan, sparse_shape: Sequence[int], num_dense: int
                 ) -> tuple[Tensor, Tensor, KeyedJagged | None]:
    """A random batch of 3 examples over a small key pool (so keys repeat), with
    empty and multi-id bags for the multi-valued features."""
    gen = torch.Generator().manual_seed(1)
    pool = torch.randint(0, 1 << 40, (12,), generator=gen) * 4099 + 12345
    batch = 3
    sparse = pool[torch.randint(0, pool.numel(), (batch, *sparse_shape), generator=gen)]
    dense = torch.rand(batch, num_dense, generator=gen)
    if plan.features is None or not plan.features.multi:
        return sparse, dense, None
    multi = plan.features.multi
    lengths = torch.randint(0, 4, (len(multi) * batch,), generator=gen, dtype=torch.int32)
    lengths[0] = 0  # an empty bag
    total = int(lengths.sum())
    values = pool[torch.randint(0, pool.numel(), (total,), generator=gen)]
    weights = torch.rand(total, generator=gen) if plan.features.weighted else None
    return sparse, dense, KeyedJagged(tuple(multi), values, lengths, weights, batch)


def _check_rows(plan: TowerPlan) -> Lookup:
    """Key-seeded rows for the check: plan table i, keys uint64[U] -> float32[U, dim]."""
    def lookup(i: int, keys: np.ndarray) -> np.ndarray:
        return init_rows(keys, plan.embeddings[i].dim, "normal", 0.1, i + 1)
    return lookup


def _check(model: nn.Module, program: torch.export.ExportedProgram, plan: TowerPlan,
           feed: _Feed, sparse_shape: Sequence[int], num_dense: int) -> None:
    """FatalError unless the program's logits equal the model's on feature keys."""
    sparse, dense, jagged = _check_batch(plan, sparse_shape, num_dense)
    lookup = _check_rows(plan)
    weighted = plan.features is not None and plan.features.weighted
    inputs = TowerInputs(plan.inputs, plan.groups, weighted)(sparse, dense, jagged, lookup)
    keys = torch.unique(sparse.reshape(-1))
    feed.keys, feed.lookup = keys, lookup
    feed.rows = [torch.from_numpy(lookup(i, keys.numpy().view(np.uint64)))
                 for i, s in enumerate(plan.inputs) if s is None]
    try:
        with torch.no_grad():
            args = (sparse, dense) if jagged is None else (sparse, dense, jagged)
            expected: Tensor = model(*args)
            got: Tensor = program.module()(*inputs)
    finally:
        feed.rows, feed.keys, feed.lookup = [], None, None
    if not torch.allclose(expected, got, rtol=_CHECK_RTOL, atol=_CHECK_ATOL):
        raise FatalError(f"the exported dense tower of {type(model).__name__} differs from "
                         "the model (max |diff| "
                         f"{(expected - got).abs().max().item():.3g}): the model must use "
                         "its sparse ids only through its SparseEmbeddings")


def _examples(plan: TowerPlan, sparse_shape: Sequence[int], num_dense: int, batch: int,
              seed: int) -> tuple[tuple[Tensor, ...], tuple[Any, ...]]:
    """Example tower inputs for torch.export and their dynamic shapes."""
    gen = torch.Generator().manual_seed(seed)
    unique, values = 7, 11
    b, static = torch.export.Dim("batch", min=1), torch.export.Dim.STATIC
    u = torch.export.Dim("unique", min=1)
    weighted = plan.features is not None and plan.features.weighted
    args: list[Tensor] = [torch.randint(0, unique, (batch, *sparse_shape), generator=gen),
                          torch.rand(batch, num_dense, generator=gen)]
    shapes: list[Any] = [(b, *[static] * len(sparse_shape)), (b, static)]
    for i, (embedding, spec) in enumerate(zip(plan.embeddings, plan.inputs, strict=True)):
        rows = torch.randn(unique, embedding.dim, generator=gen) * 0.1
        if spec is None:
            args.append(rows)
            shapes.append((u, static))
            continue
        u_i = torch.export.Dim(f"unique_{i}", min=1)
        if spec.pooling is None:
            width = len(spec.features)
            args.append(torch.randint(0, unique, (batch, width), generator=gen))
            shapes.append((b, static))
        else:
            n_i = torch.export.Dim(f"values_{i}", min=0)
            bags = len(spec.features) * batch
            inner = torch.sort(torch.randint(0, values + 1, (bags - 1,), generator=gen)).values
            args += [torch.randint(0, unique, (values,), generator=gen),
                     torch.cat([torch.zeros(1, dtype=torch.int64), inner,
                                torch.full((1,), values, dtype=torch.int64)])]
            shapes += [(n_i,), (len(spec.features) * b + 1,)]
            if bag_mode(spec.pooling, weighted)[1]:
                args.append(torch.rand(values, generator=gen))
                shapes.append((n_i,))
        args.append(rows)
        shapes.append((u_i, static))
    return tuple(args), (shapes[0], shapes[1], tuple(shapes[2:]))


def export_dense_tower(model: nn.Module, example_inputs: tuple[Tensor, Tensor]
                       ) -> torch.export.ExportedProgram:
    """Capture ``model``'s dense part with ``torch.export`` (see the module docstring).

    The model is exported in eval mode and restored afterwards (its embeddings are
    put back, its training flag reset). Not thread safe with respect to ``model``: do
    not run it while exporting.

    Args:
        model: takes ``(sparse_ids int64[B, S...], dense float32[B, F])`` (and
            ``jagged``, a KeyedJagged, when its FeatureEmbeddings' schema has
            multi-valued features) and returns logits float32[B]; its SparseEmbeddings
            and FeatureEmbeddings are factored out.
        example_inputs: ``(sparse_ids, dense)`` of any batch; only their shapes past
            the batch dimension matter.

    Returns:
        The exported program; its inputs are :func:`tower_input_names` of the
        model's :class:`~psfleet.export.plan.TowerPlan`.

    Raises:
        ConfigError: the model has no SparseEmbedding, the example inputs are not
            ``(int64[B, ...], float32[B, F])``, or its FeatureEmbeddings read
            different schemas.
        FatalError: torch.export fails, or the exported program's logits differ from
            the eager model's (the model uses its key values outside its embeddings).
    """
    sparse, dense = example_inputs
    if sparse.dtype != torch.int64 or sparse.dim() < 2:
        raise ConfigError(f"example_inputs[0]: expected int64[B, S] sparse ids, got "
                          f"{sparse.dtype} {tuple(sparse.shape)}")
    if dense.dtype != torch.float32 or dense.dim() != 2:
        raise ConfigError(f"example_inputs[1]: expected float32[B, F] dense features, got "
                          f"{dense.dtype} {tuple(dense.shape)}")
    if isinstance(model, (SparseEmbedding, FeatureEmbeddings)):
        raise ConfigError(f"the model is a bare {type(model).__name__}; export the model "
                          "using it")
    plan = TowerPlan.of(model)
    if not plan.embeddings:
        raise ConfigError(f"{type(model).__name__} has no SparseEmbedding: export a plain "
                          "torch model with torch.export directly")
    feed = _Feed()
    gathers, stand_ins = _stand_ins(model, plan, feed)
    swapped = _swap(model, gathers)
    for module, stand_in in stand_ins:
        module.forward = stand_in.forward  # type: ignore[method-assign]
    was_training = model.training
    model.eval()
    try:
        tower = _Tower(model, feed, plan)
        shape, num_dense = list(sparse.shape[1:]), int(dense.shape[1])
        args, dynamic_shapes = _examples(plan, shape, num_dense, 4, 0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = torch.export.export(tower, args, dynamic_shapes=dynamic_shapes,
                                                 strict=True)
        except Exception as exc:  # torch raises many types; name the model and cause
            raise FatalError(f"torch.export of {type(model).__name__}'s dense tower failed: "
                             f"{type(exc).__name__}: {str(exc)[:2000]}") from exc
        _check(model, program, plan, feed, shape, num_dense)
        return program
    finally:
        for module, _ in stand_ins:
            del module.forward
        for parent, name, child in swapped:
            setattr(parent, name, child)
        model.train(was_training)
