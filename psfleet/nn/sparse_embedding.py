"""SparseEmbedding: an embedding whose rows live in a sparse table.

Forward dedups the batch's ids (``torch.unique``), pulls the unique rows from the
table (in parallel from every server) as a handle, and gathers them into
``[B, S, dim]``. In training, the rows are a leaf tensor handed to the worker
runtime (:class:`~psfleet.nn.types.RowAccess`): backward leaves the gradient of the
unique rows there (duplicates already summed) and the distributed optimizer's
``step()`` has the runtime push every table's gradients once. The module keeps no
gradients and holds no communicator.

Prefetch is explicit: :meth:`SparseEmbedding.prefetch` returns a
:class:`~psfleet.nn.types.Prefetch` handle that the forward reading that batch
consumes (``embedding(ids, prefetched=handle)`` or :func:`use_prefetched`).

The module has no torch parameters: its rows are created on first pull, with
initial values seeded by each key, and updated by the table's rule.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import nn

from psfleet.errors import ConfigError, FatalError
from psfleet.nn.table_checks import AccessorSpec, check_accessor
from psfleet.nn.types import Occurrences, Prefetch, RowAccess
from psfleet.ps.types import Initializer, RuleConfig, SparseTableConfig

__all__ = ["SparseEmbedding", "live_embeddings", "use_prefetched"]

_LIVE: weakref.WeakSet[SparseEmbedding] = weakref.WeakSet()


def live_embeddings() -> list[SparseEmbedding]:
    """Every SparseEmbedding alive in this process, sorted by table name.

    ``fleet.init_worker()`` takes these when it was not given the model
    (``fleet.distributed_model``); table ids are then assigned by name
    (``psfleet.fleet.tables.TableRegistry``).

    Embeddings no longer reachable are collected first: a model built earlier (a
    notebook's cell run again, a previous test) that sits in a reference cycle would
    otherwise still count, and its names clash with the new model's.

    Raises:
        ConfigError: two embeddings share a name (give each a distinct ``name``).
    """
    gc.collect()
    embeddings = sorted(_LIVE, key=lambda e: e.name)
    check_distinct_names(embeddings)
    return embeddings


def check_distinct_names(embeddings: Iterable[SparseEmbedding]) -> None:
    """Raises ConfigError naming the embedding names used more than once."""
    names = [e.name for e in embeddings]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"SparseEmbedding names {dupes} are used more than once; "
                          "pass a distinct name= to each embedding")


@contextlib.contextmanager
def use_prefetched(handles: Iterable[Prefetch | None]) -> Iterator[None]:
    """Within the block, each handle's embedding consumes it in its next forward over
    equal ids (for models that call their embeddings themselves). None entries (no
    prefetch made) are skipped; a handle still unconsumed at exit is dropped."""
    with contextlib.ExitStack() as stack:
        for handle in handles:
            if handle is not None:
                stack.enter_context(handle.embedding.use(handle))
        yield


class SparseEmbedding(nn.Module):
    """Embedding rows held by the parameter server (or in process when local).

    Args:
        dim: floats per row (``sparse_feature_dim``).
        name: table name; distinct per embedding.
        rule: the server's optimizer rule for the rows; None takes the rule of the
            optimizer given to ``fleet.distributed_optimizer`` (same name, lr, betas).
        initializer: ``uniform``, ``normal`` or ``zeros`` (see SparseTableConfig).
        initial_range: range (uniform) or std (normal) of initial values.
        num_buckets: virtual buckets of the table (fixed at creation).
        accessor: the table's row statistics and lifecycle: an AccessorConfig, a dict
            of its fields (validated), or None for the table without statistics
            (``AccessorConfig()``). With ``name="ctr"`` the training steps push each
            row's show and click counts, taken from the labels given to
            ``optimizer.step(labels=...)``.

    Raises:
        ConfigError: on construction, an argument is out of range (names the
            embedding and the field, e.g. ``accessor.nonclk_coeff``).

    Shapes:
        input: ids (Tensor[..., S], int64): feature keys (uint64 bits in int64).
        output: Tensor[..., S, dim], float32.
    """

    def __init__(self, dim: int, name: str = "embedding", rule: RuleConfig | None = None,
                 initializer: Initializer = "uniform", initial_range: float = 0.01,
                 num_buckets: int = 4096, accessor: AccessorSpec = None) -> None:
        super().__init__()
        self.dim = dim
        self.name = name
        self.rule = rule
        self.initializer = initializer
        self.initial_range = initial_range
        self.num_buckets = num_buckets
        self.accessor = check_accessor(accessor, f"{type(self).__name__} {name!r}")
        self._access: RowAccess | None = None
        self._table_id = -1
        self._armed: Prefetch | None = None  # set by use(): the next forward's rows
        self.table_config(RuleConfig())  # validate the arguments now
        _LIVE.add(self)

    @property
    def table_id(self) -> int:
        """The sparse table of this embedding (-1 before ``fleet.init_worker``)."""
        return self._table_id

    def table_config(self, default_rule: RuleConfig) -> SparseTableConfig:
        """The table this embedding needs; ``default_rule`` when ``rule`` is None.

        Raises:
            ConfigError: an argument is out of range (names it).
        """
        try:
            return SparseTableConfig(
                name=self.name, dim=self.dim, rule=self.rule or default_rule,
                initializer=self.initializer,
                initial_range=self.initial_range, num_buckets=self.num_buckets,
                accessor=self.accessor)
        except ValueError as exc:
            raise ConfigError(f"{type(self).__name__} {self.name!r}: {exc}") from None

    def bind(self, access: RowAccess, table_id: int) -> None:
        """Read table ``table_id`` through the worker runtime (``fleet.init_worker``)."""
        self._access = access
        self._table_id = table_id

    def _require_access(self) -> RowAccess:
        if self._access is None:
            raise FatalError(f"{type(self).__name__} {self.name!r} is not connected to a table: "
                             "call fleet.init_worker() before the first forward")
        return self._access

    def prefetch(self, ids: torch.Tensor) -> Prefetch | None:
        """Start pulling the rows of a coming batch while the current one computes.

        Hand the returned handle to the forward over that batch (see
        :class:`~psfleet.nn.types.Prefetch`). Only the async mode prefetches (its steps
        may read rows a step older); elsewhere, and outside training, this returns
        None and pulls nothing, so sync stays exact.

        Args:
            ids (Tensor[..., S], int64): the coming batch's ids.

        Returns:
            The handle, or None when nothing was pulled.

        Raises:
            FatalError: not bound to a table (``fleet.init_worker``).
        """
        access = self._require_access()
        if not access.prefetches or not (self.training and torch.is_grad_enabled()):
            return None
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        keys = uniq.numpy().view(np.uint64)
        return Prefetch(self, ids, inverse, keys, access.start_pull(self._table_id, keys, True))

    @contextlib.contextmanager
    def use(self, handle: Prefetch) -> Iterator[None]:
        """Within the block, the next forward over ids equal to ``handle.ids`` uses the
        prefetched rows. Raises ConfigError if ``handle`` is another embedding's."""
        if handle.embedding is not self:
            raise ConfigError(f"{type(self).__name__} {self.name!r}: the prefetch handle belongs "
                              f"to {handle.embedding.name!r}; hand each embedding its own")
        self._armed = handle
        try:
            yield
        finally:
            self._armed = None

    def forward(self, ids: torch.Tensor, prefetched: Prefetch | None = None) -> torch.Tensor:
        """Rows of ``ids`` (Tensor[..., S], int64) as Tensor[..., S, dim], float32.

        Args:
            prefetched: the handle of :meth:`prefetch` over these ids (equal values);
                its rows are used instead of a new pull.

        Raises:
            FatalError: not bound to a table.
            ConfigError: ids are not int64, or ``prefetched`` was made for other ids
                or another embedding.
        """
        rows, inverse = self.lookup(ids, prefetched)
        return rows[inverse].reshape(*ids.shape, self.dim)

    def lookup(self, ids: torch.Tensor, prefetched: Prefetch | None = None,
               offsets: torch.Tensor | None = None, batch_size: int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct rows of ``ids`` and where each id is among them: the step every
        forward of a table-backed module shares (dedup, one pull, record).

        In training (``self.training`` and grad enabled) the rows are a leaf recorded
        with the worker runtime, so the step pushes their gradient (one merged push per
        table per step, however many forwards read the table). Uses ``prefetched`` (or
        the handle armed by :meth:`use`) when it was made for ids equal to these.

        With the ``ctr`` accessor, a training forward also records which example
        each id belongs to (:class:`~psfleet.nn.types.Occurrences`), so the step
        pushes each key's show and click counts from the batch labels: the index
        along dim 0 of ``ids``, or for bags (``offsets`` given) bag k's example
        ``k % batch_size``. Without it nothing more is computed.

        Args:
            ids (Tensor[...], int64): feature keys (uint64 bits in int64).
            prefetched: as in :meth:`forward`.
            offsets (Tensor[K + 1], int64) or None: ``ids`` are K bags (CSR), for the
                examples of the ``ctr`` accessor's counts.
            batch_size: the bags' examples (bags feature-major); None: K.

        Returns:
            rows (Tensor[U, dim], float32) of the U distinct ids, and inverse
            (Tensor[ids.numel()], int64): ``rows[inverse]`` are the rows of
            ``ids.reshape(-1)``.

        Raises:
            FatalError: not bound to a table.
            ConfigError: ids are not int64, or ``prefetched`` was made for other ids
                or another embedding.
        """
        access = self._require_access()
        label = f"{type(self).__name__} {self.name!r}"
        if ids.dtype != torch.int64:
            raise ConfigError(f"{label}: ids must be int64, got {ids.dtype}")
        training = self.training and torch.is_grad_enabled()
        if prefetched is not None and not prefetched.matches(self, ids):
            raise ConfigError(f"{label}: prefetched= was made by "
                              f"{prefetched.embedding.name!r} for ids of shape "
                              f"{tuple(prefetched.ids.shape)}, not for these ids "
                              f"{tuple(ids.shape)}; pass the handle of this batch")
        handle = prefetched
        if handle is None and self._armed is not None and self._armed.matches(self, ids):
            handle, self._armed = self._armed, None
        if handle is not None and training:
            inverse, pull = handle.inverse, handle.rows
        else:
            uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
            pull = access.start_pull(self._table_id, uniq.numpy().view(np.uint64), training)
        result = pull.result()  # pass mode's cache: a tensor on the cache's device
        rows = (result.to(ids.device) if isinstance(result, torch.Tensor)
                else torch.from_numpy(result))  # [U, dim], where the ids are
        inverse = inverse.reshape(-1)
        if training:
            rows.requires_grad_(True)
            if self.accessor.name != "ctr":  # routed once, pushed with it
                access.record(self._table_id, pull.keys, rows)
            else:  # and which example each id is of, for the step's show/click counts
                occurrences = (Occurrences.of_rows(ids, inverse, label) if offsets is None
                               else Occurrences.of_bags(offsets, inverse, batch_size, label))
                access.record(self._table_id, pull.keys, rows, occurrences)
        return rows, inverse

    def extra_repr(self) -> str:
        return f"name={self.name!r}, dim={self.dim}, table_id={self._table_id}"
