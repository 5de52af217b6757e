"""Save modes of the table service: ``full``, ``base`` and ``delta`` saves (issue 17).

As Paddle's CtrCommonAccessor save params (0 all, 2 base, 1 delta). For a sparse
table with the ``ctr`` accessor (``AccessorConfig``: ``base_threshold``,
``delta_threshold``, ``delta_keep_days``), score = ``(show - click) * nonclk_coeff +
click * click_coeff``:

- ``full``: every row, its rule state and statistics (checkpoints; unchanged by the
  save modes), plus the table's pending tombstones (so a job restarted from a
  checkpoint still writes them in its next delta). Nothing in the table changes.
- ``base``: the rows with score >= base_threshold and unseen_days <= delta_keep_days.
  Afterwards every row's delta_score is 0, the tombstones are cleared and exactly the
  written rows are "in the chain" (``Shard.saved``).
- ``delta``: the rows with score >= base_threshold, delta_score >= delta_threshold
  and unseen_days <= delta_keep_days (Paddle's rule); afterwards their delta_score
  is 0 and they are in the chain. Plus the **tombstones**: the keys whose row was in
  the chain and was deleted (shrink) or evicted (max_rows) since the last base or
  delta save, minus the keys this delta writes as rows (a key deleted and
  re-inserted is written as a row when it passes the thresholds; otherwise it stays
  a tombstone, since the chain's copy of it is stale). The tombstones are cleared.
  Tombstones never outnumber the rows of the chain (only rows in it make one).

A base or delta save of a table without the ``ctr`` accessor: base writes every row
(no score to filter by); so does a delta of a table without any lifecycle (its rows
are never deleted, so upserting them all is exact). A delta of a table with a
lifecycle but no ``ctr`` accessor (admission or a cap with ``name: none``: rows go
without statistics to track them) raises ConfigError naming the table; give it
``accessor.name: ctr`` or save ``full``/``base``. Dense tables are written whole in
every mode (a delta replaces their values).

Files (besides ``psfleet.ps.persist``'s ``.sparse``, ``.dense``, ``.stats`` and
``tables.json``, with the selected rows only)::

    server-<i>/save.json        {"mode": "full" | "base" | "delta"} (absent: full)
    server-<i>/table-<id>.tomb  tombstones of a ctr table (delta: the delta's; full:
                                the pending ones; base: none), little-endian:
                                magic b"PSFLTOMB" | uint32 version (1) | uint32 0
                                | uint64 n | uint64 keys[n] (ascending)

Loading (``TableService.Load``, :func:`apply_delta`): a full or base save replaces
the tables; a delta is applied on top of the live tables: its tombstone keys are
removed, then its rows (values, rule state, statistics) are upserted; as every load,
each server keeps the keys of the buckets it owns now, so any server count works.
A base followed by its deltas, loaded in order, equals the table at the last delta
(``psfleet.ps.restore.replay``).

A delta save resets delta_score and clears the tombstones when it takes its copy; a
write that fails afterwards loses them (take a base save next).

A table with a disk tier is copied and written by ``psfleet.ps.persist_stream`` in
every mode (its memory tier copied, its disk rows streamed into the same files).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from psfleet.checkpoint.storage import FileDigest, Storage
from psfleet.errors import ConfigError, DataError
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.persist import (
    Snapshot,
    Table,
    _storage,
    load_server,
    snapshot_tables,
    write_snapshot,
)
from psfleet.ps.persist_stats import StatsSnapshot, snapshot_stats
from psfleet.ps.persist_stream import TieredSnapshot, snapshot_tiered
from psfleet.ps.routing import BucketRouter, bucket_of
from psfleet.ps.table.accessor import CtrAccessor
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import SAVE_MODES, SaveMode, SparseTableConfig

__all__ = ["ModeSnapshot", "check_save_mode", "snapshot_mode", "write_mode_snapshot",
           "saved_mode", "read_tombstones", "apply_delta", "restore_tombstones",
           "remove_keys", "TOMB_VERSION"]

TOMB_VERSION = 1
_TOMB_MAGIC = b"PSFLTOMB"
_TOMB_HEADER = struct.Struct("<8sIIQ")


def check_save_mode(mode: object, where: str = "save") -> SaveMode:
    """``mode`` if it is one of :data:`~psfleet.ps.types.SAVE_MODES`.

    Raises:
        ConfigError: another value (names ``mode`` and the choices).
    """
    if mode not in SAVE_MODES:
        raise ConfigError(f"{where}: mode {mode!r} is not a save mode; use one of "
                          f"{list(SAVE_MODES)}")
    return mode  # type: ignore[return-value]


@dataclass
class ModeSnapshot:
    """One server's copy for a save of ``mode``: rows, statistics and tombstones.

    Attributes:
        mode: the save mode.
        tables: ``{table_id: (config, keys, rows)}`` (``psfleet.ps.persist.Snapshot``).
        stats: the ctr tables' statistics of the same rows.
        tombs: ctr table id -> tombstone keys uint64[t], ascending.
        streamed: the tables with a disk tier, by id (their rows, statistics and
            tombstones are in them instead).
    """

    mode: SaveMode
    tables: Snapshot
    stats: StatsSnapshot
    tombs: dict[int, np.ndarray] = field(default_factory=dict)
    streamed: dict[int, TieredSnapshot] = field(default_factory=dict)


def _is_ctr(table: Table) -> bool:
    return isinstance(table, SparseTable) and table.config.accessor.name == "ctr"


def _select_ctr(table: SparseTable, mode: SaveMode
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(keys, rows, stats, tombstones) a base/delta save of a ctr table without a disk
    tier writes, each shard under its lock, and the table's save state updated
    (module docstring)."""
    accessor = CtrAccessor(table.config.accessor)
    keys, rows, stats, tombs = [], [], [], []
    for shard in table.shards:
        with shard.lock:
            assert shard.stats is not None and shard.saved is not None
            live = shard.live_rows()
            chosen = live[accessor.save_selection(shard.stats[live], mode == "delta")]
            shard.mark_saved(live, chosen, base=mode == "base")
            keys.append(shard.row_keys[chosen])
            rows.append(shard.data[chosen])
            stats.append(shard.stats[chosen])
            tombs.append(shard.take_tombstones(clear=True))
    all_keys = np.concatenate(keys)
    order = np.argsort(all_keys)
    all_keys = all_keys[order]
    dead = np.concatenate(tombs)
    dead = dead[~np.isin(dead, all_keys)] if mode == "delta" else dead[:0]
    return (all_keys, np.concatenate(rows)[order], np.concatenate(stats)[order],
            np.sort(dead))


def _is_tiered(table: Table) -> bool:
    return isinstance(table, SparseTable) and table.disk is not None


def _stream(tables: Mapping[int, Table], mode: SaveMode) -> dict[int, TieredSnapshot]:
    """The copies of the tables with a disk tier (``persist_stream.snapshot_tiered``)."""
    return {tid: snapshot_tiered(t, mode) for tid, t in sorted(tables.items())
            if isinstance(t, SparseTable) and t.disk is not None}


def snapshot_mode(tables: Mapping[int, Table], mode: SaveMode) -> ModeSnapshot:
    """Copy what a save of ``mode`` writes (the caller keeps pushes out meanwhile).

    Raises:
        ConfigError: ``mode`` is unknown, or ``delta`` names a sparse table with a
            lifecycle but without the ``ctr`` accessor (checked before any table
            changes).
    """
    check_save_mode(mode)
    if mode == "full":
        tombs: dict[int, np.ndarray] = {}
        in_memory = {tid: t for tid, t in tables.items() if not _is_tiered(t)}
        for tid, t in in_memory.items():
            if _is_ctr(t):
                assert isinstance(t, SparseTable)
                tombs[tid] = np.unique(np.concatenate(
                    [s.take_tombstones(clear=False) for s in t.shards]))
        return ModeSnapshot(mode, snapshot_tables(in_memory), snapshot_stats(in_memory),
                            tombs, _stream(tables, mode))
    if mode == "delta":
        untracked = [f"{tid} ({t.config.name!r})" for tid, t in sorted(tables.items())
                     if isinstance(t, SparseTable) and not _is_ctr(t)
                     and t.config.accessor.active]
        if untracked:
            raise ConfigError(f"save mode 'delta': sparse tables {untracked} delete or "
                              "evict rows but have no ctr accessor (no delta_score nor "
                              "tombstones); give them accessor name 'ctr', or save with "
                              "mode 'full' or 'base'")
    out = ModeSnapshot(mode, {}, {}, {}, _stream(tables, mode))
    for tid, table in tables.items():
        if _is_tiered(table):
            continue
        if _is_ctr(table):
            assert isinstance(table, SparseTable)
            keys, rows, stats, dead = _select_ctr(table, mode)
            out.tables[tid] = (table.config, keys, rows)
            out.stats[tid] = (keys, stats)
            if mode == "delta":
                out.tombs[tid] = dead
        else:
            out.tables.update(snapshot_tables({tid: table}))
    return out


def write_mode_snapshot(snap: ModeSnapshot, dirname: str | Path | Storage,
                        server_index: int, dense_index: Mapping[int, np.ndarray]
                        ) -> list[FileDigest]:
    """Write a :class:`ModeSnapshot` under ``dirname/server-<server_index>/``: the
    table files (``psfleet.ps.persist.write_snapshot``), the ``.tomb`` files and
    ``save.json``. Returns every file's digest; raises as ``write_snapshot``."""
    storage = _storage(dirname)
    folder = f"server-{server_index}"
    digests = write_snapshot(snap.tables, storage, server_index, dense_index, snap.stats,
                             snap.streamed)
    tombs = dict(snap.tombs)
    tombs.update({tid: s.tombs for tid, s in snap.streamed.items() if s.tombs is not None
                  and snap.mode != "base"})
    for table_id, keys in sorted(tombs.items()):
        rel = f"{folder}/table-{table_id}.tomb"
        with storage.write(rel) as writer:
            writer.write(_TOMB_HEADER.pack(_TOMB_MAGIC, TOMB_VERSION, 0, keys.size))
            writer.write(np.ascontiguousarray(keys, dtype="<u8"))
        digests.append(FileDigest(rel, writer.size, writer.hash.hexdigest()))
    digests.append(storage.write_bytes(f"{folder}/save.json",
                                       (json.dumps({"mode": snap.mode}) + "\n").encode()))
    return digests


def _servers(storage: Storage) -> list[str]:
    return sorted(n for n in storage.listdir() if n.startswith("server-") and n[7:].isdigit())


def saved_mode(dirname: str | Path | Storage) -> SaveMode:
    """The mode of a save (``save.json`` of its servers; none: ``full``, as saves made
    before the modes existed).

    Raises:
        DataError: a ``save.json`` is unreadable, or the servers' modes differ.
    """
    storage = _storage(dirname)
    modes = set()
    for server in _servers(storage):
        if not storage.exists(server, "save.json"):
            modes.add("full")
            continue
        rel = f"{server}/save.json"
        try:
            mode = json.loads(storage.read_bytes(rel))["mode"]
            modes.add(check_save_mode(mode, f"{storage.url}/{rel}"))
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            raise DataError(f"{storage.url}/{rel}: not a save mode file ({exc})") from None
    if len(modes) > 1:
        raise DataError(f"{storage.url}: the servers' save.json files give modes "
                        f"{sorted(modes)}; the folder mixes several saves")
    return modes.pop() if modes else "full"  # type: ignore[return-value]


def read_tombstones(dirname: str | Path | Storage, table_id: int,
                    config: SparseTableConfig, server_index: int = 0,
                    server_num: int = 1) -> np.ndarray:
    """uint64[t]: the tombstones of table ``table_id`` in a save whose bucket server
    ``server_index`` of ``server_num`` owns, ascending (none: empty).

    Raises:
        DataError: a ``.tomb`` file is truncated or not one (names it).
    """
    storage = _storage(dirname)
    owned = BucketRouter(config.num_buckets, server_num).bucket_map == server_index
    found = [np.zeros(0, dtype=np.uint64)]
    for server in _servers(storage):
        if not storage.exists(server, f"table-{table_id}.tomb"):
            continue
        rel = f"{server}/table-{table_id}.tomb"
        raw = storage.read_bytes(rel)
        head = raw[: _TOMB_HEADER.size]
        if len(head) != _TOMB_HEADER.size:
            raise DataError(f"{storage.url}/{rel}: truncated tombstone file (no header)")
        magic, version, _, n = _TOMB_HEADER.unpack(head)
        if magic != _TOMB_MAGIC or version != TOMB_VERSION \
                or len(raw) != _TOMB_HEADER.size + 8 * n:
            raise DataError(f"{storage.url}/{rel}: not a tombstone file of version "
                            f"{TOMB_VERSION} with {n} keys ({len(raw)} bytes); damaged")
        keys = np.frombuffer(raw, dtype="<u8", offset=_TOMB_HEADER.size).astype(np.uint64)
        found.append(keys[owned[bucket_of(keys, config.num_buckets)]])
    return np.unique(np.concatenate(found))


def remove_keys(table: SparseTable, keys: np.ndarray) -> int:
    """Delete the rows of ``keys`` (uint64[n], distinct) that ``table`` holds (a
    delta's tombstones; they make no tombstone themselves). Returns the rows deleted.
    Tables without a lifecycle are left alone (no save gives them tombstones)."""
    removed = 0
    if not keys.size or table.lifecycle is None:
        return 0
    shard_ids = table.shard_of(keys)
    for i, shard in enumerate(table.shards):
        mine = keys[shard_ids == i]
        if not mine.size:
            continue
        with shard.lock:
            rows = shard.index.lookup(mine)
            if table.disk is not None:
                removed += table.disk.delete(shard.number, mine[rows < 0])
            rows = rows[rows >= 0]
            if shard.saved is not None:
                shard.saved[rows] = False
            shard.free_rows(rows)
            removed += int(rows.size)
    return removed


def restore_tombstones(table: SparseTable, keys: np.ndarray) -> None:
    """Make ``keys`` (uint64[n]) pending tombstones of ``table`` again (a full save's,
    loaded); no-op without the ctr accessor."""
    if not _is_ctr(table) or not keys.size:
        return
    shard_ids = table.shard_of(keys)
    for i, shard in enumerate(table.shards):
        with shard.lock:
            shard.add_tombstones(keys[shard_ids == i])


def apply_delta(tables: Mapping[int, Table], dirname: str | Path | Storage,
                server_index: int, server_num: int,
                dense_index: Mapping[int, np.ndarray]) -> dict[int, int]:
    """Apply a delta save on top of ``tables`` (live or being rebuilt).

    Everything this server owns is read first into staging tables (so a damaged file
    changes nothing), then per sparse table the tombstones are removed and the rows
    (values, rule state, statistics) upserted; dense tables take the saved values.

    Returns:
        Rows upserted (sparse) or elements loaded (dense) per table id.

    Raises:
        What ``psfleet.ps.persist.load_server`` raises; DataError for a damaged
        ``.tomb`` file.
    """
    staged: dict[int, Table] = {}
    tombs: dict[int, np.ndarray] = {}
    for tid, table in tables.items():
        if isinstance(table, SparseTable):
            accessor = table.config.accessor.model_copy(
                update={"max_rows": None, "admission": "none"})
            staged[tid] = SparseTable(table.config.model_copy(update={"accessor": accessor}))
            tombs[tid] = read_tombstones(dirname, tid, table.config, server_index,
                                         server_num)
    loaded = load_server(staged, dirname, server_index, server_num, {})
    dense = {tid: t for tid, t in tables.items() if isinstance(t, DenseTable)}
    loaded.update(load_server(dense, dirname, server_index, server_num, dense_index))
    for tid, stage in staged.items():
        table = tables[tid]
        assert isinstance(table, SparseTable) and isinstance(stage, SparseTable)
        remove_keys(table, tombs[tid])
        keys, rows = stage.items()
        table.load(keys, rows)
        if _is_ctr(table):
            table.load_stats(*stage.stats_items())
    return loaded
