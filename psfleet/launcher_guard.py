"""A launched process dies with its launcher, also when the launcher is SIGKILLed.

Two halves, both standard library only (this module sits below every layer):

- In the launcher, :func:`child_preexec` runs in each child between fork and exec
  (``subprocess.Popen(preexec_fn=...)``). On Linux it asks the kernel to send the
  child :data:`DEATH_SIGNAL` (SIGHUP) when the launcher dies
  (``prctl(PR_SET_PDEATHSIG)``), then checks that its parent is still the launcher: a
  launcher that died between fork and prctl would otherwise never signal it. The
  signal survives exec, so even a child that never imports psfleet (a plain torch
  script) is terminated by SIGHUP's default action.
- In the child, ``import psfleet`` calls :func:`watch_launcher_from_env`, which reads
  ``PSFLEET_LAUNCHER_PID`` (set by the launcher), removes it from the environment (so a
  grandchild does not take its parent for the launcher), and installs two watchers: a
  SIGHUP handler (main thread) and a daemon thread that polls ``os.getppid()`` every
  0.25 s, the portable fallback where prctl is unavailable (macOS, or no libc).
  Whichever sees the launcher gone first writes one line to stderr (the child's log)::

      12:00:01 [pid 4242] ERROR psfleet.launcher_guard: launcher 4200 died; exiting

  and SIGKILLs the child's process group (the launcher starts each child as a group
  leader, so data-loader workers and pipe commands go with it).

Caveat: ``preexec_fn`` runs Python in the forked child while the launcher may have
other threads (its tee threads); the function only calls a ctypes function pointer
resolved before the fork and ``os`` functions, no locks or imports.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from psfleet import env

__all__ = ["DEATH_SIGNAL", "LAUNCHER_PID_VARIABLE", "POLL_INTERVAL_S", "child_preexec",
           "set_parent_death_signal", "watch_launcher", "watch_launcher_from_env"]

#: The variable naming the launcher's pid in each child's environment.
LAUNCHER_PID_VARIABLE = "PSFLEET_LAUNCHER_PID"
#: What the kernel sends a child when its launcher dies (default action: terminate).
DEATH_SIGNAL = signal.SIGHUP
#: How often the watch thread compares the parent pid with the launcher's.
POLL_INTERVAL_S = 0.25

_PR_SET_PDEATHSIG = 1
_EXIT_CODE_RACE = 125
_REPARENT_WAIT_S = 0.5  # the launcher was gone before the child could run


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl (Linux), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()  # resolved at import: nothing to look up after a fork


def set_parent_death_signal(signum: int = DEATH_SIGNAL) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies.

    Returns:
        True when set (Linux), False where prctl is unavailable or refused.
    """
    if _PRCTL is None:
        return False
    return _PRCTL(_PR_SET_PDEATHSIG, ctypes.c_ulong(signum), 0, 0, 0) == 0


def child_preexec(launcher_pid: int) -> Callable[[], None]:
    """The ``preexec_fn`` that ties a child to the launcher ``launcher_pid``.

    In the child (after fork, before exec): restore SIGHUP's default action (a launcher
    under ``nohup`` ignores it, and ignored signals survive exec), set the parent-death
    signal, and exit at once if the launcher is already gone.
    """

    def preexec() -> None:
        signal.signal(DEATH_SIGNAL, signal.SIG_DFL)
        set_parent_death_signal(DEATH_SIGNAL)
        if os.getppid() != launcher_pid:
            os._exit(_EXIT_CODE_RACE)

    return preexec


class _Watch:
    """Kill this process's group once, when the launcher is gone (thread and signal safe)."""

    def __init__(self, launcher_pid: int) -> None:
        self.launcher_pid = launcher_pid
        self._fired = False

    def launcher_gone(self) -> bool:
        return os.getppid() != self.launcher_pid

    def die(self, why: str) -> None:
        if self._fired:
            return
        self._fired = True
        stamp = time.strftime("%H:%M:%S")
        line = f"{stamp} [pid {os.getpid()}] ERROR psfleet.launcher_guard: {why}; exiting\n"
        with contextlib.suppress(OSError):
            os.write(2, line.encode())  # no locks: safe in a signal handler
        with contextlib.suppress(OSError):
            if os.getpgrp() == os.getpid():  # the launcher made this child a group leader
                os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        # The kernel sends the parent-death signal while the launcher exits, possibly
        # before this process is re-parented: give getppid() a moment to change.
        deadline = time.monotonic() + _REPARENT_WAIT_S
        while not self.launcher_gone() and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.launcher_gone():
            self.die(f"launcher {self.launcher_pid} died")
        else:  # a SIGHUP from elsewhere: exit as its default action would
            self.die(f"received {signal.Signals(signum).name}")

    def poll(self) -> None:
        while not self.launcher_gone():
            time.sleep(POLL_INTERVAL_S)
        self.die(f"launcher {self.launcher_pid} died")


def watch_launcher(launcher_pid: int) -> None:
    """Exit (SIGKILL this process's group) when ``launcher_pid`` is no longer the parent.

    Sets the parent-death signal again (harmless when the launcher did), installs the
    SIGHUP handler when called from the main thread, starts the daemon watch thread,
    and dies at once if the parent is already another process. Returns immediately.
    """
    watch = _Watch(launcher_pid)
    set_parent_death_signal(DEATH_SIGNAL)
    if threading.current_thread() is threading.main_thread():
        signal.signal(DEATH_SIGNAL, watch.on_signal)
    if watch.launcher_gone():
        watch.die(f"launcher {launcher_pid} died")
    threading.Thread(target=watch.poll, name="psfleet-launcher-watch", daemon=True).start()


def watch_launcher_from_env() -> None:
    """:func:`watch_launcher` of ``PSFLEET_LAUNCHER_PID`` when set; removes the variable.

    A malformed value is ignored (the launcher always writes a decimal pid).
    """
    raw = env.read(LAUNCHER_PID_VARIABLE)
    if raw is None:
        return
    os.environ.pop(LAUNCHER_PID_VARIABLE, None)
    try:
        launcher_pid = int(raw)
    except ValueError:
        return
    if launcher_pid > 1:
        watch_launcher(launcher_pid)
