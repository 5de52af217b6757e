"""One job's children on this host and the single thread that drives them.

:class:`Job` starts the servers (waiting for their endpoints), then the workers,
supervises them (exits, and hangs through :mod:`psfleet.launch.health`; restarts of
one child or of the whole job per :class:`~psfleet.launch.restarts.RestartPolicy`,
the first failure reported with its log tail), and stops every child at the end.
``psfleet.launch.local`` builds one and runs it; the lifecycle and exit codes are
described in the manual, :mod:`psfleet.launch.main`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from typing import BinaryIO

from psfleet import env
from psfleet.launch._signals import SignalCatcher
from psfleet.launch.cluster import JobLayout
from psfleet.launch.endpoints import read_endpoint
from psfleet.launch.gang import job_restart_message, newest_checkpoint
from psfleet.launch.grow import Growth
from psfleet.launch.health import HealthMonitor, Unresponsive, health_timeout_s
from psfleet.launch.hosts import bind_error
from psfleet.launch.process import ChildProcess, read_tail
from psfleet.launch.restarts import Action, RestartPolicy, cause_of
from psfleet.launch.specs import server_spec, worker_spec
from psfleet.launch.types import LaunchConfig, ProcessSpec, Role
from psfleet.replication import refill_delay_s

__all__ = ["Job", "EXIT_FAILURE"]

logger = logging.getLogger(__name__)

#: Exit code of a job in which a child failed or the servers never came up.
EXIT_FAILURE = 1

_POLL_INTERVAL_S = 0.05
_REPORT_INTERVAL_S = 3.0
_KILL_WAIT_S = 3.0
_TAIL_LINES = 20


class Job:
    """The children of one job and the steps that drive them (one thread).

    ``environ`` is what the servers and workers inherit (``os.environ`` when None;
    the launcher adds the job's token, roots and TLS files, ``psfleet.launch.security``).
    ``checkpoint_dir`` is the job's checkpoint folder, named in the line of a whole-job
    restart (None: ``PSFLEET_CHECKPOINT_DIR`` of ``environ``).

    Raises:
        ConfigError: a bad ``PSFLEET_HEALTH_TIMEOUT_S`` in ``environ``.
    """

    def __init__(
        self,
        config: LaunchConfig,
        layout: JobLayout,
        tee_stream: BinaryIO | None,
        make_spec: Callable[[int, bool], ProcessSpec] | None = None,
        *,
        restart_policy: RestartPolicy | None = None,
        environ: Mapping[str, str] | None = None,
        checkpoint_dir: str | None = None,
    ) -> None:
        self.config = config
        self._environ = environ
        child_environ = os.environ if environ is None else environ
        self._health = HealthMonitor(health_timeout_s(child_environ), child_environ)
        if (config.replication or 1) > 1:
            refill_delay_s(child_environ)  # a bad setting fails before any process starts
        self._checkpoint_dir = checkpoint_dir or env.read("PSFLEET_CHECKPOINT_DIR",
                                                          child_environ)
        self._restarts = restart_policy or RestartPolicy(0)
        self._endpoints: dict[int, str] = {}
        self._make_spec = make_spec
        self.layout = layout
        self.tee_stream = tee_stream
        self.servers: list[ChildProcess] = []
        self.workers: list[ChildProcess] = []
        self._seen_exit: set[int] = set()
        self._spared: set[int] = set()  # hung servers not killed: maybe a share's last copy
        self._finished: set[int] = set()  # workers that failed after the stop barrier
        self._stop_signal = signal.SIGTERM
        self._growth = Growth(config, layout, environ)

    @property
    def children(self) -> list[ChildProcess]:
        return self.servers + self.workers

    # -- the steps --------------------------------------------------------------------

    def run(self, signals: SignalCatcher) -> int:
        """Start servers, wait for their endpoints, start workers, supervise; exit code."""
        config, layout = self.config, self.layout
        started = time.monotonic()
        policy = self._restarts
        shutil.rmtree(config.done_dir, ignore_errors=True)  # an earlier run's done files
        timeout_s = self._health.timeout_s
        logger.info("restarts: %s; hang detection: %s",
                    f"--max_restarts {policy.max_restarts} --restart_policy {policy.policy}"
                    if policy.max_restarts else "none (--max_restarts 0)",
                    "off (PSFLEET_HEALTH_TIMEOUT_S=off)" if timeout_s is None
                    else f"PSFLEET_HEALTH_TIMEOUT_S={timeout_s:g}")
        if layout.endpoints_known and not self._ports_free():
            return EXIT_FAILURE
        for i in layout.local_servers:
            if signals.signum is not None:
                return self._interrupted(signals.signum)
            self.servers.append(self._start(server_spec(config, i, self._environ,
                                                              layout=layout)))
        endpoints: list[str] | int
        if layout.endpoints_known:
            # Fixed ports, possibly on other nodes: the workers wait for the servers.
            endpoints = list(layout.server_endpoints)
            if endpoints:
                logger.info("server endpoints: %s", ",".join(endpoints))
        else:
            endpoints = self._wait_for_endpoints(signals)
            if isinstance(endpoints, int):
                return endpoints
            if endpoints:
                logger.info("all %d server(s) ready: %s", len(endpoints), ",".join(endpoints))
        self._endpoints = dict(enumerate(endpoints))
        for server in self.servers:
            self._health.watch(server.pid, self._endpoints[server.spec.index])
        for k in layout.local_workers:
            if signals.signum is not None:
                return self._interrupted(signals.signum)
            tee = config.tee_worker_0 and k == layout.local_workers[0]
            spec = (self._make_spec(k, tee) if self._make_spec is not None
                    else worker_spec(config, k, endpoints, self._environ, layout=layout,
                                     tee=tee))
            self.workers.append(self._start(spec))
        if not self.workers:
            logger.info(
                "no worker on this node: the server(s) run until the job's workers stop them "
                "(or a signal)"
            )
        code = self._supervise(signals)
        if code == 0:
            logger.info("job succeeded in %.1f s", time.monotonic() - started)
        return code

    def _ports_free(self) -> bool:
        """Check that this node's servers can bind their fixed endpoints; log the first
        that cannot (before anything starts) and return False."""
        for i in self.layout.local_servers:
            slot = self.layout.servers[i]
            error = bind_error(slot.host, slot.port)
            if error is not None:
                logger.error(
                    "fleetrun: server %d cannot bind %s on this node (%s): the port is taken "
                    "or the address is not this node's. Free the port or choose another one "
                    "in %s. Nothing was started.",
                    i,
                    slot.endpoint,
                    error,
                    "--servers" if self.config.is_multi_node else "--start_port",
                )
                return False
        return True

    def _wait_for_endpoints(self, signals: SignalCatcher) -> list[str] | int:
        """Endpoints of all servers in index order, or the exit code if the job must end."""
        config = self.config
        started = time.monotonic()
        deadline = started + config.server_wait_timeout_s
        next_report = started + _REPORT_INTERVAL_S
        endpoints: dict[int, str] = {}
        while True:
            if signals.signum is not None:
                return self._interrupted(signals.signum)
            for server in self.servers:
                index = server.spec.index
                if index not in endpoints:
                    endpoint = read_endpoint(config.endpoint_file(index))
                    if endpoint is not None:
                        endpoints[index] = endpoint
                        logger.info("%s listens on %s", server.name, endpoint)
                    elif server.poll() is not None:
                        return self._report_failure(
                            server, f"before writing its endpoint to {config.endpoint_file(index)}"
                        )
            if len(endpoints) == len(self.servers):
                return [endpoints[i] for i in range(len(self.servers))]
            missing = [s for s in self.servers if s.spec.index not in endpoints]
            now = time.monotonic()
            if now >= deadline:
                logger.error(
                    "fleetrun: %d of %d server(s) did not report an endpoint within "
                    "--server_wait_timeout_s=%s: %s. A server started with PADDLE_PORT=0 must "
                    "write 'host:port' to $PSFLEET_ENDPOINT_FILE once it listens; check its "
                    "log, or raise --server_wait_timeout_s if it is just slow to start.",
                    len(missing),
                    len(self.servers),
                    config.server_wait_timeout_s,
                    "; ".join(f"{s.name} (log {s.spec.log_path})" for s in missing),
                )
                return EXIT_FAILURE
            if now >= next_report:
                next_report = now + _REPORT_INTERVAL_S
                logger.info(
                    "waiting for servers, %.0f s of %s s: not ready: %s",
                    now - started,
                    config.server_wait_timeout_s,
                    ", ".join(s.name for s in missing),
                )
            time.sleep(_POLL_INTERVAL_S)

    def _supervise(self, signals: SignalCatcher) -> int:
        """Watch every child until the workers are done (0), one fails (1) or a signal.

        On a node without workers: until every server exited 0 by itself (the job's
        workers stopped them over RPC), one fails, or a signal.
        """
        config = self.config
        grace_deadline: float | None = None
        while True:
            if signals.signum is not None:
                return self._interrupted(signals.signum)
            for child in self.children:
                code = child.poll()
                if code is None or child.pid in self._seen_exit:
                    continue
                self._seen_exit.add(child.pid)
                self._health.forget(child.pid)
                if code != 0:
                    outcome = self._on_failure(child, None, grace_deadline is not None)
                    if outcome is not None:
                        return outcome
                    continue
                logger.info("%s exited 0", child.name)
            if grace_deadline is None and self.workers:  # psfleet grow's servers
                for server, endpoint in self._growth.poll(self.servers, self._endpoints,
                                                          self._start):
                    self._health.watch(server.pid, endpoint)
            if grace_deadline is None:  # once the workers are done servers may go quiet
                for found in self._health.overdue():
                    outcome = self._on_hang(found)
                    if outcome is not None:
                        return outcome
            if not self.workers:
                if all(s.returncode is not None for s in self.servers):
                    return 0
            elif grace_deadline is None and all(w.returncode == 0 or w.pid in self._finished
                                                for w in self.workers):
                if not self.servers:
                    return 0
                logger.info(
                    "all %d worker(s) exited 0; giving the servers up to %s s to exit",
                    len(self.workers),
                    config.stop_grace_s,
                )
                grace_deadline = time.monotonic() + config.stop_grace_s
            if grace_deadline is not None and (
                all(s.returncode is not None for s in self.servers)
                or time.monotonic() >= grace_deadline
            ):
                return 0
            time.sleep(_POLL_INTERVAL_S)

    def stop_all(self, signals: SignalCatcher) -> None:
        """Signal every child group still alive, wait up to the grace, SIGKILL the rest.

        Safe to call more than once; closes all log files, ends the health checks and
        removes the workers' done files (``DIR/.done``).
        """
        self._health.close()
        alive = [c for c in self.children if c.group_alive()]
        if alive:
            logger.info(
                "sending %s to the process groups of %s",
                signal.Signals(self._stop_signal).name,
                ", ".join(c.name for c in alive),
            )
            for child in alive:
                child.signal_group(self._stop_signal)
            alive = self._wait_gone(alive, self.config.stop_grace_s, signals)
        if alive:
            logger.warning(
                "%s still running %s s after %s; sending SIGKILL",
                ", ".join(c.name for c in alive),
                self.config.stop_grace_s,
                signal.Signals(self._stop_signal).name,
            )
            for child in alive:
                child.signal_group(signal.SIGKILL)
            alive = self._wait_gone(alive, _KILL_WAIT_S, None)
        if alive:
            logger.error(
                "process groups of %s survived SIGKILL; pids to check: %s",
                ", ".join(c.name for c in alive),
                ", ".join(str(c.pid) for c in alive),
            )
        for child in self.children:
            child.close()
        shutil.rmtree(self.config.done_dir, ignore_errors=True)  # every child is gone

    # -- helpers ----------------------------------------------------------------------

    def _wait_gone(
        self, children: list[ChildProcess], timeout_s: float, signals: SignalCatcher | None
    ) -> list[ChildProcess]:
        deadline = time.monotonic() + timeout_s
        while children:
            children = [c for c in children if c.group_alive()]
            if not children or time.monotonic() >= deadline:
                break
            if signals is not None and signals.repeated:
                logger.warning("second signal received; not waiting any longer")
                break
            time.sleep(_POLL_INTERVAL_S)
        return children

    def _interrupted(self, signum: int) -> int:
        self._stop_signal = signal.Signals(signum)
        # INFO: the caller reports the interruption (psfleet train: one line).
        logger.info(
            "received %s; forwarding it to all processes and stopping the job",
            self._stop_signal.name,
        )
        return 128 + signum

    def _report_failure(self, child: ChildProcess, when: str, cause: str | None = None) -> int:
        """Log the root-cause summary of ``child``'s failure; return the job's exit code."""
        child.flush_log()
        tail = read_tail(child.spec.log_path, _TAIL_LINES)
        others = [c.name for c in self.children if c is not child and c.returncode is None]
        lines = [
            f"fleetrun: {self._who(child)} {cause_of(child, cause)}"
            + (f" {when}" if when else "")
            + "; this is the first failure (the root cause).",
            f"  log: {child.spec.log_path}",
        ]
        if tail:
            lines.append(f"  last {len(tail)} line(s) of its log:")
            lines.extend(f"    | {line}" for line in tail)
        else:
            lines.append("  its log is empty")
        if others:
            lines.append(f"  stopping the other processes: {', '.join(others)}")
        logger.error("%s", "\n".join(lines))
        return EXIT_FAILURE

    def _who(self, child: ChildProcess) -> str:
        """``server 0 (pid 123, 127.0.0.1:6170)`` / ``worker 1 (pid 124)``."""
        endpoint = self._health.endpoint(child.pid)
        return f"{child.name} (pid {child.pid}{', ' + endpoint if endpoint else ''})"

    def _on_failure(self, child: ChildProcess, cause: str | None,
                    workers_done: bool) -> int | None:
        """Restart after ``child``'s failure (reaped) per the policy; None when the job
        goes on, else its exit code (the failure reported).

        With replication (``LaunchConfig.replication`` > 1) a failed server is restarted
        when the ``process`` policy has restarts left (it rejoins: the others fill it);
        otherwise the job goes on while every share has a server up, and fails when
        one has none.

        Once training is complete (a worker passed the stop barrier: its done file,
        ``PSFLEET_DONE_FILE``) nothing is restarted: a restarted process would wait
        for workers that have left. A worker other than 0 that fails after its own
        stop barrier is only warned of: every step ran, and worker 0 writes the
        metrics (the job's result is worker 0's)."""
        trained = self._training_complete()
        if (trained and child.spec.role is Role.WORKER and child.spec.index != 0
                and self.config.done_file(child.spec.index).exists()):
            self._finished.add(child.pid)
            logger.warning("fleetrun: %s %s after the job's stop barrier (its training was "
                           "complete); not restarted, and not the job's failure: worker 0 "
                           "writes the metrics. Its log: %s", self._who(child),
                           cause_of(child, cause), child.spec.log_path)
            return None
        workers_done = workers_done or trained
        if child.spec.role is Role.SERVER and (self.config.replication or 1) > 1:
            return self._on_replicated_server_failure(child, cause, workers_done)
        action = self._restarts.decide(
            child.spec, workers_done=workers_done,
            a_worker_done=any(w.returncode == 0 for w in self.workers))
        if action is Action.RESTART_CHILD:
            self._replace(child, cause)
            return None
        if action is Action.RESTART_JOB:
            return self._restart_job(child, cause)
        return self._report_failure(child, "", cause)

    def _training_complete(self) -> bool:
        """Whether a worker of this node passed the job's stop barrier (its done file)."""
        return any(self.config.done_file(w.spec.index).exists() for w in self.workers)

    def _on_replicated_server_failure(self, child: ChildProcess, cause: str | None,
                                      workers_done: bool) -> int | None:
        """A server of a replicated job failed: restarted (``process`` policy, restarts
        left) or left down while another server is up (None: the job goes on), else the
        failure reported.

        Whether a share lost every copy is the servers' knowledge, not the launcher's:
        live servers take new copies of a dead one's shares (refill), so placement
        alone does not tell. A worker calling a share with no copy left fails, naming
        it, and the job fails with that worker."""
        replication = self.config.replication or 1
        if (self._restarts.policy == "process" and not workers_done
                and self._restarts.can_restart(child.spec)):
            self._replace(child, cause)
            return None
        dead = [s.spec.index for s in self.servers
                if s.returncode is not None and s.returncode != 0]
        if len(dead) == len(self.servers):
            return self._report_failure(
                child, "", f"{cause_of(child, cause)}; every server this launcher started "
                f"is dead (replication {replication})")
        child.flush_log()
        logger.warning("fleetrun: %s %s; not restarted (replication %d): the servers "
                       "holding its shares' other copies serve them, live servers take new "
                       "copies after PSFLEET_REFILL_DELAY_S, and the job goes on (dead "
                       "servers %s). Its log: %s", self._who(child), cause_of(child, cause),
                       replication, sorted(dead), child.spec.log_path)
        return None

    def _on_hang(self, found: Unresponsive) -> int | None:
        """SIGKILL the unresponsive child ``found`` names, then handle it as a failure."""
        child = next((c for c in self.children if c.pid == found.key), None)
        if child is None or child.pid in self._seen_exit:
            self._health.forget(found.key)
            return None
        if self._last_copy(child):
            return None
        self._health.forget(child.pid)
        child.signal_group(signal.SIGKILL)  # our own child's group, by its pid
        deadline = time.monotonic() + _KILL_WAIT_S
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(_POLL_INTERVAL_S)
        self._seen_exit.add(child.pid)
        cause = (f"{found.reason} (PSFLEET_HEALTH_TIMEOUT_S="
                 f"{self._health.timeout_s:g}); fleetrun killed it (SIGKILL)")
        return self._on_failure(child, cause, workers_done=False)

    def _last_copy(self, child: ChildProcess) -> bool:
        """Whether the unresponsive ``child`` may hold the last live copy of a share: a
        server of a replicated job while another of the job's servers is down (after a
        fail-over its shares have no other copy). It is then not killed (SIGKILL would
        lose them; a slow server may still answer): warned of once, and watched on.
        In an unreplicated job every server holds its share's only copy and a hung one
        blocks the job, so it is killed (and restarted per --max_restarts)."""
        if child.spec.role is not Role.SERVER or (self.config.replication or 1) < 2:
            return False
        down = [s.name for s in self.servers if s is not child and s.returncode is not None]
        if not down:
            return False
        if child.pid not in self._spared:
            self._spared.add(child.pid)
            logger.warning("fleetrun: %s does not answer health checks, but %s %s down, so "
                           "it may hold the last live copy of their shares: not killed "
                           "(a server that hangs is then found by the workers' deadlines, "
                           "PSFLEET_RPC_DEADLINE_S)", self._who(child), ", ".join(down),
                           "is" if len(down) == 1 else "are")
        return True

    def _restart_job(self, failed: ChildProcess, cause: str | None) -> int | None:
        """``gang``: stop every child, then start them all again (servers first) with
        ``PSFLEET_RESTART_NUM=k``; they resume from the newest complete checkpoint.
        None when restarted; the exit code when a child survived SIGKILL."""
        k = self._restarts.begin_job_restart()
        who = self._who(failed)
        everyone = self.children
        for child in everyone:
            child.signal_group(signal.SIGKILL)
        survivors = self._wait_gone(everyone, _KILL_WAIT_S, None)
        for child in everyone:
            child.poll()
            self._seen_exit.add(child.pid)
            self._health.forget(child.pid)
        if survivors:
            logger.error("fleetrun: cannot restart the job: the process groups of %s "
                         "survived SIGKILL (pids %s)", ", ".join(c.name for c in survivors),
                         ", ".join(str(c.pid) for c in survivors))
            return self._report_failure(failed, "", cause)
        tail, kept = self._restarts.retire(failed, f"failed{k}")
        for child in everyone:
            if child is not failed:
                self._restarts.retire(child, f"stopped{k}")
        lines = [job_restart_message(
            who, cause_of(failed, cause), checkpoint_dir=self._checkpoint_dir,
            checkpoint=newest_checkpoint(self._checkpoint_dir), restart=k,
            max_restarts=self._restarts.max_restarts) + f". Its log: {kept}"]
        if tail:
            lines.append(f"  last {len(tail)} line(s) of its log:")
            lines.extend(f"    | {line}" for line in tail)
        logger.warning("%s", "\n".join(lines))
        respec, first = self._restarts.respec, len(self.layout.servers)
        self.servers = [self._start(respec(c.spec, k, self._endpoints, first))
                        for c in self.servers]
        self.workers = [self._start(respec(c.spec, k, self._endpoints, first))
                        for c in self.workers]
        return None

    def _replace(self, child: ChildProcess, cause: str | None = None) -> None:
        """Restart a failed child in its place (``--max_restarts``)."""
        spec = self._restarts.restart(child, self._endpoints, len(self.layout.servers), cause,
                                      self._who(child))
        group = self.servers if child in self.servers else self.workers
        group[group.index(child)] = self._start(spec)

    def _start(self, spec: ProcessSpec) -> ChildProcess:
        spec = self._restarts.prepare(spec)
        child = ChildProcess(spec, self.tee_stream)
        logger.info("started %s (pid %d), log %s", spec.name, child.pid, spec.log_path)
        self._health.watch_process(child.pid)
        endpoint = self._endpoints.get(spec.index) if spec.role is Role.SERVER else None
        if endpoint is not None:  # a restart; first starts are watched once they listen
            self._health.watch(child.pid, endpoint)
        return child
