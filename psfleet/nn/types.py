"""Vocabulary of the nn layer: what an embedding asks of the worker runtime, the handle
of a prefetch, the poolings of a bag of ids, and the spec of one embedding table of a
:class:`~psfleet.nn.FeatureEmbeddings`.

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

from psfleet.errors import ConfigError
from psfleet.nn.table_checks import AccessorSpec, Pooling, check_accessor, check_pooling
from psfleet.ps.client import PullHandle
from psfleet.ps.routing import RoutedKeys
from psfleet.ps.types import Initializer, RuleConfig

if TYPE_CHECKING:
    from psfleet.nn.sparse_embedding import SparseEmbedding

__all__ = ["EmbeddingTableSpec", "Occurrences", "Prefetch", "RowAccess"]

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
               rows: torch.Tensor, occurrences: Occurrences | None = None) -> None:
        """Collect a training forward's leaf ``rows`` (float32[U, dim], requires grad)
        of keys uint64[U] (as the pull's handle gave them, routed): the step pushes
        their gradients after backward. ``occurrences`` (tables with the ``ctr``
        accessor): which example each id of the forward belongs to, so the step
        pushes the keys' show and click counts with them."""
        ...


@dataclass(frozen=True, eq=False)
class Occurrences:
    """Where a training forward's ids came from: for each of its N ids, which of its U
    distinct keys it is and which example of the batch it belongs to.

    A step turns them into per-key counts from the batch labels (:meth:`counts`), as
    Paddle's parameter server does (``DownpourWorker::CollectLabelInfo`` gives every
    feasign occurrence its instance's label; the push carries show 1 and click =
    label per occurrence, summed per key).

    Attributes:
        inverse (Tensor[N], int64): position of each id among the U distinct keys.
        example (Tensor[N], int64): the example of each id, in ``[0, num_examples)``.
        num_examples: the batch's examples as the forward saw them (labels must have
            this length).
        where: who read the ids (``SparseEmbedding 'name'``), for errors.
    """

    inverse: torch.Tensor
    example: torch.Tensor
    num_examples: int
    where: str

    @classmethod
    def of_rows(cls, ids: torch.Tensor, inverse: torch.Tensor, where: str) -> Occurrences:
        """Ids Tensor[B, ...] (int64): example = the index along dim 0 (a 0-d or empty
        batch is one example / none)."""
        batch = int(ids.shape[0]) if ids.dim() else 1
        per_example = ids.numel() // batch if batch else 0
        example = torch.arange(batch).repeat_interleave(per_example, output_size=ids.numel())
        return cls(inverse, example, batch, where)

    @classmethod
    def of_bags(cls, offsets: torch.Tensor, inverse: torch.Tensor, batch_size: int | None,
                where: str) -> Occurrences:
        """Bags in CSR form (offsets Tensor[K + 1], int64), feature-major: bag k is
        example ``k % batch_size`` (None: ``K``, one bag per example).

        Raises:
            ConfigError: ``batch_size`` < 1 or not a divisor of K (names both).
        """
        bags = int(offsets.numel()) - 1
        batch = bags if batch_size is None else batch_size
        if batch < 1 and bags or batch and bags % batch:
            raise ConfigError(f"{where}: {bags} bags are not a whole number of bags per "
                              f"example for batch_size={batch_size}; pass the batch's "
                              "example count (bags feature-major: bag f * B + b)")
        lengths = offsets[1:] - offsets[:-1]  # [K]
        bag = torch.repeat_interleave(torch.arange(bags), lengths,
                                      output_size=int(offsets[-1]))  # [N]
        return cls(inverse, bag % batch if batch else bag, batch, where)

    def counts(self, labels: np.ndarray, unique: int) -> tuple[np.ndarray, np.ndarray]:
        """Per distinct key: shows = its occurrences, clicks = the sum of the labels of
        its occurrences' examples.

        Args:
            labels (float64[num_examples]): the batch's labels.
            unique: U, the forward's distinct keys.

        Returns:
            (shows float32[U], clicks float32[U]).

        Raises:
            ConfigError: ``labels`` is not of length :attr:`num_examples` (names both).
        """
        if labels.shape[0] != self.num_examples:
            raise ConfigError(f"{self.where}: labels has {labels.shape[0]} entries but the "
                              f"forward read a batch of {self.num_examples} examples; pass "
                              "one label per example of the batch")
        inverse = self.inverse.numpy()
        shows = np.bincount(inverse, minlength=unique).astype(np.float32)
        clicks = np.bincount(inverse, weights=labels[self.example.numpy()],
                             minlength=unique).astype(np.float32)
        return shows, clicks


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


@dataclass(frozen=True)
class EmbeddingTableSpec:
    """One embedding table of a :class:`~psfleet.nn.FeatureEmbeddings`: which features
    read it, how wide its rows are and how bags are pooled.

    Attributes:
        name: the table's name (its sparse table's, in checkpoints and exports);
            distinct over the model.
        dim: floats per row.
        features: names of the schema's features (single- or multi-valued) that look
            up this table, in the order of the table's output ``[B, F_t, dim]``.
        pooling: how a multi-valued feature's ids are pooled (:data:`Pooling`); a
            single-valued feature is a bag of one id, the same under every pooling.
        rule: the server's optimizer rule; None takes the distributed optimizer's.
        initializer: ``uniform``, ``normal`` or ``zeros`` (SparseTableConfig).
        initial_range: range (uniform) or std (normal) of initial values.
        shared_ids: the same raw id in two of the table's features is one row (the
            parsers' per-slot key prefix is replaced by one prefix of the table's), e.g.
            a target item and the items of a history.
        accessor: the table's row statistics and lifecycle (:data:`AccessorSpec`; a
            dict is validated into an AccessorConfig); None: none (today's table).

    Raises:
        ConfigError: on construction, if ``features`` is empty or repeats a name, or
            ``pooling`` is not one of :data:`POOLINGS`, or ``accessor`` is invalid
            (names the field).
    """

    name: str
    dim: int
    features: tuple[str, ...]
    pooling: Pooling = "sum"
    rule: RuleConfig | None = None
    initializer: Initializer = "uniform"
    initial_range: float = 0.01
    shared_ids: bool = False
    accessor: AccessorSpec = None

    def __post_init__(self) -> None:
        where = f"EmbeddingTableSpec {self.name!r}"
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "accessor", check_accessor(self.accessor, where))
        if not self.features:
            raise ConfigError(f"{where}: features is empty; name at least one feature "
                              "of the schema")
        repeated = sorted({f for f in self.features if self.features.count(f) > 1})
        if repeated:
            raise ConfigError(f"{where}: features {repeated} are named more than once")
        check_pooling(self.pooling, where)
