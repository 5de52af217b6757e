"""``benchmarks/tiered_table.py``'s store and table parts, in process on small sizes
(real RocksDB and LMDB files, a real tiered table), and BENCHMARKS.md's section 9 and
Targets row rendered from their records (the job part not run)."""

from __future__ import annotations

import pytest
from conftest import bench_module

pytestmark = pytest.mark.unit

tiered_table = bench_module("tiered_table")
report_tiered = bench_module("report_tiered")


def test_store_and_table_parts_and_their_section() -> None:
    stores = tiered_table.store_part(20_000)
    assert [r["store"] for r in stores] == ["rocksdb", "lmdb"]
    for record in stores:
        assert min(record["put_rows_per_s"], record["get_rows_per_s"],
                   record["delete_rows_per_s"]) > 1_000
    plain, tiered = tiered_table.table_part(40_000)
    assert (plain["tiered"], tiered["tiered"]) == (False, True)
    assert plain["disk_rows"] == 0 and tiered["disk_rows"] >= 40_000 // 2
    assert tiered["memory_bytes"] < plain["memory_bytes"] / 2
    assert tiered["promoted"] > 0 and tiered["spilled"] >= tiered["disk_rows"]
    for record in (plain, tiered):
        assert all(record[f"{op}_{tier}_rows_per_s"] > 1_000 for op in ("pull", "push")
                   for tier in ("hot", "cold"))
    section = report_tiered.tiered_section(stores + [plain, tiered])
    assert "| rocksdb |" in section and "| lmdb |" in section
    assert "| memory_rows 10,000 |" in section and "| all in memory |" in section
    assert "A job" not in section  # not run
    (row,) = report_tiered.tiered_targets(stores + [plain, tiered])
    assert row[2:] == ["not measured", "not measured"]
    assert report_tiered.tiered_section([]) == "Not run."


def test_save_part_reports_each_saves_peak_memory() -> None:
    plain, tiered = tiered_table.save_part(40_000)
    assert (plain["tiered"], tiered["tiered"]) == (False, True)
    assert tiered["disk_rows"] >= 40_000 // 2 and plain["file_mb"] == tiered["file_mb"] > 0
    for record in (plain, tiered):
        assert record["save_s"] >= record["copy_s"] > 0
        assert record["save_peak_rss_growth_mb"] >= 0
    section = report_tiered.tiered_section([plain, tiered])
    assert "**A save.**" in section and "| memory_rows 10,000 |" in section
    assert "| all in memory |" in section
