"""Vocabulary of the nn layer: what an embedding asks of the worker runtime, and the
handle of a prefetch.

A :class:`~psfleet.nn.SparseEmbedding` holds no communicator and keeps no gradients:
it is bound to a :class:`RowAccess` (the worker runtime's step collector,
``psfleet.fleet.step.StepCollector``) that serves its pulls as handles and collects
the rows whose gradients the step pushes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from psfleet.ps.client import PullHandle
from psfleet.ps.routing import RoutedKeys

if TYPE_CHECKING:
    from psfleet.nn.sparse_embedding import SparseEmbedding

__all__ = ["Prefetch", "RowAccess"]


class RowAccess(Protocol):
    """The worker runtime as a SparseEmbedding sees it."""

    @property
    def prefetches(self) -> bool:
        """Whether rows may be pulled ahead of the step that uses them (async mode)."""
        ...

    def start_pull(self, table_id: int, keys: np.ndarray, create: bool) -> PullHandle:
        """Pull the rows of distinct keys uint64[U]; the handle yields float32[U, dim]
        and carries the keys with their routing (``PullHandle.keys``)."""
        ...

    def record(self, table_id: int, keys: np.ndarray | RoutedKeys,
               rows: torch.Tensor) -> None:
        """Collect a training forward's leaf ``rows`` (float32[U, dim], requires grad)
        of keys uint64[U] (as the pull's handle gave them, routed): the step pushes
        their gradients after backward."""
        ...


@dataclass(frozen=True, eq=False)
class Prefetch:
    """The rows of a coming batch, pulled ahead (``SparseEmbedding.prefetch``).

    Hand it to the forward that reads that batch: ``embedding(ids, prefetched=h)``, or
    ``with use_prefetched([h]): model(ids, ...)`` when the model calls the embedding.
    The forward checks that its ids equal :attr:`ids` (values, not identity, so a copy
    of the batch is fine). A handle never consumed is dropped without effect.

    Attributes:
        embedding: the embedding that made it (and the only one that consumes it).
        ids (Tensor[..., S], int64): the batch's ids, as given to ``prefetch``.
        inverse (Tensor[N], int64): position of each id in :attr:`keys`.
        keys: the distinct keys, uint64[U].
        rows: the pull in flight; ``rows.result()`` is float32[U, dim].
    """

    embedding: SparseEmbedding
    ids: torch.Tensor
    inverse: torch.Tensor
    keys: np.ndarray
    rows: PullHandle

    def matches(self, embedding: SparseEmbedding, ids: torch.Tensor) -> bool:
        """Whether ``embedding``'s forward over ``ids`` may use these rows."""
        return (embedding is self.embedding and ids.shape == self.ids.shape
                and bool(torch.equal(ids, self.ids)))
