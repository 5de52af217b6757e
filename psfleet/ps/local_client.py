"""Tables in the worker's own process: single-machine training with the same math.

With no servers (``server_num: 0``) the worker keeps its sparse and dense tables in
process and applies the same rules as a server would, so a single-process run is the
reference the distributed modes are compared against.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from psfleet.errors import ConfigError, FatalError
from psfleet.ps.client import TableClient
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.persist import load_server, save_server
from psfleet.ps.sparse_table import SparseTable
from psfleet.ps.types import (
    DenseTableConfig,
    PushMode,
    RuleConfig,
    SlicingConfig,
    SparseTableConfig,
)

__all__ = ["LocalClient"]

_T = TypeVar("_T", SparseTable, DenseTable)


def _one_worker(worker_num: int) -> None:
    if worker_num != 1:
        raise ConfigError(f"in-process tables serve one worker, got worker_num={worker_num}; "
                          "start servers for more")


class LocalClient(TableClient):
    """In-process tables for one worker. Thread safe (the tables are)."""

    def __init__(self) -> None:
        self.sparse: dict[int, SparseTable] = {}
        self.dense: dict[int, DenseTable] = {}

    def create_sparse_table(self, table_id: int, config: SparseTableConfig) -> None:
        existing = self.sparse.get(table_id)
        if existing is not None and existing.config != config:
            raise ConfigError(f"sparse table {table_id} exists with another config")
        if existing is None:
            self.sparse[table_id] = SparseTable(config)

    def create_dense_table(self, table_id: int, name: str, shapes: Sequence[tuple[int, ...] | int],
                           rule: RuleConfig, init_values: np.ndarray,
                           slicing: SlicingConfig | None = None,
                           dc_asgd_lambda: float = 0.0) -> None:
        if table_id not in self.dense:
            size = int(sum(int(np.prod(s)) for s in shapes))
            config = DenseTableConfig(name=name, size=size, rule=rule)
            self.dense[table_id] = DenseTable(config, np.asarray(init_values, np.float32))

    def _table(self, tables: dict[int, _T], table_id: int) -> _T:
        table = tables.get(table_id)
        if table is None:
            raise FatalError(f"table {table_id} was not created; fleet.init_worker() "
                             "creates the tables")
        return table

    def pull_sparse(self, table_id: int, keys: np.ndarray, create: bool = True) -> np.ndarray:
        return self._table(self.sparse, table_id).pull(keys, create=create)

    def push_sparse(self, table_id: int, keys: np.ndarray, grads: np.ndarray,
                    mode: PushMode = PushMode.APPLY, step: int = 0, worker_num: int = 1) -> None:
        table = self._table(self.sparse, table_id)
        _one_worker(worker_num)
        if mode == PushMode.DELTA:
            table.add(keys, grads)
        else:  # APPLY, or SYNC with one worker: the same single step
            table.push(keys, grads)

    def pull_dense(self, table_id: int) -> np.ndarray:
        return self._table(self.dense, table_id).pull()

    def push_dense(self, table_id: int, grads: np.ndarray, mode: PushMode = PushMode.APPLY,
                   step: int = 0, worker_num: int = 1) -> None:
        table = self._table(self.dense, table_id)
        _one_worker(worker_num)
        if mode == PushMode.DELTA:
            table.add(grads)
        else:
            table.push(grads)

    def _tables(self) -> tuple[dict[int, SparseTable | DenseTable], dict[int, np.ndarray]]:
        tables: dict[int, SparseTable | DenseTable] = {**self.sparse, **self.dense}
        return tables, {tid: np.arange(len(t), dtype=np.int64) for tid, t in self.dense.items()}

    def save(self, dirname: str) -> None:
        tables, index = self._tables()
        save_server(tables, dirname, 0, index)

    def load(self, dirname: str) -> None:
        tables, index = self._tables()
        load_server(tables, dirname, 0, 1, index)

    def barrier(self, name: str, worker_index: int, worker_num: int) -> None:
        _one_worker(worker_num)

    def stop_servers(self, worker_index: int) -> None:
        """Nothing to stop: there are no servers."""
