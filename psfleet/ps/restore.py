"""Tables rebuilt from a save or a checkpoint, off to the side of the live ones.

A server's ``Load`` and a restarted server's recovery read into *new* tables
(:func:`read_save`, :func:`read_checkpoint`) and only then swap them in, so a damaged
file or a MemoryError halfway leaves the live tables as they were.

:func:`replay` rebuilds tables from a base save and its delta saves, in order
(``psfleet.ps.persist_delta``): for serving (``psfleet.export.export_from_saves``) or
to check a chain of saves against the live tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from psfleet.checkpoint import CheckpointStore
from psfleet.checkpoint.storage import Storage
from psfleet.checkpoint.store import LoadedCheckpoint
from psfleet.errors import DataError
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.persist import Table, load_server, saved_dense_index, saved_table_configs
from psfleet.ps.persist_delta import (
    apply_delta,
    read_tombstones,
    restore_tombstones,
    saved_mode,
)
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import DenseTableConfig, SparseTableConfig

__all__ = ["empty_table", "read_checkpoint", "read_save", "replay"]


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
    if saved_mode(dirname) == "full":  # its pending tombstones go on to the next delta
        for table_id, table in tables.items():
            if isinstance(table, SparseTable):
                restore_tombstones(table, read_tombstones(
                    dirname, table_id, table.config, server_index, server_num))
    return tables, loaded


def replay(base_dir: str | Path | Storage, delta_dirs: Sequence[str | Path | Storage] = (),
           configs: Mapping[int, SparseTableConfig | DenseTableConfig] | None = None,
           server_index: int = 0, server_num: int = 1,
           dense_index: Mapping[int, np.ndarray] | None = None,
           uncapped: bool = True) -> dict[int, Table]:
    """New tables holding a base save with its delta saves applied in order.

    Args:
        base_dir: a ``base`` (or ``full``) save.
        delta_dirs: ``delta`` saves taken after it, oldest first.
        configs: the tables' configs by id; None: the base's (``server-0/tables.json``).
        server_index, server_num: the share to rebuild (default: everything, as one
            server).
        dense_index: each dense table's flat indices to load (default: none, dense
            tables stay at zeros; ``saved_dense_index`` gives a server's).
        uncapped: lift every table's ``max_rows`` (and admission), so the replay
            holds every saved row whatever the saving server count.

    Returns:
        The tables by id.

    Raises:
        DataError: ``base_dir`` is a delta, a ``delta_dirs`` entry is not a delta, or
            a file is damaged (names it); what ``load_server`` raises.
    """
    if saved_mode(base_dir) == "delta":
        raise DataError(f"replay: {base_dir} is a delta save; start from a base (or full) "
                        "save and pass the deltas after it")
    if configs is None:
        configs = saved_table_configs(base_dir, 0)
    if uncapped:
        configs = {tid: (c.model_copy(update={"accessor": c.accessor.model_copy(
            update={"max_rows": None, "admission": "none"})})
            if isinstance(c, SparseTableConfig) else c) for tid, c in configs.items()}
    index = dict(dense_index or {})
    tables, _ = read_save(configs, base_dir, server_index, server_num, index)
    for delta in delta_dirs:
        if saved_mode(delta) != "delta":
            raise DataError(f"replay: {delta} is a {saved_mode(delta)} save, not a delta; "
                            "pass the delta saves taken after the base, oldest first")
        apply_delta(tables, delta, server_index, server_num, index)
    return tables


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
