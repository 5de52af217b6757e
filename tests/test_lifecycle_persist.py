"""A ctr table's row statistics (show, click, unseen_days, delta_score) survive a save
(``server-<i>/table-<id>.stats`` beside the rows): saved from two in-process servers and
loaded into three, every key's statistics equal the saved ones; a save whose ``.stats``
files are removed (an older save) loads the rows with statistics at zero; a damaged
``.stats`` file is a DataError naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from psfleet.errors import DataError
from psfleet.ps import RuleConfig, SparseTable, SparseTableConfig, TableClient, TableService
from psfleet.ps.transport import InProcessTransport

pytestmark = pytest.mark.unit

DIM = 4
CONFIG = SparseTableConfig(name="ctr", dim=DIM, rule=RuleConfig(name="adam"), num_shards=2,
                           num_buckets=64, accessor={"name": "ctr"})


def _client(count: int) -> tuple[TableClient, list[TableService]]:
    services = [TableService() for _ in range(count)]
    client = TableClient([InProcessTransport(s) for s in services])
    client.create_sparse_table(0, CONFIG)
    return client, services


def _gather(services: list[TableService], what: str) -> tuple[np.ndarray, np.ndarray]:
    """(keys, rows or stats) of table 0 over every server, sorted by key."""
    parts = []
    for s in services:
        table = s.tables[0]
        assert isinstance(table, SparseTable)
        parts.append(table.stats_items() if what == "stats" else table.items())
    keys = np.concatenate([k for k, _ in parts])
    values = np.concatenate([v for _, v in parts])
    order = np.argsort(keys)
    return keys[order], values[order]


def _filled(tmp_path: Path) -> tuple[Path, tuple[np.ndarray, np.ndarray],
                                     tuple[np.ndarray, np.ndarray]]:
    client, services = _client(2)
    rng = np.random.default_rng(11)
    keys = np.unique(rng.integers(1, 2**40, size=400).astype(np.uint64))
    client.pull_sparse(0, keys)
    shows = rng.integers(1, 6, size=keys.size).astype(np.float32)
    clicks = np.minimum(rng.integers(0, 3, size=keys.size), shows).astype(np.float32)
    grads = rng.normal(size=(keys.size, DIM)).astype(np.float32)
    client.push_sparse(0, keys, grads, shows=shows, clicks=clicks)
    client.age_one_day()
    client.push_sparse(0, keys[:50], grads[:50], shows=shows[:50], clicks=clicks[:50])
    save = tmp_path / "save"
    client.save(str(save))
    stats = _gather(services, "stats")
    assert stats[0].size == keys.size and float(stats[1][:, 2].max()) == 1.0  # aged rows
    return save, stats, _gather(services, "rows")


def test_stats_round_trip_through_a_save_into_another_server_count(tmp_path: Path) -> None:
    save, (keys, stats), (_, rows) = _filled(tmp_path)
    assert sorted(p.name for p in (save / "server-0").iterdir()) == [
        "save.json", "table-0.sparse", "table-0.stats", "table-0.tomb", "tables.json"]
    client, services = _client(3)
    client.load(str(save))
    got_keys, got_stats = _gather(services, "stats")
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_stats, stats)
    np.testing.assert_array_equal(_gather(services, "rows")[1], rows)


def test_a_save_without_stats_loads_them_as_zero(tmp_path: Path) -> None:
    save, (keys, _), (_, rows) = _filled(tmp_path)
    for path in save.glob("server-*/table-0.stats"):
        path.unlink()
    client, services = _client(1)
    client.load(str(save))
    got_keys, got_stats = _gather(services, "stats")
    np.testing.assert_array_equal(got_keys, keys)
    assert not got_stats.any()
    np.testing.assert_array_equal(_gather(services, "rows")[1], rows)


def test_a_damaged_stats_file_is_named(tmp_path: Path) -> None:
    save, _, _ = _filled(tmp_path)
    (save / "server-1" / "table-0.stats").write_bytes(b"not an npz")
    client, _ = _client(1)
    with pytest.raises(DataError, match=r"server-1/table-0\.stats"):
        client.load(str(save))
