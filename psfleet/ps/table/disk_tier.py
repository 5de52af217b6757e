"""The disk tier of a sparse table: rows spilled from its memory tier, in RocksDB.

A table with ``AccessorConfig.memory_rows`` (or ``memory_budget_bytes``) keeps at most
that many rows per server in memory; when a shard is full, its least recently used
rows *spill* here instead of being dropped, and a pull or push of a spilled key
*promotes* its row back into memory (``psfleet.ps.table.sparse_table``). Workers never see
which tier a row is in: values, rule state and CTR statistics travel with the row.

Store: RocksDB through ``rocksdict``, one database per table per server, in a fresh
folder under ``disk_dir`` (the system's temporary folder by default), removed with
the table. Chosen over LMDB on measurements (``benchmarks/tiered_table.py``, 400k
rows of 193 floats): LMDB reads 5x faster, but it reads through a memory map, so every
row read stays in the server's resident memory; RocksDB reads into a block cache of
fixed size, which keeps the server's RSS at the memory tier's budget plus a constant.
Writes skip the write-ahead log: the tier is not durable (a restarted server reloads
its rows from the newest checkpoint, as without a disk tier).

A record is keyed by (shard, bucket, key): the shard as 2 bytes, the key's virtual
bucket (``psfleet.ps.routing.bucket_of``) as 4, then the key's 8 bytes, all big-endian,
so each shard's rows are one key range, ordered by (bucket, key): the order of a
``.sparse`` file (``psfleet.ps.persist``), which a save streams the rows in
(:class:`DiskView`, ``psfleet.ps.persist_stream``). Its value is float32
``[width | stats (4, ctr tables) | saved | day]``: the row (values, then rule state),
the statistics, the row's ``saved`` flag (in the base/delta chain) and the tier's day
count when it spilled. ``age_one_day`` only counts days here; a row's unseen_days
grow by the days it spent on disk when it is read. The tier counts its rows per
bucket, so a save knows its file's bucket index before it reads a row. Every
operation of pull and push is vectorised over the request's keys: encoding, decoding
and the store's batch calls run in C (no Python loop per key); a :class:`DiskView`
steps a RocksDB iterator in a Python loop (rocksdict has no batch read of a range
that keeps a fixed view), about 0.5 us a row, on the save path only.
"""

from __future__ import annotations

import collections
import itertools
import operator
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import rocksdict

from psfleet.ps.routing import bucket_of
from psfleet.ps.table.shard import UNSEEN_DAYS

__all__ = ["DiskRows", "DiskTier", "DiskView"]

_KEY = np.dtype([("shard", ">u2"), ("bucket", ">u4"), ("key", ">u8")])
_BLOCK_CACHE_BYTES = 32 << 20
_WRITE_BUFFER_BYTES = 16 << 20


@dataclass
class DiskRows:
    """Rows read from the disk tier, aligned with ``keys``.

    Attributes:
        keys: uint64[F].
        data: float32[F, width]: values then rule state.
        stats: float32[F, 4] (unseen_days including the days on disk), or None for a
            table without CTR statistics.
        saved: bool[F]: the row was in the base/delta chain when it spilled.
        buckets: int64[F]: the keys' virtual buckets (rows read by a
            :class:`DiskView`), or None.
    """

    keys: np.ndarray
    data: np.ndarray
    stats: np.ndarray | None
    saved: np.ndarray
    buckets: np.ndarray | None = None


class DiskTier:
    """One table's spilled rows on one server. Thread safe per shard: callers hold the
    shard's lock for every call naming that shard.

    Args:
        width: floats per row (dim + rule state).
        stats: rows carry CTR statistics (4 float32).
        num_buckets: the table's virtual buckets (``SparseTableConfig.num_buckets``).
        disk_dir: the folder to create this tier's folder in (None: the system's
            temporary folder).
        label: the table's name, in the folder's name.
        num_shards: the table's internal shards (``SparseTableConfig.num_shards``).

    Raises:
        OSError: the folder cannot be created (names it).
    """

    def __init__(self, width: int, stats: bool, disk_dir: str | None, label: str,
                 num_buckets: int = 4096, num_shards: int = 1) -> None:
        self.width = width
        self.has_stats = stats
        self.num_buckets = num_buckets
        self._record = width + (4 if stats else 0) + 2  # floats per record
        parent = Path(disk_dir) if disk_dir else Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() else "_" for c in label)[:40]
        self.path = Path(tempfile.mkdtemp(prefix=f"psfleet-{safe}-", dir=parent))
        options = rocksdict.Options(raw_mode=True)
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(10, False)  # a lookup of an absent key skips most files
        table.set_block_cache(rocksdict.Cache(_BLOCK_CACHE_BYTES))
        options.set_block_based_table_factory(table)
        options.set_write_buffer_size(_WRITE_BUFFER_BYTES)
        options.set_max_write_buffer_number(2)
        options.set_compression_type(rocksdict.DBCompressionType.none())
        self._db = rocksdict.Rdict(str(self.path), options)
        write = rocksdict.WriteOptions()
        write.disable_wal = True  # type: ignore[method-assign,assignment]  # a property
        self._db.set_write_options(write)
        self._counts: collections.Counter[int] = collections.Counter()  # rows per shard
        # rows per (shard, bucket): a shard's keys come from every bucket
        self._bucket_rows = np.zeros((num_shards, num_buckets), dtype=np.int64)
        self._lock = threading.Lock()  # the counts and the day
        self.day = 0
        self._closer = weakref.finalize(self, _close, self._db, self.path)

    # -- size ------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    @property
    def disk_bytes(self) -> int:
        """Bytes of the store's files on disk (SST files and the memtables)."""
        files = self._db.property_int_value("rocksdb.total-sst-files-size") or 0
        tables = self._db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
        return int(files + tables)

    def rows_in(self, shard: int) -> int:
        """Rows of ``shard`` on disk."""
        with self._lock:
            return self._counts[shard]

    # -- rows ------------------------------------------------------------------------

    def spill(self, shard: int, keys: np.ndarray, data: np.ndarray,
              stats: np.ndarray | None, saved: np.ndarray) -> None:
        """Write rows that leave the memory tier (keys uint64[n], not on disk;
        data float32[n, width]; stats float32[n, 4] or None; saved bool[n])."""
        if not keys.size:
            return
        buckets = self._put(shard, keys, data, stats, saved)
        with self._lock:
            self._counts[shard] += keys.size
            np.add.at(self._bucket_rows[shard], buckets, 1)

    def rewrite(self, shard: int, keys: np.ndarray, data: np.ndarray,
                stats: np.ndarray | None, saved: np.ndarray) -> None:
        """Write rows over the records of the same ``keys`` (uint64[n], all on disk;
        the other arguments as :meth:`spill`): a save's reset of delta_score and
        ``saved``. The rows count as spilled today (their stats' unseen_days are
        as of now)."""
        if keys.size:
            self._put(shard, keys, data, stats, saved)

    def _put(self, shard: int, keys: np.ndarray, data: np.ndarray,
             stats: np.ndarray | None, saved: np.ndarray) -> np.ndarray:
        """Write the records of ``keys`` (see :meth:`spill`); returns their buckets."""
        record = np.empty((keys.size, self._record), dtype=np.float32)
        record[:, : self.width] = data
        if self.has_stats:
            assert stats is not None
            record[:, self.width: self.width + 4] = stats
        record[:, -2] = saved
        record[:, -1] = self.day
        encoded, buckets = self._encode(shard, keys)
        batch = rocksdict.WriteBatch(raw_mode=True)
        collections.deque(map(batch.put, encoded,
                              record.view(f"V{4 * self._record}").ravel().tolist()),
                          maxlen=0)
        self._db.write(batch)
        return buckets

    def read(self, shard: int, keys: np.ndarray, take: bool) -> tuple[np.ndarray, DiskRows]:
        """The rows of distinct ``keys`` (uint64[N]) that are on disk.

        Args:
            take: delete the rows found (a promotion into memory).

        Returns:
            (found bool[N], the found keys' rows in the order of ``keys``).
        """
        if not keys.size or not self.rows_in(shard):
            return np.zeros(keys.size, dtype=bool), self._decode(keys[:0], b"")
        encoded, buckets = self._encode(shard, keys)
        values = cast(list[Any], self._db.get(cast(list[Any], encoded)))  # None: absent
        found = np.fromiter(map(bool, values), dtype=np.bool_, count=keys.size)
        rows = self._decode(keys[found], b"".join(itertools.compress(values, found)))
        if take and rows.keys.size:
            self._delete(shard, list(itertools.compress(encoded, found)), buckets[found])
        return found, rows

    def delete(self, shard: int, keys: np.ndarray) -> int:
        """Delete the rows of distinct ``keys`` (uint64[N]) that are on disk; returns
        how many were."""
        found, _ = self.read(shard, keys, take=True)
        return int(found.sum())

    def discard(self, shard: int, keys: np.ndarray) -> None:
        """Delete the rows of distinct ``keys`` (uint64[n]), all on disk (found by
        :meth:`read`): a promotion once the rows are in memory."""
        if keys.size:
            self._delete(shard, *self._encode(shard, keys))

    def scan(self, shard: int) -> DiskRows:
        """Every row of ``shard`` on disk, ascending by (bucket, key)."""
        if not self.rows_in(shard):
            return self._decode(np.zeros(0, dtype=np.uint64), b"")
        bound = rocksdict.ReadOptions()
        bound.set_iterate_upper_bound((shard + 1).to_bytes(2, "big"))
        items = list(self._db.items(from_key=shard.to_bytes(2, "big"), read_opt=bound))
        keys = np.frombuffer(b"".join(map(operator.itemgetter(0), items)), dtype=_KEY)["key"]
        return self._decode(keys.astype(np.uint64),
                            b"".join(map(operator.itemgetter(1), items)))

    def view(self, shard: int) -> DiskView:
        """The rows of ``shard`` as they are now, to read later while the tier changes
        (a save's copy: call with the shard's lock held, read after releasing it)."""
        with self._lock:
            counts = self._bucket_rows[shard].copy()
            day = self.day
        return DiskView(self, shard, counts, day, self._db.iter())

    def rewrite_stats(self, shard: int, keys: np.ndarray, stats: np.ndarray) -> None:
        """Replace the statistics (float32[n, 4], unseen_days as of now) of the rows
        of distinct ``keys`` (uint64[n]) that are on disk; other keys are ignored."""
        found, rows = self.read(shard, keys, take=True)
        self.spill(shard, rows.keys, rows.data, stats[found], rows.saved)

    def replace(self, shard: int, rows: DiskRows) -> None:
        """Write ``rows`` (from :meth:`scan`, changed) over the shard's records of
        the same keys."""
        self.discard(shard, rows.keys)
        self.spill(shard, rows.keys, rows.data, rows.stats, rows.saved)

    def age_one_day(self) -> None:
        """Every row on disk is one day older (read back with unseen_days + 1)."""
        with self._lock:
            self.day += 1

    def close(self) -> None:
        """Close the store and delete its folder (also done when the tier is
        garbage-collected or the process exits)."""
        self._closer()

    # -- encoding --------------------------------------------------------------------

    def _encode(self, shard: int, keys: np.ndarray) -> tuple[list[bytes], np.ndarray]:
        """(the records' keys, the keys' buckets int64[n])."""
        buckets = bucket_of(keys, self.num_buckets)
        encoded = np.empty(keys.size, dtype=_KEY)
        encoded["shard"] = shard
        encoded["bucket"] = buckets
        encoded["key"] = keys
        return encoded.view(f"V{_KEY.itemsize}").tolist(), buckets

    def _decode(self, keys: np.ndarray, values: bytes, day: int | None = None) -> DiskRows:
        """The records ``values`` of ``keys``, unseen_days as of ``day`` (None: now)."""
        record = np.frombuffer(values, dtype=np.float32).reshape(-1, self._record)
        stats = None
        if self.has_stats:
            stats = record[:, self.width: self.width + 4].copy()
            # the days spent on disk
            stats[:, UNSEEN_DAYS] += (self.day if day is None else day) - record[:, -1]
        return DiskRows(keys, record[:, : self.width].copy(), stats, record[:, -2] != 0)

    def _delete(self, shard: int, encoded: list[bytes], buckets: np.ndarray) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        collections.deque(map(batch.delete, encoded), maxlen=0)
        self._db.write(batch)
        with self._lock:
            self._counts[shard] -= len(encoded)
            np.subtract.at(self._bucket_rows[shard], buckets, 1)


class DiskView:
    """One shard's rows on the disk tier at one moment, read in (bucket, key) order
    while the tier goes on changing: a RocksDB iterator sees the store as it was when
    it was created (it pins that version's memtables and files until it is dropped,
    so the tier's files may grow meanwhile). Made by :meth:`DiskTier.view`; not
    thread safe (one reader). ``rocksdict``'s ``Snapshot`` is not used: its
    iterators read the live store (rocksdict 0.3.29).

    Attributes:
        shard: the shard.
        bucket_rows: int64[num_buckets]: the shard's rows in each bucket.
        day: the tier's day count then (unseen_days of rows read are as of it).
    """

    def __init__(self, tier: DiskTier, shard: int, bucket_rows: np.ndarray, day: int,
                 iterator: rocksdict.RdictIter) -> None:
        self.shard = shard
        self.bucket_rows = bucket_rows
        self.day = day
        self._tier = tier
        self._iter = iterator
        self._next_bucket = 0  # the first bucket not read yet
        self.rewind()

    def rewind(self) -> None:
        """Read from the shard's first row again."""
        self._iter.seek(self.shard.to_bytes(2, "big"))
        self._next_bucket = 0

    def read_to(self, bucket: int) -> DiskRows:
        """The rows of the buckets below ``bucket`` not read yet (with ``buckets``),
        ascending by (bucket, key); unseen_days as of :attr:`day`.

        Raises:
            RuntimeError: the store holds fewer rows than counted (a bug).
        """
        n = int(self.bucket_rows[self._next_bucket: max(bucket, self._next_bucket)].sum())
        self._next_bucket = max(self._next_bucket, bucket)
        it, keys, values = self._iter, [], []
        for _ in range(n):
            if not it.valid():
                raise RuntimeError(f"disk tier {self._tier.path}: shard {self.shard} holds "
                                   f"fewer rows than its bucket counts")
            keys.append(it.key())
            values.append(it.value())
            it.next()
        record = np.frombuffer(b"".join(keys), dtype=_KEY)
        rows = self._tier._decode(record["key"].astype(np.uint64), b"".join(values), self.day)
        rows.buckets = record["bucket"].astype(np.int64)
        return rows

    def close(self) -> None:
        """Drop the iterator (the store's pinned files can go)."""
        del self._iter


def _close(db: rocksdict.Rdict, path: Path) -> None:
    try:
        db.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
