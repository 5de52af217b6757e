"""``psfleet parity`` (psfleet.rec.parity, psfleet.cli.parity).

- The run plan: configurations, order (repeat r of all before repeat r+1), run names,
  collective with no servers; each run's overrides.
- The summary from hand-made metrics: median, min-max, differences to the reference,
  tolerance, failed runs.
- Bad flags fail with exit 2 naming the flag before any run starts (no run folder).
- Slow: a real parity run on the Criteo sample (the table and parity.json hold the
  run folders' own metrics), and a run whose workers fail on malformed data (exit 1
  naming the configuration; the other runs are still reported).

The module's tier is e2e (the CLI on real data); the plan, summary and flag tests are
in-process and quick, so they stay in the fast tier.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_no_processes_mentioning, write_slice

from psfleet.cli.main import main
from psfleet.errors import ConfigError
from psfleet.rec import parity

pytestmark = pytest.mark.e2e

RunCli = Callable[..., subprocess.CompletedProcess[str]]

# -- the plan ---------------------------------------------------------------------------


def test_plan_runs_every_configuration_per_repeat_reference_first() -> None:
    specs = parity.plan_runs(["async", "geo"], [1, 2], [1, 2], repeats=2)

    names = [s.run_name for s in specs]
    one_repeat = ["single-r{r}", "async-1x1-r{r}", "async-1x2-r{r}", "async-2x1-r{r}",
                  "async-2x2-r{r}", "geo-1x1-r{r}", "geo-1x2-r{r}", "geo-2x1-r{r}",
                  "geo-2x2-r{r}"]
    assert names == [n.format(r=1) for n in one_repeat] + [n.format(r=2) for n in one_repeat]
    assert specs[0] == parity.RunSpec("single", None, 0, 1, 1)
    assert specs[6] == parity.RunSpec("geo 1x2", "geo", 1, 2, 1)


def test_plan_collective_has_one_configuration_per_worker_count() -> None:
    specs = parity.plan_runs(["collective", "sync"], [1, 2], [2, 4], repeats=1)

    assert [(s.configuration, s.server_num, s.worker_num) for s in specs] == [
        ("single", 0, 1), ("collective 0x2", 0, 2), ("collective 0x4", 0, 4),
        ("sync 1x2", 1, 2), ("sync 1x4", 1, 4), ("sync 2x2", 2, 2), ("sync 2x4", 2, 4)]
    # servers 0 is fine when no parameter-server mode is asked for
    assert [s.run_name for s in parity.plan_runs(["collective"], [0], [2], 1)] == [
        "single-r1", "collective-0x2-r1"]


def test_plan_refuses_servers_0_in_a_ps_mode_and_repeats_below_1() -> None:
    with pytest.raises(ConfigError, match="--servers: 0 with --modes geo"):
        parity.plan_runs(["collective", "geo"], [0, 1], [1], 1)
    with pytest.raises(ConfigError, match="--repeats: 0 must be >= 1"):
        parity.plan_runs(["async"], [1], [1], 0)


def test_parse_flags() -> None:
    assert parity.parse_modes(" async,geo,async ") == ["async", "geo"]
    assert parity.parse_counts("--workers", "2,1,2") == [2, 1]
    with pytest.raises(ConfigError, match=r"--modes: 'asyc' is not one of sync, async"):
        parity.parse_modes("async,asyc")
    with pytest.raises(ConfigError, match=r"--workers: 'x' in '1,x' is not an integer"):
        parity.parse_counts("--workers", "1,x")
    with pytest.raises(ConfigError, match="--servers: -1 must be >= 0"):
        parity.parse_counts("--servers", "-1", minimum=0)


def test_run_overrides_set_cluster_mode_and_run_folder(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    async_1x2 = parity.RunSpec("async 1x2", "async", 1, 2, 3)
    assert parity.run_overrides(async_1x2, runs, "geo") == [
        "runner.sync_mode=async", "cluster.server_num=1", "cluster.worker_num=2",
        f"runner.model_save_path={runs}", "runner.run_name=async-1x2-r3",
        "runner.export_model=false"]
    reference = parity.RunSpec("single", None, 0, 1, 1)
    assert parity.run_overrides(reference, runs, "geo")[:3] == [
        "runner.sync_mode=geo", "cluster.server_num=0", "cluster.worker_num=1"]
    # a collective config's reference trains in process on tables: a PS mode
    assert parity.run_overrides(reference, runs, "collective")[0] == "runner.sync_mode=async"
    # pass mode reads from memory (its passes' ids); its reference is plain async
    gpubox = parity.RunSpec("gpubox 1x2", "gpubox", 1, 2, 1)
    assert parity.run_overrides(gpubox, runs, "async")[-1] == "runner.reader_type=InMemoryDataset"
    assert parity.run_overrides(reference, runs, "gpubox") == [
        "runner.sync_mode=async", "cluster.server_num=0", "cluster.worker_num=1",
        f"runner.model_save_path={runs}", "runner.run_name=single-r1",
        "runner.export_model=false"]


# -- the summary ------------------------------------------------------------------------


def _record(configuration: str, auc: float | None, logloss: float = 0.5,
            speed: float = 1000.0, copc: float = 1.0) -> dict[str, Any]:
    finished = auc is not None
    return {"configuration": configuration, "finished": finished,
            "metrics": {"test": {"auc": auc, "logloss": logloss, "copc": copc},
                        "examples_per_s": speed} if finished else None}


def test_summary_medians_ranges_and_differences() -> None:
    records = [
        _record("single", 0.70, 0.50, 900.0), _record("async 1x2", 0.69, 0.52, 2000.0, 0.8),
        _record("geo 1x2", None),
        _record("single", 0.72, 0.48, 1100.0), _record("async 1x2", 0.71, 0.51, 1800.0, 1.3),
        _record("geo 1x2", None),
        _record("single", 0.71, 0.49, 1000.0), _record("async 1x2", 0.66, 0.55, 1900.0),
        _record("geo 1x2", None),
    ]

    rows = parity.summarise(records, tolerance=0.015)

    assert [r["configuration"] for r in rows] == ["single", "async 1x2", "geo 1x2"]
    single, async_, geo = rows
    assert (single["runs"], single["finished"]) == (3, 3)
    assert (single["auc_median"], single["auc_min"], single["auc_max"]) == (0.71, 0.70, 0.72)
    assert single["auc_diff"] == 0.0 and single["logloss_diff"] == 0.0
    assert single["examples_per_s_median"] == 1000.0
    assert single["within_tolerance"] is True
    assert async_["auc_median"] == 0.69 and async_["logloss_median"] == 0.52
    assert async_["auc_diff"] == pytest.approx(-0.02)
    assert async_["auc_diff_min"] == pytest.approx(0.66 - 0.71)
    assert async_["auc_diff_max"] == pytest.approx(0.0)
    assert async_["logloss_diff"] == pytest.approx(0.03)
    assert async_["examples_per_s_median"] == 1900.0
    assert single["copc_median"] == 1.0 and async_["copc_median"] == 1.0  # of 0.8, 1.3, 1.0
    assert async_["within_tolerance"] is False  # |-0.02| > 0.015
    assert (geo["runs"], geo["finished"], geo["auc_median"], geo["auc_diff"],
            geo["within_tolerance"]) == (3, 0, None, None, None)
    assert parity.summarise(records, tolerance=0.02)[1]["within_tolerance"] is True

    table = parity.format_table(rows, 0.015).splitlines()
    assert table[0].split("  ")[0] == "configuration" and "within 0.015" in table[0]
    assert re.match(r"single\s+3\s+0\.7100 \(0\.7000-0\.7200\)\s+\+0\.0000\s+0\.4900\s+"
                    r"\+0\.0000\s+1\.000\s+1,000\s+yes$", table[1]), table[1]
    assert re.match(r"async 1x2\s+3\s+0\.6900 \(0\.6600-0\.7100\)\s+-0\.0200\s+0\.5200\s+"
                    r"\+0\.0300\s+1\.000\s+1,900\s+NO$", table[2]), table[2]
    assert re.match(r"geo 1x2\s+0/3 ok\s+-\s+-\s+-\s+-\s+-\s+-\s+-$", table[3]), table[3]


def test_summary_without_a_finished_reference_has_no_differences() -> None:
    rows = parity.summarise([_record("single", None), _record("async 1x1", 0.7)], 0.005)
    assert rows[1]["auc_median"] == 0.7
    assert rows[1]["auc_diff"] is None and rows[1]["within_tolerance"] is None


def test_run_record_reads_metrics_and_reports_failures(tmp_path: Path) -> None:
    spec = parity.RunSpec("async 1x2", "async", 1, 2, 1)
    folder = tmp_path / "runs" / spec.run_name
    stderr = tmp_path / "err"
    stderr.write_text("".join(f"line {i}\n" for i in range(30)))

    missing = parity.run_record(spec, folder, 0, 1.5, stderr)
    assert not missing["finished"] and "no readable" in missing["error"]
    folder.mkdir(parents=True)
    metrics = {"test": {"auc": 0.7, "logloss": 0.5}, "examples_per_s": 10.0}
    (folder / "metrics.json").write_text(json.dumps(metrics))
    ok = parity.run_record(spec, folder, 0, 1.5, stderr)
    assert ok["finished"] and ok["error"] is None and ok["metrics"] == metrics
    assert (ok["run_name"], ok["run_folder"], ok["wall_s"]) == ("async-1x2-r1", str(folder),
                                                                1.5)
    failed = parity.run_record(spec, folder, 1, 2.0, stderr)
    assert not failed["finished"]
    assert failed["error"].startswith("exit code 1; stderr")
    assert failed["error"].endswith("line 10\n" + "\n".join(f"line {i}"
                                                            for i in range(11, 30)))
    assert "line 9\n" not in failed["error"]


# -- bad flags: exit 2 before any run ---------------------------------------------------


def _parity_argv(repo_root: Path, criteo_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["parity", "-m", str(repo_root / "examples" / "criteo_dnn" / "config.yaml"),
            "-o", f"runner.train_data_dir={criteo_dir / 'train.csv'}",
            "-o", f"runner.test_data_dir={criteo_dir / 'test.csv'}",
            "--out", str(out), *extra]


@pytest.mark.parametrize(("extra", "message"), [
    (["-o", "runner.test_data_dir=null"], "runner.test_data_dir: not set"),
    (["--modes", "async,asyc"], "--modes: 'asyc' is not one of"),
    (["--workers", "0"], "--workers: 0 must be >= 1"),
    (["--workers", "1,two"], "--workers: 'two'"),
    (["--servers", "0"], "--servers: 0 with --modes async"),
    (["--servers", "1.5"], "--servers: '1.5'"),
    (["--repeats", "0"], "--repeats: 0 must be >= 1"),
    (["--tolerance", "-0.1"], "--tolerance: -0.1 must be"),
    (["-o", "runner.epoch=2"], "runner.epoch: unknown key"),
    (["--modes", "collective", "-o", "cluster.tls=self-signed"],
     "the configuration 'collective 0x1' is invalid"),
], ids=["no_test_data", "mode", "workers_0", "workers_text", "ps_servers_0",
        "servers_float", "repeats", "tolerance", "override", "configuration"])
def test_bad_flags_exit_2_before_any_run(repo_root: Path, criteo_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str],
                                         extra: list[str], message: str) -> None:
    out = tmp_path / "out"

    code = main(_parity_argv(repo_root, criteo_dir, out, *extra))

    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err, captured.err
    assert "started" not in captured.out
    assert not out.exists()  # no run folder, not even the report's folder


def test_out_not_creatable_or_holding_runs_exits_2(repo_root: Path, criteo_dir: Path,
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(_parity_argv(repo_root, criteo_dir, blocker / "out")) == 2
    assert f"--out: cannot create or write {str(blocker / 'out')!r}" in capsys.readouterr().err

    out = tmp_path / "out"
    (out / "runs" / "single-r1").mkdir(parents=True)
    (out / "runs" / "single-r1" / "metrics.json").write_text("{}")
    assert main(_parity_argv(repo_root, criteo_dir, out)) == 2
    assert "already holds the run single-r1" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["single-r1"]


# -- real runs --------------------------------------------------------------------------

FAST = ["-o", "runner.epochs=1", "-o", "hyper_parameters.fc_sizes=[64, 32]"]


def _table_rows(stdout: str) -> dict[str, str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("configuration"))
    rows = {}
    for line in lines[start + 1:]:
        if line.startswith("psfleet parity:"):
            break
        rows[re.split(r"\s{2,}", line)[0]] = line
    return rows


@pytest.mark.slow
def test_parity_on_the_sample_reports_the_runs_own_metrics(
        run_cli: RunCli, repo_root: Path, criteo_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [*_parity_argv(repo_root, criteo_dir, out, "--modes", "async", "--workers", "1,2",
                          "--servers", "1", "--repeats", "1"), *FAST]
    argv[argv.index(f"runner.test_data_dir={criteo_dir / 'test.csv'}")] = (
        f"runner.test_data_dir=[{criteo_dir / 'dev.csv'}, {criteo_dir / 'test.csv'}]")

    r = run_cli(argv, timeout=150)

    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert (out / "parity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "parity.json").read_text())
    expected = {"single": ("single-r1", 0, 1), "async 1x1": ("async-1x1-r1", 1, 1),
                "async 1x2": ("async-1x2-r1", 1, 2)}
    assert [run["configuration"] for run in report["runs"]] == list(expected)
    table = _table_rows(r.stdout)
    assert list(table) == list(expected)
    summary = {row["configuration"]: row for row in report["summary"]}
    for run in report["runs"]:
        name, servers, workers = expected[run["configuration"]]
        folder = out / "runs" / name
        assert run["run_folder"] == str(folder) and run["finished"]
        metrics = json.loads((folder / "metrics.json").read_text())  # read independently
        assert (metrics["server_num"], metrics["worker_num"]) == (servers, workers)
        assert metrics["test"]["examples"] == 800 and metrics["export"] is None
        auc, logloss = metrics["test"]["auc"], metrics["test"]["logloss"]
        row = summary[run["configuration"]]
        assert run["metrics"]["test"] == metrics["test"]
        assert (row["auc_median"], row["auc_min"], row["auc_max"]) == (auc, auc, auc)
        assert row["logloss_median"] == logloss
        assert row["copc_median"] == metrics["test"]["copc"]
        assert row["examples_per_s_median"] == metrics["examples_per_s"]
        line = table[run["configuration"]]
        assert f"{auc:.4f} ({auc:.4f}-{auc:.4f})" in line and f"  {logloss:.4f}  " in line
        assert f"  {metrics['test']['copc']:.3f}  " in line
        assert f"test auc {auc:.4f}, logloss {logloss:.4f}" in r.stdout
    reference_auc = summary["single"]["auc_median"]
    assert summary["single"]["auc_diff"] == 0.0 and summary["single"]["logloss_diff"] == 0.0
    assert re.search(r"\s\+0\.0000\s.*\s\+0\.0000\s", table["single"])
    assert summary["async 1x2"]["auc_diff"] == summary["async 1x2"]["auc_median"] - reference_auc
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_a_failing_run_exits_1_naming_its_configuration(
        run_cli: RunCli, repo_root: Path, criteo_dir: Path, tmp_path: Path) -> None:
    # 2,000 real rows with every 25th odd line garbled: worker 1 of 2 (odd lines) reads
    # 4% malformed lines, one process 2%; with max_malformed_fraction 0.03 the
    # reference trains and the 2-worker job fails at runtime on its data.
    train = write_slice(criteo_dir / "train.csv", tmp_path / "train.csv", 2000)
    lines = train.read_text().splitlines(keepends=True)
    for i in range(1, len(lines), 50):
        lines[i] = "garbled\tline\n"
    train.write_text("".join(lines))
    out = tmp_path / "out"
    argv = [*_parity_argv(repo_root, criteo_dir, out, "--modes", "async", "--workers", "2"),
            *FAST, "-o", f"runner.train_data_dir={train}",
            "-o", "runner.max_malformed_fraction=0.03"]

    r = run_cli(argv, timeout=120)

    assert r.returncode == 1, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "run async-1x2-r1 (async 1x2, repeat 1) failed: exit code" in r.stderr
    assert "malformed" in r.stderr  # the tail of the job's stderr says why
    report = json.loads((out / "parity.json").read_text())
    runs = {run["configuration"]: run for run in report["runs"]}
    assert runs["single"]["finished"] and not runs["async 1x2"]["finished"]
    rows = {row["configuration"]: row for row in report["summary"]}
    assert rows["single"]["auc_median"] == runs["single"]["metrics"]["test"]["auc"]
    assert (rows["async 1x2"]["finished"], rows["async 1x2"]["within_tolerance"]) == (0, None)
    assert re.search(r"^async 1x2\s+0/1 ok\s", r.stdout, re.M)
    assert (out / "parity.png").is_file()
    assert_no_processes_mentioning(str(tmp_path))
