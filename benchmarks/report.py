"""Render the benchmark records into BENCHMARKS.md (used by ``run_all.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from e2e_throughput import CASES as E2E_CASES
from report_lifecycle import lifecycle_section, lifecycle_targets
from report_tiered import tiered_section, tiered_targets

Record = dict[str, Any]

PHASE_ORDER = ("reader", "pull", "forward", "backward", "push (hand-off)",
               "wait (send queue full)", "install dense", "bookkeeping", "other")

_PS_CONTEXT = """\
psfleet's PS paths are Python end to end: the sparse table is a numpy open-addressing
index (``psfleet/ps/table/hash_index.py``) over float32 row matrices, the wire is grpcio with
protobuf ``bytes`` fields, and the server applies Adam with numpy. Everything here ran
on 127.0.0.1; on this machine workers, servers and the launcher share 2 cores, so a PS
job with W workers and S servers has W + S busy processes on 2 cores."""


def fmt(summary: dict[str, Any] | None, scale: float = 1.0, digits: int = 1,
        spread: bool = True) -> str:
    """``median (min-max)`` of a summary, values multiplied by ``scale``."""
    if not summary or summary.get("median") is None:
        return "n/a"
    med = summary["median"] * scale
    text = f"{med:,.{digits}f}"
    if spread and summary.get("n", 0) > 1:
        text += f" ({summary['min'] * scale:,.{digits}f}-{summary['max'] * scale:,.{digits}f})"
    return text


def _unit(text: str, unit: str) -> str:
    return text if text == "n/a" else text + unit


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _find(records: list[Record], **match: Any) -> Record | None:
    for record in records:
        if all(record.get(k) == v for k, v in match.items()):
            return record
    return None


def _met(value: float | None, target: float, higher: bool = True,
         low: float | None = None, high: float | None = None) -> str:
    if value is None:
        return "not measured"
    ok = value >= target if higher else value <= target
    if low is not None and high is not None:
        straddles = (low < target <= high) if higher else (low <= target < high)
        if straddles:
            return ("yes (median; the spread crosses the target)" if ok
                    else "no (median; the spread crosses the target)")
    return "**yes**" if ok else "**no**"


def _med(record: Record | None, *path: str) -> float | None:
    node: Any = record
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node.get("median") if isinstance(node, dict) else None


def _spread(record: Record | None, *path: str) -> tuple[float | None, float | None]:
    node: Any = record
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None, None
        node = node[key]
    return (node.get("min"), node.get("max")) if isinstance(node, dict) else (None, None)


# -- sections -----------------------------------------------------------------------------


def _targets(e2e: list[Record], table: list[Record], memory: list[Record],
             steps: list[Record], reader: list[Record], lifecycle: list[Record],
             capped: list[Record], tiered: list[Record]) -> str:
    rows = []
    for case, target, note in (
        ("PS async 1x1", 0.9, ""),
        ("PS async 1x2", 1.6, "limited by 2 cores (see below)"),
    ):
        rec = _find(e2e, kind="summary", case=case)
        value = _med(rec, "ratio_to_single")
        lo, hi = _spread(rec, "ratio_to_single")
        rows.append([f"{case} examples/s vs single process", f">= {target}x",
                     _unit(fmt(rec and rec.get("ratio_to_single"), digits=2), "x"),
                     _met(value, target, low=lo, high=hi) + (f"; {note}" if note else "")])
    for op, target in (("pull", 10e6), ("push", 5e6)):
        for keys in (100_000, 10_000):
            rec = _find(table, op=op, keys=keys, dim=9, kind="existing")
            value = _med(rec, "rows_per_s")
            lo, hi = _spread(rec, "rows_per_s")
            rows.append([f"in-process sparse {op}, dim 9, existing keys, batches of {keys:,}",
                         f">= {target / 1e6:.0f}M rows/s",
                         _unit(fmt(rec and rec.get("rows_per_s"), 1e-6, 2), "M rows/s"),
                         _met(value, target, low=lo, high=hi)])
    for rec in memory:
        for key, what in (("table_ratio_to_raw", "table.memory_bytes / rows"),
                          ("rss_ratio_to_raw", "RSS growth / rows")):
            value = _med(rec, key)
            lo, hi = _spread(rec, key)
            rows.append([f"memory per sparse row, dim {rec['dim']} ({what})",
                         f"<= 1.3x raw ({rec['raw_row_bytes']} B)",
                         _unit(fmt(rec.get(key), digits=2), "x"),
                         _met(value, 1.3, higher=False, low=lo, high=hi)])
    rows += _reader_targets(reader, e2e)
    rows += lifecycle_targets(lifecycle, capped)
    rows += tiered_targets(tiered)
    return _table(["target", "target value", "measured: median (min-max)", "met?"], rows)


def _reader_targets(reader: list[Record], e2e: list[Record]) -> list[list[str]]:
    """The reader's target rows: issue 5's parse rate, and reader faster than training."""
    queue = _find(reader, format="criteo", reader="QueueDataset", thread_num=2)
    value = _med(queue, "lines_per_s")
    lo, hi = _spread(queue, "lines_per_s")
    measured = _unit(fmt(queue and queue.get("lines_per_s"), digits=0), " lines/s")
    rows = [["raw Criteo TSV parse + hash, thread_num 2, one process (QueueDataset pass, "
             "batches included; section 5)", ">= 300,000 lines/s", measured,
             _met(value, 300_000, low=lo, high=hi)]]
    single = _find(e2e, kind="summary", case="single process")
    train_rate = _med(single, "examples_per_s")
    target = ("> single-process training examples/s"
              + (f" ({train_rate:,.0f}, section 1)" if train_rate is not None else ""))
    met = "not measured" if train_rate is None else _met(value, train_rate, low=lo, high=hi)
    if value is not None and train_rate:
        met += f"; {value / train_rate:,.1f}x the training rate"
    rows.append(["reader never the bottleneck: reader lines/s (QueueDataset, raw Criteo, "
                 "thread_num 2)", target, measured, met])
    return rows


def _e2e_section(e2e: list[Record]) -> str:
    summaries = [r for r in e2e if r.get("kind") == "summary"]
    if not summaries:
        return "_not run_"
    rows = []
    for rec in summaries:
        rss = rec.get("peak_rss_mb", {})
        rss_text = "<br>".join(f"{role} {fmt(s, digits=0, spread=False)}"
                               for role, s in sorted(rss.items()))
        rows.append([rec["case"], fmt(rec["examples_per_s"], digits=0),
                     fmt(rec["ratio_to_single"], digits=2),
                     fmt(rec["test_auc"], digits=4), fmt(rec["train_wall_s"], digits=1),
                     fmt(rec["job_wall_s"], digits=1), rss_text])
    first = summaries[0]
    text = _table(["configuration", "examples/s", "ratio to single process", "test AUC",
                   "train wall s", "job wall s", "peak RSS MB (median)"], rows)
    return (f"{first['train_rows']:,} training rows, {first['test_rows']:,} test rows "
            f"(synthetic, seed 7; optimum test AUC {first['test_optimum_auc']:.4f}), 1 epoch, "
            f"batch {first['batch_size']} per worker, Adam lr 0.001, dim 9, "
            "fc 512-256-128-32, 1 torch thread per process, geo_step 400.\n"
            "examples/s is the job's (every worker's examples over the training wall "
            "time, metrics.json); the ratio is taken per repeat against the single-process "
            "run of the same repeat. Job wall time includes start-up (imports, servers, "
            "reading and parsing the data) and the test evaluation. Peak RSS is VmHWM per "
            "process (launcher = the `psfleet train` process that starts the job); a "
            "worker's peak is mostly its in-memory share of the data and the model. Wide "
            "spreads (e.g. one slow repeat) are other sessions' load on the shared machine."
            + (" Collective rows (`runner.sync_mode=collective`: no servers, every rank "
               "holds the whole model, gloo all-reduce of dense gradients and all-gather of "
               "sparse rows) run each rank as its own process; with 2 ranks both share the "
               "machine's 2 cores with each other and the launcher, so the ratio cannot "
               "reach 2x here." if any(r.get("mode") == "collective" for r in summaries)
               else "")
            + "\n\n" + text)


def _e2e_commands(e2e: list[Record]) -> str:
    commands = [r["command"] for r in e2e if r.get("kind") == "summary"]
    if not commands:
        return ""
    return ("Each end-to-end run is:\n\n```bash\n" + "\n".join(commands)
            + "\n```\n\n(TRAIN.tsv / TEST.tsv are the cached data files, OUT a fresh "
            "folder per run.)\n\n")


def _table_section(table: list[Record]) -> str:
    if not table:
        return "_not run_"
    rows = [[r["op"], f"{r['keys']:,}", str(r["dim"]), r["kind"],
             fmt(r["rows_per_s"], 1e-6, 2), fmt(r["gb_per_s"], digits=3),
             fmt(r["ms_per_call"], digits=2)]
            for r in sorted(table, key=lambda r: (r["dim"], r["op"], r["kind"], r["keys"]))]
    pool = table[0]["table_rows_before"]
    return (f"`SparseTable` (Adam, 8 shards), {pool:,} rows inserted before the runs. "
            "Distinct random uint64 keys per call; 'existing' keys are in the table, 'new' "
            "keys are not (pull inserts them; push creates and updates them). GB/s counts "
            "8 bytes of key + 4*dim bytes of values per row.\n\n"
            + _table(["op", "keys/call", "dim", "keys", "M rows/s", "GB/s", "ms/call"], rows))


def _backends_section(backends: list[Record]) -> str:
    """Section 2a: the table's numpy and native backends against the references
    (``benchmarks/table_ops.py --compare_backends``)."""
    if not backends:
        return "_not run_"
    r = backends[-1]
    rates, cpu = r["rows_per_s"], r.get("rows_per_cpu_s", {})
    names = [("numpy_pull", "pull, numpy backend"), ("native_pull", "pull, native backend"),
             ("native_pull_pool1", "pull, native, 1 pool thread"),
             ("native_pull_pool2", "pull, native, 2 pool threads"),
             ("pandas_lookup_take", "pandas Index.get_indexer + np.take"),
             ("np_take", "np.take alone (rows known)"),
             ("numpy_push_adam", "push (Adam), numpy backend"),
             ("native_push_adam", "push (Adam), native backend"),
             ("native_pull_1_thread_both_halves", "pull, native, 1 caller thread, both halves"),
             ("native_pull_2_threads_disjoint", "pull, native, 2 caller threads, a half each")]
    rows = [[label, fmt(rates.get(name), 1e-6, 2),
             fmt(cpu.get(name), 1e-6, 2) if name in cpu else ""] for name, label in names]
    ratio_names = [("native_pull_vs_numpy", "native pull / numpy pull", ">= 3.5"),
                   ("native_pull_vs_pandas_take", "native pull / pandas + np.take", ">= 1.8"),
                   ("native_push_adam_vs_numpy", "native Adam push / numpy", ">= 2.5"),
                   ("pool2_vs_pool1", "2 pool threads / 1 (one call)", ">= 1.6"),
                   ("two_threads_vs_one", "2 caller threads on disjoint keys / 1", ">= 1.6")]
    cpu_ratios = r.get("cpu_ratios", {})
    ratio_rows = [[label, target, fmt(r["ratios"].get(name), digits=2),
                   fmt(cpu_ratios.get(name), digits=2) if name in cpu_ratios else ""]
                  for name, label, target in ratio_names]
    load = ", ".join(f"{x:.2f}" for x in r["load_average"])
    memory = ", ".join(f"{b} {x:.2f}x" for b, x in r["table_ratio_to_raw"].items())
    return (f"`benchmarks/table_ops.py --compare_backends`: one process, a table per backend "
            f"(dim {r['dim']}, Adam, 8 shards, {r['rows']:,} rows), batches of "
            f"{r['keys']:,} existing keys, every variant {r['calls_per_sample']} calls per "
            f"round, the variants alternated round after round ({rates['numpy_pull']['n']} "
            "rounds); ratios are taken within a round. The native backend's default uses "
            f"min(cores, shards) = {min(r['cpus'], 8)} pool threads per call; 'CPU' rates "
            "count the whole process's CPU time (fairer on shared cores, and the cost a "
            f"server pays). Load average at the end: {load} on {r['cpus']} cores. Rows "
            f"identical in both tables after all pushes: {r['rows_identical_after']}. "
            f"table.memory_bytes / raw row: {memory}.\n\n"
            + _table(["variant", "M rows/s", "M rows/CPU s"], rows) + "\n\n"
            + _table(["ratio", "target", "wall", "CPU"], ratio_rows))


def _memory_section(memory: list[Record]) -> str:
    if not memory:
        return "_not run_"
    rows = [[str(r["dim"]), f"{r['rows']:,}", str(r["raw_row_bytes"]),
             fmt(r["table_bytes_per_row"], digits=0), fmt(r["table_ratio_to_raw"], digits=2),
             fmt(r["rss_bytes_per_row"], digits=0), fmt(r["rss_ratio_to_raw"], digits=2),
             fmt(r["rss_bytes_per_row"], digits=0, spread=False)]
            for r in memory]
    return ("Raw row = 8-byte key + 4*dim bytes of values + Adam state (2*dim + 1 float32: "
            "m, v, step count). Rows inserted by pulls of 100,000 new keys into a fresh table; "
            "RSS growth is VmRSS after minus before. It is the noisier figure: capacity "
            "numpy allocated but has not written yet (the row matrix grows by 1.5x) is not "
            "resident, and later repeats reuse memory freed by earlier ones, so it can fall "
            "below the raw size; `table.memory_bytes` (allocated bytes) is the one to hold "
            "against the target.\n\n"
            + _table(["dim", "rows", "raw B/row", "table.memory_bytes / rows",
                      "ratio", "RSS growth B/row", "ratio", "MB per million rows"], rows))


def _wire_section(wire: list[Record]) -> str:
    if not wire:
        return "_not run_"
    rows = [[r["op"], f"{r['keys']:,}", str(r["dim"]), r["kind"],
             fmt(r["rows_per_s"], 1e-6, 3), fmt(r["mb_per_s"], digits=0),
             fmt(r["calls_per_s"], digits=0), fmt(r["p50_ms"], digits=2),
             fmt(r["p99_ms"], digits=2)]
            for r in sorted(wire, key=lambda r: (r["dim"], r["op"], r["kind"], r["keys"]))]
    return ("One server in a subprocess, this process as the client through `RemoteClient`, "
            "one call in flight; tables and batches as in section 2. MB/s counts keys + "
            "values (10^6 bytes).\n\n"
            + _table(["op", "keys/call", "dim", "keys", "M rows/s", "MB/s", "calls/s",
                      "p50 ms", "p99 ms"], rows))


def _step_section(steps: list[Record]) -> str:
    ps = _find(steps, mode="ps")
    local = _find(steps, mode="local")
    if ps is None and local is None:
        return "_not run_"
    present = (ps or local or {}).get("phases_ms", {})
    phases = [p for p in PHASE_ORDER if p in present] + [p for p in present
                                                         if p not in PHASE_ORDER]
    rows = []
    for phase in phases:
        rows.append([phase, fmt(ps and ps["phases_ms"].get(phase), digits=2),
                     fmt(local and local["phases_ms"].get(phase), digits=2)])
    rows.append(["**step (wall)**", fmt(ps and ps["step_ms"], digits=2),
                 fmt(local and local["step_ms"], digits=2)])
    rows.append(["examples/s (this loop)", fmt(ps and ps["examples_per_s"], digits=0),
                 fmt(local and local["examples_per_s"], digits=0)])
    rows.append(["worker CPU ms/step (all threads)", fmt(ps and ps["worker_cpu_ms"], digits=2),
                 fmt(local and local["worker_cpu_ms"], digits=2)])
    rows.append(["server CPU ms/step", fmt(ps and ps.get("server_cpu_ms"), digits=2), "-"])
    for name, summary in (ps or {}).get("send_thread_ms", {}).items():
        rows.append([f"{name} (background, overlaps)", fmt(summary, digits=2), "-"])
    text = _table(["phase (ms per step)", "PS async 1x1 worker", "single process"], rows)
    for rec, label in ((ps, "PS async 1x1 worker"), (local, "single process")):
        if rec is None:
            continue
        top = rec.get("cprofile_top", [])[:8]
        text += (f"\n\ncProfile of {rec['steps_per_window']} more steps, {label}, main "
                 "thread, functions by own time:\n\n")
        text += _table(["function", "own ms/step", "share"],
                       [[f"`{t['function']}`", f"{t['own_ms_per_step']:.2f}",
                         f"{100 * t['share']:.0f} %"] for t in top])
    n = (ps or local or {}).get("steps_per_window")
    return ("The runner's training loop in one process, timed phase by phase with "
            f"`time.perf_counter` (median (min-max) over windows of {n} steps after a "
            "warm-up; batch 512, dim 9, Adam). PS: worker 0 of a 1x1 async job against a "
            "server subprocess. Phases on the main thread add up to the step; the send "
            "thread's rpc time runs beside them.\n\n" + text)


_READER_CONTEXT = """\
What limits the raw Criteo parser (`psfleet.data.parse_criteo_bytes`): Arrow's CSV
reader splits the fields (C++, releases the GIL; about 35 % of the time), then a fixed
series of numpy calls per 4 MiB chunk (about 16-17k lines) converts the dense columns,
hashes the 26 categorical columns and cuts batches. Between those calls the thread holds the
GIL, so a second reader thread overlaps only the Arrow and numpy-kernel parts: about
1.4x with thread_num 2 on an otherwise idle 2-core machine rather than 2x (measured
here: {measured} for QueueDataset; when other processes keep the cores busy the second
thread finds no free core and the gain shrinks or turns into a loss). The PaddleRec slot
format (`click:1 dense_feature:0.05 ... 1:123 2:456`) is not split by Arrow but by numpy
passes over the chunk's separator bytes (`psfleet/data/_slot_fast.py`; Arrow only casts
the dense values); its cost is in the figures above: {slot}."""


def _reader_section(reader: list[Record]) -> str:
    if not reader:
        return "_not run_"
    order = {"QueueDataset": 0, "InMemoryDataset": 1}
    rows = []
    for rec in sorted(reader, key=lambda r: (r["format"] != "criteo", r["format"],
                                             order.get(r["reader"], 2), r["thread_num"])):
        one = _find(reader, format=rec["format"], reader=rec["reader"], thread_num=1)
        speedup = "-"
        if rec["thread_num"] != 1 and _med(one, "lines_per_s"):
            speedup = f"{_med(rec, 'lines_per_s') / _med(one, 'lines_per_s'):.2f}x"
        rows.append([{"criteo": "raw Criteo TSV", "slot": "PaddleRec slot"}.get(
                         rec["format"], rec["format"]),
                     rec["reader"], str(rec["thread_num"]),
                     fmt(rec["lines_per_s"], digits=0), fmt(rec["lines_per_cpu_s"], digits=0),
                     speedup])
    lines = reader[0]["rows"]
    one = _med(_find(reader, format="criteo", reader="QueueDataset", thread_num=1),
               "lines_per_s")
    two = _med(_find(reader, format="criteo", reader="QueueDataset", thread_num=2),
               "lines_per_s")
    measured = f"{two / one:.2f}x" if one and two else "not measured"
    raw_cpu = _med(_find(reader, format="criteo", reader="QueueDataset", thread_num=1),
                   "lines_per_cpu_s")
    slot_cpu = _med(_find(reader, format="slot", reader="QueueDataset", thread_num=1),
                    "lines_per_cpu_s")
    slot = (f"{slot_cpu / raw_cpu:.2f}x the raw format's lines per CPU second "
            "(QueueDataset, thread_num 1)" if raw_cpu and slot_cpu else "not measured")
    return (f"One worker reads a file of {lines:,} synthetic lines (seed 7; the slot file is "
            "its PaddleRec slot-format twin: min-max normalised dense features, ids = "
            "key % 1000001, made once and cached). QueueDataset: one streaming pass, "
            "parse + hash + cut into batches of 512 (what the training loop consumes); "
            "InMemoryDataset: `load_into_memory` (parse + hash + concatenate). Lines per "
            "CPU second counts the CPU time of all the process's threads, so it is less "
            "disturbed by other load on the shared machine than lines/s.\n\n"
            + _table(["format", "reader", "thread_num", "lines/s", "lines per CPU second",
                      "vs thread_num 1 (lines/s)"], rows)
            + "\n\n" + _READER_CONTEXT.format(measured=measured, slot=slot))


def _costs(e2e: list[Record], table: list[Record], memory: list[Record], wire: list[Record],
           steps: list[Record]) -> str:
    ps = _find(steps, mode="ps")
    local = _find(steps, mode="local")

    def phase(rec: Record | None, name: str) -> float:
        value = _med(rec, "phases_ms", name)
        return value if value is not None else float("nan")

    def send(name: str) -> float:
        value = _med(ps, "send_thread_ms", f"send thread: {name}")
        return value if value is not None else float("nan")

    pull_ps, pull_local = phase(ps, "pull"), phase(local, "pull")
    compute_ps = phase(ps, "forward") + phase(ps, "backward")
    compute_local = phase(local, "forward") + phase(local, "backward")
    server_cpu = _med(ps, "server_cpu_ms") or float("nan")
    worker_cpu = _med(ps, "worker_cpu_ms") or float("nan")
    local_cpu = _med(local, "worker_cpu_ms") or float("nan")
    dense_ms = send("push_dense") + send("pull_dense")
    pull_rec = _find(table, op="pull", keys=100_000, dim=9, kind="existing")
    push_rec = _find(table, op="push", keys=100_000, dim=9, kind="existing")
    new_rec = _find(table, op="pull", keys=100_000, dim=9, kind="new")
    wire_pull = _find(wire, op="pull", keys=10_000, dim=9, kind="existing")
    wire_one = _find(wire, op="pull", keys=1, dim=9, kind="existing")
    mem9 = _find(memory, dim=9)
    bound = 2 * local_cpu / (worker_cpu + server_cpu) if ps and local else float("nan")
    r12 = _med(_find(e2e, kind="summary", case="PS async 1x2"), "ratio_to_single")

    def m(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
        return "n/a" if value is None or value != value else f"{value * scale:,.{digits}f}"

    return f"""\
Ranked by what they cost the PS step against the single-process step (section 4) and
the targets (sections 1-3):

1. **The sparse pull is a blocking rpc on the critical path of every forward.** It takes
   {m(pull_ps, 2)} ms of a {m(_med(ps, 'step_ms'), 1)} ms PS step against {m(pull_local, 2)} ms
   in process; over the wire one 10,000-key pull has a p50 of
   {m(_med(wire_pull, 'p50_ms'), 2)} ms and even a 1-key call costs
   {m(_med(wire_one, 'p50_ms'), 2)} ms (grpcio + protobuf + thread hand-offs, both sides in
   Python). *Removal:* prefetch — dedup and pull batch t+1's keys on a background thread
   while batch t computes (the reader already holds the next batch), which hides the pull
   whenever compute is longer; then a leaner transport for the payload (one
   preallocated buffer instead of `tobytes`/`frombuffer` copies, or shared memory when
   the server is on the same host).
2. **Dense traffic and server-side Adam compete with the model's compute for the
   2 cores.** Each step pushes the 295,361 dense gradients (1.2 MB) and, with
   `k_steps` 1, pulls the dense values back: the send thread spends
   {m(dense_ms, 2)} ms/step in those calls and the server {m(server_cpu, 2)} ms CPU per
   step (numpy Adam over 295k floats plus the sparse rows, and protobuf). Forward +
   backward take {m(compute_ps, 2)} ms/step in the PS worker against
   {m(compute_local, 2)} ms alone: the same work, slowed by the CPU (and GIL) it shares
   with the send thread and the server. With 1 worker + 1 server the job has exactly
   2 busy processes on 2 cores; with 1x2 it has 3. A CPU bound for 1x2 is
   2 cores x single-process CPU per step / (worker + server CPU per PS step) =
   {m(bound, 2)}x against the 1.6x target (measured {m(r12, 2)}x; with two workers the
   send thread merges more queued steps per send, so the measured ratio can pass this
   estimate a little). 1.6x needs the PS step's CPU cost to fall to about the
   single-process one. *Removal:* send the
   dense part less often (`k_steps` > 1, merging more steps per send with
   `send_wait_times`), apply dense Adam with torch's fused/foreach kernels, or keep the
   dense MLP replicated on the workers and all-reduce it (collective mode) so only sparse
   rows travel; on a real cluster the servers get their own cores.
3. **The sparse table is numpy driven by Python.** In process it pulls
   {m(_med(pull_rec, 'rows_per_s'), 2, 1e-6)}M rows/s and pushes
   {m(_med(push_rec, 'rows_per_s'), 2, 1e-6)}M rows/s (dim 9, 100,000 existing keys;
   targets 10M and 5M) and inserts new rows at
   {m(_med(new_rec, 'rows_per_s'), 2, 1e-6)}M rows/s: every call routes the keys to 8
   shards (hash, sort, split) and then, per shard, runs a handful of whole-array numpy
   passes (hash again, probe rounds, gather of whole rows including the Adam state,
   scatter into the output), each allocating a temporary and each touching the 1M-row
   table at random; inserts add `np.unique`, a claim loop over probe rounds and the
   key-seeded initializer; a push adds Adam over the gathered block (float64 powers for
   the per-row bias correction) and a scatter back. At 1,000 keys per call the fixed
   per-numpy-call overhead dominates. Memory is {m(_med(mem9, 'table_ratio_to_raw'), 2)}x
   the raw row at dim 9:
   the index's 4-byte slots kept at most a quarter full plus an 8-byte key per row
   (24-40 B per row) and 1.5x growth slack on the row matrix (section 2b explains why
   its RSS figure is noisy). *Removal:* a compiled open-addressing map (C++/Rust
   extension, or a torch C++ op) that probes each key to the end and copies its values
   in one pass, with no temporaries, at a higher load factor; values and optimizer
   state in separate matrices so a pull gathers only the values."""


def _pooled_section(pooled: list[Record]) -> str:
    rows = [[r["config"], f"{r['ids_per_batch']:,.0f}", fmt(r["examples_per_s"], digits=0),
             fmt(r["ids_per_s"], 1e-6, 2), fmt(r["ms_per_step"], digits=1),
             fmt(r["cpu_ms_per_step"], digits=1)]
            for r in pooled if r.get("bench") == "pooled_embedding"]
    if not rows:
        return "_not run_"
    return ("`benchmarks/pooled_embedding.py`: one training step of the embeddings alone "
            "(forward, backward of a linear loss, the step's one push per table, Adam in "
            "in-process tables), batch 512, dim 16, 1 torch thread. `pooled_*`: 8 "
            "single-valued and 3 multi-valued features (Poisson lengths, mean 20, Zipf ids), "
            "mean pooling; `single_*`: the 26 single-valued Criteo slots of the shared "
            "sample through FeatureEmbeddings' fast path, a plain SparseEmbedding and the "
            "same ids as bags of one. ids/s counts every id looked up and pooled.\n\n"
            + _table(["configuration", "ids per batch", "examples/s", "M ids/s", "ms/step",
                      "CPU ms/step"], rows))


def _multihot_section(multihot: list[Record]) -> str:
    summaries = [r for r in multihot if r.get("kind") == "summary"]
    parity = {r["model"]: r for r in multihot if r.get("kind") == "parity"}
    if not summaries:
        return "_not run_"
    rows = [[r["model"], r["case"], fmt(r["examples_per_s"], digits=0),
             fmt(r["test_auc"], digits=4), fmt(r["train_wall_s"], digits=1)]
            for r in summaries]
    spread = [[model, f"{p['max_auc_difference']:.4f}",
               "yes" if p["max_auc_difference"] <= 0.005 else "**no**"]
              for model, p in parity.items()]
    first = summaries[0]
    return (f"`benchmarks/multihot_parity.py`: `psfleet datagen multihot` ({first['train_rows']:,}"
            f" training rows, {first['test_rows']:,} test rows, seed 7; optimum test AUC "
            f"{first['test_optimum_auc']:.4f}), `examples/multivalued_csv/config.yaml` with "
            "1 epoch, batch 512 per worker, Adam lr 0.001, fc 256-128-64, two tables of dim "
            "8 (c1..c6 + genres; hist + tags mean-pooled).\n\n"
            + _table(["model", "configuration", "examples/s", "test AUC", "train wall s"], rows)
            + "\n\nLargest test-AUC difference among the three configurations of each "
            "model (target <= 0.005):\n\n"
            + _table(["model", "max AUC difference", "<= 0.005?"], spread))


def write_report(out: Path, *, records: dict[str, list[Record]], machine: dict[str, Any],
                 end_loadavg: list[float], started_at: str, total_s: float,
                 timings: dict[str, float], commands: list[str], run_all_command: str,
                 settings: dict[str, Any], rerendered: bool = False) -> None:
    """Write BENCHMARKS.md from the scripts' JSON records."""
    e2e = records.get("e2e_throughput", [])
    ops = records.get("table_ops", [])
    table = [r for r in ops if r.get("bench") == "table_ops"]
    memory = [r for r in ops if r.get("bench") == "table_memory"]
    backends = [r for r in records.get("table_backends", [])
                if r.get("bench") == "table_backends"]
    wire = records.get("wire_ops", [])
    steps = records.get("step_profile", [])
    reader = [r for r in records.get("reader_throughput", [])
              if r.get("bench") == "reader_throughput"]
    lifecycle = records.get("table_lifecycle", [])
    capped = records.get("capped_auc", [])
    capped_runs = [r for r in capped if r.get("kind") == "run"]
    m = machine
    n_cases = len([r for r in e2e if r.get("kind") == "summary"]) or len(E2E_CASES)

    def section(title: str, body: str) -> str:
        return f"## {title}\n\n{body}\n"

    timing_rows = [[name, f"{seconds:,.0f}"] for name, seconds in timings.items()]
    timing_rows.append(["**total (run_all.py)**", f"**{total_s:,.0f}**"])
    rows = settings.get("train_rows", 0)
    parts = [
        "# psfleet benchmarks\n",
        f"Generated by `{run_all_command}` (started {started_at}, {total_s / 60:.1f} min). "
        "Every figure is the median of "
        f"{settings.get('repeats')} runs with the spread (min-max) in parentheses. "
        "Do not edit by hand: rerun the command."
        + (" (This text was re-rendered from that run's saved records with `python "
           "benchmarks/run_all.py --from_json benchmarks/.data/last_run.json`; the figures "
           "are the run's.)" if rerendered else "") + "\n\n"
        f"Load average (1, 5, 15 min) at the start: {', '.join(f'{x:.2f}' for x in m['loadavg'])}"
        f"; at the end: {', '.join(f'{x:.2f}' for x in end_loadavg)}. The machine is shared "
        "with other sessions, so figures carry that noise; the spread shows how much.\n\n"
        + _PS_CONTEXT + "\n",
        section("Targets", _targets(e2e, table, memory, steps, reader, lifecycle, capped,
                                    records.get("tiered_table", []))),
        section("Machine", _table(["", ""], [
            ["CPU", m["cpu_model"]], ["cores (nproc)", str(m["nproc"])],
            ["RAM", f"{m['ram_gib']} GiB"], ["kernel", m["kernel"]],
            ["Python", m["python"]], ["torch", m["torch"]], ["numpy", m["numpy"]],
            ["grpcio", m["grpcio"]], ["psfleet", m["psfleet"]]])),
        section("Data", (
            f"Synthetic Criteo rows from `psfleet datagen criteo --rows {rows} --seed 7 "
            f"--out ... --test_rows {settings.get('test_rows')} --test_out ...` "
            "(`psfleet.data.generate_criteo`), cached in `benchmarks/.data` (gitignored) "
            "and generated when missing.\n\n"
            f"The issue asks for 1M training rows unless said otherwise. The end-to-end table "
            f"uses {rows:,} (and {settings.get('test_rows'):,} test rows) so that the "
            f"whole run — {n_cases} configurations x {settings.get('repeats')} repeat(s), each "
            "paying ~10-25 s of start-up (torch import, servers, parsing), plus sections "
            "2-5 — is kept to about 15 minutes on this 2-core machine: at 1M rows the "
            f"training alone is {n_cases} jobs x 1M rows at ~7-15k examples/s, "
            f"{n_cases * 1e6 / 15e3 / 60:.0f}-{n_cases * 1e6 / 7e3 / 60:.0f} minutes per "
            "repeat, plus a few seconds per job to parse the file. Throughput per "
            "step does not depend on the row count once the tables are warm; the test AUC "
            "does (one epoch over fewer rows), so the AUCs here are below those of "
            "DESIGN.md's 1M-row runs."
            + (f" Section 5 (reader) reads its own file of {reader[0]['rows']:,} lines "
               "(same generator and seed) and does not train." if reader else "")
            + (f" Section 8's AUC runs train on their own {capped_runs[0]['train_rows']:,} "
               "rows (same generator and seed) and test on the same test file."
               if capped_runs else ""))),
        section("Commands", "From the repository root, with the virtualenv's python "
                "(psutil, from the `test` extra, is the only extra dependency):\n\n```bash\n"
                + run_all_command + "\n# which runs, one after the other:\n"
                + "\n".join(commands) + "\n```\n\n" + _e2e_commands(e2e)
                + _table(["step", "seconds"], timing_rows)),
        section("1. End-to-end training throughput", _e2e_section(e2e)),
        section("2. Sparse table in process", _table_section(table)),
        section("2a. Sparse table backends: numpy and native (issue 41)",
                _backends_section(backends)),
        section("2b. Memory per sparse row", _memory_section(memory)),
        section("3. Over the wire (gRPC, 127.0.0.1)", _wire_section(wire)),
        section("4. Where the time goes in one PS training step", _step_section(steps)),
        section("5. Reader throughput", _reader_section(reader)),
        section("6. Pooled multi-hot embeddings", _pooled_section(
            records.get("pooled_embedding", []))),
        section("7. Multi-valued features: AUC parity of the four models",
                _multihot_section(records.get("multihot_parity", []))),
        section("8. Table lifecycle: a row cap on never-ending ids",
                lifecycle_section(lifecycle, capped)),
        section("9. A table larger than memory: the disk tier",
                tiered_section(records.get("tiered_table", []))),
        section("Top three costs and what would remove each",
                _costs(e2e, table, memory, wire, steps)),
    ]
    out.write_text("\n".join(parts))
