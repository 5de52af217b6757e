"""End-to-end training throughput of the DNN through the YAML runner.

Runs ``psfleet train -m examples/criteo_dnn/config.yaml`` on the synthetic Criteo data
(one epoch, batch 512) in each configuration: the single-process reference
(``cluster.server_num=0``), parameter-server jobs (async 1x1, 1x2, 2x2; sync 1x2;
geo 1x2 with geo_step 400; pass mode ``gpubox`` 1x2, whose reader must be
``InMemoryDataset``, with its default dense path (async) and with
``pass_configs.dense_mode`` geo, which makes no RPC per step) and collective jobs
(``runner.sync_mode=collective``, 1 and 2 ranks, gloo all-reduce, no servers). Repeats
are interleaved (every configuration once, then again), so slow drift of the
machine's load spreads over all configurations.

Per run it records, from ``metrics.json``: the job's examples/s (all workers' examples
over the training wall time), the training wall time and the test AUC; and, by
polling the process tree, each process's peak RSS (VmHWM). Each PS run is also
divided by the single-process run of the same repeat.

Prints one JSON line per run (``"kind": "run"``) and one per configuration
(``"kind": "summary"``: median and min-max over the repeats).

    python benchmarks/e2e_throughput.py --repeats 3 --train_rows 200000 --test_rows 50000
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_CACHE_DIR,
    REPO_ROOT,
    TreeRssMonitor,
    base_parser,
    clean_env,
    emit,
    ensure_criteo,
    log,
    stop_tree,
    summarise,
)

CONFIG = REPO_ROOT / "examples" / "criteo_dnn" / "config.yaml"
BATCH_SIZE = 512
GEO_STEP = 400

#: (case, server_num, worker_num, mode); the first is the reference. A mode is a
#: ``runner.sync_mode``, or ``gpubox/DENSE``: pass mode with that ``dense_mode``.
CASES: list[tuple[str, int, int, str]] = [
    ("single process", 0, 1, "async"),
    ("PS async 1x1", 1, 1, "async"),
    ("PS async 1x2", 1, 2, "async"),
    ("PS async 2x2", 2, 2, "async"),
    ("PS sync 1x2", 1, 2, "sync"),
    ("PS geo 1x2", 1, 2, "geo"),
    ("PS gpubox 1x2", 1, 2, "gpubox"),
    ("PS gpubox 1x2 dense geo", 1, 2, "gpubox/geo"),
    ("collective 1 rank", 0, 1, "collective"),
    ("collective 2 ranks", 0, 2, "collective"),
]
REFERENCE = CASES[0][0]


def train_command(train: Path, test: Path, server_num: int, worker_num: int, mode: str,
                  out: Path) -> list[str]:
    """The ``psfleet train`` command line of one run (as documented in BENCHMARKS.md)."""
    mode, _, dense_mode = mode.partition("/")
    overrides = {
        "runner.train_data_dir": str(train), "runner.test_data_dir": str(test),
        "runner.epochs": "1", "runner.batch_size": str(BATCH_SIZE),
        "cluster.server_num": str(server_num), "cluster.worker_num": str(worker_num),
        "runner.sync_mode": mode, "runner.geo_step": str(GEO_STEP),
        "runner.model_save_path": str(out),
    }
    if mode == "gpubox":  # pass mode collects each pass's ids from memory
        overrides["runner.reader_type"] = "InMemoryDataset"
    if dense_mode:
        overrides["runner.pass_configs.dense_mode"] = dense_mode
    command = [str(Path(sys.executable).with_name("psfleet")), "train", "-m", str(CONFIG)]
    for key, value in overrides.items():
        command += ["-o", f"{key}={value}"]
    return command


def run_once(command: list[str], out: Path, root_label: str,
             timeout_s: float) -> dict[str, Any]:
    """Run one training job; return its metrics and per-process peak RSS."""
    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=clean_env(), cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with TreeRssMonitor(proc.pid, root_label) as monitor:
            try:
                output, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"timed out after {timeout_s:.0f} s: {' '.join(command)}")\
                    from None
    finally:
        if proc.poll() is None:
            stop_tree(proc.pid)
            proc.wait()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = output.decode(errors="replace")[-3000:]
        raise RuntimeError(f"exit code {proc.returncode}: {' '.join(command)}\n{tail}")
    # The run folder psfleet train wrote under model_save_path (psfleet.rec.run_folder).
    metrics = json.loads((out / "latest" / "metrics.json").read_text())
    return {
        "examples_per_s": metrics["examples_per_s"],
        "train_wall_s": metrics["train_wall_s"],
        "test_auc": metrics["test"]["auc"],
        "test_logloss": metrics["test"]["logloss"],
        "job_wall_s": wall,
        "peak_rss_mb": monitor.peaks_mb(),
    }


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--train_rows", type=int, default=150_000)
    parser.add_argument("--test_rows", type=int, default=40_000)
    parser.add_argument("--cache_dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--cases", default="all",
                        help="comma-separated case names, or 'all' (the reference always runs)")
    parser.add_argument("--timeout_s", type=float, default=900.0)
    args = parser.parse_args()

    cases = CASES if args.cases == "all" else [
        c for c in CASES if c[0] == REFERENCE or c[0] in args.cases.split(",")]
    train, test, data_meta = ensure_criteo(args.train_rows, args.test_rows, args.cache_dir)
    runs: dict[str, list[dict[str, Any]]] = {c[0]: [] for c in cases}
    work = Path(tempfile.mkdtemp(prefix="psfleet-bench-e2e-"))
    try:
        for repeat in range(args.repeats):
            for case, server_num, worker_num, mode in cases:
                out = work / f"{case.replace(' ', '_')}_{repeat}"
                command = train_command(train, test, server_num, worker_num, mode, out)
                log(f"e2e repeat {repeat + 1}/{args.repeats}: {case}")
                launches = server_num > 0 or (mode == "collective" and worker_num > 1)
                result = run_once(command, out, "launcher" if launches else "process",
                                  args.timeout_s)
                reference = runs[REFERENCE][repeat] if case != REFERENCE else result
                result["ratio_to_single"] = (result["examples_per_s"]
                                             / reference["examples_per_s"])
                runs[case].append(result)
                emit({"bench": "e2e", "kind": "run", "case": case, "repeat": repeat,
                      "server_num": server_num, "worker_num": worker_num, "mode": mode,
                      **result})
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for case, server_num, worker_num, mode in cases:
        results = runs[case]
        roles = sorted({r for res in results for r in res["peak_rss_mb"]})
        emit({
            "bench": "e2e", "kind": "summary", "case": case, "server_num": server_num,
            "worker_num": worker_num, "mode": mode, "batch_size": BATCH_SIZE,
            "geo_step": GEO_STEP if mode == "geo" else None,
            "train_rows": args.train_rows, "test_rows": args.test_rows, **data_meta,
            "command": " ".join(train_command(Path("TRAIN.tsv"), Path("TEST.tsv"), server_num,
                                              worker_num, mode, Path("OUT"))),
            **{key: summarise([r[key] for r in results])
               for key in ("examples_per_s", "train_wall_s", "test_auc", "job_wall_s",
                           "ratio_to_single")},
            "peak_rss_mb": {role: summarise([r["peak_rss_mb"][role] for r in results
                                             if role in r["peak_rss_mb"]]) for role in roles},
        })


if __name__ == "__main__":
    main()
