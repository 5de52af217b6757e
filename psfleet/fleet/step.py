"""The step protocol of one worker: pulls as handles, a step's gradients, the push.

A training step is explicit::

    rows = collector.start_pull(table_id, keys, create)   # SparseEmbedding.forward
    collector.record(table_id, keys, leaf)                 # the same forward, training
    loss.backward()                                        # grads land on the leaves
    fresh = collector.end_step(dense_grads)                # DistributedOptimizer.step

:meth:`StepCollector.end_step` pushes each sparse table's gradients of the step once
(the forwards of one table merged, equal keys summed; an empty push for a table not
read, since a sync round counts every worker's push), then the dense gradient, closes
the step in the communicator and returns the freshest dense values it has. The
gradients are held here, not on the modules, and only until that push.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from psfleet.errors import FatalError
from psfleet.ps.client import PullHandle
from psfleet.ps.communicator import Communicator
from psfleet.ps.merge import merge_sparse
from psfleet.ps.routing import RoutedKeys, keys_of

__all__ = ["StepCollector"]


class StepCollector:
    """Serves the embeddings' pulls and collects the step's sparse gradients.

    Implements :class:`psfleet.nn.RowAccess`. Not thread safe: one training loop.

    Args:
        communicator: the mode's communicator (owns the client).
        sparse_dims: every sparse table's id and row width (``dim``).
        dense_table_id: the dense table (None: the model has no dense parameters).
    """

    def __init__(self, communicator: Communicator, sparse_dims: Mapping[int, int],
                 dense_table_id: int | None) -> None:
        self.communicator = communicator
        self.dense_table_id = dense_table_id
        self._dims = dict(sparse_dims)
        self._rows: dict[int, list[tuple[np.ndarray | RoutedKeys, torch.Tensor]]] = {
            table_id: [] for table_id in self._dims}
        #: Sparse pushes handed to the communicator so far (one per table per step).
        self.sparse_pushes = 0

    # -- what the embeddings call (psfleet.nn.RowAccess) --------------------------------
    @property
    def prefetches(self) -> bool:
        return self.communicator.prefetches

    def start_pull(self, table_id: int, keys: np.ndarray, create: bool) -> PullHandle:
        """Pull rows of keys uint64[U]; ``result()`` is float32[U, dim] (see
        ``Communicator.start_pull_sparse``)."""
        return self.communicator.start_pull_sparse(table_id, keys, create)

    def record(self, table_id: int, keys: np.ndarray | RoutedKeys,
               rows: torch.Tensor) -> None:
        """Keep a training forward's leaf rows float32[U, dim] of keys uint64[U] (routed,
        as the pull's handle gave them) until :meth:`end_step` pushes their gradients.

        Raises:
            FatalError: ``table_id`` is not a table of this worker.
        """
        try:
            self._rows[table_id].append((keys, rows))
        except KeyError:
            raise FatalError(f"sparse table {table_id} is not one of this worker's tables "
                             f"{sorted(self._rows)}: bind embeddings through "
                             "fleet.init_worker()") from None

    @property
    def pending_rows(self) -> int:
        """Rows recorded since the last push (all tables)."""
        return sum(keys_of(keys).size for forwards in self._rows.values()
                   for keys, _ in forwards)

    # -- what the optimizer calls ------------------------------------------------------
    def push_sparse_grads(self) -> int:
        """Hand every table's gradients of this step to the communicator, once per table.

        A table read by one forward pushes the keys as that forward's pull routed
        them; several forwards' keys are merged (equal keys summed) and routed anew.

        Returns:
            Rows pushed (equal keys of several forwards summed into one row).
        """
        pushed = 0
        for table_id in sorted(self._rows):
            forwards = self._rows[table_id]
            with_grad = [(keys, rows.grad.numpy()) for keys, rows in forwards
                         if rows.grad is not None]
            forwards.clear()
            if not with_grad:  # still push (nothing): a sync round counts every push
                with_grad = [(np.zeros(0, np.uint64),
                              np.zeros((0, self._dims[table_id]), np.float32))]
            keys, grads = merge_sparse([k for k, _ in with_grad], [g for _, g in with_grad])
            self.communicator.push_sparse(table_id, keys, grads)
            self.sparse_pushes += 1
            pushed += int(grads.shape[0])
        return pushed

    def end_step(self, dense_grads: np.ndarray | None) -> np.ndarray | None:
        """Push the step (sparse, then the flat dense gradient float32[total]) and close it.

        Returns:
            Fresh dense values float32[total] to install, or None (none arrived, or no
            dense gradient was given).

        Raises:
            FatalError, RpcError, RemoteError: sending failed (see the communicator).
        """
        self.push_sparse_grads()
        dense_id = self.dense_table_id
        if dense_grads is not None and dense_id is not None:
            self.communicator.push_dense(dense_id, dense_grads)
        self.communicator.end_step()
        if dense_grads is None or dense_id is None:
            return None
        return self.communicator.fresh_dense(dense_id)

    def pull_dense(self) -> np.ndarray | None:
        """The dense values the tables hold now, float32[total] (blocks); None without a
        dense table."""
        if self.dense_table_id is None:
            return None
        return self.communicator.client.pull_dense(self.dense_table_id)
