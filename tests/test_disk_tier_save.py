"""Saves of a tiered sparse table stream its disk rows (``psfleet.ps.persist_stream``).

Real files and a real RocksDB; chunks made small (``CHUNK_ROWS``) so every save takes
many of them:

- A tiered table whose rows are 4x its ``memory_rows`` and an in-memory table with the
  same rows write the same ``.sparse`` files, byte for byte, in full, base and delta
  saves; their ``.stats`` hold the same statistics and their ``.tomb`` files are
  equal; each save loads into the other kind of table, and a base followed by its
  delta restores the table as it was at the delta.
- Pushes, adds and new rows applied while a save streams do not reach the file: it
  holds the rows as they were when the save took its copy.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

import numpy as np
import pytest

from psfleet.ps import SparseTable, SparseTableConfig, persist_stream
from psfleet.ps.persist import load_server
from psfleet.ps.persist_delta import snapshot_mode, write_mode_snapshot
from psfleet.ps.restore import replay
from psfleet.ps.types import AccessorConfig, RuleConfig

pytestmark = pytest.mark.unit

DIM = 4
MEMORY_ROWS = 1_000
ROWS = 4 * MEMORY_ROWS
CTR = dict(name="ctr", base_threshold=0.5, delta_threshold=0.2, delta_keep_days=5,
           delete_threshold=0.3, delete_after_unseen_days=3)


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(persist_stream, "CHUNK_ROWS", 300)


def _config(tiered: bool, tmp_path: Path, **accessor: object) -> SparseTableConfig:
    extra = dict(memory_rows=MEMORY_ROWS, disk_dir=str(tmp_path)) if tiered else {}
    return SparseTableConfig(name="emb", dim=DIM, rule=RuleConfig(name="adam"), num_shards=4,
                             num_buckets=64, accessor=AccessorConfig(**accessor, **extra))


def _train(tables: list[SparseTable], rng: np.random.Generator, steps: int) -> None:
    """The same pulls and pushes (with show/click counts) on every table."""
    for _ in range(steps):
        keys = np.unique(rng.integers(1, ROWS + 1, 600).astype(np.uint64))
        grads = rng.standard_normal((keys.size, DIM)).astype(np.float32)
        shows = rng.integers(1, 4, keys.size).astype(np.float32)
        clicks = (rng.random(keys.size) < 0.3).astype(np.float32)
        for table in tables:
            table.pull(keys)
            table.push(keys, grads, shows, clicks)


def _filled(tmp_path: Path, **accessor: object) -> tuple[SparseTable, SparseTable]:
    """(in memory, tiered) tables holding the same ROWS rows, most of the tiered
    table's on disk."""
    plain = SparseTable(_config(False, tmp_path, **accessor))
    tiered = SparseTable(_config(True, tmp_path, **accessor))
    for table in (plain, tiered):
        for start in range(1, ROWS + 1, 500):
            table.pull(np.arange(start, start + 500, dtype=np.uint64))
    _train([plain, tiered], np.random.default_rng(0), 10)
    assert len(tiered) == len(plain) == ROWS
    assert tiered.disk_rows >= ROWS - MEMORY_ROWS
    return plain, tiered


def _save(table: SparseTable, folder: Path, mode: str) -> Path:
    write_mode_snapshot(snapshot_mode({1: table}, mode), folder, 0, {})  # type: ignore[arg-type]
    return folder / "server-0"


def _stats(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(io.BytesIO((folder / "table-1.stats").read_bytes())) as saved:
        keys, stats = saved["keys"], saved["stats"]
    order = np.argsort(keys)
    return keys[order], stats[order]


def _assert_rows_equal(got: SparseTable, want: SparseTable) -> None:
    for a, b in zip(got.items(), want.items(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_full_saves_are_the_same_files_and_load_both_ways(tmp_path: Path) -> None:
    plain, tiered = _filled(tmp_path)
    p, t = _save(plain, tmp_path / "plain", "full"), _save(tiered, tmp_path / "tiered", "full")
    assert (t / "table-1.sparse").read_bytes() == (p / "table-1.sparse").read_bytes()
    for save, kind in ((t, False), (p, True)):  # a tiered save into a plain table, ...
        table = SparseTable(_config(kind, tmp_path))
        load_server({1: table}, save.parent, 0, 1, {})
        _assert_rows_equal(table, plain)
        assert not kind or table.disk_rows > 0
    _assert_rows_equal(tiered, plain)  # the save changed nothing


def test_ctr_base_and_delta_saves_equal_and_restore(tmp_path: Path) -> None:
    plain, tiered = _filled(tmp_path, **CTR)
    rng = np.random.default_rng(1)
    for table in (plain, tiered):
        table.age_one_day()
    folders = {}
    for step, mode in enumerate(("base", "delta", "delta")):
        if step:
            _train([plain, tiered], rng, 4)
            for table in (plain, tiered):
                for _ in range(3):
                    table.age_one_day()
            assert plain.shrink() == tiered.shrink() > 0  # makes tombstones
        p = _save(plain, tmp_path / f"plain-{step}", mode)
        t = _save(tiered, tmp_path / f"tiered-{step}", mode)
        sparse = (t / "table-1.sparse").read_bytes()
        assert sparse == (p / "table-1.sparse").read_bytes(), mode
        assert len(sparse) > 20_000, mode  # rows were selected
        for got, want in zip(_stats(t), _stats(p), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=mode)
        if mode == "delta":
            tomb = (t / "table-1.tomb").read_bytes()
            assert tomb == (p / "table-1.tomb").read_bytes() and len(tomb) > 24
        folders[step] = (p.parent, t.parent)
        for got, want in zip(tiered.stats_items(), plain.stats_items(), strict=True):
            np.testing.assert_array_equal(got, want, err_msg=mode)  # the same resets
    # The tiered chain replayed into a tiered table equals the plain chain replayed.
    restored = {}
    for side, tiered_side in ((0, False), (1, True)):
        chain = [str(folders[step][side]) for step in (1, 2)]
        table = replay(folders[0][side], chain,
                       configs={1: _config(tiered_side, tmp_path, **CTR)})[1]
        assert isinstance(table, SparseTable)
        restored[tiered_side] = table
    assert restored[True].disk_rows > 0 and len(restored[False]) > MEMORY_ROWS
    _assert_rows_equal(restored[True], restored[False])


def test_writes_during_a_streaming_save_do_not_reach_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, tiered = _filled(tmp_path, **CTR)
    want = tiered.items()
    want_stats = tiered.stats_items()
    snap = snapshot_mode({1: tiered}, "full")  # the copy, as under the push gate
    stop = threading.Event()
    rounds = [0]
    chunk = persist_stream.TieredSnapshot.chunk
    chunks = [0]

    def chunk_after_a_round(self: persist_stream.TieredSnapshot, lo: int, hi: int
                            ) -> object:
        """Each chunk is read after one more round of training."""
        seen = rounds[0]
        for _ in range(2_000):
            if rounds[0] > seen:
                break
            stop.wait(0.005)
        chunks[0] += 1
        return chunk(self, lo, hi)

    monkeypatch.setattr(persist_stream.TieredSnapshot, "chunk", chunk_after_a_round)

    def train() -> None:
        rng = np.random.default_rng(2)
        while not stop.is_set():
            keys = np.unique(rng.integers(1, 2 * ROWS, 700).astype(np.uint64))  # new rows too
            tiered.add(keys, np.ones((keys.size, DIM), np.float32))
            tiered.push(keys, np.ones((keys.size, DIM), np.float32),
                        np.ones(keys.size, np.float32), np.ones(keys.size, np.float32))
            rounds[0] += 1

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        write_mode_snapshot(snap, tmp_path / "save", 0, {})
    finally:
        stop.set()
        trainer.join()
    assert rounds[0] >= chunks[0] > 20 and len(tiered) > ROWS
    loaded = SparseTable(_config(False, tmp_path, **CTR))
    load_server({1: loaded}, tmp_path / "save", 0, 1, {})
    for got, expected in zip(loaded.items(), want, strict=True):
        np.testing.assert_array_equal(got, expected)
    for got, expected in zip(loaded.stats_items(), want_stats, strict=True):
        np.testing.assert_array_equal(got, expected)
