"""Copying a share to a new member while training goes on: the files of a full save,
sent in one message, read back into tables.

The primary takes the snapshot (``TableService.copy_snapshot``) under the share's order
lock, so it is an exact cut of the writes: every write after it is forwarded to the new
member, which queues them until the copy is loaded and then applies them in order
(``psfleet.ps.replica.host``). The snapshot is written in the layout of a save
(``psfleet.ps.persist``: values, optimizer state, statistics, the dense blocks and
their indexes) to an in-memory file system, so the copy is exactly what a checkpoint
of the share would hold, and read back with the code that loads checkpoints.
"""

from __future__ import annotations

import uuid

import fsspec
import numpy as np

from psfleet.ps.dense_table import DenseTable
from psfleet.ps.persist import Table, saved_dense_part, saved_table_configs
from psfleet.ps.persist_delta import ModeSnapshot, write_mode_snapshot
from psfleet.ps.restore import read_save
from psfleet.ps.types import DenseTableConfig, SparseTableConfig
from psfleet.rpc import messages as msg

__all__ = ["share_files", "tables_from_files"]

_MEMORY = "memory"


def share_files(snapshot: ModeSnapshot, dense_index: dict[int, np.ndarray],
                share: int) -> list[msg.SharedFile]:
    """The files of a full save of ``share`` holding ``snapshot`` (paths relative to the
    save folder, ``server-<share>/...``)."""
    root = f"/psfleet-copy-{uuid.uuid4().hex}"
    fs = fsspec.filesystem(_MEMORY)
    try:
        write_mode_snapshot(snapshot, f"{_MEMORY}://{root}", share, dense_index)
        return [msg.SharedFile(path=path[len(root) + 1:], data=fs.cat_file(path))
                for path in sorted(fs.find(root))]
    finally:
        if fs.exists(root):
            fs.rm(root, recursive=True)


def tables_from_files(files: list[msg.SharedFile], share: int, host_num: int
                      ) -> tuple[dict[int, Table], dict[int, np.ndarray], dict[int, int]]:
    """The tables of share ``share`` read from :func:`share_files`' files.

    Returns:
        (tables by id, dense tables' flat indexes by id, rows or elements per table).

    Raises:
        DataError: a file is missing or damaged (names it).
    """
    root = f"/psfleet-received-{uuid.uuid4().hex}"
    fs = fsspec.filesystem(_MEMORY)
    try:
        for file in files:
            fs.pipe_file(f"{root}/{file.path}", file.data)
        url = f"{_MEMORY}://{root}"
        configs = saved_table_configs(url, share)
        sparse = {tid: c for tid, c in configs.items() if isinstance(c, SparseTableConfig)}
        tables, loaded = read_save(sparse, url, share, host_num, {})
        index = {}
        for tid, config in configs.items():
            if isinstance(config, DenseTableConfig):  # this share's part, as saved
                index[tid], values, state = saved_dense_part(url, share, tid)
                dense = DenseTable(config, values)
                dense.load(values, state)
                tables[tid], loaded[tid] = dense, int(values.size)
        return tables, index, loaded
    finally:
        if fs.exists(root):
            fs.rm(root, recursive=True)
