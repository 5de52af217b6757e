"""The disk tier of a sparse table (``accessor.memory_rows``, ``psfleet.ps.table.disk_tier``):
rows beyond the memory budget spill to RocksDB and come back when read, invisibly.

- A tiered table and an all-in-memory table given the same operations (pull with and
  without create, push, add, assign, load, contains) hold equal rows, bit for bit,
  while thousands of rows move between the tiers; with the ``ctr`` accessor also the
  statistics through pushes with counts, days, shrink and base/delta saves (the
  same ``.sparse`` bytes; ``tests/test_disk_tier_save.py`` has the rest of saves).
- The memory tier stays at its budget (rows and bytes); ``memory_budget_bytes`` sizes
  it by the bytes a row takes; a request with more keys than a shard holds is
  refused naming the setting; the folder is created under ``disk_dir`` and removed
  with the table; bad settings are config errors naming the keys.
- Through real servers on 127.0.0.1, Stats reports the rows and bytes of each tier.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from psfleet.errors import InvalidRequestError
from psfleet.ps import RemoteClient, SparseTable, SparseTableConfig, TableService, start_server
from psfleet.ps.persist_delta import snapshot_mode, write_mode_snapshot
from psfleet.ps.types import AccessorConfig, RuleConfig
from psfleet.rpc import RpcConfig

pytestmark = pytest.mark.service

DIM = 4
KEYS = 20_000  # distinct ids drawn from
MEMORY_ROWS = 2_048  # a tenth of them


def _pair(rule: RuleConfig, tmp_path: Path, **accessor: object
          ) -> tuple[SparseTable, SparseTable]:
    """(all in memory, tiered) tables of the same config."""
    base = dict(name="emb", dim=DIM, rule=rule, num_shards=2)
    plain = SparseTable(SparseTableConfig(**base, accessor=AccessorConfig(**accessor)))
    tiered = SparseTable(SparseTableConfig(**base, accessor=AccessorConfig(
        **accessor, memory_rows=MEMORY_ROWS, disk_dir=str(tmp_path))))
    return plain, tiered


def _assert_same(plain: SparseTable, tiered: SparseTable) -> None:
    keys, rows = plain.items()
    tiered_keys, tiered_rows = tiered.items()
    np.testing.assert_array_equal(tiered_keys, keys)
    np.testing.assert_array_equal(tiered_rows, rows)
    assert len(tiered) == len(plain) == keys.size


@pytest.mark.parametrize("rule", [RuleConfig(name="sgd", learning_rate=0.1),
                                  RuleConfig(name="adam", learning_rate=0.01)],
                         ids=["sgd", "adam"])
def test_a_tiered_table_equals_one_in_memory(rule: RuleConfig, tmp_path: Path) -> None:
    plain, tiered = _pair(rule, tmp_path)
    rng = np.random.default_rng(0)
    for step in range(60):
        keys = rng.integers(1, KEYS, 1_500).astype(np.uint64)  # repeats within a pull
        np.testing.assert_array_equal(tiered.pull(keys), plain.pull(keys), err_msg=str(step))
        distinct = np.unique(keys)
        grads = rng.standard_normal((distinct.size, DIM)).astype(np.float32)
        op = step % 4
        for table in (plain, tiered):
            if op == 3:
                table.add(distinct, grads)  # GEO's deltas
            elif op == 2:
                table.assign(distinct[::3], grads[::3])
            else:
                table.push(distinct, grads)
    _assert_same(plain, tiered)
    assert tiered.disk_rows > len(tiered) // 2  # most rows are on disk ...
    memory_rows = len(tiered) - tiered.disk_rows
    assert memory_rows <= MEMORY_ROWS  # ... and the memory tier within its budget
    counts = tiered.lifecycle_counts()
    assert counts.spilled > len(tiered) and counts.promoted > 10_000  # rows moved a lot
    assert counts.spilled - counts.promoted == tiered.disk_rows
    assert tiered.memory_bytes < plain.memory_bytes / 5
    everything = np.arange(1, KEYS + 50, dtype=np.uint64)  # some never seen
    np.testing.assert_array_equal(tiered.contains(everything), plain.contains(everything))
    on_disk = tiered.disk_rows
    np.testing.assert_array_equal(tiered.pull(everything, create=False),
                                  plain.pull(everything, create=False))
    assert tiered.disk_rows == on_disk  # a read without create promotes nothing
    # A load (a restore) replaces rows wherever they are.
    keys, rows = plain.items()
    rows = rows[::2] * 2
    plain.load(keys[::2], rows)
    tiered.load(keys[::2], rows)
    _assert_same(plain, tiered)


def test_ctr_statistics_shrink_and_saves_see_both_tiers(tmp_path: Path) -> None:
    ctr = dict(name="ctr", delete_threshold=0.3, delete_after_unseen_days=2,
               base_threshold=0.5, delta_threshold=0.2, delta_keep_days=5)
    plain, tiered = _pair(RuleConfig(name="sgd", learning_rate=0.1), tmp_path, **ctr)
    rng = np.random.default_rng(1)

    def day(n: int) -> None:
        for _ in range(n):
            keys = np.unique(rng.integers(1, KEYS, 1_500).astype(np.uint64))
            grads = rng.standard_normal((keys.size, DIM)).astype(np.float32)
            shows = rng.integers(1, 4, keys.size).astype(np.float32)
            clicks = (rng.random(keys.size) < 0.3).astype(np.float32)
            for table in (plain, tiered):
                table.pull(keys)
                table.push(keys, grads, shows, clicks)
            other = keys[::5]
            for table in (plain, tiered):
                table.update_stats(other, np.ones(other.size, np.float32),
                                   np.zeros(other.size, np.float32))
        for table in (plain, tiered):
            table.age_one_day()

    day(12)
    day(12)
    assert tiered.disk_rows > 0
    for got, want in zip(tiered.stats_items(), plain.stats_items(), strict=True):
        np.testing.assert_array_equal(got, want)  # unseen_days counted on disk too
    for mode in ("base", "delta"):
        day(6)
        folders = []
        for name, table in (("tiered", tiered), ("plain", plain)):
            write_mode_snapshot(snapshot_mode({7: table}, mode), tmp_path / f"{mode}-{name}",
                                0, {})
            folders.append(tmp_path / f"{mode}-{name}" / "server-0")
        got, want = ((f / "table-7.sparse").read_bytes() for f in folders)
        assert got == want and len(got) > 50_000, mode  # rows of both tiers selected
        stats = []
        for folder in folders:  # the tiered file lists them by (bucket, key)
            with np.load(folder / "table-7.stats") as saved:
                order = np.argsort(saved["keys"])
                stats.append((saved["keys"][order], saved["stats"][order]))
        for a, b in zip(*stats, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=mode)
    deleted = plain.shrink()
    assert deleted > 0 and tiered.shrink() == deleted
    _assert_same(plain, tiered)
    for got, want in zip(tiered.stats_items(), plain.stats_items(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_memory_budget_and_bad_settings(tmp_path: Path) -> None:
    rule = RuleConfig(name="adam")
    config = SparseTableConfig(name="e", dim=8, rule=rule, accessor=AccessorConfig(
        memory_budget_bytes=1 << 20, disk_dir=str(tmp_path / "tiers")))
    per_row = SparseTable.row_memory_bytes(config)
    assert per_row == 4 * (8 + 2 * 8 + 1) + 8 + 8 + 16  # adam: 2 moments + a step
    assert SparseTable.memory_rows(config) == (1 << 20) // per_row
    table = SparseTable(config)
    folder = next((tmp_path / "tiers").iterdir())
    assert folder.name.startswith("psfleet-e-")
    table.close()
    assert not folder.exists()
    for bad, match in (({"memory_rows": 10, "memory_budget_bytes": 10}, "set one of them"),
                       ({"memory_rows": 10, "max_rows": 10}, "max_rows drops rows"),
                       ({"disk_dir": "/tmp"}, "disk_dir: only used with"),
                       ({"memory_rows": 0}, "memory_rows")):
        with pytest.raises(ValidationError, match=match):
            AccessorConfig(**bad)  # type: ignore[arg-type]


def test_a_request_larger_than_a_shard_is_refused_naming_the_setting(tmp_path: Path) -> None:
    table = SparseTable(SparseTableConfig(name="e", dim=DIM, num_shards=1, accessor=
                                          AccessorConfig(memory_rows=100,
                                                         disk_dir=str(tmp_path))))
    table.pull(np.arange(1, 101, dtype=np.uint64))
    table.pull(np.arange(101, 201, dtype=np.uint64))  # the first 100 spill
    assert table.disk_rows >= 95
    with pytest.raises(InvalidRequestError, match=r"150 keys in a table shard holding 100 "
                                                  r"rows .* raise accessor\.memory_rows"):
        table.pull(np.arange(1, 151, dtype=np.uint64))
    before = table.items()
    np.testing.assert_array_equal(table.items()[0], before[0])  # nothing lost


def test_stats_report_each_tier_through_a_server(tmp_path: Path) -> None:
    service = TableService()
    config = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05)
    _, server = start_server("127.0.0.1", 0, config, service)
    client = RemoteClient([server.endpoint], config)
    try:
        table = SparseTableConfig(name="emb", dim=DIM, accessor=AccessorConfig(
            memory_rows=MEMORY_ROWS, disk_dir=str(tmp_path)))
        client.create_sparse_table(1, table)
        keys = np.arange(1, 10_001, dtype=np.uint64)
        for start in range(0, keys.size, 1_000):
            client.pull_sparse(1, keys[start:start + 1_000])
        stats = next(t for t in client.stats()[0].tables if t.table_id == 1)
        assert stats.rows == 10_000
        assert 10_000 - MEMORY_ROWS <= stats.disk_rows < 10_000
        assert stats.spilled == stats.disk_rows and stats.promoted == 0
        assert stats.disk_bytes >= stats.disk_rows * 4 * DIM
        assert stats.memory_bytes < 200 * MEMORY_ROWS
        values = client.pull_sparse(1, keys[:1_000])  # spilled rows come back as they were
        assert values.shape == (1_000, DIM) and np.abs(values).max() <= 0.01
        stats = next(t for t in client.stats()[0].tables if t.table_id == 1)
        assert stats.promoted >= 900 and stats.rows == 10_000
    finally:
        client.close()
        server.stop(grace_s=0.5)
