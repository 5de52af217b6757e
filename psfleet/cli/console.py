"""What ``psfleet train`` shows on the console: the start line, the console level, and
the one line an interrupted run ends with (SIGINT: exit 130, SIGTERM: exit 143).

The worker processes of a job run ``psfleet.cli.main`` too: there an interrupt ends the
process quietly (:func:`exit_now`), and the launcher, which stopped the job, reports it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn

from psfleet import interrupts, logs
from psfleet.interrupts import Terminated
from psfleet.launch.console import plural

if TYPE_CHECKING:
    from psfleet.rec.config import TrainConfig

__all__ = ["Terminated", "signals_interrupt", "received_signal", "quiet_stderr",
           "set_console_level", "start_summary", "interrupted_line", "report_interrupt",
           "close_progress_bars", "exit_now", "stdout_buffer"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise interrupts.record(signum)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within: SIGINT and SIGTERM raise a KeyboardInterrupt (:class:`Terminated` for
    SIGTERM), so training stops as on Ctrl-C (the trainer saves what it can), and
    :func:`received_signal` tells which came. The signal is also recorded for the
    training loop (``psfleet.interrupts``): an interrupt swallowed where it landed is
    raised again at the next step. Main thread only; else a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupts.clear()
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def received_signal(exc: BaseException | None = None) -> int:
    """The signal that interrupted: the first one :func:`signals_interrupt` saw, else
    SIGTERM for a :class:`Terminated` ``exc``, else SIGINT (Python's own handler)."""
    received = interrupts.first()
    if received is not None:
        return received
    return signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT


class _DropInterruptRecords(logging.Filter):
    """Drops log records that report a KeyboardInterrupt (the trainer's note of where it
    stopped): the console ends with the CLI's own interrupted line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(arg, KeyboardInterrupt) for arg in args)


@contextlib.contextmanager
def quiet_stderr(quiet: bool) -> Iterator[None]:
    """Within, with ``quiet``: drop what is written to ``sys.stderr`` (the progress bar,
    Python warnings); psfleet's log handler keeps the real stderr for errors."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        yield


def set_console_level(level: int) -> None:
    """Show psfleet's log records from ``level`` up on the console; the logger keeps
    PSFLEET_LOG_LEVEL (``fleet.init`` sets it again), so only the handlers filter."""
    logs.setup_logging()
    for handler in logging.getLogger("psfleet").handlers:
        handler.setLevel(level)
        handler.addFilter(_DropInterruptRecords())


def start_summary(config: TrainConfig, where: str) -> str:
    """The start line: model, mode, processes, data files (and the log folder)."""
    from psfleet.rec.readers import data_files

    runner = config.runner
    files = len(data_files(runner.train_data_dir, runner))
    return (f"psfleet: starting {runner.model}, {runner.sync_mode} mode, {where}, "
            f"{plural(files, 'data file')}")


def interrupted_line(config: TrainConfig, command: str, signum: int, started: float,
                     exc: BaseException | None = None) -> str:
    """The one line an interrupted ``psfleet train`` ends with: where training stopped,
    what was saved, and how to resume.

    Args:
        config: the run's config (where metrics.json and the checkpoints are).
        command: the command that resumes.
        signum: the signal received.
        started: when the command started (``time.time()``): an older metrics.json is
            a previous run's.
        exc: the exception training raised; the trainer's (``epoch``, ``step``,
            ``checkpoint`` attributes) says where it stopped. Without it, the
            ``interrupted`` entry of metrics.json, when this run wrote one.
    """
    runner = config.runner
    metrics_path = runner.run_dir / "metrics.json"
    entry: dict[str, Any] | None = None
    if exc is not None and hasattr(exc, "epoch") and hasattr(exc, "step"):
        entry = {"epoch": exc.epoch, "step": exc.step,
                 "checkpoint": getattr(exc, "checkpoint", None)}
    fresh = False
    with contextlib.suppress(OSError, ValueError):
        fresh = metrics_path.stat().st_mtime >= started - 1.0  # not a previous run's
        if fresh and entry is None:
            found = json.loads(metrics_path.read_text()).get("interrupted")
            entry = found if isinstance(found, dict) else None
    where = ""
    if entry is not None and entry.get("epoch") is not None:
        where = f" at epoch {entry['epoch']}, step {entry.get('step')}"
    parts = [f"psfleet: interrupted ({signal.Signals(signum).name}){where}",
             f"metrics so far in {metrics_path}" if fresh else "no metrics written"]
    checkpoint = entry.get("checkpoint") if entry is not None else None
    if checkpoint is None and runner.checkpoint is not None and entry is None:
        with contextlib.suppress(Exception):  # best effort: the newest folder's name
            from psfleet.checkpoint import CheckpointStore

            names = CheckpointStore(runner.checkpoint.checkpoint_dir).names()
            checkpoint = f"{runner.checkpoint.checkpoint_dir.rstrip('/')}/{names[0]}"
    if checkpoint:
        parts.append(f"newest checkpoint {checkpoint} (resume: {command})")
    elif runner.checkpoint is None:
        parts.append("no checkpoint (set runner.checkpoint to resume)")
    else:
        parts.append(f"no checkpoint written yet in {runner.checkpoint.checkpoint_dir}")
    return "; ".join(parts)


def report_interrupt(config: TrainConfig, config_path: Path, overrides: Sequence[str],
                     signum: int, started: float, exc: BaseException | None = None) -> int:
    """Print the interrupted line (:func:`interrupted_line`) to stderr; return 128 +
    ``signum``."""
    command = shlex.join(["psfleet", "train", "-m", str(config_path),
                          *(a for o in overrides for a in ("-o", o))])
    print(interrupted_line(config, command, signum, started, exc), file=sys.stderr,
          flush=True)
    return 128 + signum


def exit_now(code: int) -> NoReturn:
    """End a job's process stopped by a signal at once: the trainer has written what it
    saves, and interpreter shutdown could wait for RPC threads blocked on stopped peers
    (the launcher would SIGKILL it after ``--stop_grace_s``)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def stdout_buffer() -> BinaryIO | None:
    """This process's binary stdout (where worker 0's output is copied), if any."""
    return getattr(sys.stdout, "buffer", None)


def close_progress_bars() -> None:
    """Close tqdm bars an exception left open, so the next line starts on its own."""
    from tqdm import tqdm

    with contextlib.suppress(Exception):
        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()
