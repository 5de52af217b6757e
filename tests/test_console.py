"""What a user sees on the console (issue 16, items 5 and 6).

- ``--version`` of ``psfleet`` and ``fleetrun`` (fleetrun's without importing torch);
  fleetrun's own messages: none with ``-q``, INFO by default, DEBUG too with ``-v``.
- The console filter of worker 0's copied output: log records below the console level
  are dropped (split anywhere across writes, also after a progress bar), the rest
  passes at once; quiet mode keeps errors and the CLI's own lines.
- ``psfleet train`` on a 1 server x 2 workers job: by default a one-line start summary
  ("1 server x 2 workers"), the progress bar and the final line, no INFO record and no
  role/strategy dump, while the log files keep the INFO lines; ``-q`` shows no INFO, no
  summary and no progress bar; ``-v`` shows the INFO lines.
- SIGINT to the launcher of a running job, SIGTERM to a one-process run with
  checkpoints: exit 130 / 143 with one ``interrupted`` line (no checkpoint / the newest
  one and the resume command), no traceback, nothing left running.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import (
    assert_no_processes_mentioning,
    clean_env,
    kill_processes,
    run_command,
    run_folder,
)

from psfleet.launch.console import ConsoleFilter, console_level, plural

pytestmark = pytest.mark.e2e

RunCli = Callable[..., subprocess.CompletedProcess[str]]

VERSION = f"psfleet {importlib.metadata.version('psfleet')}"
#: A psfleet log record of the given levels anywhere in a text.
INFO_RECORD = re.compile(r"\d\d:\d\d:\d\d \[[^\]]*\] (INFO|DEBUG) ")
# A small model, no test set and no serving export (no assertion here reads a model;
# the export is test_export_*.py's): what is left of a run is what its console shows.
TINY = ["-o", "hyper_parameters.fc_sizes=[16]", "-o", "runner.test_data_dir=null",
        "-o", "runner.export_model=false"]


# -- --version --------------------------------------------------------------------------


def test_version_of_psfleet(run_cli: RunCli) -> None:
    r = run_cli(["--version"], timeout=60)

    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == VERSION == "psfleet 0.1.0"


def test_version_of_fleetrun_without_torch() -> None:
    script = ("import sys\nfrom psfleet.launch.main import main\n"
              "try:\n    main(['--version'])\nexcept SystemExit as e:\n    code = e.code\n"
              "print('torch imported:', 'torch' in sys.modules, 'exit', code)\n")

    r = run_command([sys.executable, "-c", script], timeout=60)

    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [VERSION, "torch imported: False exit 0"]


def test_commands_other_than_train_without_torch(tmp_path: Path) -> None:
    """``psfleet init``, ``datagen`` and ``example`` only read and write files: they must
    not pay torch's import (seconds per call); nor does ``psfleet train`` that refuses a
    config value or a missing data file (the model, checked last, imports it). (``k8s
    render`` builds the model once to check it, so it does import torch.)"""
    script = (
        "import sys\nfrom psfleet.cli.main import main\n"
        f"d = {str(tmp_path)!r}\n"
        "codes = [main(['init', d + '/job']),\n"
        "         main(['datagen', 'criteo', '--rows', '300', '--seed', '2',\n"
        "               '--out', d + '/t.tsv']),\n"
        "         main(['example', 'deepfm', '--out', d + '/deepfm']),\n"
        "         main(['train', '-m', d + '/job/config.yaml', '-o', 'runner.epochs=x']),\n"
        "         main(['train', '-m', d + '/job/config.yaml'])]\n"  # no data made
        "print('exit', codes, 'torch imported:', 'torch' in sys.modules)\n")

    r = run_command([sys.executable, "-c", script], timeout=60)

    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "exit [0, 0, 0, 2, 2] torch imported: False", r.stdout
    assert "runner.epochs" in r.stderr and "runner.train_data_dir" in r.stderr, r.stderr
    assert len((tmp_path / "t.tsv").read_text().splitlines()) == 300
    assert (tmp_path / "job" / "config.yaml").is_file()
    assert (tmp_path / "deepfm" / "config.yaml").is_file()


@pytest.mark.parametrize("flag", ["-q", "", "-v"])
def test_fleetrun_quiet_and_verbose(tmp_path: Path, repo_root: Path, flag: str) -> None:
    script = repo_root / "tests" / "launch_scripts" / "ps_job.py"
    argv = [sys.executable, "-m", "psfleet.launch.main", *([flag] if flag else []),
            "--server_num=1", "--worker_num=1", f"--log_dir={tmp_path / 'log'}",
            str(script), "--out_dir", str(tmp_path)]

    r = run_command(argv, timeout=60)

    assert r.returncode == 0, r.stderr
    own = [line for line in r.stderr.splitlines() if line.startswith("[fleetrun]")]
    levels = {line.split()[2] for line in own}  # [fleetrun] HH:MM:SS LEVEL message
    assert levels == {"-q": set(), "": {"INFO"}, "-v": {"INFO", "DEBUG"}}[flag], r.stderr
    assert any("job succeeded" in line for line in own) == (flag != "-q")
    assert_no_processes_mentioning(str(tmp_path))


# -- the console filter -----------------------------------------------------------------


def _filtered(chunks: list[bytes], level: int) -> bytes:
    out = io.BytesIO()
    console = ConsoleFilter(out, level)
    for chunk in chunks:
        assert console.write(chunk) == len(chunk)
    return out.getvalue()


INFO_LINE = b"12:00:01 [worker:0] INFO psfleet.fleet.fleet: fleet.init: RoleInfo(...)\n"
WARN_LINE = b"12:00:02 [worker:0] WARNING psfleet.data.reader: skipped 3 malformed lines\n"
ERROR_LINE = b"12:00:03 [worker:0] ERROR psfleet.x: failed\n"
BAR = [b"\repoch 1/1:  10%|#    | 1/10 [00:00<00:01]", b"\repoch 1/1: 100%|#####| 10/10"]
FINAL = b"psfleet: test auc 0.7000, logloss 0.5000 on 800 examples\n"


def test_filter_drops_records_below_the_level_split_anywhere() -> None:
    stream = INFO_LINE + WARN_LINE + b"plain text\n" + INFO_LINE + b"  continued\n" + FINAL
    for cut in range(1, len(stream)):  # every split into two writes
        got = _filtered([stream[:cut], stream[cut:]], logging.WARNING)
        assert got == WARN_LINE + b"plain text\n" + FINAL, cut
    assert _filtered([stream], logging.INFO) == stream
    assert _filtered([stream], logging.ERROR) == FINAL


def test_filter_passes_the_progress_bar_at_once_and_finds_records_after_it() -> None:
    out = io.BytesIO()
    console = ConsoleFilter(out, logging.WARNING)
    console.write(BAR[0])
    assert out.getvalue() == BAR[0]  # not held back until a newline
    console.write(INFO_LINE + BAR[1])  # a record logged while the bar is drawn
    console.write(b"\n" + WARN_LINE + FINAL)
    assert out.getvalue() == BAR[0] + BAR[1] + b"\n" + WARN_LINE + FINAL
    # Quiet: no bar, no warning; errors and the CLI's lines.
    quiet = _filtered([BAR[0], INFO_LINE, BAR[1], b"\n", ERROR_LINE, FINAL], logging.ERROR)
    assert quiet == ERROR_LINE + FINAL


def test_filter_ends_the_line_and_suppresses() -> None:
    out = io.BytesIO()
    console = ConsoleFilter(out, logging.WARNING)
    console.write(BAR[0])
    console.end_line()
    console.end_line()  # once only
    console.suppress()
    console.write(b"Traceback (most recent call last):\n" + FINAL)
    assert out.getvalue() == BAR[0] + b"\n"


def test_console_levels_and_plurals() -> None:
    assert console_level(quiet=True, verbose=False) == logging.ERROR
    assert console_level(quiet=False, verbose=False) == logging.WARNING
    assert console_level(quiet=False, verbose=True) == logging.INFO
    assert console_level(quiet=False, verbose=True, detail_level=logging.DEBUG) == logging.DEBUG
    assert [plural(n, "server") for n in (0, 1, 2, 1000)] == [
        "0 servers", "1 server", "2 servers", "1,000 servers"]


# -- psfleet train ----------------------------------------------------------------------


def _train_args(repo_root: Path, out: Path, data: Path, *extra: str) -> list[str]:
    return ["train", "-m", str(repo_root / "examples" / "criteo_dnn" / "config.yaml"),
            "-o", f"runner.train_data_dir={data}", "-o", f"runner.model_save_path={out}",
            *TINY, *extra]


def _before_first_bar(stdout: str) -> list[str]:
    """The lines before worker 0's progress bar (text mode turned its \r into \n)."""
    head = stdout.split("epoch 1/")[0]
    return [line for line in head.splitlines() if line.strip()]


@pytest.mark.slow
def test_default_console_of_a_job(run_cli: RunCli, repo_root: Path, tmp_path: Path,
                                  data_slice: Callable[..., Path]) -> None:
    out = tmp_path / "out"
    data = data_slice(600)

    r = run_cli(_train_args(repo_root, out, data, "-o", "runner.epochs=1",
                            "-o", "cluster.server_num=1", "-o", "cluster.worker_num=2"),
                timeout=120)

    assert r.returncode == 0, r.stderr[-3000:]
    lines = _before_first_bar(r.stdout)
    run = run_folder(out)
    assert lines == [f"psfleet: starting dnn, async mode, 1 server x 2 workers, 1 data file; "
                     f"run folder {run}"], r.stdout[-3000:]
    assert "epoch 1/1" in r.stdout  # worker 0's progress bar
    assert r.stdout.strip().splitlines()[-1].startswith("psfleet: "), r.stdout[-3000:]
    assert "metrics in" in r.stdout.strip().splitlines()[-1]
    for text in (r.stdout, r.stderr):
        assert not INFO_RECORD.search(text), text[-3000:]
        assert "RoleInfo" not in text and "strategy" not in text
    # The log files keep the details.
    worker_log = (run / "log" / "workerlog.0").read_text()
    assert INFO_RECORD.search(worker_log) and "fleet.init" in worker_log
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_quiet_and_verbose_job(run_cli: RunCli, repo_root: Path, tmp_path: Path,
                               data_slice: Callable[..., Path]) -> None:
    data = data_slice(600)
    job = ["-o", "runner.epochs=1", "-o", "cluster.server_num=1", "-o", "cluster.worker_num=2"]

    quiet = run_cli([*_train_args(repo_root, tmp_path / "q", data, *job), "-q"], timeout=120)
    verbose = run_cli([*_train_args(repo_root, tmp_path / "v", data, *job), "-v"], timeout=120)

    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stderr == ""
    # Only the final line: no summary, no progress bar, no record.
    (final,) = quiet.stdout.splitlines()
    assert final.startswith("psfleet: ") and "metrics in" in final
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "fleet.init" in verbose.stdout  # worker 0's INFO lines, copied
    assert "started server 0" in verbose.stderr  # the launcher's own
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_quiet_one_process_prints_no_info(run_cli: RunCli, repo_root: Path, tmp_path: Path,
                                          data_slice: Callable[..., Path]) -> None:
    r = run_cli([*_train_args(repo_root, tmp_path / "out", data_slice(600), "-q",
                              "-o", "runner.epochs=1", "-o", "cluster.server_num=0",
                              "-o", "cluster.worker_num=1")], timeout=90)

    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == ""
    (final,) = r.stdout.splitlines()
    assert final.startswith("psfleet: ") and "metrics in" in final


# -- interrupts -------------------------------------------------------------------------


class _Reader(threading.Thread):
    """Collects a pipe's text as it comes."""

    def __init__(self, pipe: io.TextIOBase) -> None:
        super().__init__(daemon=True)
        self.pipe = pipe
        self.text = ""

    def run(self) -> None:
        while chunk := self.pipe.read(1):
            self.text += chunk


def _interrupt(argv: list[str], signum: signal.Signals, started_when: str,
               timeout_s: float = 120.0) -> tuple[int, str, str]:
    """Start ``argv`` in its own session, send ``signum`` once its output shows
    ``started_when``, and return the exit code, stdout and stderr."""
    proc = subprocess.Popen(argv, env=clean_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _Reader(proc.stdout), _Reader(proc.stderr)  # type: ignore[arg-type]
    out.start()
    err.start()
    try:
        deadline = time.monotonic() + timeout_s
        while started_when not in out.text + err.text and proc.poll() is None:
            assert time.monotonic() < deadline, f"no {started_when!r}:\n{out.text}\n{err.text}"
            time.sleep(0.1)
        assert proc.poll() is None, f"ended before the signal:\n{out.text}\n{err.text}"
        time.sleep(1.0)  # a few steps into the epoch
        proc.send_signal(signum)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            import psutil

            kill_processes([psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)])
            proc.wait()
    out.join(10)
    err.join(10)
    return code, out.text, err.text


def _assert_one_interrupted_line(stdout: str, stderr: str, signum: signal.Signals,
                                 out: Path, checkpoints: Path | None = None) -> str:
    both = stdout + stderr
    assert "Traceback" not in both and "KeyboardInterrupt" not in both, both[-4000:]
    lines = [line for line in both.replace("\r", "\n").splitlines() if "interrupted" in line]
    assert len(lines) == 1, both[-4000:]
    (line,) = lines
    assert line.startswith(f"psfleet: interrupted ({signum.name})"), line
    if checkpoints is None:
        assert "no checkpoint (set runner.checkpoint to resume)" in line
    else:  # the newest complete one, and the command that resumes from it
        newest = max(p for p in checkpoints.iterdir() if (p / "manifest.json").is_file())
        assert f"newest checkpoint {newest} (resume: psfleet train -m " in line, line
    metrics = run_folder(out) / "metrics.json"
    if metrics.is_file():  # written by the trainer when it stopped
        assert f"metrics so far in {metrics}" in line
        entry = json.loads(metrics.read_text()).get("interrupted")
        if entry is not None:
            assert f"at epoch {entry['epoch']}, step {entry['step']}" in line
    else:
        assert "no metrics written" in line
    return line


@pytest.mark.slow
def test_sigint_to_a_job_ends_with_one_line(repo_root: Path, tmp_path: Path,
                                            criteo_dir: Path) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "psfleet.cli.main",
            *_train_args(repo_root, out, criteo_dir / "train.csv", "-o", "runner.epochs=50",
                         "-o", "runner.batch_size=32", "-o", "cluster.server_num=1",
                         "-o", "cluster.worker_num=2")]

    code, stdout, stderr = _interrupt(argv, signal.SIGINT, "epoch 1/50")

    assert code == 130, stdout[-3000:] + stderr[-3000:]
    _assert_one_interrupted_line(stdout, stderr, signal.SIGINT, out)
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_sigterm_to_one_process_ends_with_one_line(repo_root: Path, tmp_path: Path,
                                                   criteo_dir: Path) -> None:
    out, checkpoints = tmp_path / "out", tmp_path / "ck"
    argv = [sys.executable, "-m", "psfleet.cli.main",
            *_train_args(repo_root, out, criteo_dir / "train.csv", "-o", "runner.epochs=50",
                         "-o", "runner.batch_size=32", "-o", "cluster.server_num=0",
                         "-o", "cluster.worker_num=1", "-o",
                         f"runner.checkpoint={{checkpoint_dir: {checkpoints}, epoch_interval: 1}}")]

    code, stdout, stderr = _interrupt(argv, signal.SIGTERM, "epoch 2/50")  # 2 checkpoints

    assert code == 143, stdout[-3000:] + stderr[-3000:]
    _assert_one_interrupted_line(stdout, stderr, signal.SIGTERM, out, checkpoints)
    assert_no_processes_mentioning(str(tmp_path))
