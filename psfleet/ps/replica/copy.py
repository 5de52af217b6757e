"""Copying a share to a new member while training goes on: the files of a full save,
sent in parts of at most ``PSFLEET_COPY_CHUNK_BYTES``, joined and read back into tables.

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
from collections.abc import Iterator

import fsspec
import numpy as np

from psfleet import env
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.persist import Table, saved_dense_part, saved_table_configs
from psfleet.ps.persist_delta import ModeSnapshot, write_mode_snapshot
from psfleet.ps.restore import read_save
from psfleet.ps.types import DenseTableConfig, SparseTableConfig
from psfleet.rpc import messages as msg

__all__ = ["chunk_bytes", "join_parts", "share_files", "split_parts", "tables_from_files"]

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


def chunk_bytes() -> int:
    """``PSFLEET_COPY_CHUNK_BYTES``: file bytes per message of a copy.

    Raises:
        ConfigError: not an integer from 1024 to below 1 GiB (names the variable).
    """
    value = env.int_var(None, "PSFLEET_COPY_CHUNK_BYTES", 1024, (1 << 30) - 1)
    assert value is not None  # declared with a default
    return value


def split_parts(files: list[msg.SharedFile], limit: int
                ) -> Iterator[tuple[list[msg.SharedFile], bool]]:
    """``files`` in consecutive parts of at most ``limit`` bytes of data each, with
    whether the part is the last: a file larger than what is left of a part is cut,
    its pieces in order (:func:`join_parts` joins them). At least one part (the last
    may be empty). The pieces are made as the parts are taken, so the sender holds
    the files and one part, not two copies of the share."""
    part: list[msg.SharedFile] = []
    room = limit
    for file in files:
        data = memoryview(file.data)
        while True:
            piece = data[:room]
            part.append(msg.SharedFile(path=file.path, data=bytes(piece)))
            room -= len(piece)
            data = data[len(piece):]
            if room == 0:
                yield part, False
                part, room = [], limit
            if not data:
                break
    yield part, True


def join_parts(parts: list[msg.SharedFile]) -> list[msg.SharedFile]:
    """The files :func:`split_parts` cut, each file's pieces joined in order."""
    joined: dict[str, list[bytes]] = {}
    for piece in parts:
        joined.setdefault(piece.path, []).append(piece.data)
    return [msg.SharedFile(path=path, data=b"".join(pieces)) for path, pieces in joined.items()]


def tables_from_files(files: list[msg.SharedFile], share: int, share_num: int
                      ) -> tuple[dict[int, Table], dict[int, np.ndarray], dict[int, int]]:
    """The tables of share ``share`` (of ``share_num``) read from :func:`share_files`'
    files.

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
        tables, loaded = read_save(sparse, url, share, share_num, {})
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
