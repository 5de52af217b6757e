"""The dense tower: a model with its SparseEmbedding lookups factored out.

Every :class:`~psfleet.nn.SparseEmbedding` of the model is replaced, for the time
of the export, by a gather ``rows_t[positions]`` from a tensor given as an input, and
the model is captured with ``torch.export`` (dynamic batch and unique-key counts).
So the exported program holds only dense parameters and ops::

    forward(positions int64[B, S], dense float32[B, F], rows_0 float32[U, dim_0], ...)
        -> logits float32[B]

``positions`` are the indices of each feature key in the batch's unique keys (the
``return_inverse`` of ``unique``): any indexing the model does on its ids (slices,
reshapes) works on positions the same way. A model that computes with its key
values outside its SparseEmbeddings cannot be exported this way; the export checks
the program against the eager model and raises if they differ.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from psfleet.errors import ConfigError, FatalError
from psfleet.nn import SparseEmbedding

__all__ = ["model_embeddings", "export_dense_tower"]

_CHECK_RTOL, _CHECK_ATOL = 1e-5, 1e-6


class _Feed:
    """The rows of the call in progress, shared by the gathers (export time only).

    ``keys`` (int64[U], ascending) is set only to check the export: the gathers then
    take feature keys, as the SparseEmbeddings did, and find their positions.
    """

    def __init__(self) -> None:
        self.rows: list[Tensor] = []
        self.keys: Tensor | None = None


class _Gather(nn.Module):
    """Stands in for a SparseEmbedding: ``rows[positions]`` -> Tensor[..., dim]."""

    def __init__(self, feed: _Feed, index: int) -> None:
        super().__init__()
        self.feed = feed
        self.index = index

    def forward(self, positions: Tensor) -> Tensor:
        if self.feed.keys is not None:  # the check: positions are feature keys here
            positions = torch.searchsorted(self.feed.keys, positions.contiguous())
        return self.feed.rows[self.index][positions]


class _Tower(nn.Module):
    def __init__(self, model: nn.Module, feed: _Feed) -> None:
        super().__init__()
        self.model = model
        self.feed = feed

    def forward(self, positions: Tensor, dense: Tensor, *rows: Tensor) -> Tensor:
        self.feed.rows = list(rows)
        try:
            out: Tensor = self.model(positions, dense)
            return out
        finally:
            self.feed.rows = []


def model_embeddings(model: nn.Module) -> list[SparseEmbedding]:
    """The distinct SparseEmbeddings of ``model``, sorted by name (the table order)."""
    found = {id(m): m for m in model.modules() if isinstance(m, SparseEmbedding)}
    return sorted(found.values(), key=lambda e: e.name)


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


def _examples(sparse_shape: Sequence[int], num_dense: int, dims: Sequence[int],
              batch: int, unique: int, seed: int) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, unique, (batch, *sparse_shape), generator=gen)
    dense = torch.rand(batch, num_dense, generator=gen)
    rows = [torch.randn(unique, d, generator=gen) * 0.1 for d in dims]
    return (positions, dense, *rows)


def _eager_on_keys(model: nn.Module, feed: _Feed, inputs: tuple[Tensor, ...]) -> Tensor:
    """The model on feature keys (not positions) whose rows are ``inputs``' rows."""
    positions, dense, *rows = inputs
    unique = int(rows[0].shape[0])
    gen = torch.Generator().manual_seed(2)
    keys = torch.sort(torch.randperm(1 << 20, generator=gen)[:unique] * 4099 + 12345).values
    feed.rows, feed.keys = list(rows), keys
    try:
        with torch.no_grad():
            out: Tensor = model(keys[positions], dense)
        return out
    finally:
        feed.rows, feed.keys = [], None


def export_dense_tower(model: nn.Module, example_inputs: tuple[Tensor, Tensor]
                       ) -> torch.export.ExportedProgram:
    """Capture ``model``'s dense part with ``torch.export`` (see the module docstring).

    The model is exported in eval mode and restored afterwards (its SparseEmbeddings
    are put back, its training flag reset). Not thread safe with respect to
    ``model``: do not run it while exporting.

    Args:
        model: takes ``(sparse_ids int64[B, S...], dense float32[B, F])`` and returns
            logits float32[B]; its SparseEmbeddings are factored out.
        example_inputs: ``(sparse_ids, dense)`` of any batch; only their shapes past
            the batch dimension matter.

    Returns:
        The exported program; its inputs are ``positions, dense, rows_0, ...`` in the
        order of :func:`model_embeddings`.

    Raises:
        ConfigError: the model has no SparseEmbedding, or the example inputs are not
            ``(int64[B, ...], float32[B, F])``.
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
    if isinstance(model, SparseEmbedding):
        raise ConfigError("the model is a bare SparseEmbedding; export the model using it")
    embeddings = model_embeddings(model)
    if not embeddings:
        raise ConfigError(f"{type(model).__name__} has no SparseEmbedding: export a plain "
                          "torch model with torch.export directly")
    feed = _Feed()
    swapped = _swap(model, {id(e): _Gather(feed, i) for i, e in enumerate(embeddings)})
    was_training = model.training
    model.eval()
    try:
        tower = _Tower(model, feed)
        dims = [e.dim for e in embeddings]
        shape, num_dense = list(sparse.shape[1:]), int(dense.shape[1])
        batch, unique = torch.export.Dim("batch", min=1), torch.export.Dim("unique", min=1)
        static = torch.export.Dim.STATIC
        dynamic_shapes = ((batch, *[static] * len(shape)), (batch, static),
                          tuple((unique, static) for _ in dims))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = torch.export.export(
                    tower, _examples(shape, num_dense, dims, 4, 7, 0),
                    dynamic_shapes=dynamic_shapes)
        except Exception as exc:  # torch raises many types; name the model and cause
            raise FatalError(f"torch.export of {type(model).__name__}'s dense tower failed: "
                             f"{type(exc).__name__}: {str(exc)[:2000]}") from exc
        check = _examples(shape, num_dense, dims, 3, 5, 1)
        expected = _eager_on_keys(model, feed, check)
        with torch.no_grad():
            got = program.module()(*check)
        if not torch.allclose(expected, got, rtol=_CHECK_RTOL, atol=_CHECK_ATOL):
            raise FatalError(f"the exported dense tower of {type(model).__name__} differs from "
                             "the model (max |diff| "
                             f"{(expected - got).abs().max().item():.3g}): the model must use "
                             "its sparse ids only through its SparseEmbeddings")
        return program
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
        model.train(was_training)
