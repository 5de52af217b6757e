"""SparseEmbedding: an embedding whose rows live in a sparse table.

Forward dedups the batch's ids (``torch.unique``), pulls the unique rows from the
table (in parallel from every server), and gathers them into ``[B, S, dim]``.
Backward leaves the gradient of the unique rows (duplicates already summed) on a
leaf tensor; the distributed optimizer's ``step()`` pushes it (:meth:`push_grads`).

The module has no torch parameters: its rows are created on first pull, with
initial values seeded by each key, and updated by the table's rule.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from psfleet.errors import ConfigError, FatalError
from psfleet.ps.communicator import Communicator
from psfleet.ps.merge import merge_sparse
from psfleet.ps.types import RuleConfig, SparseTableConfig

__all__ = ["SparseEmbedding", "live_embeddings"]

_LIVE: weakref.WeakSet[SparseEmbedding] = weakref.WeakSet()
_MAX_PREFETCHED = 2  # pulls in flight per embedding: the next batch and the one after


def live_embeddings() -> list[SparseEmbedding]:
    """Every SparseEmbedding alive in this process, sorted by table name.

    ``fleet.init_worker()`` creates one table per embedding in this order, so table
    ids agree across workers that build the same model.

    Raises:
        ConfigError: two embeddings share a name (give each a distinct ``name``).
    """
    embeddings = sorted(_LIVE, key=lambda e: e.name)
    names = [e.name for e in embeddings]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"SparseEmbedding names {dupes} are used more than once; "
                          "pass a distinct name= to each embedding")
    return embeddings


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

    Shapes:
        input: ids (Tensor[..., S], int64): feature keys (uint64 bits in int64).
        output: Tensor[..., S, dim], float32.
    """

    def __init__(self, dim: int, name: str = "embedding", rule: RuleConfig | None = None,
                 initializer: str = "uniform", initial_range: float = 0.01,
                 num_buckets: int = 4096) -> None:
        super().__init__()
        self.dim = dim
        self.name = name
        self.rule = rule
        self.initializer = initializer
        self.initial_range = initial_range
        self.num_buckets = num_buckets
        self._communicator: Communicator | None = None
        self._table_id = -1
        self._pending: list[tuple[np.ndarray, torch.Tensor]] = []
        # Pulls started by prefetch(), oldest first: (ids, inverse, keys, collect).
        self._prefetched: list[tuple[torch.Tensor, torch.Tensor, np.ndarray,
                                     Callable[[], np.ndarray]]] = []
        self.table_config(RuleConfig())  # validate the arguments now
        _LIVE.add(self)

    def table_config(self, default_rule: RuleConfig) -> SparseTableConfig:
        """The table this embedding needs; ``default_rule`` when ``rule`` is None.

        Raises:
            ConfigError: an argument is out of range (names it).
        """
        try:
            return SparseTableConfig(
                name=self.name, dim=self.dim, rule=self.rule or default_rule,
                initializer=self.initializer,  # type: ignore[arg-type]
                initial_range=self.initial_range, num_buckets=self.num_buckets)
        except ValueError as exc:
            raise ConfigError(f"SparseEmbedding {self.name!r}: {exc}") from None

    def bind(self, communicator: Communicator, table_id: int) -> None:
        """Connect to table ``table_id`` through ``communicator`` (fleet.init_worker)."""
        self._communicator = communicator
        self._table_id = table_id

    def prefetch(self, ids: torch.Tensor) -> bool:
        """Start pulling the rows of a coming batch while the current one computes.

        The next ``forward`` whose input is this very tensor uses the rows (any other
        input pulls as usual). Only the async mode prefetches (its steps may read rows
        a step older); elsewhere this does nothing, so sync stays exact.

        Args:
            ids (Tensor[..., S], int64): the coming batch's ids.

        Returns:
            Whether a pull was started.
        """
        communicator = self._communicator
        if communicator is None or not communicator.prefetches or not (
                self.training and torch.is_grad_enabled()):
            return False
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        keys = uniq.numpy().view(np.uint64)
        self._prefetched.append(
            (ids, inverse, keys, communicator.start_pull_sparse(self._table_id, keys, True)))
        del self._prefetched[:-_MAX_PREFETCHED]
        return True

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self._communicator is None:
            raise FatalError(f"SparseEmbedding {self.name!r} is not connected to a table: "
                             "call fleet.init_worker() before the first forward")
        if ids.dtype != torch.int64:
            raise ConfigError(f"SparseEmbedding {self.name!r}: ids must be int64, "
                              f"got {ids.dtype}")
        training = self.training and torch.is_grad_enabled()
        match = next((i for i, p in enumerate(self._prefetched) if p[0] is ids), None)
        if match is not None and training:
            _, inverse, keys, collect = self._prefetched[match]
            del self._prefetched[: match + 1]  # this one and any never used
            values = collect()
        else:
            uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
            keys = uniq.numpy().view(np.uint64)
            values = self._communicator.pull_sparse(self._table_id, keys, create=training)
        rows = torch.from_numpy(values)  # [U, dim]
        if training:
            rows.requires_grad_(True)
            self._pending.append((keys, rows))
        return rows[inverse].reshape(*ids.shape, self.dim)

    def push_grads(self) -> int:
        """Hand the gradients of every forward since the last call to the communicator.

        Returns:
            Number of rows pushed (forwards of one step are merged into one push,
            equal keys summed).
        """
        with_grad = [(keys, rows.grad.numpy()) for keys, rows in self._pending
                     if rows.grad is not None]
        self._pending.clear()
        if self._communicator is None:
            return 0
        if not with_grad:  # still push (nothing): a sync round counts every worker's push
            with_grad = [(np.zeros(0, np.uint64), np.zeros((0, self.dim), np.float32))]
        keys, grads = merge_sparse([k for k, _ in with_grad], [g for _, g in with_grad])
        self._communicator.push_sparse(self._table_id, keys, grads)
        return int(keys.size)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, dim={self.dim}, table_id={self._table_id}"
