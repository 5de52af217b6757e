"""Tables rebuilt from a save or a checkpoint, off to the side of the live ones.

A server's ``Load`` and a restarted server's recovery read into *new* tables
(:func:`read_save`, :func:`read_checkpoint`) and only then swap them in, so a damaged
file or a MemoryError halfway leaves the live tables as they were.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from psfleet.checkpoint import CheckpointStore
from psfleet.checkpoint.storage import Storage
from psfleet.checkpoint.store import LoadedCheckpoint
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.persist import Table, load_server, saved_dense_index, saved_table_configs
from psfleet.ps.sparse_table import SparseTable
from psfleet.ps.types import DenseTableConfig, SparseTableConfig

__all__ = ["empty_table", "read_checkpoint", "read_save"]


def empty_table(config: SparseTableConfig | DenseTableConfig) -> Table:
    """A new table of ``config``: no rows (sparse) or ``config.size`` zeros (dense)."""
    if isinstance(config, SparseTableConfig):
        return SparseTable(config)
    return DenseTable(config, np.zeros(config.size, np.float32))


def read_save(configs: Mapping[int, SparseTableConfig | DenseTableConfig],
              dirname: str | Path | Storage, server_index: int, server_num: int,
              dense_index: Mapping[int, np.ndarray]) -> tuple[dict[int, Table], dict[int, int]]:
    """New tables of ``configs`` holding a save's state for this server
    (:func:`psfleet.ps.persist.load_server` has the arguments).

    Returns:
        (the tables by id, rows or elements loaded per table id).

    Raises:
        What :func:`~psfleet.ps.persist.load_server` raises, and MemoryError.
    """
    tables = {table_id: empty_table(config) for table_id, config in configs.items()}
    loaded = load_server(tables, dirname, server_index, server_num, dense_index)
    return tables, loaded


def read_checkpoint(checkpoint_dir: str, server_index: int
                    ) -> tuple[dict[int, Table], dict[int, int], LoadedCheckpoint] | None:
    """This server's tables as of the newest complete checkpoint in ``checkpoint_dir``,
    with the configs it saved (a restarted server: the workers created its tables before
    it died); None when there is no complete checkpoint.

    Returns:
        (the tables by id, rows or elements loaded per table id, the checkpoint).

    Raises:
        DataError: the checkpoint has no tables of this server index.
    """
    latest = CheckpointStore(checkpoint_dir).latest()
    if latest is None:
        return None
    configs = saved_table_configs(latest.storage, server_index)
    index = {table_id: saved_dense_index(latest.storage, server_index, table_id)
             for table_id, config in configs.items() if isinstance(config, DenseTableConfig)}
    tables, loaded = read_save(configs, latest.storage, server_index,
                               latest.manifest.server_num, index)
    return tables, loaded, latest
