"""Saving a tiered sparse table without holding it in memory (issue 17's saves, for
tables with a disk tier, ``psfleet.ps.table.disk_tier``).

A save of an in-memory table copies its rows under the push gate and writes the copy
(``psfleet.ps.persist``). A tiered table may be many times its memory budget, so its
save copies only what is in memory and reads the rest from disk while writing:

1. :func:`snapshot_tiered`, under the gate, each shard under its lock: the memory
   tier's rows to write (all of them, or a ctr table's base/delta selection, whose
   delta_score and ``saved`` flag are reset as ``psfleet.ps.persist_delta`` does),
   sorted by (bucket, key); a :class:`~psfleet.ps.table.disk_tier.DiskView` of the shard's
   rows on disk as they are at that moment, with their count per bucket; the
   shard's tombstones. For a base or delta save of a ctr table the disk rows' own
   reset is written back here too, in chunks (one pass over the shard's disk rows,
   as before: the time under the gate is that pass, the memory one chunk).
2. :meth:`TieredSnapshot.write`, after the gate opens: the ``.sparse`` file (and
   the ``.stats`` file of a ctr table) in chunks of about :data:`CHUNK_ROWS` rows,
   by ranges of buckets: each chunk merges the memory rows and the disk rows of its
   buckets, sorted by (bucket, key). The file's bucket index comes first, from the
   counts; its keys, then its rows, take one pass over the views each.

The files are those of an in-memory table with the same rows, byte for byte for the
``.sparse`` file (same header, bucket index, order). The ``.stats`` npz holds the
same keys and statistics in (bucket, key) order instead of ascending key order
(written as a stream, without a seekable file); ``persist_stats.load_stats`` reads
either. A save's extra memory is the memory tier's copy plus a chunk (and a bucket
holding more rows than a chunk is read whole).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, cast

import numpy as np

from psfleet.checkpoint.storage import FileDigest, Storage
from psfleet.ps.persist import _HEADER, _MAGIC, FORMAT_VERSION
from psfleet.ps.routing import bucket_of
from psfleet.ps.table.accessor import CtrAccessor
from psfleet.ps.table.disk_tier import DiskRows, DiskTier, DiskView
from psfleet.ps.table.shard import DELTA_SCORE
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import SaveMode, SparseTableConfig

__all__ = ["CHUNK_ROWS", "TieredSnapshot", "snapshot_tiered"]

#: Rows a chunk of a streamed save holds (about; whole buckets).
CHUNK_ROWS = 1 << 16


@dataclass
class _Piece:
    """Rows to write, sorted by (bucket, key): keys uint64[n], buckets int64[n],
    data float32[n, width], stats float32[n, 4] or None."""

    keys: np.ndarray
    buckets: np.ndarray
    data: np.ndarray
    stats: np.ndarray | None

    def between(self, lo: int, hi: int) -> _Piece:
        """The rows of buckets ``lo`` .. ``hi`` - 1 (views)."""
        a, b = np.searchsorted(self.buckets, [lo, hi])
        return _Piece(self.keys[a:b], self.buckets[a:b], self.data[a:b],
                      None if self.stats is None else self.stats[a:b])


@dataclass
class TieredSnapshot:
    """A tiered sparse table's save, copied at one moment, written later.

    Attributes:
        config: the table's config.
        memory: per shard, the memory tier's rows to write.
        views: per shard, its rows on disk at that moment.
        bucket_rows: int64[num_buckets]: rows to write per bucket (both tiers).
        select: the ctr accessor selecting the disk rows a base/delta save writes
            (their delta_score is written as 0); None: every row.
        delta: the selection is a delta's.
        tombs: the tombstones (uint64, ascending) the save writes: a delta's, less
            the keys it writes as rows once :meth:`write` returns; None: not a ctr
            table.
    """

    config: SparseTableConfig
    memory: list[_Piece]
    views: list[DiskView]
    bucket_rows: np.ndarray
    select: CtrAccessor | None = None
    delta: bool = False
    tombs: np.ndarray | None = None

    def write(self, storage: Storage, folder: str, table_id: int) -> list[FileDigest]:
        """Write ``folder/table-<id>.sparse`` (and ``.stats`` for a ctr table).

        Blocks; reads the disk tier twice (keys, then rows). Single use: the views
        are closed afterwards.

        Returns:
            The files' digests.

        Raises:
            OSError: a file cannot be written (none appears half-written).
        """
        config = self.config
        width = self.memory[0].data.shape[1]
        n = int(self.bucket_rows.sum())
        offsets = np.zeros(config.num_buckets + 1, dtype="<i8")
        np.cumsum(self.bucket_rows, out=offsets[1:])
        ranges = _bucket_ranges(self.bucket_rows, CHUNK_ROWS)
        ctr = self.memory[0].stats is not None
        tombs = np.zeros(0, np.uint64) if self.tombs is None or not self.delta else self.tombs
        tomb_buckets = bucket_of(tombs, config.num_buckets)
        order = np.lexsort((tombs, tomb_buckets))  # as the rows: by (bucket, key)
        tombs, tomb_buckets = tombs[order], tomb_buckets[order]
        written = np.zeros(tombs.size, dtype=bool)  # tombstones written as rows
        sparse_rel, stats_rel = f"{folder}/table-{table_id}.sparse", \
            f"{folder}/table-{table_id}.stats"
        digests: list[FileDigest] = []
        try:
            with storage.write(sparse_rel) as out, \
                    _npz_file(storage, stats_rel, ctr, digests) as stats_file:
                out.write(_HEADER.pack(_MAGIC, FORMAT_VERSION, config.dim, width,
                                       config.num_buckets, n))
                out.write(offsets)
                stats_file.begin("keys", "<u8", (n,))
                for (lo, hi), chunk in zip(ranges, self._chunks(ranges), strict=True):
                    out.write(np.ascontiguousarray(chunk.keys, dtype="<u8"))  # the keys
                    stats_file.write(chunk.keys.astype("<u8"))
                    a, b = np.searchsorted(tomb_buckets, [lo, hi])
                    written[a:b] = np.isin(tombs[a:b], chunk.keys)
                stats_file.begin("stats", "<f4", (n, 4))
                for chunk in self._chunks(ranges):  # the rows
                    out.write(np.ascontiguousarray(chunk.data, dtype="<f4"))
                    if chunk.stats is not None:
                        stats_file.write(chunk.stats.astype("<f4"))
            digests.append(FileDigest(sparse_rel, out.size, out.hash.hexdigest()))
        finally:
            for view in self.views:
                view.close()
        if self.tombs is not None and self.delta:
            self.tombs = np.sort(tombs[~written])
        return digests

    def _chunks(self, ranges: list[tuple[int, int]]) -> Iterator[_Piece]:
        """Every chunk, in order (one pass over the views)."""
        for view in self.views:
            view.rewind()
        for lo, hi in ranges:
            yield self.chunk(lo, hi)

    def chunk(self, lo: int, hi: int) -> _Piece:
        """The rows of buckets ``lo`` .. ``hi`` - 1 (read in ascending ranges after a
        rewind), sorted by (bucket, key)."""
        parts = [piece.between(lo, hi) for piece in self.memory]
        for view in self.views:
            rows = view.read_to(hi)
            if rows.keys.size:
                parts.append(self._chosen(rows))
        keys = np.concatenate([p.keys for p in parts])
        buckets = np.concatenate([p.buckets for p in parts])
        order = np.lexsort((keys, buckets))
        stats = None if parts[0].stats is None else \
            np.concatenate([p.stats for p in parts])[order]  # type: ignore[misc]
        return _Piece(keys[order], buckets[order],
                      np.concatenate([p.data for p in parts])[order], stats)

    def _chosen(self, rows: DiskRows) -> _Piece:
        """The disk rows this save writes, as they are written (module docstring)."""
        assert rows.buckets is not None
        if self.select is None:
            return _Piece(rows.keys, rows.buckets, rows.data, rows.stats)
        assert rows.stats is not None
        pick = self.select.save_selection(rows.stats, self.delta)
        stats = rows.stats[pick]
        stats[:, DELTA_SCORE] = 0
        return _Piece(rows.keys[pick], rows.buckets[pick], rows.data[pick], stats)


class _NpzStream:
    """The arrays of an npz (``np.load`` reads it) written in pieces: :meth:`begin`
    one, :meth:`write` its data in C order, then the next. A no-op without an
    archive."""

    def __init__(self, archive: zipfile.ZipFile | None) -> None:
        self._archive = archive
        self._entry: IO[bytes] | None = None

    def begin(self, name: str, dtype: str, shape: tuple[int, ...]) -> None:
        """Start array ``name`` of ``dtype`` (little-endian) and ``shape``."""
        if self._archive is None:
            return
        self.close()
        self._entry = self._archive.open(f"{name}.npy", "w", force_zip64=True)
        np.lib.format.write_array_header_1_0(
            self._entry, {"descr": dtype, "fortran_order": False, "shape": shape})

    def write(self, data: np.ndarray) -> None:
        """Append ``data`` (of the array's dtype) to the array begun last."""
        if self._entry is not None:
            self._entry.write(data.tobytes())

    def close(self) -> None:
        """End the array begun last."""
        if self._entry is not None:
            self._entry.close()
            self._entry = None


@contextmanager
def _npz_file(storage: Storage, rel: str, enabled: bool, digests: list[FileDigest]
              ) -> Iterator[_NpzStream]:
    """An npz written as a stream to ``rel`` (its digest appended to ``digests`` once
    complete), or a no-op stream when not ``enabled``."""
    if not enabled:
        yield _NpzStream(None)
        return
    with storage.write(rel) as out, zipfile.ZipFile(
            cast(IO[bytes], out), "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        stream = _NpzStream(archive)
        yield stream
        stream.close()
    digests.append(FileDigest(rel, out.size, out.hash.hexdigest()))


def _bucket_ranges(bucket_rows: np.ndarray, chunk_rows: int) -> list[tuple[int, int]]:
    """Consecutive bucket ranges [lo, hi) covering every bucket, each with about
    ``chunk_rows`` rows (less than 2 x ``chunk_rows`` unless one bucket holds more)."""
    before = np.concatenate([[0], np.cumsum(bucket_rows)[:-1]])  # rows before each bucket
    starts = np.flatnonzero(np.diff(before // chunk_rows)) + 1
    edges = [0, *starts.tolist(), bucket_rows.size]
    return list(zip(edges[:-1], edges[1:], strict=True))


def snapshot_tiered(table: SparseTable, mode: SaveMode) -> TieredSnapshot:
    """Copy what a save of ``mode`` writes of a tiered table (module docstring, step 1).

    Call with pushes held back (the server's push gate); each shard is locked in turn.
    A base or delta save of a ctr table resets delta_score and ``saved`` in both tiers
    here (``psfleet.ps.persist_delta``), and takes the tombstones (a full save reads
    them, a base or delta clears them).

    Args:
        table: a table with a disk tier.
        mode: ``full``, ``base`` or ``delta`` (a delta only of a ctr table; checked by
            the caller).

    Returns:
        The snapshot, to :meth:`~TieredSnapshot.write` once the gate is open.
    """
    disk = table.disk
    assert disk is not None
    config = table.config
    ctr = config.accessor.name == "ctr"
    select = CtrAccessor(config.accessor) if ctr and mode != "full" else None
    delta = mode == "delta"
    memory: list[_Piece] = []
    views: list[DiskView] = []
    bucket_rows = np.zeros(config.num_buckets, dtype=np.int64)
    tombs = []
    for shard in table.shards:
        with shard.lock:
            live = shard.live_rows()
            if select is not None:
                assert shard.stats is not None and shard.saved is not None
                chosen = live[select.save_selection(shard.stats[live], delta)]
                shard.mark_saved(live, chosen, base=mode == "base")
                live = chosen
            keys = shard.row_keys[live]
            buckets = bucket_of(keys, config.num_buckets)
            order = np.lexsort((keys, buckets))
            live = live[order]
            memory.append(_Piece(keys[order], buckets[order], shard.data[live],
                                 None if shard.stats is None else shard.stats[live]))
            bucket_rows += np.bincount(buckets, minlength=config.num_buckets)
            if ctr:
                tombs.append(shard.take_tombstones(clear=mode != "full"))
            view = disk.view(shard.number)
            if select is None:
                bucket_rows += view.bucket_rows
            else:
                bucket_rows += _reset_disk(disk, view, select, delta)
            views.append(view)
    dead = None
    if ctr:
        dead = np.unique(np.concatenate(tombs)) if mode != "base" else np.zeros(0, np.uint64)
    return TieredSnapshot(config, memory, views, bucket_rows, select, delta, dead)


def _reset_disk(disk: DiskTier, view: DiskView, select: CtrAccessor, delta: bool
                ) -> np.ndarray:
    """Reset delta_score and ``saved`` of the view's shard's disk rows as a base
    (``delta`` False) or delta save does, in chunks of :data:`CHUNK_ROWS`; the caller
    holds the shard's lock. Returns int64[num_buckets]: the rows the save writes per
    bucket. The view is rewound for the writer."""
    chosen = np.zeros(disk.num_buckets, dtype=np.int64)
    for _, end in _bucket_ranges(view.bucket_rows, CHUNK_ROWS):
        rows = view.read_to(end)
        if not rows.keys.size:
            continue
        assert rows.stats is not None and rows.buckets is not None
        pick = select.save_selection(rows.stats, delta)
        stats = rows.stats.copy()
        saved = rows.saved.copy()
        if delta:
            stats[pick, DELTA_SCORE] = 0
        else:
            stats[:, DELTA_SCORE] = 0
            saved[:] = False
        saved[pick] = True
        changed = (stats[:, DELTA_SCORE] != rows.stats[:, DELTA_SCORE]) | (saved != rows.saved)
        disk.rewrite(view.shard, rows.keys[changed], rows.data[changed], stats[changed],
                     saved[changed])
        chosen += np.bincount(rows.buckets[pick], minlength=disk.num_buckets)
    view.rewind()
    return chosen
