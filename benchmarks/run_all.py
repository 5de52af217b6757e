"""Run every benchmark and write BENCHMARKS.md.

Each script runs as a subprocess (its stderr shown, its stdout parsed as JSON lines);
then the tables, the targets, the machine and the exact commands are written to
``BENCHMARKS.md`` at the repository root (``--out``).

    python benchmarks/run_all.py                 # the figures in BENCHMARKS.md
    python benchmarks/run_all.py --quick --out /tmp/B.md   # a small smoke run
    python benchmarks/run_all.py --only reader_throughput --out /tmp/B.md   # one script
    python benchmarks/run_all.py --from_json benchmarks/.data/last_run.json  # re-render
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_CACHE_DIR,
    REPO_ROOT,
    clean_env,
    ensure_criteo,
    log,
    machine_info,
    parse_json_lines,
)
from report import write_report


def script_commands(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(name, argv after ``python``) of every benchmark, in the order they run."""
    repeats = ["--repeats", str(args.repeats)]
    cache = [] if args.cache_dir == DEFAULT_CACHE_DIR else ["--cache_dir", str(args.cache_dir)]
    data = ["--train_rows", str(args.train_rows), "--test_rows", str(args.test_rows), *cache]
    table = ["--pool_rows", str(args.pool_rows), "--memory_rows", str(args.memory_rows)]
    return [
        ("table_ops", ["benchmarks/table_ops.py", *repeats, *table]),
        ("table_backends", ["benchmarks/table_ops.py", "--compare_backends", "--repeats",
                            str(max(7, args.repeats)), "--pool_rows", str(args.pool_rows)]),
        ("wire_ops", ["benchmarks/wire_ops.py", *repeats, "--pool_rows",
                      str(args.wire_pool_rows)]),
        ("step_profile", ["benchmarks/step_profile.py", *repeats, "--steps",
                          str(args.steps), *data]),
        ("reader_throughput", ["benchmarks/reader_throughput.py", *repeats, "--rows",
                               str(args.reader_rows), *cache]),
        ("e2e_throughput", ["benchmarks/e2e_throughput.py", *repeats, *data]),
        ("pooled_embedding", ["benchmarks/pooled_embedding.py", *repeats]),
        ("multihot_parity", ["benchmarks/multihot_parity.py", "--train_rows",
                             str(args.multihot_rows), "--test_rows",
                             str(args.multihot_rows // 5), *cache]),
        ("table_lifecycle", ["benchmarks/table_lifecycle.py", "--n", str(args.lifecycle_ids),
                             "--uncapped_n", str(args.lifecycle_uncapped_ids),
                             "--max_rows", str(args.lifecycle_max_rows)]),
        ("capped_auc", ["benchmarks/capped_auc.py", "--train_rows", str(args.capped_auc_rows),
                        "--test_rows", str(args.test_rows), *cache]),
        ("tiered_table", ["benchmarks/tiered_table.py", "--table_rows",
                          str(args.tiered_table_rows), "--train_rows", str(args.tiered_job_rows),
                          "--test_rows", str(args.test_rows), *cache]),
    ]


#: Sizes (and repeats) of a full run, and of a ``--quick`` one.
SIZES = {"repeats": 3, "train_rows": 150_000, "test_rows": 40_000, "pool_rows": 1_000_000,
         "memory_rows": 1_000_000, "wire_pool_rows": 500_000, "steps": 100,
         "reader_rows": 1_000_000, "multihot_rows": 1_000_000,
         "lifecycle_ids": 30_000_000, "lifecycle_uncapped_ids": 2_000_000,
         "lifecycle_max_rows": 2_000_000, "capped_auc_rows": 1_000_000,
         "tiered_table_rows": 1_000_000, "tiered_job_rows": 1_000_000}
QUICK_SIZES = {"repeats": 1, "train_rows": 20_000, "test_rows": 5_000, "pool_rows": 100_000,
               "memory_rows": 100_000, "wire_pool_rows": 100_000, "steps": 20,
               "reader_rows": 50_000, "multihot_rows": 20_000,
               "lifecycle_ids": 300_000, "lifecycle_uncapped_ids": 300_000,
               "lifecycle_max_rows": 50_000, "capped_auc_rows": 20_000,
               "tiered_table_rows": 100_000, "tiered_job_rows": 20_000}


def _argv_without_out(argv: list[str]) -> list[str]:
    """``argv`` less ``--out PATH`` (the report's own path is not part of the run)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            out.append(arg)
    return out


def run_script(argv: list[str], timeout_s: float) -> tuple[list[dict[str, Any]], float]:
    """Run ``python argv`` from the repository root; its JSON lines and wall seconds."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, env=clean_env(),
                            stdout=subprocess.PIPE, text=True, timeout=timeout_s, check=False)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed with exit code {result.returncode}")
    return parse_json_lines(result.stdout.splitlines()), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in SIZES.items():
        parser.add_argument(f"--{name}", type=int, default=None,
                            help=f"default {value:,}; {QUICK_SIZES[name]:,} with --quick")
    parser.add_argument("--cache_dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--only", default="", help="comma-separated script names to run "
                        "(table_ops, table_backends, wire_ops, step_profile, "
                        "reader_throughput, e2e_throughput, pooled_embedding, multihot_parity, "
                        "table_lifecycle, capped_auc, tiered_table)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, 1 repeat: checks the harness, not the figures "
                        "(sizes given explicitly are kept)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    parser.add_argument("--from_json", type=Path, default=None,
                        help="re-render the report from a run's saved records "
                        "(benchmarks/.data/last_run.json) instead of running")
    args = parser.parse_args()
    for name, value in (QUICK_SIZES if args.quick else SIZES).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    only = set(filter(None, args.only.split(",")))
    names = [name for name, _ in script_commands(args)]
    if only - set(names):
        parser.error(f"--only: unknown script(s) {', '.join(sorted(only - set(names)))}; "
                     f"choose from {', '.join(names)}")

    if args.from_json is not None:  # re-render a finished run
        saved = json.loads(args.from_json.read_text())
        write_report(args.out, **saved, rerendered=True)
        log(f"run_all: wrote {args.out} from {args.from_json}")
        return
    start = time.perf_counter()
    started_at = datetime.datetime.now().astimezone()
    machine = machine_info()
    t0 = time.perf_counter()
    ensure_criteo(args.train_rows, args.test_rows, args.cache_dir)
    data_s = time.perf_counter() - t0
    records: dict[str, list[dict[str, Any]]] = {}
    timings: dict[str, float] = {"data (cached: ~0 s)": data_s}
    commands: list[str] = []
    failed: list[str] = []
    for name, argv in script_commands(args):
        if only and name not in only:
            continue
        commands.append("python " + " ".join(argv))
        log(f"run_all: {commands[-1]}")
        try:
            records[name], timings[name] = run_script(argv, timeout_s=1800)
        except (SystemExit, subprocess.TimeoutExpired) as exc:  # keep the others' figures
            failed.append(f"{name}: {exc}")
            log(f"run_all: FAILED {failed[-1]}; going on with the other scripts")
            continue
        log(f"run_all: {name} took {timings[name]:.0f} s")
    total_s = time.perf_counter() - start
    report = {"records": records, "machine": machine,
              "end_loadavg": machine_info()["loadavg"],
              "started_at": started_at.isoformat(timespec="seconds"), "total_s": total_s,
              "timings": timings, "commands": commands,
              "run_all_command": " ".join(["python benchmarks/run_all.py",
                                           *_argv_without_out(sys.argv[1:])]),
              "settings": {k: (str(v) if isinstance(v, Path) else v)
                           for k, v in vars(args).items()}}
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    (args.cache_dir / "last_run.json").write_text(json.dumps(report, indent=1))
    write_report(args.out, **report)
    log(f"run_all: wrote {args.out} in {total_s:.0f} s")
    if failed:
        raise SystemExit("run_all: these scripts failed (their sections say 'not run'): "
                         + "; ".join(failed))


if __name__ == "__main__":
    main()
