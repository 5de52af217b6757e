"""Section 8 of BENCHMARKS.md (table lifecycle: a row cap on never-ending ids) and its
rows of the Targets table, from the records of ``table_lifecycle.py`` and
``capped_auc.py`` (issue 17). Used by ``report.py``."""

from __future__ import annotations

from typing import Any

__all__ = ["AUC_TARGET", "RATE_TARGET", "RSS_TARGET", "lifecycle_section", "lifecycle_targets"]

Record = dict[str, Any]

#: Issue 17: capped pull/push rates >= this fraction of the uncapped table's.
RATE_TARGET = 0.70
#: Issue 17: server peak RSS <= this x the cap's raw bytes + a fixed base.
RSS_TARGET = 1.3
#: Issue 17: |capped test AUC - uncapped| <= this.
AUC_TARGET = 0.01


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _pick(records: list[Record], **match: Any) -> Record | None:
    return next((r for r in records if all(r.get(k) == v for k, v in match.items())), None)


def _met(ok: bool | None) -> str:
    return "not measured" if ok is None else ("**yes**" if ok else "**no**")


def _num(value: float | None, digits: int = 2, scale: float = 1.0, unit: str = "") -> str:
    return "n/a" if value is None else f"{value * scale:,.{digits}f}{unit}"


def lifecycle_targets(lifecycle: list[Record], capped: list[Record]) -> list[list[str]]:
    """The Targets-table rows ``[target, target value, measured, met?]`` of issue 17:
    pull and push rates capped vs uncapped, peak RSS vs the cap, the capped AUC."""
    summary = _pick(lifecycle, bench="table_lifecycle_summary")
    s = summary or {}
    ids = f"{s['ids']:,} never-seen ids, max_rows {s['max_rows']:,}" if summary else "a stream"
    rows = []
    for op in ("pull", "push"):
        value = s.get(f"{op}_rate_vs_uncapped")
        cpu = s.get(f"{op}_cpu_rate_vs_uncapped")
        rows.append([f"capped table {op} rows/s vs uncapped ({ids}; section 8)",
                     f">= {RATE_TARGET:.2f}x", _num(value, unit="x")
                     + ("" if cpu is None else f" (by CPU time {cpu:.2f}x)"),
                     _met(None if value is None else value >= RATE_TARGET)])
    growth = s.get("peak_rss_growth_over_raw")
    rows.append([f"capped table peak RSS ({ids}; section 8)",
                 f"<= {RSS_TARGET}x the cap's raw bytes + base (RSS before the table)",
                 "n/a" if growth is None else f"peak - base = {growth:.2f}x the cap's raw bytes",
                 _met(None if growth is None else growth <= RSS_TARGET)])
    auc = _pick(capped, kind="summary")
    worst = auc.get("max_abs_auc_difference") if auc else None
    label = (f"{auc['train_rows']:,} rows, max_rows {auc['max_rows']:,} = "
             f"{auc['cap_fraction']:g} x {auc['uncapped_rows']:,} distinct ids"
             if auc else "a cap of half the distinct ids")
    rows.append([f"test AUC with a row cap vs uncapped ({label}; section 8)",
                 f"abs difference <= {AUC_TARGET}", _num(worst, digits=4),
                 _met(None if worst is None else worst <= AUC_TARGET)])
    return rows


def _stream_part(lifecycle: list[Record]) -> str:
    runs = [r for r in lifecycle if r.get("bench") == "table_lifecycle"]
    summary = _pick(lifecycle, bench="table_lifecycle_summary")
    if not runs or summary is None:
        return "_not run_"
    mb = 1 / 2**20
    rows = [[r["case"], r["accessor"], str(r.get("eviction") or "-"),
             "-" if r.get("max_rows") is None else f"{r['max_rows']:,}", f"{r['ids']:,}",
             f"{r['rows']:,}", f"{r['evicted']:,}", _num(r["pulls_per_s"], 2, 1e-6),
             _num(r["pushes_per_s"], 2, 1e-6), _num(r["pulls_per_cpu_s"], 2, 1e-6),
             _num(r["pushes_per_cpu_s"], 2, 1e-6), _num(r["base_rss_bytes"], 0, mb),
             _num(r["peak_rss_bytes"], 0, mb), _num(r["table_memory_bytes"], 0, mb)]
            for r in runs]
    pair = _pick(lifecycle, bench="table_lifecycle_interleaved")
    for case in ("capped", "uncapped") if pair else ():
        r = pair[case]
        rows.append([f"{case}, interleaved", "", "", "", f"{pair['ids']:,}", "", "",
                     _num(r["pulls_per_s"], 2, 1e-6), _num(r["pushes_per_s"], 2, 1e-6),
                     _num(r["pulls_per_cpu_s"], 2, 1e-6),
                     _num(r["pushes_per_cpu_s"], 2, 1e-6), "", "", ""])
    capped = _pick(runs, case="capped") or {}
    s = summary
    ratios = _table(["", "pull", "push"], [
        ["capped / uncapped, rows/s (wall)", _num(s["pull_rate_vs_uncapped"], unit="x"),
         _num(s["push_rate_vs_uncapped"], unit="x")],
        ["capped / uncapped, rows per CPU second",
         _num(s["pull_cpu_rate_vs_uncapped"], unit="x"),
         _num(s["push_cpu_rate_vs_uncapped"], unit="x")]])
    growth = s.get("peak_rss_growth_over_raw")
    return (
        "`benchmarks/table_lifecycle.py`: consecutive never-seen uint64 ids streamed through "
        "one in-process `SparseTable` (dim 9, Adam, 8 shards) in batches of "
        f"{capped.get('batch', 4096):,}: a pull (creating the rows) then a push of the same "
        "keys (with the ctr accessor: show 1, click 0 per key). Each run is its own child "
        "process, so its peak RSS (`ru_maxrss`) is its own. The capped run has the ctr "
        f"accessor, `max_rows` {s['max_rows']:,}, eviction "
        f"{capped.get('eviction')} in batches of {capped.get('evict_batch_fraction')} of a "
        "shard's cap; the uncapped reference is the plain table over as many ids as the "
        "cap. The ratios below come from a third run that feeds both tables the same "
        "ids alternately, batch by batch (the uncapped one starting afresh at the cap's "
        "row count), so that noise on shared cores weighs on both alike. Rates are rows "
        "per second of pull and push calls alone; the CPU-time rates are the fairer comparison on "
        "shared cores.\n\n"
        + _table(["run", "accessor", "eviction", "max_rows", "ids", "rows at the end",
                  "evicted", "pull M rows/s", "push M rows/s", "pull M rows/CPU s",
                  "push M rows/CPU s", "base RSS MiB", "peak RSS MiB",
                  "table.memory_bytes MiB"], rows)
        + "\n\n" + ratios + "\n\n"
        f"Memory: the cap's raw bytes are {s['max_rows']:,} rows x "
        f"{capped.get('raw_row_bytes')} B (8-byte key + dim 9 values + Adam's m, v and "
        "step count in float32 + the ctr statistics' 16 B) = "
        f"{_num(s['cap_raw_bytes'], 0, 1 / 2**20)} MiB. The fixed base is the run's RSS "
        "before it builds the table (Python, numpy and psfleet imported: "
        f"{_num(capped.get('base_rss_bytes'), 0, 1 / 2**20)} MiB). Peak RSS minus that "
        f"base is {_num(growth, unit='x')} the cap's raw bytes (target <= {RSS_TARGET}x); "
        f"peak / (base + raw) = {_num(s['peak_rss_over_base_plus_raw'], unit='x')}.")


def _auc_part(capped: list[Record]) -> str:
    runs = [r for r in capped if r.get("kind") == "run"]
    summary = _pick(capped, kind="summary")
    if not runs or summary is None:
        return "_not run_"
    rows = [[r["case"], "-" if r.get("max_rows") is None else f"{r['max_rows']:,}",
             f"{r['rows']:,}", f"{r['admitted']:,}" if r.get("max_rows") else "-",
             f"{r['evicted']:,}", f"{r['test_auc']:.4f}", f"{r['test_logloss']:.4f}",
             "-" if r.get("max_rows") is None
             else f"{r['test_auc'] - summary['uncapped_auc']:+.4f}",
             _num(r["examples_per_s"], 0), _num(r["train_wall_s"], 1)]
            for r in runs]
    s = summary
    return (
        f"`benchmarks/capped_auc.py`: the DNN of `examples/criteo_dnn/config.yaml` on "
        f"{s['train_rows']:,} synthetic Criteo training rows and {s['test_rows']:,} test "
        f"rows (seed 7; optimum test AUC {s['test_optimum_auc']:.4f}), 1 epoch, batch "
        f"{s['batch_size']}, in {s['mode']}: the table is in the worker, no async "
        "staleness, so the cap is the only difference between the runs. The training file "
        "is the job's one pass (`runner.train_passes`) so that metrics.json records the "
        "table's rows and counts after it. The uncapped run (plain table) ends with "
        f"{s['uncapped_rows']:,} rows, the distinct ids of training; the capped runs set "
        "`hyper_parameters.sparse_accessor: {name: ctr, max_rows: "
        f"{s['max_rows']:,}, eviction: ...}}` ({s['cap_fraction']:g} x that). Admitted "
        "counts re-admissions of evicted ids. Target: |AUC difference| <= "
        f"{s['auc_target']}; the largest is {_num(s['max_abs_auc_difference'], 4)} "
        f"({'met' if s['met'] else '**not met**'}).\n\n"
        + _table(["run", "max_rows", "rows at the end", "admitted", "evicted", "test AUC",
                  "test logloss", "AUC - uncapped", "examples/s", "train wall s"], rows))


def lifecycle_section(lifecycle: list[Record], capped: list[Record]) -> str:
    """Section 8's body: the stream figures (rates, RSS, evictions) and the capped AUC."""
    return ("Issue 17's hard row cap (`max_rows`, the ctr accessor) against a stream that "
            "never repeats an id, and its cost in test AUC.\n\n"
            "### Rates and memory under a stream of never-seen ids\n\n"
            + _stream_part(lifecycle)
            + "\n\n### Test AUC with a cap of half the distinct ids\n\n" + _auc_part(capped))
