"""The row statistics of ``ctr`` tables in a save, beside their rows (issue 17).

A sparse table with the ``ctr`` accessor keeps show, click, unseen_days and
delta_score per row (``psfleet.ps.table.shard.STAT_COLUMNS``). A save writes them to
``server-<i>/table-<id>.stats`` next to ``table-<id>.sparse``: an npz with ``keys``
uint64[n] and ``stats`` float32[n, 4], sorted by key (a table in memory) or by
(bucket, key) (a tiered table's, streamed: ``psfleet.ps.persist_stream``). Loading
keeps the rows whose bucket the loading server owns now (as the ``.sparse`` rows, so
any server count works) and sets their statistics with ``SparseTable.load_stats``
after the rows are loaded; keys without a loaded row are ignored. A save without
``.stats`` files (older saves, or tables without the accessor) loads with statistics
at zero.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

import numpy as np

from psfleet.checkpoint.storage import FileDigest, Storage
from psfleet.errors import DataError
from psfleet.ps.routing import BucketRouter, bucket_of
from psfleet.ps.table.sparse_table import SparseTable

__all__ = ["StatsSnapshot", "snapshot_stats", "write_stats", "load_stats"]

#: table id -> (keys uint64[n], stats float32[n, 4]) of the ctr tables.
StatsSnapshot = dict[int, tuple[np.ndarray, np.ndarray]]


def _has_stats(table: object) -> bool:
    return isinstance(table, SparseTable) and table.config.accessor.name == "ctr"


def snapshot_stats(tables: Mapping[int, object]) -> StatsSnapshot:
    """Copy the statistics of every ``ctr`` table (``SparseTable.stats_items``); the
    caller keeps pushes out meanwhile, as for the rows."""
    return {tid: t.stats_items() for tid, t in tables.items()
            if isinstance(t, SparseTable) and _has_stats(t)}


def write_stats(storage: Storage, folder: str, stats: StatsSnapshot) -> list[FileDigest]:
    """Write ``folder/table-<id>.stats`` for each table of ``stats``.

    Returns:
        Each file's digest (path relative to the save, bytes, SHA-256).

    Raises:
        OSError: a file cannot be written (none appears half-written).
    """
    digests = []
    for table_id, (keys, values) in sorted(stats.items()):
        rel = f"{folder}/table-{table_id}.stats"
        buffer = io.BytesIO()
        np.savez(buffer, keys=np.asarray(keys, dtype="<u8"),
                 stats=np.asarray(values, dtype="<f4"))
        with storage.write(rel) as writer:
            writer.write(buffer.getbuffer())
        digests.append(FileDigest(rel, writer.size, writer.hash.hexdigest()))
    return digests


def load_stats(table: SparseTable, table_id: int, storage: Storage, servers: list[str],
               server_index: int, server_num: int) -> int:
    """Set the statistics of ``table``'s loaded rows from the save's ``.stats`` files.

    Args:
        table: a table whose rows were just loaded; nothing is done without the
            ``ctr`` accessor.
        table_id: its id in the save.
        storage: the save's folder.
        servers: the save's ``server-<i>`` folders.
        server_index, server_num: this server's place now.

    Returns:
        The statistics rows read for this server's buckets (0: no ``.stats`` file).

    Raises:
        DataError: a ``.stats`` file is not an npz of ``keys`` [n] and ``stats`` [n, 4].
    """
    if not _has_stats(table):
        return 0
    owned = BucketRouter(table.config.num_buckets, server_num).bucket_map == server_index
    read = 0
    for server in servers:
        if not storage.exists(server, f"table-{table_id}.stats"):
            continue
        rel = f"{server}/table-{table_id}.stats"
        try:
            with np.load(io.BytesIO(storage.read_bytes(rel))) as npz:
                keys = np.asarray(npz["keys"], dtype=np.uint64)
                stats = np.asarray(npz["stats"], dtype=np.float32)
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"{storage.url}/{rel}: not a statistics file ({exc}); "
                            "restore the save's copy or delete the file (stats load as "
                            "zero then)") from None
        if stats.shape != (keys.size, 4):
            raise DataError(f"{storage.url}/{rel}: stats of shape {stats.shape} for "
                            f"{keys.size} keys; need ({keys.size}, 4)")
        mine = owned[bucket_of(keys, table.config.num_buckets)]
        table.load_stats(keys[mine], stats[mine])
        read += int(mine.sum())
    return read
