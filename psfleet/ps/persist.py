"""Saving a server's tables through fsspec and loading them into any number of servers.

Layout under a save's folder (a checkpoint, or ``fleet.save_persistables(dirname)``)::

    server-<i>/tables.json          {table_id: TableConfig JSON} of the tables server i held
    server-<i>/table-<id>.sparse    a sparse table's rows, grouped by virtual bucket
    server-<i>/table-<id>.dense     a dense table's values, rule state and flat index (npz)
    server-<i>/table-<id>.stats     a ctr table's row statistics (psfleet.ps.persist_stats)
    manifest.json                   written last by worker 0 (see psfleet.checkpoint)

A ``.sparse`` file (all little-endian)::

    magic b"PSFLSPRS" | uint32 version | uint32 dim | uint32 width | uint32 num_buckets
    | uint64 n | int64 offsets[num_buckets + 1] | uint64 keys[n] | float32 rows[n, width]

``width`` = dim + the rule's state width; each row is the values then the rule state.
Rows are sorted by (bucket, key); the rows of bucket ``b`` are
``offsets[b] .. offsets[b+1]``, so a loader reads only the byte ranges of the buckets
it owns. A ``.dense`` file is an npz with ``values`` float32[n], ``state`` (the rule
state, see ``Rule.state_width``) and ``index`` int64[n], the elements' positions in
the flat dense vector. Loading keeps the sparse rows whose bucket the loading server
owns now (``BucketRouter``: bucket ``b`` -> server ``b % server_num``) and the dense
elements of its current blocks, so a save loads into any server count.

Every file is written under a temporary name and renamed when complete; each write
returns the file's SHA-256 for the manifest. A table with a disk tier writes the same
files from a stream (``psfleet.ps.persist_stream``, :class:`StreamedTable`).
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Protocol

import numpy as np

from psfleet.checkpoint.storage import FileDigest, Storage
from psfleet.errors import ConfigError, DataError, RemoteError
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.persist_stats import StatsSnapshot, load_stats, snapshot_stats, write_stats
from psfleet.ps.routing import BucketRouter, bucket_of
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import TableConfig, table_config_from_json

__all__ = ["save_server", "load_server", "snapshot_tables", "write_snapshot",
           "saved_table_configs", "saved_dense_index", "Snapshot", "StreamedTable",
           "FORMAT_VERSION"]

FORMAT_VERSION = 2

Table = SparseTable | DenseTable
_MAGIC = b"PSFLSPRS"
_HEADER = struct.Struct("<8sIIIIQ")
#: Merge two byte ranges of a file into one read when fewer bytes than this lie between.
_MERGE_GAP_BYTES = 1 << 18

#: One table's copy taken at one moment: sparse (keys, rows) or dense (values, state).
Snapshot = dict[int, tuple[TableConfig, np.ndarray, np.ndarray]]


class StreamedTable(Protocol):
    """A table's copy written as a stream (a tiered table: ``psfleet.ps.persist_stream``)."""

    @property
    def config(self) -> TableConfig:
        """The table's config (``tables.json``)."""

    def write(self, storage: Storage, folder: str, table_id: int) -> list[FileDigest]:
        """Write the table's files under ``folder``; their digests."""


def _storage(dirname: str | Path | Storage) -> Storage:
    """``dirname`` as a Storage.

    Raises:
        ConfigError: an unknown protocol, or one whose fsspec package is not installed
            (a request's dirname, so the server answers INVALID_ARGUMENT).
    """
    if isinstance(dirname, Storage):
        return dirname
    try:
        return Storage(dirname)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"{str(dirname)[:200]!r} is not a folder this process can use "
                          f"({type(exc).__name__}: {exc}); give a local path or an fsspec "
                          "URL of an installed filesystem (file://, memory://, s3:// with "
                          "s3fs)") from None


def snapshot_tables(tables: Mapping[int, Table]) -> Snapshot:
    """Copy every table's values and rule state into memory.

    The caller makes the copy consistent by keeping writes out meanwhile (the server
    closes its push gate); the file writing then happens outside (:func:`write_snapshot`).

    Returns:
        ``{table_id: (config, a, b)}``: sparse: keys uint64[n] and rows
        float32[n, dim + state]; dense: values float32[n] and state.
    """
    out: Snapshot = {}
    for table_id, table in tables.items():
        if isinstance(table, SparseTable):
            keys, rows = table.items()
            out[table_id] = (table.config, keys, rows)
        else:
            values, state = table.state()
            out[table_id] = (table.config, values, state)
    return out


def _sparse_bytes(config: TableConfig, keys: np.ndarray, rows: np.ndarray
                  ) -> tuple[bytes, np.ndarray, np.ndarray]:
    assert config.kind == "sparse"
    buckets = bucket_of(keys, config.num_buckets)
    order = np.lexsort((keys, buckets))
    counts = np.bincount(buckets, minlength=config.num_buckets)
    offsets = np.zeros(config.num_buckets + 1, dtype="<i8")
    np.cumsum(counts, out=offsets[1:])
    header = _HEADER.pack(_MAGIC, FORMAT_VERSION, config.dim, rows.shape[1],
                          config.num_buckets, keys.size)
    return header + offsets.tobytes(), keys[order], rows[order]


def write_snapshot(snapshot: Snapshot, dirname: str | Path | Storage, server_index: int,
                   dense_index: Mapping[int, np.ndarray],
                   stats: StatsSnapshot | None = None,
                   streamed: Mapping[int, StreamedTable] | None = None) -> list[FileDigest]:
    """Write a snapshot's files under ``dirname/server-<server_index>/``.

    Args:
        snapshot: from :func:`snapshot_tables`.
        stats: the ctr tables' statistics taken with it
            (``psfleet.ps.persist_stats.snapshot_stats``); None: none written.
        dirname: the save's folder (a path, an fsspec URL or a Storage).
        server_index: this server's index.
        dense_index: for each dense table, the flat indices (int64[n]) of its elements.
        streamed: tables (not in ``snapshot``) whose files they write themselves.

    Returns:
        The digest (path relative to ``dirname``, bytes, SHA-256) of every file written.

    Raises:
        RemoteError: a dense table's index is missing, of the wrong length or holds a
            negative position.
        OSError: a file cannot be written (files written before stay complete; no
            file appears half-written under its final name).
        ConfigError: ``dirname`` has an unknown protocol or one not installed.
    """
    storage = _storage(dirname)
    folder = f"server-{server_index}"
    digests = []
    configs = {}
    streamed = streamed or {}
    for table_id in sorted({*snapshot, *streamed}):
        if table_id in streamed:
            stream = streamed[table_id]
            configs[str(table_id)] = json.loads(stream.config.model_dump_json())
            digests += stream.write(storage, folder, table_id)
            continue
        config, a, b = snapshot[table_id]
        configs[str(table_id)] = json.loads(config.model_dump_json())
        if config.kind == "sparse":
            rel = f"{folder}/table-{table_id}.sparse"
            head, keys, rows = _sparse_bytes(config, a, b)
            with storage.write(rel) as writer:
                writer.write(head)
                writer.write(np.ascontiguousarray(keys, dtype="<u8"))
                writer.write(np.ascontiguousarray(rows, dtype="<f4"))
        else:
            index = dense_index.get(table_id)
            if index is None or index.size != a.size:
                raise RemoteError(f"save: dense table {table_id} needs the flat index of its "
                                  f"{a.size} elements from the worker")
            if index.size and int(index.min()) < 0:
                raise RemoteError(f"save: dense table {table_id}: the worker's flat index "
                                  f"holds {int(index.min())}; positions are >= 0")
            rel = f"{folder}/table-{table_id}.dense"
            buffer = io.BytesIO()
            np.savez(buffer, values=a, state=b, index=np.asarray(index, dtype="<i8"))
            with storage.write(rel) as writer:
                writer.write(buffer.getbuffer())
        digests.append(FileDigest(rel, writer.size, writer.hash.hexdigest()))
    digests += write_stats(storage, folder, stats or {})
    digests.append(storage.write_bytes(f"{folder}/tables.json",
                                       (json.dumps(configs, indent=1) + "\n").encode()))
    return digests


def save_server(tables: Mapping[int, Table], dirname: str | Path | Storage, server_index: int,
                dense_index: Mapping[int, np.ndarray]) -> list[FileDigest]:
    """Snapshot and write every table of one server (no concurrent writes assumed).

    See :func:`write_snapshot` for the arguments, result and errors.
    """
    return write_snapshot(snapshot_tables(tables), dirname, server_index, dense_index,
                          snapshot_stats(tables))


def _servers(storage: Storage) -> list[str]:
    return [n for n in storage.listdir() if n.startswith("server-") and n[7:].isdigit()]


def _files(storage: Storage, table_id: int, suffix: str) -> list[str]:
    files = [f"{s}/table-{table_id}.{suffix}" for s in _servers(storage)
             if storage.exists(s, f"table-{table_id}.{suffix}")]
    if not files:
        raise DataError(f"load: no saved file of table {table_id} under {storage.url!r} "
                        f"(server-*/table-{table_id}.{suffix}); pass a folder written by "
                        "fleet.save_persistables() or a checkpoint")
    return files


def saved_table_configs(dirname: str | Path | Storage, server_index: int) -> dict[int, TableConfig]:
    """The configs of the tables server ``server_index`` held in a save (``tables.json``).

    Raises:
        DataError: the file is missing or malformed (names it).
    """
    storage = _storage(dirname)
    rel = f"server-{server_index}/tables.json"
    try:
        raw = json.loads(storage.read_bytes(rel))
        return {int(k): table_config_from_json(json.dumps(v)) for k, v in raw.items()}
    except FileNotFoundError:
        raise DataError(f"{storage.url}/{rel}: missing; the save was made with another "
                        "server count or is incomplete") from None
    except (ValueError, AttributeError) as exc:
        raise DataError(f"{storage.url}/{rel}: not a table list ({exc})") from None


def saved_dense_index(dirname: str | Path | Storage, server_index: int,
                      table_id: int) -> np.ndarray:
    """The flat indices (int64[n]) of the dense elements server ``server_index`` held.

    Raises:
        DataError: the file is missing or unreadable (names it).
    """
    storage = _storage(dirname)
    rel = f"server-{server_index}/table-{table_id}.dense"
    try:
        with np.load(io.BytesIO(storage.read_bytes(rel))) as saved:
            return np.asarray(saved["index"], dtype=np.int64)
    except (FileNotFoundError, ValueError, OSError, KeyError) as exc:
        raise DataError(f"{storage.url}/{rel}: not a readable dense table file ({exc})"
                        ) from None


def saved_dense_part(dirname: str | Path | Storage, server_index: int, table_id: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Server ``server_index``'s part of dense table ``table_id`` in a save: (flat
    indexes int64[n], values float32[n], rule state float32[m]).

    Raises:
        DataError: the file is missing or damaged (names it).
    """
    storage = _storage(dirname)
    rel = f"server-{server_index}/table-{table_id}.dense"
    if not storage.exists(rel):
        raise DataError(f"{storage.url}/{rel}: missing")
    return _read_dense_part(storage, rel)


def _read_header(handle: IO[bytes], where: str, file_bytes: int
                 ) -> tuple[int, int, int, int, np.ndarray]:
    """The header and bucket offsets of a ``.sparse`` file of ``file_bytes`` bytes.

    Every size the header gives is checked against the file's size before anything
    is read or allocated from it, and the offsets must rise from 0 to ``n``.

    Raises:
        DataError: not such a file, or truncated or damaged (names ``where``).
    """
    raw = handle.read(_HEADER.size)
    if len(raw) != _HEADER.size:
        raise DataError(f"{where}: truncated (no header); the file is damaged")
    magic, version, dim, width, num_buckets, n = _HEADER.unpack(raw)
    if magic != _MAGIC or version != FORMAT_VERSION:
        raise DataError(f"{where}: not a psfleet sparse table file of format {FORMAT_VERSION}")
    need = 8 * (num_buckets + 1)
    if _HEADER.size + need + n * (8 + 4 * width) != file_bytes:
        raise DataError(f"{where}: {file_bytes} bytes, but its header says {num_buckets} "
                        f"buckets and {n} rows of {width} floats; the file is truncated or "
                        "damaged")
    offsets = np.frombuffer(handle.read(need), dtype="<i8")
    if (offsets.size != num_buckets + 1 or offsets[0] != 0 or offsets[-1] != n
            or (np.diff(offsets) < 0).any()):
        raise DataError(f"{where}: truncated or damaged bucket index")
    return dim, width, num_buckets, n, offsets


def _owned_ranges(offsets: np.ndarray, owned: np.ndarray, row_bytes: int
                  ) -> list[tuple[int, int]]:
    """Row ranges covering the owned buckets; ranges closer than the gap are merged."""
    ranges: list[tuple[int, int]] = []
    gap_rows = max(1, _MERGE_GAP_BYTES // row_bytes)
    for b in np.flatnonzero(owned):
        start, end = int(offsets[b]), int(offsets[b + 1])
        if end == start:
            continue
        if ranges and start - ranges[-1][1] <= gap_rows:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((start, end))
    return ranges


def _load_sparse(table: SparseTable, storage: Storage, files: list[str], server_index: int,
                 server_num: int) -> int:
    config = table.config
    owned = BucketRouter(config.num_buckets, server_num).bucket_map == server_index
    loaded = 0
    for rel in files:
        where = f"{storage.url}/{rel}"
        with storage.open(rel) as handle:
            dim, width, num_buckets, n, offsets = _read_header(handle, where,
                                                               storage.size(rel))
            if dim != table.dim:
                raise RemoteError(f"load: table {config.name!r} was saved with dim {dim}, "
                                  f"this model has dim {table.dim} ({where})")
            if num_buckets != config.num_buckets:
                raise RemoteError(f"load: table {config.name!r} was saved with num_buckets "
                                  f"{num_buckets}, this model has {config.num_buckets}")
            if width != table.dim + table.state_width:
                raise RemoteError(f"load: table {config.name!r} was saved with rows of "
                                  f"{width} floats, rule {config.rule.name!r} needs "
                                  f"{table.dim + table.state_width}: another optimizer rule")
            keys_at = _HEADER.size + 8 * (num_buckets + 1)
            rows_at = keys_at + 8 * n
            for start, end in _owned_ranges(offsets, owned, 4 * width):
                handle.seek(keys_at + 8 * start)
                keys = np.frombuffer(handle.read(8 * (end - start)), dtype="<u8")
                handle.seek(rows_at + 4 * width * start)
                rows = np.frombuffer(handle.read(4 * width * (end - start)), dtype="<f4")
                if keys.size != end - start or rows.size != width * (end - start):
                    raise DataError(f"{where}: truncated (rows {start}..{end} of {n} missing)")
                mine = owned[bucket_of(keys, num_buckets)]
                table.load(keys[mine], rows.reshape(-1, width)[mine])
                loaded += int(mine.sum())
    return loaded


def _read_dense_part(storage: Storage, rel: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One server's ``.dense`` file: (index int64[n], values float32[n], state float32[m]).

    Raises:
        DataError: not an npz with those arrays (integer index, as many values as
            positions), names the file.
    """
    where = f"{storage.url}/{rel}"
    try:
        with np.load(io.BytesIO(storage.read_bytes(rel))) as saved:
            index, values, state = saved["index"], saved["values"], saved["state"]
    except (ValueError, OSError, KeyError, EOFError) as exc:
        raise DataError(f"{where}: not a readable dense table file ({exc})") from None
    if (not np.issubdtype(index.dtype, np.integer) or index.ndim != 1
            or values.shape != index.shape or state.ndim != 1):
        raise DataError(f"{where}: damaged dense table file (index {index.dtype}"
                        f"{list(index.shape)}, values {values.dtype}{list(values.shape)}, "
                        f"state {state.dtype}{list(state.shape)}; expected int64[n], "
                        "float32[n], float32[m])")
    return (index.astype(np.int64, copy=False), values.astype(np.float32, copy=False),
            state.astype(np.float32, copy=False))


def _check_dense_cover(table: DenseTable, storage: Storage, files: list[str],
                       indices: list[np.ndarray]) -> None:
    """Check that the saved flat indices (int64 each) cover 0..n-1 exactly once, n their
    total count, as the servers of one save do together; else (a negative, repeated or
    out-of-range position: a damaged file, or files of several saves mixed) raise
    DataError naming the files, before anything is allocated from them. O(n)."""
    total = sum(i.size for i in indices)
    covered = np.zeros(total, dtype=bool)
    for positions in indices:
        if positions.size and (int(positions.min()) < 0 or int(positions.max()) >= total):
            break
        covered[positions] = True
    else:
        if covered.all():
            return
    raise DataError(f"load: dense table {table.config.name!r}: the flat indices in "
                    f"{[f'{storage.url}/{f}' for f in files]} do not cover positions 0.."
                    f"{total - 1} once each; the files are damaged or of different saves")


def _load_dense(table: DenseTable, storage: Storage, files: list[str], index: np.ndarray) -> int:
    rule = table.rule
    k, c = rule.element_states, rule.scalar_states
    parts = [_read_dense_part(storage, rel) for rel in files]
    _check_dense_cover(table, storage, files, [p[0] for p in parts])
    total = sum(p[0].size for p in parts)
    if index.size and int(index.min()) < 0:
        raise RemoteError(f"load: dense table {table.config.name!r}: the worker's flat index "
                          f"holds {int(index.min())}; positions are >= 0")
    if index.size and int(index.max()) >= total:
        raise RemoteError(f"load: dense table {table.config.name!r} was saved with {total} "
                          f"elements; this model has more ({int(index.max()) + 1}). Load into "
                          "the same model")
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


def load_server(tables: Mapping[int, Table], dirname: str | Path | Storage, server_index: int,
                server_num: int, dense_index: Mapping[int, np.ndarray]) -> dict[int, int]:
    """Load a save into one server's tables (created beforehand with the same configs).

    Args:
        tables: the server's tables by id.
        dirname: the save's folder (a path, an fsspec URL or a Storage).
        server_index, server_num: this server's place now (may differ from the save's).
        dense_index: for each dense table, the flat indices of the elements it holds now.

    Returns:
        Rows (sparse) or elements (dense) loaded per table id.

    Raises:
        DataError: a table has no saved file, a file is truncated, or the saved dense
            indices do not cover each position once (names the files).
        RemoteError: the saved table does not fit (names the table and both values),
            or ``dense_index`` holds a negative position.
        ConfigError: ``dirname`` has an unknown protocol or one not installed.
    """
    storage = _storage(dirname)
    loaded = {}
    for table_id, table in tables.items():
        if isinstance(table, SparseTable):
            files = _files(storage, table_id, "sparse")
            loaded[table_id] = _load_sparse(table, storage, files, server_index, server_num)
            load_stats(table, table_id, storage, _servers(storage), server_index, server_num)
        else:
            servers = _servers(storage)
            if (not any(storage.exists(s, f"table-{table_id}.dense") for s in servers)
                    and any(storage.exists(s, f"table-{table_id}.sparse") for s in servers)):
                raise RemoteError(f"load: table {table_id} was saved as sparse, is dense now")
            files = _files(storage, table_id, "dense")
            loaded[table_id] = _load_dense(table, storage, files, dense_index.get(
                table_id, np.zeros(0, np.int64)))
    return loaded
