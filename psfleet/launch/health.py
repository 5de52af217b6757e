"""Hang detection: which children of a job stopped answering (``PSFLEET_HEALTH_TIMEOUT_S``).

A process that hangs (a deadlock, a SIGSTOP, a stuck disk) does not exit, so polling
exit codes never notices it; the job stalls until some remote call's deadline
(``PSFLEET_RPC_DEADLINE_S``, 180 s) gives up, naming the wrong process. The launcher
therefore watches the children it started:

- **Servers**: :class:`HealthMonitor` has a helper process
  (:mod:`psfleet.launch.health_probe`; the launcher, which forks children, never calls
  gRPC itself) ask each server's standard gRPC health service (no token needed; TLS as
  the job's clients speak it) every ``timeout / 3`` seconds (at most 5 s), each check
  waiting up to ``timeout / 3`` (at most 10 s) for its answer, so a starved server that
  answers slowly is alive. A server is watched from its first SERVING answer on (its
  start-up, checkpoint recovery included, is bounded elsewhere:
  ``--server_wait_timeout_s`` and the workers' server wait); one whose checks then all
  time out for the timeout is *unresponsive*. A quick NOT_SERVING or refused connection
  is not silence: a server that stops (workers' ``stop_worker``) or restarts is not
  hung. A server that sends no HTTP/2 greeting when connected to (not gRPC: a test's
  stand-in) is never sent a request and not health-checked.
- **Every child** (workers too): a process found in the stopped state (``T`` in
  ``/proc/<pid>/stat``, e.g. after SIGSTOP) for the timeout is *unresponsive*.
  Workers have no server endpoint to ask; a worker that hangs while running (not
  stopped) is not detected here: its calls to the servers end at their deadline, and
  the other workers wait for it at the next barrier (``PSFLEET_RPC_DEADLINE_S``).
  A heartbeat file written by the training loop would close that gap (it needs the
  worker's side, ``psfleet.fleet``).

The launcher SIGKILLs an unresponsive child (its process group; it is the launcher's
own child, by pid) and handles it as a failure: restarted per ``--max_restarts`` and
``--restart_policy``, or the job fails with a summary naming it, its endpoint and
"did not answer health checks for N s".

:class:`HealthTracker` is the pure decision part (times passed in, no threads), unit
tested on its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.launcher_guard import LAUNCHER_PID_VARIABLE, child_preexec

__all__ = ["DEFAULT_HEALTH_TIMEOUT_S", "MAX_HEALTH_TIMEOUT_S", "HealthTracker", "HealthMonitor",
           "Unresponsive", "health_timeout_s", "check_interval_s", "process_stopped"]

logger = logging.getLogger(__name__)

#: ``PSFLEET_HEALTH_TIMEOUT_S``'s default, and the largest value it may have (an hour:
#: a starved host may answer nothing for minutes; ``off`` turns hang detection off).
DEFAULT_HEALTH_TIMEOUT_S = 30.0
MAX_HEALTH_TIMEOUT_S = 3600.0
_MAX_INTERVAL_S = 5.0
#: The longest one health check may take to count as an answer. A third of the timeout
#: up to this: a starved server answering in 5 s is alive (a 2 s cap declared such a
#: server dead whatever the timeout: every check "timed out").
_MAX_CALL_TIMEOUT_S = 10.0
_PROBE_EXIT_S = 3.0


def health_timeout_s(environ: Mapping[str, str] | None = None) -> float | None:
    """``PSFLEET_HEALTH_TIMEOUT_S`` (default 30) as seconds; None for ``off`` (no hang
    detection).

    Raises:
        ConfigError: not ``off`` nor a number in (0, 3600] (names the variable and value).
    """
    raw = env.read("PSFLEET_HEALTH_TIMEOUT_S", environ) or str(DEFAULT_HEALTH_TIMEOUT_S)
    if raw.strip().lower() == "off":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"PSFLEET_HEALTH_TIMEOUT_S: {raw!r} is not a number of seconds; "
                          f"allowed: off, or > 0 and <= {MAX_HEALTH_TIMEOUT_S:g}") from None
    if not 0 < value <= MAX_HEALTH_TIMEOUT_S:  # also refuses NaN
        raise ConfigError(f"PSFLEET_HEALTH_TIMEOUT_S: {raw!r} is out of range; allowed: "
                          f"off, or > 0 and <= {MAX_HEALTH_TIMEOUT_S:g} seconds")
    return value


def check_interval_s(timeout_s: float) -> float:
    """Seconds between two health checks of one server: a third of the timeout, at
    most 5 s (so at least two checks fail before a server is declared dead)."""
    return min(timeout_s / 3.0, _MAX_INTERVAL_S)


def process_stopped(pid: int) -> bool:
    """Whether process ``pid`` is in the stopped state (``T``: SIGSTOP, SIGTSTP).

    Reads ``/proc/<pid>/stat``; False where there is no /proc or the process is gone.
    A process stopped by a tracer (``t``: a debugger) does not count.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2:].split()
    return bool(fields) and fields[0] == "T"


@dataclass(frozen=True)
class Unresponsive:
    """A child found unresponsive: its key, for how long, and why (for the summary).

    Attributes:
        key: the caller's key of the child (e.g. its pid).
        silent_s: seconds since its last sign of life, >= the timeout.
        reason: ``did not answer health checks for 3 s`` or ``was stopped (state T)
            for 3 s``.
    """

    key: int
    silent_s: float
    reason: str


class HealthTracker:
    """When each watched child last showed it is alive; which are overdue. Pure logic.

    A child is *armed* by its first :meth:`answered` (a server's first SERVING
    reply); before that it is never overdue by health checks. A stopped process is
    overdue once :meth:`stopped` has reported it stopped, without a break, for the
    timeout. Not thread safe by itself (:class:`HealthMonitor` holds a lock).

    Args:
        timeout_s: seconds without a sign of life before a child is overdue, > 0.
    """

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ConfigError(f"health timeout: {timeout_s!r} must be > 0 seconds")
        self.timeout_s = timeout_s
        self._last_ok: dict[int, float] = {}
        self._stopped_since: dict[int, float] = {}

    def answered(self, key: int, now: float) -> None:
        """Child ``key`` answered a health check at ``now`` (monotonic seconds)."""
        self._last_ok[key] = now

    def stopped(self, key: int, is_stopped: bool, now: float) -> None:
        """Child ``key`` was seen stopped (or running) at ``now``."""
        if not is_stopped:
            self._stopped_since.pop(key, None)
        else:
            self._stopped_since.setdefault(key, now)

    def forget(self, key: int) -> None:
        """Stop watching ``key`` (it exited or was replaced)."""
        self._last_ok.pop(key, None)
        self._stopped_since.pop(key, None)

    def armed(self, key: int) -> bool:
        """Whether ``key`` has answered at least once."""
        return key in self._last_ok

    def overdue(self, now: float) -> list[Unresponsive]:
        """Children without a sign of life for ``timeout_s`` at ``now``, oldest first."""
        found: dict[int, Unresponsive] = {}
        for key, since in self._stopped_since.items():
            if now - since >= self.timeout_s:
                found[key] = Unresponsive(key, now - since, f"was stopped (process state T, "
                                          f"e.g. SIGSTOP) for {now - since:.0f} s")
        for key, last in self._last_ok.items():
            if now - last >= self.timeout_s:
                stopped = " (its process is stopped: state T, e.g. SIGSTOP)" \
                    if key in self._stopped_since else ""
                found[key] = Unresponsive(key, now - last, "did not answer health checks "
                                          f"for {now - last:.0f} s{stopped}")
        return sorted(found.values(), key=lambda u: -u.silent_s)


class HealthMonitor:
    """Health-checks the job's servers through a helper process; watches every
    child's process state.

    :meth:`watch` a server's pid with its endpoint and :meth:`watch_process` every
    child; the launcher's loop calls :meth:`overdue` (cheap: reads the tracker and,
    at most once per interval, each child's ``/proc`` state). The checks themselves
    run in :mod:`psfleet.launch.health_probe`, started at the first :meth:`watch`:
    this process never calls gRPC, because it forks the job's children (gRPC's fork
    handlers can crash a child forked while a call is in flight). A reader thread
    takes the probe's answers. If the probe dies, server checks stop (logged once)
    rather than declaring healthy servers dead. Call :meth:`close` at the end.

    Args:
        timeout_s: ``PSFLEET_HEALTH_TIMEOUT_S``; None (``off``): nothing is watched,
            no probe starts, and :meth:`overdue` is always empty.
        environ: the children's environment (its ``PSFLEET_TLS_*`` decide TLS); the
            probe runs with it.
    """

    def __init__(self, timeout_s: float | None, environ: Mapping[str, str]) -> None:
        self.timeout_s = timeout_s
        self.tracker = HealthTracker(timeout_s or DEFAULT_HEALTH_TIMEOUT_S)
        self.interval_s = check_interval_s(self.tracker.timeout_s)
        self.call_timeout_s = min(self.tracker.timeout_s / 3.0, _MAX_CALL_TIMEOUT_S)
        self._environ = dict(environ)
        self._lock = threading.Lock()
        self._servers: set[int] = set()
        self._processes: set[int] = set()
        self._endpoints: dict[int, str] = {}
        self._next_state_check = 0.0
        self._probe: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._probe_failed = False

    def endpoint(self, pid: int) -> str | None:
        """The endpoint a watched server's pid is checked at."""
        return self._endpoints.get(pid)

    def watch(self, pid: int, endpoint: str) -> None:
        """Health-check the server ``pid`` at ``endpoint`` until :meth:`forget`."""
        if self.timeout_s is None:
            return
        self.watch_process(pid)
        self._endpoints[pid] = endpoint
        with self._lock:
            self._servers.add(pid)
        self._send(f"watch {pid} {endpoint}")

    def watch_process(self, pid: int) -> None:
        """Watch ``pid``'s process state (stopped or not)."""
        if self.timeout_s is not None:
            self._processes.add(pid)

    def forget(self, pid: int) -> None:
        """Stop watching ``pid``."""
        self._processes.discard(pid)
        with self._lock:
            was_server = pid in self._servers
            self._servers.discard(pid)
            self.tracker.forget(pid)
        if was_server:
            self._send(f"forget {pid}")

    def overdue(self) -> list[Unresponsive]:
        """The watched children unresponsive for the timeout, now."""
        now = time.monotonic()
        if now >= self._next_state_check:
            self._next_state_check = now + self.interval_s
            states = {pid: process_stopped(pid) for pid in self._processes}
            with self._lock:
                for pid, is_stopped in states.items():
                    self.tracker.stopped(pid, is_stopped, now)
        with self._lock:
            return self.tracker.overdue(now)

    def close(self) -> None:
        """End the probe and the reader, at once: the probe keeps no state, so it is
        SIGKILLed (our child, by pid) rather than waited for (a check in flight to a
        server that just exited could hold it for its call timeout, seconds per job)."""
        probe, self._probe = self._probe, None
        if probe is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if probe.stdin is not None:
                probe.stdin.close()
        probe.kill()
        probe.wait()
        if self._reader is not None:
            self._reader.join(_PROBE_EXIT_S)
        if probe.stdout is not None:
            probe.stdout.close()

    def _send(self, line: str) -> None:
        if self._probe_failed:
            return
        if self._probe is None:
            self._start_probe()
        probe = self._probe
        try:
            assert probe is not None and probe.stdin is not None  # started above
            probe.stdin.write(line + "\n")
            probe.stdin.flush()
        except (OSError, ValueError) as exc:
            self._give_up(f"cannot reach it ({exc})")

    def _start_probe(self) -> None:
        argv = [sys.executable, "-m", "psfleet.launch.health_probe",
                "--interval_s", str(self.interval_s),
                "--call_timeout_s", str(self.call_timeout_s)]
        env = {k: v for k, v in self._environ.items() if k != LAUNCHER_PID_VARIABLE}
        self._probe = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            bufsize=1, close_fds=True, preexec_fn=child_preexec(os.getpid()))
        self._reader = threading.Thread(target=self._read, args=(self._probe,),
                                        name="health-probe-reader", daemon=True)
        self._reader.start()
        logger.debug("health probe started (pid %d), every %.1f s", self._probe.pid,
                     self.interval_s)

    def _read(self, probe: subprocess.Popen[str]) -> None:
        assert probe.stdout is not None  # started with a pipe
        try:
            for line in probe.stdout:
                words = line.split()
                if len(words) == 2 and words[0] == "ok" and words[1].isdigit():
                    pid = int(words[1])
                    with self._lock:
                        if pid in self._servers:
                            self.tracker.answered(pid, time.monotonic())
                elif len(words) == 2 and words[0] == "skip" and words[1].isdigit():
                    pid = int(words[1])
                    logger.info("%s (pid %d) sends no HTTP/2 greeting, so it is not a gRPC "
                                "server: not health-checked (a stopped one is still found)",
                                self._endpoints.get(pid, "a server"), pid)
        except (OSError, ValueError):
            pass
        if self._probe is probe:  # not closed by us: it died
            self._give_up(f"it exited with {probe.poll()}")

    def _give_up(self, why: str) -> None:
        """The probe is gone: stop judging servers by health checks (never a false
        'dead'); stopped processes are still found."""
        if self._probe_failed:
            return
        self._probe_failed = True
        with self._lock:
            for pid in self._servers:
                self.tracker.forget(pid)
            self._servers.clear()
        logger.warning("fleetrun's health-check helper stopped: %s; servers are no longer "
                       "health-checked (a hung server is found by the workers' deadlines)",
                       why)
