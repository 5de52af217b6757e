"""One child process of a job: start it with its log file, poll it, signal its group.

Each child starts in its own session (``start_new_session=True``), so its process group
id equals its pid and holds the child's whole subtree (data loader workers, pipe
commands) unless a descendant starts a session of its own. The launcher signals only
these groups, never anything else. A child's stdout and stderr go to its log file; for
a *teed* child (worker 0) a reader thread also copies what the log file gains, chunk by
chunk so progress bars drawn with ``\\r`` show at once, to a stream. The child writes
its log itself, so the log keeps everything also when the launcher dies.

Every child dies with the launcher, also when the launcher is SIGKILLed: it is started
with the parent-death signal set and ``PSFLEET_LAUNCHER_PID`` in its environment
(:mod:`psfleet.launcher_guard`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO, cast

from psfleet.launch.types import ProcessSpec
from psfleet.launcher_guard import LAUNCHER_PID_VARIABLE, child_preexec

__all__ = ["ChildProcess", "describe_exit", "group_alive", "read_tail"]

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 65536
_TAIL_BYTES = 65536
_TEE_POLL_S = 0.05


def describe_exit(returncode: int) -> str:
    """Say how a process ended: ``exit code 3`` or ``signal SIGKILL (9)``.

    Args:
        returncode: ``Popen.returncode``; negative when killed by a signal.
    """
    if returncode >= 0:
        return f"exit code {returncode}"
    signum = -returncode
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "unknown signal"
    return f"signal {name} ({signum})"


def read_tail(path: Path, max_lines: int = 20) -> list[str]:
    """Return the last ``max_lines`` lines of a log file (empty if unreadable).

    Reads at most the last 64 KiB; undecodable bytes are replaced.
    """
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace").replace("\r", "\n")
    lines = [line for line in text.split("\n") if line.strip()]
    return lines[-max_lines:]


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a live (non-zombie) member.

    ``killpg(pgid, 0)`` also succeeds for zombies, which stay forever where PID 1 does
    not reap orphans (some containers); on Linux the members are checked in /proc.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name "(comm)": state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


class ChildProcess:
    """A started child: its spec, its ``Popen``, its log file and tee thread.

    Not thread safe; the launcher drives all children from one thread.

    Raises:
        OSError: from the constructor, when the log file cannot be opened or the
            interpreter cannot be started.
    """

    def __init__(self, spec: ProcessSpec, tee_stream: BinaryIO | None = None) -> None:
        self.spec = spec
        self._log = spec.log_path.open("wb")
        self._tee_thread: threading.Thread | None = None
        self._tee_stop = threading.Event()
        env = dict(spec.env)
        env[LAUNCHER_PID_VARIABLE] = str(os.getpid())
        try:
            self._popen = subprocess.Popen(
                list(spec.argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                preexec_fn=child_preexec(os.getpid()),
            )
        except BaseException:
            self._log.close()
            raise
        if spec.tee:
            stream = tee_stream if tee_stream is not None else _stdout_buffer()
            self._tee_thread = threading.Thread(
                target=_copy,
                args=(spec.log_path, stream, self._tee_stop),
                name=f"tee-{spec.role.word}-{spec.index}",
                daemon=True,
            )
            self._tee_thread.start()
        logger.debug("started %s pid %s: %s", spec.name, self.pid, " ".join(spec.argv))

    @property
    def pid(self) -> int:
        """The child's pid, also its process group id."""
        return self._popen.pid

    @property
    def name(self) -> str:
        """``server 0``, ``worker 1``."""
        return self.spec.name

    @property
    def returncode(self) -> int | None:
        """Exit status once :meth:`poll` has seen the child exit, else None."""
        return self._popen.returncode

    def poll(self) -> int | None:
        """Reap the child if it exited; return its exit status or None. Never blocks."""
        return self._popen.poll()

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the child's process group (no-op if the group is gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def group_alive(self) -> bool:
        """Whether the child or anything left in its process group is still running."""
        self.poll()
        return group_alive(self.pid)

    def flush_log(self, timeout_s: float = 2.0) -> None:
        """Wait (bounded) for the tee thread to copy the rest of the log, then stop it.

        Call once the child exited (the tee stops at the end of what was written).
        """
        if self._tee_thread is not None:
            self._tee_stop.set()
            self._tee_thread.join(timeout_s)
        if not self._log.closed:
            self._log.flush()

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush and close the log file. Call after the group is gone."""
        self.flush_log(timeout_s)
        self._log.close()


def _stdout_buffer() -> BinaryIO | None:
    for stream in (sys.stdout, sys.__stdout__):
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            return cast(BinaryIO, buffer)
    return None


def _copy(log_path: Path, stream: BinaryIO | None, stop: threading.Event) -> None:
    """Copy what ``log_path`` gains to ``stream`` until ``stop`` is set and the end is
    reached; a broken stream stops only the tee (the log file is the child's own)."""
    if stream is None:
        return
    try:
        src = log_path.open("rb")
    except OSError:
        return
    with src:
        while True:
            try:
                chunk = src.read(_CHUNK_BYTES)
            except OSError:
                return
            if not chunk:
                if stop.is_set():
                    return
                time.sleep(_TEE_POLL_S)
                continue
            try:
                stream.write(chunk)
                stream.flush()
            except (OSError, ValueError):
                logger.warning("cannot copy worker output to stdout any more; see its log")
                return
