"""How a table server applies a push, one method per mode (``PushMode``): APPLY (async:
the table's rule), DELTA (GEO: values added), ROW_DELTA (pass mode: values and rule
state added; sparse tables), SYNC (a round of every worker's
gradients, averaged; ``psfleet.ps.sync_rounds``) and AGGREGATE (GBA: a global batch of
any workers' gradients, averaged; ``psfleet.ps.global_batch``). Every write holds the push gate
(``psfleet.ps.coordination.PushGate``), so a save's snapshot sees no push half applied.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from psfleet.errors import InvalidRequestError
from psfleet.ps.coordination import PushGate
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.global_batch import GlobalBatches, SparseMean
from psfleet.ps.lifecycle_service import ShowClicks, sync_mean_with_counts
from psfleet.ps.merge import merge_sparse
from psfleet.ps.sync_rounds import SyncRounds
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import PushMeta, PushMode
from psfleet.ps.wait_budget import WaitBudget

__all__ = ["PushModes"]


class PushModes:
    """The push modes of one server's tables. Thread safe (the tables and rounds are).

    Args:
        gate: the server's push gate.
        barrier_timeout_s: how long a SYNC round waits for every worker, seconds.
        wait_budget: the server's budget of waiting calls (SYNC rounds long-poll).

    Attributes:
        sparse_rounds, dense_rounds: the SYNC rounds of sparse and dense tables.
        global_batches: the AGGREGATE global batches of every table.
        sparse, dense: APPLY, DELTA and AGGREGATE of each kind, by mode (SYNC is
            :meth:`sparse_sync` / :meth:`dense_sync`: it answers whether its round is
            applied).
    """

    def __init__(self, gate: PushGate, barrier_timeout_s: float,
                 wait_budget: WaitBudget) -> None:
        self._gate = gate
        self.sparse_rounds: SyncRounds[tuple[np.ndarray, np.ndarray, ShowClicks]] = \
            SyncRounds(barrier_timeout_s, wait_budget)
        self.dense_rounds: SyncRounds[np.ndarray] = SyncRounds(barrier_timeout_s, wait_budget)
        self.global_batches = GlobalBatches()
        self.sparse: dict[PushMode, Callable[..., None]] = {
            PushMode.APPLY: self.sparse_apply, PushMode.DELTA: self.sparse_delta,
            PushMode.ROW_DELTA: self.sparse_row_delta,
            PushMode.AGGREGATE: self.sparse_aggregate}
        self.dense: dict[PushMode, Callable[..., None]] = {
            PushMode.APPLY: self.dense_apply, PushMode.DELTA: self.dense_delta,
            PushMode.AGGREGATE: self.dense_aggregate}

    def sparse_apply(self, push: PushMeta, table: SparseTable, keys: np.ndarray,
                      grads: np.ndarray, counts: ShowClicks = None) -> None:
        with self._gate.write():
            if counts is None:
                table.push(keys, grads)
            else:
                table.push(keys, grads, *counts)

    def sparse_delta(self, push: PushMeta, table: SparseTable, keys: np.ndarray,
                      deltas: np.ndarray, counts: ShowClicks = None) -> None:
        with self._gate.write():
            table.add(keys, deltas)
            if counts is not None:
                table.update_stats(keys, *counts)

    def sparse_row_delta(self, push: PushMeta, table: SparseTable, keys: np.ndarray,
                         deltas: np.ndarray, counts: ShowClicks = None) -> None:
        with self._gate.write():
            table.add(keys, deltas, with_state=True)
            if counts is not None:
                table.update_stats(keys, *counts)

    def sparse_sync(self, push: PushMeta, table: SparseTable, keys: np.ndarray,
                     grads: np.ndarray, incarnation: int = 0,
                     counts: ShowClicks = None) -> bool:
        def apply_mean(pushes: list[tuple[np.ndarray, np.ndarray, ShowClicks]]) -> None:
            if all(c is None for _, _, c in pushes):
                merged_keys, summed = merge_sparse([k for k, _, _ in pushes],
                                                   [g for _, g, _ in pushes])
                with self._gate.write():
                    table.push(merged_keys, summed / np.float32(len(pushes)))
                return
            merged_keys, mean, shows, clicks = sync_mean_with_counts(pushes)
            with self._gate.write():
                table.push(merged_keys, mean, shows, clicks)

        return self.sparse_rounds.contribute(push.table_id, push.step, push.worker_index,
                                              push.worker_num, (keys, grads, counts),
                                              apply_mean, incarnation, push.push_id)

    def sparse_aggregate(self, push: PushMeta, table: SparseTable, keys: np.ndarray,
                         grads: np.ndarray, counts: ShowClicks = None) -> None:
        def apply(mean: SparseMean) -> None:
            merged_keys, grads_mean, shows, clicks = mean
            with self._gate.write():
                if shows is None or clicks is None:
                    table.push(merged_keys, grads_mean)
                else:
                    table.push(merged_keys, grads_mean, shows, clicks)

        shows, clicks = counts if counts is not None else (None, None)
        self.global_batches.push_sparse(push, keys, grads, shows, clicks, apply)

    def apply_partial_global_batches(self, tables: dict[int, SparseTable | DenseTable]
                                     ) -> None:
        """Apply every table's partial global batch now (AGGREGATE; before a copy of
        the tables is taken, so the copy and this server gather from the same point)."""
        for table_id in self.global_batches.partial():
            push = PushMeta(table_id=table_id, mode=PushMode.AGGREGATE, batches=0)
            table = tables[table_id]
            if isinstance(table, DenseTable):
                self.dense_aggregate(push, table, np.empty(0, np.float32))
            else:
                self.sparse_aggregate(push, table, np.empty(0, np.uint64),
                                      np.empty((0, table.dim), np.float32))

    def dense_apply(self, push: PushMeta, table: DenseTable, grads: np.ndarray) -> None:
        with self._gate.write():
            table.push(grads, push.worker_index)

    def dense_delta(self, push: PushMeta, table: DenseTable, deltas: np.ndarray) -> None:
        with self._gate.write():
            table.add(deltas)

    def dense_aggregate(self, push: PushMeta, table: DenseTable, grads: np.ndarray) -> None:
        if push.batches and grads.size != table.config.size:
            raise InvalidRequestError(f"push to dense table {push.table_id}: {grads.size} "
                                      f"gradients, expected {table.config.size}")

        def apply(mean: np.ndarray) -> None:
            with self._gate.write():
                table.push(mean)

        self.global_batches.push_dense(push, grads, apply)

    def dense_sync(self, push: PushMeta, table: DenseTable, grads: np.ndarray,
                    incarnation: int = 0) -> bool:
        def apply_mean(pushes: list[np.ndarray]) -> None:
            mean = np.add.reduce(pushes, dtype=np.float32) / np.float32(len(pushes))
            with self._gate.write():
                table.push(mean)

        return self.dense_rounds.contribute(push.table_id, push.step, push.worker_index,
                                             push.worker_num, grads, apply_mean, incarnation,
                                             push.push_id)

    # -- the rpc methods of psfleet.proto -------------------------------------------------
