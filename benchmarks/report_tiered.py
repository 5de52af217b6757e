"""Section 9 of BENCHMARKS.md (a table larger than memory: the disk tier) and its row
of the Targets table, from the records of ``tiered_table.py`` (issue 19). Used by
``report.py``."""

from __future__ import annotations

from typing import Any

from report_lifecycle import _num, _pick, _table

__all__ = ["FIXED_BASE_MB", "tiered_section", "tiered_targets"]

Record = dict[str, Any]

#: What a tiered server may hold beyond its budget and an untiered server's own
#: memory (the process without the table): RocksDB's write buffers (2 x 16 MB), its
#: block cache (32 MB) and allocator slack, MB.
FIXED_BASE_MB = 128.0


def _rss_check(jobs: list[Record]) -> tuple[float | None, float | None]:
    """(the tiered server's peak RSS, its bound: budget + the in-memory run's server
    peak minus its table bytes + FIXED_BASE_MB), MB; Nones when not measured."""
    plain, tiered = _pick(jobs, case="in memory"), _pick(jobs, case="budget 1/4")
    if plain is None or tiered is None or not tiered.get("server_peak_rss_mb"):
        return None, None
    base = plain["server_peak_rss_mb"] - plain["bytes"] / 1e6
    bound = tiered["memory_budget_bytes"] / 1e6 + base + FIXED_BASE_MB
    return tiered["server_peak_rss_mb"], bound


def tiered_targets(records: list[Record]) -> list[list[str]]:
    """The Targets-table row of issue 19's disk tier: the server's peak RSS of the
    1M-row dim-64 job whose table takes 4x its budget."""
    peak, bound = _rss_check([r for r in records if r.get("kind") == "job"])
    return [["server peak RSS, table 4x its memory budget (1M rows, dim 64, both runs ending "
             "with the export's save, so the base includes the in-memory save's copies; "
             "section 9)",
             f"<= budget + server base + {FIXED_BASE_MB:.0f} MB",
             "not measured" if peak is None else f"{peak:,.0f} MB (bound {bound:,.0f} MB)",
             "not measured" if peak is None or bound is None
             else ("**yes**" if peak <= bound else "**no**")]]


def tiered_section(records: list[Record]) -> str:
    """The section's text: the store choice, the table's rates per tier, the job."""
    if not records:
        return "Not run."
    stores = [r for r in records if r.get("kind") == "store"]
    tables = [r for r in records if r.get("kind") == "table"]
    jobs = [r for r in records if r.get("kind") == "job"]
    saves = [r for r in records if r.get("kind") == "save"]
    parts = []
    if stores:
        rows = [[r["store"], _num(r["put_rows_per_s"], 0), _num(r["get_rows_per_s"], 0),
                 _num(r["delete_rows_per_s"], 0), _num(r["rss_growth_mb"], 0)]
                for r in stores]
        parts.append(
            f"**The store.** {stores[0]['rows']:,} rows of {stores[0]['row_bytes']} bytes "
            f"(dim 64 with Adam's state), batches of {stores[0]['batch']:,} keys; RSS "
            "growth from opening the store to the end of a full read. psfleet uses RocksDB "
            "(`rocksdict`): LMDB reads faster, but through a memory map whose pages stay in "
            "the server's RSS, which a memory budget cannot allow.\n\n"
            + _table(["store", "put rows/s", "get rows/s", "delete rows/s",
                      "RSS growth MB"], rows))
    if tables:
        rows = [["memory_rows " + f"{r['memory_rows']:,}" if r["tiered"] else "all in memory",
                 _num(r["pull_hot_rows_per_s"], 0), _num(r["push_hot_rows_per_s"], 0),
                 _num(r["pull_cold_rows_per_s"], 0), _num(r["push_cold_rows_per_s"], 0),
                 _num(r["memory_bytes"], 0, 1e-6), _num(r["disk_bytes"], 0, 1e-6)]
                for r in tables]
        parts.append(
            f"**Rates per tier.** An in-process table of {tables[0]['rows']:,} rows (dim "
            "64, Adam, 8 shards), batches of 4,096 keys. Hot keys are in memory; cold keys "
            "are on disk in the tiered table (each is read once: the read promotes it and "
            "spills another row), in memory in the other.\n\n"
            + _table(["table", "pull hot rows/s", "push hot rows/s", "pull cold rows/s",
                      "push cold rows/s", "memory MB", "disk MB"], rows))
    if saves:
        rows = [["memory_rows " + f"{r['memory_rows']:,}" if r["tiered"] else "all in memory",
                 _num(r["save_peak_rss_growth_mb"], 0), _num(r["copy_s"], 2),
                 _num(r["save_s"], 1), _num(r["file_mb"], 0)] for r in saves]
        parts.append(
            f"**A save.** A full save of the same table ({saves[0]['rows']:,} rows) to "
            "local files, as a checkpoint or the export does it: the server's RSS growth, "
            "the time pushes wait (the copy under the push gate) and the whole save. A "
            "tiered save copies its memory tier and streams its disk rows in chunks.\n\n"
            + _table(["table", "peak RSS growth MB", "pushes held s", "save s", "file MB"],
                     rows))
    if jobs:
        rows = [[r["case"], _num(r["test_auc"], 4), _num(r["examples_per_s"], 0),
                 _num(r.get("server_peak_rss_mb"), 0), f"{r['rows']:,}",
                 f"{r['disk_rows']:,}", _num(r["bytes"], 0, 1e-6),
                 _num(r["disk_bytes"], 0, 1e-6)] for r in jobs]
        peak, bound = _rss_check(jobs)
        check = "" if peak is None else (
            f" The tiered server's peak, {peak:,.0f} MB, against budget + the in-memory "
            f"server's own memory (its peak minus its table) + {FIXED_BASE_MB:.0f} MB: "
            f"{bound:,.0f} MB.")
        parts.append(
            f"**A job.** `examples/criteo_dnn` with `sparse_feature_dim: 64` on "
            f"{jobs[0]['train_rows']:,} rows, async, 1 server x 1 worker, 1 epoch, batch "
            "512, with the export at the end (its save streams the disk rows); the "
            "second run with `sparse_accessor.memory_budget_bytes` a quarter of the first "
            "run's table bytes. Table figures at the end of training (Stats)."
            + check + "\n\n"
            + _table(["case", "test AUC", "examples/s", "server peak RSS MB", "rows",
                      "rows on disk", "table memory MB", "disk MB"], rows))
    return "\n\n".join(parts)
