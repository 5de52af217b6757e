"""The issue-17 benchmarks' harness, in process: ``benchmarks/table_lifecycle.py``'s
records and summary from a real (small) capped and uncapped stream, BENCHMARKS.md's
section 8 and Targets rows rendered from them (the other sections 'not run', as with
``run_all.py --only``), and ``benchmarks/capped_auc.py``'s job config validated by the
runner's own loader and its reading of metrics.json."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import bench_module

from psfleet.errors import ConfigError
from psfleet.rec.config_load import load_config

pytestmark = pytest.mark.unit

capped_auc = bench_module("capped_auc")
report = bench_module("report")
table_lifecycle = bench_module("table_lifecycle")
report_lifecycle = bench_module("report_lifecycle")
lifecycle_section = report_lifecycle.lifecycle_section
lifecycle_targets = report_lifecycle.lifecycle_targets

N_IDS, MAX_ROWS = 60_000, 8_000


def _args(case: str) -> argparse.Namespace:
    return argparse.Namespace(case=case, n=N_IDS, uncapped_n=N_IDS // 2, max_rows=MAX_ROWS,
                              batch=2048, accessor="ctr", eviction="lru",
                              evict_batch_fraction=0.05)


@pytest.fixture(scope="module")
def stream_records() -> list[dict[str, Any]]:
    capped = table_lifecycle.run(_args("capped"))
    uncapped = table_lifecycle.run(_args("uncapped"))
    pair = table_lifecycle.run_interleaved(_args("interleaved"))
    return [uncapped, capped, pair, table_lifecycle.summary(capped, pair, MAX_ROWS)]


def test_stream_counts_and_summary(stream_records: list[dict[str, Any]]) -> None:
    uncapped, capped, pair, summary = stream_records
    # Never-seen ids: the plain table keeps each; the capped one admits each, keeps at
    # most the cap and evicted exactly the rest.
    assert uncapped["rows"] == N_IDS // 2 and uncapped["evicted"] == 0
    assert capped["admitted"] == N_IDS
    assert capped["rows"] <= MAX_ROWS
    assert capped["rows"] + capped["evicted"] == N_IDS
    assert capped["raw_row_bytes"] == 8 + 4 * (9 + 2 * 9 + 1) + 16
    raw = MAX_ROWS * capped["raw_row_bytes"]
    assert summary["cap_raw_bytes"] == raw
    # The ratios come from the interleaved run, which fed both tables every id.
    assert pair["ids"] == N_IDS and set(pair["capped"]) == set(pair["uncapped"])
    assert summary["pull_rate_vs_uncapped"] == pytest.approx(
        pair["capped"]["pulls_per_s"] / pair["uncapped"]["pulls_per_s"])
    assert summary["push_cpu_rate_vs_uncapped"] == pytest.approx(
        pair["capped"]["pushes_per_cpu_s"] / pair["uncapped"]["pushes_per_cpu_s"])
    assert summary["peak_rss_growth_over_raw"] == pytest.approx(
        (capped["peak_rss_bytes"] - capped["base_rss_bytes"]) / raw)


def test_targets_rows_from_the_records(stream_records: list[dict[str, Any]]) -> None:
    summary = stream_records[3]
    rows = lifecycle_targets(stream_records, [])
    assert [r[0].split(" (")[0] for r in rows] == [
        "capped table pull rows/s vs uncapped", "capped table push rows/s vs uncapped",
        "capped table peak RSS", "test AUC with a row cap vs uncapped"]
    pull = summary["pull_rate_vs_uncapped"]
    assert rows[0][2].startswith(f"{pull:.2f}x")
    assert rows[0][3] == ("**yes**" if pull >= 0.70 else "**no**")
    growth = summary["peak_rss_growth_over_raw"]
    assert rows[2][3] == ("**yes**" if growth <= 1.3 else "**no**")
    assert rows[3][2:] == ["n/a", "not measured"]  # capped_auc not run


def test_report_renders_section_8_and_the_rest_not_run(
        stream_records: list[dict[str, Any]], tmp_path: Path) -> None:
    out = tmp_path / "B.md"
    machine = {"loadavg": [0.0, 0.0, 0.0], "cpu_model": "x", "nproc": 2, "ram_gib": 1,
               "kernel": "k", "python": "3", "torch": "t", "numpy": "n", "grpcio": "g",
               "psfleet": "p"}
    report.write_report(out, records={"table_lifecycle": stream_records}, machine=machine,
                        end_loadavg=[0.0, 0.0, 0.0], started_at="now", total_s=1.0,
                        timings={}, commands=[], run_all_command="run_all",
                        settings={"repeats": 1, "train_rows": 1, "test_rows": 1})
    text = out.read_text()
    section = text.split("## 8. Table lifecycle: a row cap on never-ending ids")[1]
    section = section.split("\n## ")[0]
    capped = stream_records[1]
    assert f"| capped | ctr | lru | {MAX_ROWS:,} | {N_IDS:,} | {capped['rows']:,} | " \
           f"{capped['evicted']:,} |" in section
    assert "### Test AUC with a cap of half the distinct ids\n\n_not run_" in section
    for title in ("1. End-to-end training throughput", "2. Sparse table in process",
                  "7. Multi-valued features: AUC parity of the four models"):
        assert f"## {title}\n\n_not run_" in text
    assert lifecycle_section([], []).count("_not run_") == 2


def test_capped_auc_config_loads_with_the_cap(tmp_path: Path) -> None:
    train, test = tmp_path / "train.tsv", tmp_path / "test.tsv"
    train.write_text("")
    test.write_text("")
    accessor = {"name": "ctr", "max_rows": 1234, "eviction": "lowest_score"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(capped_auc.job_config(train, test, tmp_path / "o",
                                                         accessor)))
    config = load_config(path)
    assert config.runner.train_passes == [train]
    assert (config.cluster.server_num, config.cluster.worker_num) == (0, 1)
    assert (config.runner.epochs, config.runner.batch_size) == (1, 512)
    hp = config.hyper_parameters.sparse_accessor
    assert hp is not None and (hp.name, hp.max_rows, hp.eviction) == ("ctr", 1234,
                                                                      "lowest_score")
    path.write_text(yaml.safe_dump(capped_auc.job_config(train, test, tmp_path / "o",
                                                         {**accessor, "eviction": "lfu2"})))
    with pytest.raises(ConfigError, match="eviction"):
        load_config(path)


def test_table_figures_sum_the_tables_and_name_missing_counts() -> None:
    metrics = {"passes": [{"tables": {
        "a": {"rows": 5, "admitted": 9, "evicted": 4, "bytes": 100},
        "b": {"rows": 2, "admitted": 2, "evicted": 0, "bytes": 30}}}]}
    assert capped_auc.table_figures(metrics) == {"rows": 7, "admitted": 11, "evicted": 4,
                                                 "bytes": 130, "tables": 2}
    with pytest.raises(RuntimeError, match="passes"):
        capped_auc.table_figures({"passes": None})
