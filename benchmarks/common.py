"""Shared helpers of the benchmark scripts: JSON lines, medians, machine, data, RSS.

Every script prints one JSON object per line on stdout (``emit``); progress and
diagnostics go to stderr. ``run_all.py`` runs the scripts as subprocesses, parses
their stdout and writes BENCHMARKS.md.

Summaries are ``{"median", "min", "max", "n", "samples"}`` over the repeats of one
measurement (:func:`summarise`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_CACHE_DIR = BENCH_DIR / ".data"
DATA_SEED = 7

# Environment variables that would make a child process part of some other job.
_JOB_VARIABLES = ("TRAINING_ROLE", "POD_IP", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                  "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
_JOB_PREFIXES = ("PADDLE_", "PSFLEET_")
#: PSFLEET_ variables that choose how this machine runs, not a job: kept for children.
_KEPT = ("PSFLEET_TABLE_BACKEND", "PSFLEET_TABLE_THREADS")


def emit(record: dict[str, Any]) -> None:
    """Print ``record`` as one JSON line on stdout (flushed)."""
    print(json.dumps(record, sort_keys=True), flush=True)


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def summarise(samples: Sequence[float]) -> dict[str, Any]:
    """Median and spread of the repeats of one measurement."""
    values = [float(v) for v in samples]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0, "samples": []}
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "samples": values}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def base_parser(description: str, repeats: int = 3) -> argparse.ArgumentParser:
    """An argument parser with ``--repeats`` (runs per figure, >= 1)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=repeats,
                        help=f"runs per figure; the median is reported (default {repeats})")
    return parser


def job_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser for scripts that run ``psfleet train`` jobs: ``--train`` and
    ``--test`` (data files) and ``--work`` (the runs' folder), made absolute since they
    go into the jobs' configs."""
    parser = argparse.ArgumentParser(description=description)
    for name in ("--train", "--test", "--work"):
        parser.add_argument(name, type=lambda p: Path(p).resolve(), required=True)
    return parser


# -- machine ------------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def _version(module: str) -> str:
    try:
        mod = __import__(module)
    except ImportError:
        return "not installed"
    return str(getattr(mod, "__version__", "unknown"))


def machine_info() -> dict[str, Any]:
    """nproc, RAM, CPU model, OS and the versions that matter for the figures."""
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "ram_gib": round(_mem_total_gib(), 1),
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "grpcio": _version("grpc"),
        "psfleet": _version("psfleet"),
        "loadavg": list(os.getloadavg()),
    }


# -- processes ----------------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without job variables (the table backend's are kept:
    ``PSFLEET_TABLE_BACKEND`` picks what a benchmark's children run), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k in _KEPT or (
        k not in _JOB_VARIABLES and not k.startswith(_JOB_PREFIXES))}
    env.update(extra)
    return env


def job_process(under: Path, variable: str, value: str) -> Any:
    """A running process whose command line names ``under`` (a run's config, or a
    folder holding it) and whose environment has ``variable=value`` (e.g.
    ``PADDLE_TRAINER_ID=1``): a ``psutil.Process``, or None when there is none."""
    import psutil  # only the scripts that look for a job's processes need it

    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(under) in " ".join(proc.info["cmdline"] or []) and \
                    proc.environ().get(variable) == value:
                return proc
        except psutil.Error:
            continue
    return None


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process now (VmRSS), bytes; 0 if it is gone."""
    return _status_kb(pid, "VmRSS:") * 1024


def _status_kb(pid: int | str, field: str) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def _role_of(environ: dict[str, str], is_root: bool, root_label: str) -> str:
    if is_root:
        return root_label
    role = environ.get("TRAINING_ROLE") or environ.get("PADDLE_TRAINING_ROLE") or ""
    if role.upper() == "PSERVER":
        return f"server{environ.get('PSFLEET_SERVER_INDEX', '?')}"
    if role.upper() == "TRAINER":
        return f"worker{environ.get('PADDLE_TRAINER_ID', '?')}"
    return "other"


class TreeRssMonitor:
    """Polls the peak RSS (VmHWM) of a process and all its descendants.

    Each process is labelled by its role (``serverN`` / ``workerN`` from its
    environment, ``root_label`` for the root). VmHWM is the kernel's high-water
    mark of the process's RSS, so a poll anywhere before the process exits sees its
    true peak; processes that live shorter than one interval may be missed.

    Args:
        pid: the root process.
        root_label: the root's label (``launcher``, ``process``).
        interval_s: seconds between polls.
    """

    def __init__(self, pid: int, root_label: str, interval_s: float = 0.1) -> None:
        import psutil  # benchmark-only dependency (the ``test`` extra)

        self._psutil = psutil
        self._root = psutil.Process(pid)
        self._root_label = root_label
        self._interval_s = interval_s
        self._labels: dict[int, str] = {}
        self.peak_kb: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-monitor", daemon=True)

    def __enter__(self) -> TreeRssMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self._interval_s)

    def poll(self) -> None:
        psutil = self._psutil
        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            pid = proc.pid
            # Between fork and exec a child still has its parent's environment (and
            # memory): keep asking until it shows a role, and count it from then on.
            if self._labels.get(pid, "other") == "other":
                try:
                    environ = proc.environ()
                except psutil.Error:
                    continue
                self._labels[pid] = _role_of(environ, proc == self._root, self._root_label)
                if self._labels[pid] == "other":
                    continue
            hwm = _status_kb(pid, "VmHWM:")
            if hwm:
                self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), hwm)

    def peaks_mb(self) -> dict[str, float]:
        """Peak RSS per labelled process, MB (10^6 bytes); 'other' processes dropped."""
        out: dict[str, float] = {}
        for pid, kb in self.peak_kb.items():
            label = self._labels.get(pid, "other")
            if label != "other":
                out[label] = max(out.get(label, 0.0), kb * 1024 / 1e6)
        return out


def stop_tree(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM a process and its descendants, then SIGKILL whatever is left."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


# -- data ---------------------------------------------------------------------------------


def ensure_criteo(train_rows: int, test_rows: int, cache_dir: Path = DEFAULT_CACHE_DIR,
                  seed: int = DATA_SEED) -> tuple[Path, Path, dict[str, Any]]:
    """The synthetic Criteo train and test files, generated into ``cache_dir`` if missing.

    Same as ``psfleet datagen criteo --rows TRAIN --seed 7 --out ... --test_rows TEST
    --test_out ...``. A file counts as present when its ``.json`` metadata (written
    after the atomic rename of the TSV) exists.

    Returns:
        (train path, test path, {"train_optimum_auc", "test_optimum_auc"}).
    """
    from psfleet.data import generate_criteo

    return _ensure("criteo", generate_criteo, "tsv", train_rows, test_rows, cache_dir, seed)


def ensure_multihot(train_rows: int, test_rows: int, cache_dir: Path = DEFAULT_CACHE_DIR,
                    seed: int = DATA_SEED) -> tuple[Path, Path, dict[str, Any]]:
    """The synthetic multi-hot CSV train and test files (``psfleet datagen multihot
    --rows TRAIN --seed 7 ...``), generated into ``cache_dir`` if missing; as
    :func:`ensure_criteo`."""
    from psfleet.data.synthetic_multihot import generate_multihot

    return _ensure("multihot", generate_multihot, "csv", train_rows, test_rows, cache_dir,
                   seed)


def _ensure(name: str, generate: Any, suffix: str, train_rows: int, test_rows: int,
            cache_dir: Path, seed: int) -> tuple[Path, Path, dict[str, Any]]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = {"train": cache_dir / f"{name}_train_{train_rows}_seed{seed}.{suffix}",
             "test": cache_dir / f"{name}_test_{test_rows}_seed{seed}.{suffix}"}
    rows = {"train": train_rows, "test": test_rows}
    meta: dict[str, Any] = {}
    for split, path in paths.items():
        meta_path = Path(f"{path}.json")
        if not (path.exists() and meta_path.exists()):
            log(f"generating {rows[split]} {split} rows into {path}")
            generate(rows[split], seed, path, split=split)
        meta[f"{split}_optimum_auc"] = json.loads(meta_path.read_text())["optimum_auc"]
    return paths["train"], paths["test"], meta


def parse_json_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON objects among ``lines`` (other lines are ignored)."""
    out = []
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


# -- a server in a subprocess -------------------------------------------------------------

_SERVER_CODE = """
import sys
from pathlib import Path
from psfleet.ps import run_server
from psfleet.rpc import RpcConfig
run_server("127.0.0.1", 0, RpcConfig(), endpoint_file=Path(sys.argv[1]))
"""


class ServerProcess:
    """One psfleet server (``psfleet.ps.run_server``) in a subprocess on 127.0.0.1.

    It binds port 0 and reports the port through an endpoint file. Use as a context
    manager: on exit the server is told to stop by whoever holds a client (optional)
    and is then terminated if still alive.
    """

    def __init__(self, start_timeout_s: float = 120.0) -> None:
        import subprocess
        import tempfile

        from psfleet.rpc.endpoint_file import read_endpoint_file

        self._dir = Path(tempfile.mkdtemp(prefix="psfleet-bench-server-"))
        endpoint_file = self._dir / "endpoint"
        self.log_path = self._dir / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER_CODE, str(endpoint_file)],
                                     env=clean_env(), stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + start_timeout_s
        endpoint = None
        while endpoint is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server did not start; log: {self.log_path.read_text()}")
            time.sleep(0.05)
            endpoint = read_endpoint_file(endpoint_file)
        self.endpoint = endpoint

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace_s: float = 10.0) -> None:
        """End the server: a short wait (a client may have sent Stop), then SIGTERM
        (the server stops gracefully), then SIGKILL after ``grace_s``. Idempotent."""
        import shutil
        import subprocess

        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)
