"""Fixtures shared by every test: leak checks, paths, data slices, running the CLI.

- ``_no_leaks`` (autouse) fails a test that leaves behind child processes of pytest, a
  fleet initialized in the test's process, non-daemon threads, listening sockets or
  changed environment variables; it kills leftover processes and restores the
  environment so later tests start clean. Mark a test ``@pytest.mark.allow_leaks`` to
  skip the check (say why in the test).
- ``repo_root``, ``criteo_dir``: where the code and the shared Criteo sample are; a test
  that needs ``../shared/data`` FAILS naming it when it is missing (never skips):
  :func:`require_shared_data`.
- ``data_slice``: writes the first N lines of a Criteo file into ``tmp_path``.
- ``run_cli``: runs ``python -m psfleet.cli.main ...`` in a clean environment.
- :func:`run_folder`: the run folder a ``psfleet train`` run wrote under its
  ``runner.model_save_path`` (where ``latest`` points).
- :func:`clean_env`, :func:`run_command`, :func:`processes_mentioning` for tests that
  start processes themselves.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import psutil
import pytest

if TYPE_CHECKING:
    from torch import Tensor

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO_ROOT / ".." / "shared" / "data").resolve()
CRITEO_DIR = SHARED_DATA / "criteo_kaggle_sample"
CRITEO_FILES = ("train.csv", "dev.csv", "test.csv")
LEAK_GRACE_S = 5.0

# Variables that make a process part of a job; children of tests never inherit them.
JOB_VARIABLES = ("TRAINING_ROLE", "POD_IP", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                 "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
JOB_PREFIXES = ("PADDLE_", "PSFLEET_")
#: PSFLEET_ variables that choose the table kernels, not a job: children keep them, so a
#: run under PSFLEET_TABLE_BACKEND=numpy tests the reference in every process.
KEPT_VARIABLES = ("PSFLEET_TABLE_BACKEND", "PSFLEET_TABLE_THREADS")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "allow_leaks: skip the process / thread / socket / env leak check")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one and a half test processes per core (3 on 2 cores). The job
    tests wait part of their time (start-up, polls, timeouts they provoke): with one
    process per core the cores were idle for part of a full run, which took 1,604 s on
    2 cores against 1,456 s with 3 processes (1% idle)."""
    cores = os.cpu_count() or 1
    return max(1, cores + cores // 2)


#: Seconds the longest test modules took in a full run (3 test processes on 2 cores,
#: README's Test command with ``--durations=0``, the module's setup, call and teardown
#: times summed; 2026-11-29). Only their order matters: longest first.
MODULE_SECONDS = {
    "test_dataset_examples": 231, "test_collective_e2e": 223, "test_train_e2e": 212,
    "test_checkpoint_resume": 198, "test_curves": 198, "test_model_sync_oracle": 192,
    "test_run_folders": 186, "test_fuzz_server": 185, "test_mpi_job": 182,
    "test_bad_input": 172, "test_online_passes": 168, "test_starter": 163,
    "test_replication_job": 200, "test_launch_gang_jobs": 156, "test_console": 150,
    "test_fleet_minimal": 140, "test_checkpoint_failures": 116, "test_slurm_job": 112,
    "test_k8s_job": 107, "test_export_predict": 104, "test_parity": 101,
    "test_sync_oracle": 93, "test_datagen": 92, "test_disk_tier_job": 86,
    "test_user_schema": 80, "test_launch_multinode": 78, "test_transpiler": 73,
    "test_server_process": 68, "test_pass_mode_job": 64, "test_security_jobs": 64,
}
#: A module not in MODULE_SECONDS with a ``slow`` test, seconds (a guess: after the
#: listed ones, before the modules of fast tests only).
SLOW_MODULE_SECONDS = 30


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first (:data:`MODULE_SECONDS`), then the other modules with
    ``slow`` tests, then the rest: ``--dist loadscope`` hands each module whole to the
    next free test process in this order (pyproject.toml passes
    ``--no-loadscope-reorder``, which keeps it), so the long job modules start early
    and the many short ones fill the end of the run instead of one long module running
    alone there."""
    slow = {item.module.__name__ for item in items  # type: ignore[attr-defined]
            if item.get_closest_marker("slow") is not None}

    def seconds(item: pytest.Item) -> int:
        module = item.module.__name__  # type: ignore[attr-defined]
        return MODULE_SECONDS.get(module, SLOW_MODULE_SECONDS if module in slow else 0)

    items.sort(key=lambda item: -seconds(item))


# -- leak check -------------------------------------------------------------------------


def _live_children(me: psutil.Process) -> dict[int, psutil.Process]:
    alive = {}
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                alive[child.pid] = child
    return alive


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}"


def _listening(me: psutil.Process) -> set[tuple[str, int]]:
    try:
        conns = me.net_connections(kind="inet")
    except psutil.Error:
        return set()
    return {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}


# Set by pytest itself, or by torch the first time it uses inductor: not a test's doing.
_ENV_IGNORED_PREFIXES = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_", "TRITON_")


def _env_snapshot() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_ENV_IGNORED_PREFIXES)}


def kill_processes(procs: Sequence[psutil.Process]) -> None:
    """SIGKILL ``procs`` and wait (briefly) until they are gone."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(list(procs), timeout=5)


def _fleet_initialized() -> bool:
    """Whether this process's fleet holds a run (fleet.init called, no reset since);
    False while the process-wide Fleet was never made (no torch import for the check)."""
    module = sys.modules.get("psfleet.fleet._default")
    return module is not None and module._fleet._role is not None


@pytest.fixture(autouse=True)
def _no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("allow_leaks"):
        yield
        return
    me = psutil.Process()
    children_before = set(_live_children(me))
    threads_before = set(threading.enumerate())
    listening_before = _listening(me)
    env_before = _env_snapshot()
    fleet_before = _fleet_initialized()
    yield
    problems = []
    if _fleet_initialized() and not fleet_before:  # the next in-process run would fail
        from psfleet import fleet

        fleet.reset()
        problems.append("fleet left initialized in this process (call fleet.reset())")
    deadline = time.monotonic() + LEAK_GRACE_S
    leaked = {p: c for p, c in _live_children(me).items() if p not in children_before}
    while leaked and time.monotonic() < deadline:
        time.sleep(0.1)
        leaked = {p: c for p, c in _live_children(me).items() if p not in children_before}
    if leaked:
        problems.append("child processes still running: "
                        + "; ".join(_describe(c) for c in leaked.values()))
        kill_processes(list(leaked.values()))

    def new_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate()
                if t not in threads_before and t.is_alive() and not t.daemon]

    threads = new_threads()
    while threads and time.monotonic() < deadline:
        time.sleep(0.05)
        threads = new_threads()
    if threads:
        problems.append(f"non-daemon threads still alive: {[t.name for t in threads]}")
    sockets = _listening(me) - listening_before
    if sockets:
        problems.append(f"listening sockets left open: {sorted(sockets)}")
    env_after = _env_snapshot()
    if env_after != env_before:
        changed = sorted(k for k in set(env_after) | set(env_before)
                         if env_after.get(k) != env_before.get(k))
        problems.append(f"environment variables changed (use monkeypatch): {changed}")
        for key in set(env_after) - set(env_before):
            del os.environ[key]
        os.environ.update(env_before)
    if problems:
        pytest.fail("test leaked resources:\n  " + "\n  ".join(problems), pytrace=False)


# -- paths and data ---------------------------------------------------------------------


@pytest.fixture
def repo_root() -> Path:
    """The repository root (the folder holding ``psfleet/`` and ``tests/``)."""
    return REPO_ROOT


def bench_module(name: str) -> ModuleType:
    """The module ``benchmarks/<name>.py``; the benchmark scripts import each other by
    plain name (``from common import ...``), so their folder joins ``sys.path``."""
    bench_dir = str(REPO_ROOT / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.append(bench_dir)
    return importlib.import_module(name)


def require_shared_data(folder: Path | None = None,
                        files: Sequence[str] = CRITEO_FILES) -> Path:
    """Return ``folder`` (default :data:`CRITEO_DIR`) if it holds ``files``.

    Raises:
        pytest.fail.Exception: some file is missing; the message names the folder, the
            missing files and how to get them. A missing data set fails the test: it is
            never skipped, so a run without ``../shared`` cannot pass silently.
    """
    folder = CRITEO_DIR if folder is None else folder
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        pytest.fail(f"{folder} (../shared/data/{folder.name} beside the repository) is "
                    f"missing {', '.join(missing)}: clone the project with ../shared beside "
                    f"it (the shared folder holds the real Criteo data the tests train on)",
                    pytrace=False)
    return folder


@pytest.fixture(scope="session")
def criteo_dir() -> Path:
    """The shared Criteo Kaggle sample (train.csv 7,200 lines, dev.csv, test.csv); the
    test fails (never skips) when ``../shared/data/criteo_kaggle_sample`` is missing."""
    return require_shared_data()


def one_process_runs(script: Path, runs: list[list[str]]) -> list[str]:
    """The command running ``script`` once per argument list of ``runs``, one after the
    other in one process (``script A :: B``; tests/jobs/run_each.py)."""
    argv = [sys.executable, str(script)]
    for k, args in enumerate(runs):
        argv += [*(["::"] if k else []), *args]
    return argv


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a job's ``.npz`` file, by name (loaded, the file closed)."""
    with np.load(path) as saved:
        return {key: saved[key] for key in saved.files}


def write_slice(source: Path, dest: Path, lines: int, start: int = 0) -> Path:
    """Write lines ``start .. start+lines-1`` of ``source`` to ``dest``; returns ``dest``."""
    with source.open(encoding="utf-8") as f:
        chunk = [line for i, line in enumerate(f) if start <= i < start + lines]
    if len(chunk) < lines:
        raise ValueError(f"{source} has only {start + len(chunk)} lines, asked for "
                         f"{start + lines}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(chunk), encoding="utf-8")
    return dest


@pytest.fixture
def data_slice(criteo_dir: Path, tmp_path: Path) -> Callable[..., Path]:
    """``data_slice(n, source="train.csv", name=None, start=0)``: a file in tmp_path
    holding ``n`` lines of the Criteo sample's ``source``."""

    def make(n: int, source: str = "train.csv", name: str | None = None,
             start: int = 0) -> Path:
        dest = tmp_path / "data" / (name or f"{Path(source).stem}_{start}_{n}.csv")
        return write_slice(criteo_dir / source, dest, n, start)

    return make


def run_folder(save_path: Path) -> Path:
    """The newest run folder under ``save_path`` (a ``runner.model_save_path``): where
    its ``latest`` link points (:mod:`psfleet.rec.run_folder`), resolved.

    Raises:
        pytest.fail.Exception: ``save_path`` has no ``latest`` run folder; the message
            names ``save_path`` and what it holds.
    """
    latest = save_path / "latest"
    if not latest.is_dir():
        held = sorted(p.name for p in save_path.iterdir()) if save_path.is_dir() else None
        pytest.fail(f"{save_path} has no run folder ({latest} is not a folder or a link "
                    f"to one); it holds {held if held is not None else 'nothing: no folder'}",
                    pytrace=False)
    return latest.resolve()


# -- processes --------------------------------------------------------------------------


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment minus job variables, plus ``extra``.

    PYTHONPATH starts with the repository so children import this checkout.
    """
    env = {k: v for k, v in os.environ.items() if k in KEPT_VARIABLES or (
        k not in JOB_VARIABLES and not k.startswith(JOB_PREFIXES))}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_command(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
                cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a clean environment (plus ``env``) and its own session.

    On timeout every process of its tree is killed and the test fails with the
    output so far.
    """
    started = time.monotonic()
    proc = subprocess.Popen(list(argv), env=clean_env(env), cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
            kill_processes(tree)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(argv)} did not finish within {timeout} s "
                    f"({time.monotonic() - started:.1f} s)\n--- stdout\n{stdout[-4000:]}\n"
                    f"--- stderr\n{stderr[-4000:]}", pytrace=False)
    return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)


def start_by_hand(script: Path, roles: Sequence[Mapping[str, str]],
                  common: Mapping[str, str], args: Sequence[str], tmp_path: Path,
                  timeout_s: float = 240.0) -> list[str]:
    """Start ``script`` once per role (no launcher: each process told its role by
    environment variables, ``common`` plus its own), wait for all, and return their
    outputs. Fails the test with every output's tail unless all exit 0; a process
    still running is killed (the leak check fails a test that leaves one)."""
    procs: list[subprocess.Popen[str]] = []
    logs = []
    try:
        for i, role in enumerate(roles):
            log = open(tmp_path / f"proc{i}.log", "w")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, str(script), *args], env=clean_env({**common, **role}),
                stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        codes = [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    outputs = [(tmp_path / f"proc{i}.log").read_text() for i in range(len(roles))]
    assert codes == [0] * len(roles), "\n\n".join(o[-2000:] for o in outputs)
    return outputs


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_cli(args, timeout=60, env=None, cwd=None)``: ``python -m psfleet.cli.main
    *args`` in a clean environment; returns the CompletedProcess (text)."""

    def run(args: Sequence[str], timeout: float = 60.0, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return run_command([sys.executable, "-m", "psfleet.cli.main", *args], timeout,
                           env=env, cwd=cwd)

    return run


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes (any parent) whose command line contains ``text``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.pid != os.getpid() and any(text in part for part in cmdline):
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
    return found


def assert_no_processes_mentioning(text: str, timeout_s: float = 10.0) -> None:
    """Fail (after killing them) if processes mentioning ``text`` outlive ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    left = processes_mentioning(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_mentioning(text)
    if left:
        described = [_describe(p) for p in left]
        kill_processes(left)
        pytest.fail(f"processes left behind: {described}", pytrace=False)


def criteo_id_batches(criteo_dir: Path, batch: int, steps: int
                      ) -> list[tuple[Tensor, Tensor]]:
    """The first ``batch * steps`` lines of the shared Criteo sample as ``steps`` batches
    of (ids Tensor[batch, 26] int64 with their slot prefixes, labels Tensor[batch]
    float32): for tests that train SparseEmbeddings on real ids."""
    import numpy as np
    import torch

    from psfleet.data.criteo import parse_lines

    with (criteo_dir / "train.csv").open(encoding="utf-8") as f:
        lines = [next(f) for _ in range(batch * steps)]
    chunk = parse_lines(lines, "train.csv")
    assert chunk.sparse.shape == (batch * steps, 26)
    ids = torch.from_numpy(chunk.sparse.view(np.int64).copy())
    labels = torch.from_numpy(chunk.labels.copy())
    return [(ids[i:i + batch], labels[i:i + batch]) for i in range(0, batch * steps, batch)]
