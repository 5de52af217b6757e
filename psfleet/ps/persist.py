"""Saving a server's tables to files and loading them into any number of servers.

Layout of a save in ``dirname``::

    server-<i>/table-<id>.npz    one file per table per server that held it
    manifest.json                written by worker 0: format, server count, table configs

A sparse file holds ``keys`` (uint64[n]) and ``rows`` (float32[n, dim + state]): the
values and the rule state of every row the server held. A dense file holds ``values``
and ``state`` of the elements the server held and ``index`` (int64[n]), their
positions in the flat dense vector. Loading reads every server's file of a table: a
server keeps the sparse rows whose virtual bucket it owns now and the dense elements
of its current blocks, so a save loads into any server count. Each server's folder
is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from psfleet.errors import DataError, RemoteError
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.routing import bucket_of
from psfleet.ps.sparse_table import SparseTable

__all__ = ["save_server", "load_server", "FORMAT_VERSION"]

FORMAT_VERSION = 1

Table = SparseTable | DenseTable


def save_server(tables: Mapping[int, Table], dirname: Path, server_index: int,
                dense_index: Mapping[int, np.ndarray]) -> Path:
    """Write every table of one server to ``dirname/server-<server_index>/``.

    Args:
        tables: the server's tables by id.
        dirname: the save's folder (created if missing).
        server_index: this server's index.
        dense_index: for each dense table, the flat indices (int64[n]) of its elements.

    Returns:
        The folder written.

    Raises:
        RemoteError: a dense table's index is missing or of the wrong length.
        OSError: the folder cannot be written (an earlier save there stays intact).
    """
    final = Path(dirname) / f"server-{server_index}"
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for table_id, table in tables.items():
        config = table.config.model_dump_json()
        path = tmp / f"table-{table_id}.npz"
        if isinstance(table, SparseTable):
            keys, rows = table.items()
            np.savez(path, config=config, keys=keys, rows=rows)
        else:
            index = dense_index.get(table_id)
            if index is None or index.size != len(table):
                raise RemoteError(f"save: dense table {table_id} needs the flat index of its "
                                  f"{len(table)} elements from the worker")
            values, state = table.state()
            np.savez(path, config=config, values=values, state=state, index=index)
    old = final.with_name(f".{final.name}.old{os.getpid()}")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _files(dirname: Path, table_id: int) -> list[Path]:
    files = sorted(Path(dirname).glob(f"server-*/table-{table_id}.npz"))
    if not files:
        raise DataError(f"load: no saved file of table {table_id} under {str(dirname)!r}; "
                        "pass the folder fleet.save_persistables() wrote")
    return files


def _load_sparse(table: SparseTable, files: list[Path], server_index: int,
                 server_num: int) -> int:
    keys, rows = [], []
    for path in files:
        with np.load(path) as saved:
            keys.append(saved["keys"])
            rows.append(saved["rows"])
    all_keys, all_rows = np.concatenate(keys), np.concatenate(rows)
    mine = bucket_of(all_keys, table.config.num_buckets) % server_num == server_index
    table.load(all_keys[mine], all_rows[mine])
    return int(mine.sum())


def _load_dense(table: DenseTable, files: list[Path], index: np.ndarray) -> int:
    rule = table.rule
    k, c = rule.element_states, rule.scalar_states
    parts = []
    for path in files:
        with np.load(path) as saved:
            parts.append((saved["index"], saved["values"], saved["state"]))
    total = max(int(p[0].max()) + 1 for p in parts if p[0].size) if any(
        p[0].size for p in parts) else 0
    if index.size and int(index.max()) >= total:
        raise RemoteError(f"load: dense table {table.config.name!r} was saved with {total} "
                          f"elements; this model has more. Load into the same model")
    values = np.zeros(total, dtype=np.float32)
    blocks = np.zeros((k, total), dtype=np.float32)
    scalars = np.zeros(c, dtype=np.float32)
    for part_index, part_values, part_state in parts:
        n = part_index.size
        if part_state.size != k * n + c:
            raise RemoteError(f"load: dense table {table.config.name!r} was saved with another "
                              f"optimizer rule (state of {part_state.size} floats for {n} "
                              f"values; rule {rule.name!r} needs {k * n + c})")
        values[part_index] = part_values
        for j in range(k):
            blocks[j, part_index] = part_state[j * n:(j + 1) * n]
        if c and n:
            scalars = part_state[k * n:]
    state = np.concatenate([*(blocks[j, index] for j in range(k)), scalars]).astype(np.float32)
    table.load(values[index], state)
    return int(index.size)


def load_server(tables: Mapping[int, Table], dirname: Path, server_index: int, server_num: int,
                dense_index: Mapping[int, np.ndarray]) -> dict[int, int]:
    """Load a save into one server's tables (created beforehand with the same configs).

    Args:
        tables: the server's tables by id.
        dirname: the save's folder.
        server_index, server_num: this server's place now (may differ from the save's).
        dense_index: for each dense table, the flat indices of the elements it holds now.

    Returns:
        Rows (sparse) or elements (dense) loaded per table id.

    Raises:
        DataError: a table has no saved file.
        RemoteError: the saved config does not fit the table (names both).
    """
    loaded = {}
    for table_id, table in tables.items():
        files = _files(Path(dirname), table_id)
        with np.load(files[0]) as first:
            saved_config = json.loads(str(first["config"]))
        if saved_config.get("kind") != table.config.kind:
            raise RemoteError(f"load: table {table_id} was saved as {saved_config.get('kind')}, "
                              f"is {table.config.kind} now")
        if isinstance(table, SparseTable):
            if saved_config.get("dim") != table.dim:
                raise RemoteError(f"load: table {table_id} ({table.config.name!r}) was saved "
                                  f"with dim {saved_config.get('dim')}, this model has dim "
                                  f"{table.dim}")
            loaded[table_id] = _load_sparse(table, files, server_index, server_num)
        else:
            loaded[table_id] = _load_dense(table, files, dense_index.get(
                table_id, np.zeros(0, np.int64)))
    return loaded
