"""Sync mode: every step is one round in which all workers' gradients are averaged.

At the end of each step a worker pushes its gradients of every table with the step
number; each server waits for all ``worker_num`` workers' pushes of that step (per
table, per server), applies their mean once and releases them; the worker then
pulls the dense values. So W workers with batch b compute exactly what one process
with batch W*b computes (the mean of the halves' mean gradients is the mean
gradient of the union). Every worker must run the same number of steps.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from psfleet.ps.client import TableClient
from psfleet.ps.communicator.types import Communicator
from psfleet.ps.merge import merge_pushes
from psfleet.ps.routing import RoutedKeys
from psfleet.ps.types import PushMode

__all__ = ["SyncCommunicator"]


class SyncCommunicator(Communicator):
    """Pushes in lockstep with the other workers; blocks in :meth:`end_step`.

    Args:
        client: the tables.
        worker_num: workers that push every step.
    """

    def __init__(self, client: TableClient, worker_num: int) -> None:
        super().__init__(client)
        self.worker_num = worker_num
        self.step = 0
        # per table: the step's pushes' keys, grads, shows and clicks (None: no counts)
        self._sparse: dict[int, tuple[list[np.ndarray | RoutedKeys], list[np.ndarray],
                                      list[np.ndarray | None], list[np.ndarray | None]]] = (
            defaultdict(lambda: ([], [], [], [])))
        self._dense: dict[int, np.ndarray] = {}
        self._fresh: dict[int, np.ndarray] = {}

    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    grads: np.ndarray, shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> None:
        pending_keys, pending_grads, pending_shows, pending_clicks = self._sparse[table_id]
        pending_keys.append(keys)
        pending_grads.append(grads)
        pending_shows.append(shows)
        pending_clicks.append(clicks)

    def push_dense(self, table_id: int, grads: np.ndarray) -> None:
        self._dense[table_id] = grads

    def end_step(self) -> None:
        """Run this step's round on every table; blocks until every worker pushed."""
        for table_id in sorted(self._sparse):
            # a ctr table's counts go with its gradients; the round sums them too
            keys, grads, shows, clicks = merge_pushes(*self._sparse[table_id])
            if shows is None:  # no counts: exactly the push of a table without them
                self.client.push_sparse(table_id, keys, grads, PushMode.SYNC, self.step,
                                        self.worker_num)
            else:
                self.client.push_sparse(table_id, keys, grads, PushMode.SYNC, self.step,
                                        self.worker_num, shows, clicks)
        for table_id in sorted(self._dense):
            self.client.push_dense(table_id, self._dense[table_id], PushMode.SYNC, self.step,
                                   self.worker_num)
            self._fresh[table_id] = self.client.pull_dense(table_id)
        self._sparse.clear()
        self._dense.clear()
        self.step += 1

    def fresh_dense(self, table_id: int) -> np.ndarray | None:
        return self._fresh.pop(table_id, None)

    def flush(self) -> None:
        """Nothing waits: every round completed in :meth:`end_step`."""
