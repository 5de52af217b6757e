"""Where the time of one training step goes on the worker.

The DNN of the YAML runner (dim 9, fc 512-256-128-32, Adam, batch 512, one torch
thread) trains in this process, as worker 0 of a 1x1 async job against one server in
a subprocess (``ps``), and alone on in-process tables (``local``, the single-process
reference). Each mode runs in its own child process (``fleet`` is one per process).

The loop is the runner's (``psfleet.rec.trainer``), with ``time.perf_counter`` around
each phase; library calls are timed by wrapping them on their instances:

- ``reader``: the next batch from the in-memory CriteoReader.
- ``pull``: ``communicator.pull_sparse`` inside the embedding's forward (an rpc in
  ``ps`` mode, a table lookup in ``local`` mode).
- ``forward``: the rest of the forward pass and the loss (dedup, gather, MLP).
- ``backward``: ``loss.backward()``.
- ``push (hand-off)``: ``optimizer.step()`` handing gradients to the communicator
  (``local``: applying them to the tables, sparse and dense).
- ``wait (send queue full)``: ``end_step`` blocked on the async send queue.
- ``install dense``: copying fresh dense values into the model.
- ``bookkeeping``: ``zero_grad``, ``loss.item()`` and the running AUC (worker 0).
- ``other``: the rest of the step's wall time.

Besides: the send thread's busy time (``ps``; it overlaps the loop), this process's CPU
time and the server's CPU time per step. Windows of ``--steps`` steps after a warm-up
are the repeats. A last window runs under cProfile (main thread) and reports the top
functions by own time.

    python benchmarks/step_profile.py --repeats 3 --steps 100
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import (
    DEFAULT_CACHE_DIR,
    ServerProcess,
    base_parser,
    clean_env,
    emit,
    ensure_criteo,
    log,
    parse_json_lines,
    summarise,
)

BATCH_SIZE = 512
MAIN_PHASES = ("reader", "pull", "forward", "backward", "push (hand-off)",
               "wait (send queue full)", "install dense", "bookkeeping")


class Timers:
    """Seconds accumulated per name, per thread kind (``main`` or ``send``)."""

    def __init__(self) -> None:
        self.main: dict[str, float] = defaultdict(float)
        self.send: dict[str, float] = defaultdict(float)
        self._main_thread = threading.main_thread()

    def add(self, name: str, seconds: float) -> None:
        where = self.main if threading.current_thread() is self._main_thread else self.send
        where[name] += seconds

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - t0)
        return timed

    def reset(self) -> None:
        self.main.clear()
        self.send.clear()


def _batches(reader: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        reader.set_epoch(epoch)
        yield from reader
        epoch += 1


def run_child(mode: str, train: Path, steps: int, repeats: int, warmup: int) -> None:
    """Train in this process in ``mode`` (``ps`` or ``local``) and emit the phases."""
    server = ServerProcess() if mode == "ps" else None
    try:
        if server is not None:
            os.environ.update({"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINERS_NUM": "1",
                               "PADDLE_TRAINER_ID": "0",
                               "PADDLE_PSERVERS_IP_PORT_LIST": server.endpoint})
        _train(mode, train, steps, repeats, warmup, server)
    finally:
        if server is not None:
            server.stop()


def _train(mode: str, train: Path, steps: int, repeats: int, warmup: int,
           server: ServerProcess | None) -> None:
    import psutil
    import torch
    from torch import nn

    from psfleet import fleet
    from psfleet.data import CriteoReader
    from psfleet.fleet import DistributedStrategy
    from psfleet.metrics import StreamingAuc
    from psfleet.nn import SparseEmbedding
    from psfleet.rec.models import build_model

    torch.set_num_threads(1)
    torch.manual_seed(2026)
    fleet.init(strategy=DistributedStrategy(mode="async"))
    embedding = SparseEmbedding(9, name="embedding", initializer="uniform", initial_range=0.01)
    model = build_model("dnn", embedding=embedding, embedding_dim=9,
                        fc_sizes=[512, 256, 128, 32])
    optimizer = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=0.001))
    reader = CriteoReader([train], BATCH_SIZE, 0, 1, shuffle_seed=2026)
    fleet.init_worker()

    timers = Timers()
    communicator = fleet._fleet._require_runtime().communicator  # noqa: SLF001
    start_pull = communicator.start_pull_sparse

    def pull(table_id: int, keys: Any, create: bool = True) -> Any:
        handle = start_pull(table_id, keys, create)
        handle.result()  # the forward waits for the rows here
        return handle

    communicator.start_pull_sparse = timers.wrap("pull", pull)  # type: ignore
    communicator.end_step = timers.wrap("wait (send queue full)",  # type: ignore
                                        communicator.end_step)
    optimizer.install = timers.wrap("install dense", optimizer.install)  # type: ignore
    client = communicator.client
    for name in ("push_sparse", "push_dense", "pull_dense"):  # the send thread's calls
        setattr(client, name, timers.wrap(f"send thread: {name}", getattr(client, name)))
    server_proc = psutil.Process(server.proc.pid) if server is not None else None
    me = psutil.Process()

    loss_fn = nn.BCEWithLogitsLoss()
    running = StreamingAuc()
    batches = _batches(reader)

    def step() -> None:
        t0 = time.perf_counter()
        batch = next(batches)
        t1 = time.perf_counter()
        pull_before = timers.main["pull"]
        logits = model(batch.sparse, batch.dense)
        loss = loss_fn(logits, batch.labels)
        t2 = time.perf_counter()
        timers.add("forward", (t2 - t1) - (timers.main["pull"] - pull_before))
        optimizer.zero_grad()
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        inner_before = timers.main["wait (send queue full)"] + timers.main["install dense"]
        optimizer.step()
        t5 = time.perf_counter()
        inner = timers.main["wait (send queue full)"] + timers.main["install dense"]
        timers.add("push (hand-off)", (t5 - t4) - (inner - inner_before))
        loss.item()
        running.update(batch.labels, torch.sigmoid(logits.detach()))
        t6 = time.perf_counter()
        timers.add("reader", t1 - t0)
        timers.add("backward", t4 - t3)
        timers.add("bookkeeping", (t3 - t2) + (t6 - t5))

    for _ in range(warmup):
        step()
    windows: list[dict[str, Any]] = []
    for _ in range(repeats):
        fleet.flush()  # an empty send queue at the start of every window
        timers.reset()
        cpu0 = me.cpu_times()
        srv0 = server_proc.cpu_times() if server_proc is not None else None
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - start
        cpu1 = me.cpu_times()
        ms = {name: timers.main.get(name, 0.0) * 1e3 / steps for name in MAIN_PHASES}
        ms["other"] = wall * 1e3 / steps - sum(ms.values())
        window = {"step_ms": wall * 1e3 / steps, "phases_ms": ms,
                  "send_thread_ms": {k: v * 1e3 / steps for k, v in timers.send.items()},
                  "worker_cpu_ms": ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system))
                  * 1e3 / steps,
                  "examples_per_s": steps * BATCH_SIZE / wall}
        if server_proc is not None and srv0 is not None:
            srv1 = server_proc.cpu_times()
            window["server_cpu_ms"] = ((srv1.user + srv1.system) - (srv0.user + srv0.system)) \
                * 1e3 / steps
        windows.append(window)
        log(f"step_profile {mode}: {window['step_ms']:.1f} ms/step")

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    fleet.flush()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    top = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:15]  # type: ignore
    fleet.stop_worker()

    def summary_of(get: Callable[[dict[str, Any]], float]) -> dict[str, Any]:
        return summarise([get(w) for w in windows])

    send_names = sorted({k for w in windows for k in w["send_thread_ms"]})
    emit({
        "bench": "step_profile", "mode": mode, "steps_per_window": steps,
        "batch_size": BATCH_SIZE, "step_ms": summary_of(lambda w: w["step_ms"]),
        "examples_per_s": summary_of(lambda w: w["examples_per_s"]),
        "phases_ms": {p: summary_of(lambda w, p=p: w["phases_ms"][p])
                      for p in (*MAIN_PHASES, "other")},
        "send_thread_ms": {n: summary_of(lambda w, n=n: w["send_thread_ms"].get(n, 0.0))
                           for n in send_names},
        "worker_cpu_ms": summary_of(lambda w: w["worker_cpu_ms"]),
        "server_cpu_ms": (summary_of(lambda w: w["server_cpu_ms"])
                          if server_proc is not None else None),
        "cprofile_top": [{"function": f"{Path(f).name}:{line}({name})",
                          "own_ms_per_step": tottime * 1e3 / steps,
                          "share": tottime / total if total else 0.0}
                         for (f, line, name), (_, _, tottime, _, _) in top],
    })


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps per timed window")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--train_rows", type=int, default=150_000)
    parser.add_argument("--test_rows", type=int, default=40_000)
    parser.add_argument("--cache_dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--modes", default="ps,local")
    parser.add_argument("--child", default=None, help=argparse_hidden())
    args = parser.parse_args()
    train, _, _ = ensure_criteo(args.train_rows, args.test_rows, args.cache_dir)
    if args.child:
        run_child(args.child, train, args.steps, args.repeats, args.warmup)
        return
    for mode in args.modes.split(","):
        log(f"step_profile: {mode}")
        command = [sys.executable, __file__, "--child", mode, "--repeats", str(args.repeats),
                   "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--train_rows", str(args.train_rows), "--test_rows", str(args.test_rows),
                   "--cache_dir", str(args.cache_dir)]
        result = subprocess.run(command, env=clean_env(PSFLEET_LOG_LEVEL="WARNING"),
                                stdout=subprocess.PIPE, text=True, check=True, timeout=900)
        for record in parse_json_lines(result.stdout.splitlines()):
            emit(record)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
