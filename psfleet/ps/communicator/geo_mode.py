"""GEO mode: train a local copy, exchange parameter deltas every ``geo_step`` steps.

As Paddle's GeoCommunicator (GEO-SGD): each worker applies the optimizer to its own
copy of the rows it uses and of the dense parameters. The first time a row is used
in a sync interval its fresh value is pulled from the servers and remembered as the
row's base; every ``geo_step`` steps the worker pushes the delta (local value - base)
of every row it touched and of the dense parameters, divided by the number of
workers (as Paddle's GeoCommunicator scales deltas by 1/trainers: the servers then
hold the average of the workers' models, not W times their common movement), the
servers add the deltas, and the worker takes the servers' fresh dense values.
Communication drops by about ``geo_step`` times; workers see each other's updates
at the next sync.

Tables with the ``ctr`` accessor: the show and click counts of the interval's pushes
are summed per key and sent with the deltas (DELTA pushes add them to the rows'
statistics). The local copies keep no lifecycle (no statistics, admission or cap):
the servers' tables do.
"""

from __future__ import annotations

import numpy as np

from psfleet.ps.client import PullHandle, TableClient
from psfleet.ps.communicator.types import Communicator
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.merge import sum_equal_keys
from psfleet.ps.routing import RoutedKeys, keys_of
from psfleet.ps.table.rules import SgdRule
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import (
    AccessorConfig,
    DenseTableConfig,
    PushMode,
    RuleConfig,
    SparseTableConfig,
)

__all__ = ["GeoCommunicator"]


class GeoCommunicator(Communicator):
    """Local training with delta exchange every ``geo_step`` steps.

    Args:
        client: the servers' tables.
        geo_step: steps between syncs (PaddleRec's default is 400).
        worker_num: workers whose deltas the servers add; each delta is scaled by
            1/worker_num.
    """

    def __init__(self, client: TableClient, geo_step: int, worker_num: int = 1) -> None:
        super().__init__(client)
        self.geo_step = geo_step
        self._scale = np.float32(1.0 / worker_num)
        self.steps = 0
        self.syncs = 0
        self._local: dict[int, SparseTable] = {}
        self._base: dict[int, SparseTable] = {}  # rows touched this interval: their base
        self._local_dense: dict[int, DenseTable] = {}
        self._base_dense: dict[int, np.ndarray] = {}
        self._dirty: set[int] = set()
        # ctr tables: the interval's pushed keys, shows and clicks (summed at the sync)
        self._counts: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    def on_sparse_table(self, table_id: int, config: SparseTableConfig) -> None:
        config = config.model_copy(update={"accessor": AccessorConfig()})  # servers' job
        self._local[table_id] = SparseTable(config)
        self._base[table_id] = self._new_base(config)

    @staticmethod
    def _new_base(config: SparseTableConfig) -> SparseTable:
        # Values only: the base needs no optimizer state.
        return SparseTable(config.model_copy(update={"rule": RuleConfig(name=SgdRule.name)}))

    def on_dense_table(self, table_id: int, rule: RuleConfig, values: np.ndarray) -> None:
        config = DenseTableConfig(name=f"geo-local-{table_id}", size=values.size, rule=rule)
        self._local_dense[table_id] = DenseTable(config, values)
        self._base_dense[table_id] = values.copy()

    def pull_sparse(self, table_id: int, keys: np.ndarray, create: bool = True) -> np.ndarray:
        if not create:  # evaluation reads the servers' values
            return self.client.pull_sparse(table_id, keys, create=False)
        local, base = self._local[table_id], self._base[table_id]
        first_use = ~base.contains(keys)
        if first_use.any():
            new_keys = np.unique(keys[first_use])
            fresh = self.client.pull_sparse(table_id, new_keys)
            local.assign(new_keys, fresh)
            base.assign(new_keys, fresh)
        return local.pull(keys)

    def start_pull_sparse(self, table_id: int, keys: np.ndarray,
                          create: bool = True) -> PullHandle:
        """Rows from the local copy (:meth:`pull_sparse`), served at once."""
        return PullHandle.ready(keys, self.pull_sparse(table_id, keys, create))

    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    grads: np.ndarray, shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> None:
        if grads.shape[0]:
            self._local[table_id].push(keys_of(keys), grads)
            if shows is not None and clicks is not None:
                self._counts.setdefault(table_id, []).append((keys_of(keys), shows, clicks))

    def push_dense(self, table_id: int, grads: np.ndarray) -> None:
        self._local_dense[table_id].push(grads)
        self._dirty.add(table_id)

    def end_step(self) -> None:
        self.steps += 1
        if self.steps % self.geo_step == 0:
            self._sync()

    def fresh_dense(self, table_id: int) -> np.ndarray | None:
        if table_id not in self._dirty:
            return None
        self._dirty.discard(table_id)
        return self._local_dense[table_id].pull()

    def flush(self) -> None:
        """Push the deltas of the current interval (not yet at a ``geo_step`` boundary)."""
        self._sync()

    def _sync(self) -> None:
        for table_id, base in self._base.items():
            keys, rows = base.items()
            counts = self._counts.pop(table_id, None)
            if keys.size:
                delta = self._local[table_id].pull(keys) - rows[:, : base.dim]
                if counts is None:
                    self.client.push_sparse(table_id, keys, delta * self._scale,
                                            PushMode.DELTA)
                else:
                    shows, clicks = _aligned_counts(keys, counts)
                    self.client.push_sparse(table_id, keys, delta * self._scale,
                                            PushMode.DELTA, shows=shows, clicks=clicks)
            self._base[table_id] = self._new_base(base.config)
        for table_id, local in self._local_dense.items():
            delta = local.pull() - self._base_dense[table_id]
            self.client.push_dense(table_id, delta * self._scale, PushMode.DELTA)
            fresh = self.client.pull_dense(table_id)
            local.assign(fresh)
            self._base_dense[table_id] = fresh
            self._dirty.add(table_id)
        self.syncs += 1


def _aligned_counts(keys: np.ndarray, counts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The interval's pushed (keys, shows, clicks) summed per key and laid out along
    ``keys`` (uint64[N], the rows whose deltas are sent; every pushed key was pulled,
    so it is among them): (shows float32[N], clicks float32[N]), zero elsewhere."""
    pushed, summed = sum_equal_keys(
        np.concatenate([k for k, _, _ in counts]),
        np.concatenate([np.stack([s, c], axis=1) for _, s, c in counts]))  # [P], [P, 2]
    at = np.minimum(np.searchsorted(pushed, keys), max(pushed.size - 1, 0))
    found = pushed[at] == keys if pushed.size else np.zeros(keys.size, dtype=bool)
    aligned = np.zeros((keys.size, 2), dtype=np.float32)
    aligned[found] = summed[at[found]]
    return np.ascontiguousarray(aligned[:, 0]), np.ascontiguousarray(aligned[:, 1])
