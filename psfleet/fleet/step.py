"""The step protocol of one worker: pulls as handles, a step's gradients, the push.

A training step is explicit::

    rows = collector.start_pull(table_id, keys, create)   # SparseEmbedding.forward
    collector.record(table_id, keys, leaf)                 # the same forward, training
    loss.backward()                                        # grads land on the leaves
    fresh = collector.end_step(dense_grads, labels)        # DistributedOptimizer.step

:meth:`StepCollector.end_step` pushes each sparse table's gradients of the step once
(the forwards of one table merged, equal keys summed; an empty push for a table not
read, since a sync round counts every worker's push), then the dense gradient, closes
the step in the communicator and returns the freshest dense values it has. The
gradients are held here, not on the modules, and only until that push.

Tables with the ``ctr`` accessor also push per-key show and click counts: their
forwards record which example each id belongs to
(:class:`~psfleet.nn.types.Occurrences`) and the step's labels turn those into
shows (occurrences) and clicks (sum of the occurrences' labels), as Paddle's
``DownpourWorker::CollectLabelInfo`` does. Other tables push exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from psfleet.errors import ConfigError, DataError, FatalError
from psfleet.nn.types import Occurrences
from psfleet.ps.client import PullHandle
from psfleet.ps.communicator import Communicator
from psfleet.ps.merge import merge_sparse, merge_sparse_counts
from psfleet.ps.routing import RoutedKeys, keys_of

__all__ = ["StepCollector"]


class StepCollector:
    """Serves the embeddings' pulls and collects the step's sparse gradients.

    Implements :class:`psfleet.nn.RowAccess`. Not thread safe: one training loop.

    Args:
        communicator: the mode's communicator (owns the client).
        sparse_dims: every sparse table's id and row width (``dim``).
        dense_table_id: the dense table (None: the model has no dense parameters).
        ctr_tables: the tables with the ``ctr`` accessor, id -> name: their pushes
            carry show and click counts from the step's labels (unless the
            communicator takes none, ``Communicator.takes_counts``).
    """

    def __init__(self, communicator: Communicator, sparse_dims: Mapping[int, int],
                 dense_table_id: int | None, ctr_tables: Mapping[int, str] | None = None
                 ) -> None:
        self.communicator = communicator
        self.dense_table_id = dense_table_id
        self._dims = dict(sparse_dims)
        self._ctr = dict(ctr_tables or {}) if communicator.takes_counts else {}
        self._rows: dict[int, list[tuple[np.ndarray | RoutedKeys, torch.Tensor,
                                         Occurrences | None]]] = {
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
               rows: torch.Tensor, occurrences: Occurrences | None = None) -> None:
        """Keep a training forward's leaf rows float32[U, dim] of keys uint64[U] (routed,
        as the pull's handle gave them) until :meth:`end_step` pushes their gradients;
        ``occurrences`` (ctr tables): for their show and click counts.

        Raises:
            FatalError: ``table_id`` is not a table of this worker.
        """
        try:
            self._rows[table_id].append((keys, rows, occurrences))
        except KeyError:
            raise FatalError(f"sparse table {table_id} is not one of this worker's tables "
                             f"{sorted(self._rows)}: bind embeddings through "
                             "fleet.init_worker()") from None

    @property
    def pending_rows(self) -> int:
        """Rows recorded since the last push (all tables)."""
        return sum(keys_of(keys).size for forwards in self._rows.values()
                   for keys, _, _ in forwards)

    # -- what the optimizer calls ------------------------------------------------------
    def push_sparse_grads(self, labels: torch.Tensor | np.ndarray | None = None) -> int:
        """Hand every table's gradients of this step to the communicator, once per table.

        A table read by one forward pushes the keys as that forward's pull routed
        them; several forwards' keys are merged (equal keys summed) and routed anew.
        A ``ctr`` table's push carries per-key shows and clicks (float32[U] each)
        counted from ``labels``; other tables push no counts.

        Args:
            labels (Tensor[B] or [B, 1], float or int; or a numpy array) or None: the
                step's labels, one per example of the batch the forwards read.

        Returns:
            Rows pushed (equal keys of several forwards summed into one row).

        Raises:
            ConfigError: a ctr table was read this step and ``labels`` is None (names
                the table), or labels' length is not the batch's (names both); nothing
                was pushed and the step's rows stay recorded (call again with labels).
            DataError: a label is not finite (nothing was pushed).
        """
        flat = _flat_labels(labels)
        tensors = self.communicator.takes_tensors
        plans = []  # every table's push, counted before anything is sent or cleared
        for table_id in sorted(self._rows):
            with_grad: list[tuple[np.ndarray | RoutedKeys, Any, Occurrences | None]] = [
                (keys, rows.grad if tensors else rows.grad.numpy(), occ)
                for keys, rows, occ in self._rows[table_id] if rows.grad is not None]
            if not with_grad:  # still push (nothing): a sync round counts every push
                dim = self._dims[table_id]
                with_grad = [(np.zeros(0, np.uint64), np.zeros((0, dim), np.float32), None)]
            counts = None
            if table_id in self._ctr:
                counts = [self._counts(table_id, flat, occ, g.shape[0])
                          for _, g, occ in with_grad]
            plans.append((table_id, with_grad, counts))
        pushed = 0
        for table_id, with_grad, counts in plans:
            self._rows[table_id].clear()
            keys_list = [k for k, _, _ in with_grad]
            grads_list = [g for _, g, _ in with_grad]
            if tensors:  # pass mode's cache sums repeated keys itself, on its device
                pushed += self._push_tensors(table_id, keys_list, grads_list, counts)
            elif counts is None:
                keys, grads = merge_sparse(keys_list, grads_list)
                self.communicator.push_sparse(table_id, keys, grads)
                pushed += int(grads.shape[0])
            else:
                keys, grads, shows, clicks = merge_sparse_counts(
                    keys_list, grads_list, [c[0] for c in counts], [c[1] for c in counts])
                self.communicator.push_sparse(table_id, keys, grads, shows=shows,
                                              clicks=clicks)
                pushed += int(grads.shape[0])
            self.sparse_pushes += 1
        return pushed

    def _push_tensors(self, table_id: int, keys_list: list[np.ndarray | RoutedKeys],
                      grads_list: list[Any],
                      counts: list[tuple[np.ndarray, np.ndarray]] | None) -> int:
        """One table's push to a communicator that takes tensors (pass mode): the
        forwards' keys and gradients side by side, repeats not merged here."""
        keys = np.concatenate([keys_of(k) for k in keys_list])
        grads = torch.cat([torch.as_tensor(g) for g in grads_list])
        shows = clicks = None
        if counts is not None:
            shows = np.concatenate([c[0] for c in counts])
            clicks = np.concatenate([c[1] for c in counts])
        self.communicator.push_sparse(table_id, keys, grads, shows, clicks)  # type: ignore[arg-type]
        return int(grads.shape[0])

    def _counts(self, table_id: int, labels: np.ndarray | None, occurrences: Occurrences | None,
                unique: int) -> tuple[np.ndarray, np.ndarray]:
        """One forward's (shows, clicks) float32[U] each (zeros without occurrences)."""
        if occurrences is None or unique == 0:
            return np.zeros(unique, np.float32), np.zeros(unique, np.float32)
        if labels is None:
            raise ConfigError(f"sparse table {self._ctr[table_id]!r} (id {table_id}) has the "
                              "ctr accessor: its pushes count shows and clicks from the "
                              "batch labels; pass them: optimizer.step(labels=batch_labels)"
                              " or optimizer.minimize(loss, labels=batch_labels)")
        return occurrences.counts(labels, unique)

    def end_step(self, dense_grads: np.ndarray | None,
                 labels: torch.Tensor | np.ndarray | None = None) -> np.ndarray | None:
        """Push the step (sparse, then the flat dense gradient float32[total]) and close it.

        Args:
            dense_grads (float32[total]) or None: the dense gradient.
            labels: the step's labels, for the ctr tables' counts
                (:meth:`push_sparse_grads`).

        Returns:
            Fresh dense values float32[total] to install, or None (none arrived, or no
            dense gradient was given).

        Raises:
            ConfigError: as :meth:`push_sparse_grads` (nothing of the step was pushed).
            FatalError, RpcError, RemoteError: sending failed (see the communicator).
        """
        self.push_sparse_grads(labels)
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


def _flat_labels(labels: torch.Tensor | np.ndarray | None) -> np.ndarray | None:
    """Labels Tensor/array [B] or [B, 1] as float64[B] (None stays None).

    Raises:
        ConfigError: another shape (names it).
        DataError: a label is NaN or infinite (names the first example).
    """
    if labels is None:
        return None
    array = (labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor)
             else np.asarray(labels))
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise ConfigError(f"labels must be of shape [B] or [B, 1] (one per example), got "
                          f"{tuple(array.shape)}")
    flat = array.astype(np.float64, copy=False)
    bad = np.flatnonzero(~np.isfinite(flat))
    if bad.size:
        raise DataError(f"labels: {bad.size} of {flat.size} are not finite (the first is "
                        f"example {bad[0]}: {float(flat[bad[0]])}); clicks are sums of labels: "
                        "fix or drop those examples")
    return flat
