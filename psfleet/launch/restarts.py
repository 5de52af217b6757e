"""Restarting failed children (``fleetrun --max_restarts N --restart_policy P``).

Two policies decide what a failure (an exit other than 0, a signal, or a child found
unresponsive by :mod:`psfleet.launch.health`) restarts:

- ``process`` (fleetrun's default; async and GEO jobs): only the failed child, up to N
  times per server and per worker. It gets the environment it had plus
  ``PSFLEET_RESTART_NUM`` (how many times it was restarted); a server that had bound
  a free port (``PADDLE_PORT=0``) binds the port it had, so the workers' endpoint list
  stays valid. ``fleet`` makes a restarted server re-create its tables from the
  newest checkpoint and a restarted worker rejoin the running job
  (``psfleet.fleet.fleet``). In sync mode a replaced worker cannot rejoin a round the
  others are in, so use ``gang`` there.
- ``gang`` (sync jobs; as torchrun's elastic agent): every server and worker of this
  node is stopped (SIGKILL: the job resumes from a checkpoint, nothing in memory is
  needed) and all start again with ``PSFLEET_RESTART_NUM=k`` (the k-th restart of the
  job), up to N times per job. The servers re-create their tables from the newest
  complete checkpoint and every worker resumes from its cursor in it, so a sync job
  with SGD ends with the same parameters as an undisturbed run (bit for bit); with no
  checkpoint yet the job starts from scratch.

With N > 0 every child also gets ``PSFLEET_RPC_MAX_RETRIES=1000`` (unless set), so
workers keep retrying a server that is being restarted until ``PSFLEET_RPC_DEADLINE_S``.
The failed child's log is kept as ``<log>.failed<k>`` (k = the restart that followed);
with ``gang`` the others' logs are kept as ``<log>.stopped<k>``. The new processes write
``<log>`` again. Nothing is restarted once every worker has finished; with ``gang``,
once any worker has (in sync mode it passed the last barrier).

:meth:`RestartPolicy.decide` is the pure decision (unit tested).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import signal
from collections.abc import Mapping
from pathlib import Path

from psfleet.errors import ConfigError
from psfleet.launch.process import ChildProcess, describe_exit, read_tail
from psfleet.launch.types import ProcessSpec, Role

__all__ = ["RESTART_POLICIES", "Action", "RestartPolicy", "cause_of", "check_max_restarts",
           "check_restart_policy"]

logger = logging.getLogger(__name__)

#: Values of ``fleetrun --restart_policy`` (the first is the default).
RESTART_POLICIES = ("process", "gang")

_TAIL_LINES = 10
_RETRIES_WITH_RESTARTS = "1000"


class Action(enum.Enum):
    """What the launcher does about a failed child."""

    RESTART_CHILD = "restart the child"
    RESTART_JOB = "restart every server and worker"
    FAIL = "end the job"


def check_max_restarts(value: object) -> int:
    """Validate ``--max_restarts``.

    Raises:
        ConfigError: not an integer >= 0.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"--max_restarts: got {value!r}; allowed: an integer >= 0")
    return value


def check_restart_policy(value: object) -> str:
    """Validate ``--restart_policy``.

    Raises:
        ConfigError: not one of :data:`RESTART_POLICIES`.
    """
    if value not in RESTART_POLICIES:
        raise ConfigError(f"--restart_policy: {value!r} is not one of "
                          f"{', '.join(RESTART_POLICIES)}; use gang for sync-mode jobs")
    return str(value)


def cause_of(child: ChildProcess, cause: str | None = None) -> str:
    """``failed with exit code 3`` / ``failed with signal SIGKILL (9)``, or ``cause``."""
    if cause is not None:
        return cause
    code = child.returncode
    return f"failed with {describe_exit(code if code is not None else 0)}"


class RestartPolicy:
    """How many restarts are left, what a failure restarts, and how restarts start.

    Args:
        max_restarts: restarts allowed per child (``process``) or per job (``gang``);
            0: none.
        policy: one of :data:`RESTART_POLICIES`.

    Raises:
        ConfigError: a bad ``max_restarts`` or ``policy``.
    """

    def __init__(self, max_restarts: int = 0, policy: str = "process") -> None:
        self.max_restarts = check_max_restarts(max_restarts)
        self.policy = check_restart_policy(policy)
        self._counts: dict[tuple[Role, int], int] = {}
        self.job_restarts = 0

    def prepare(self, spec: ProcessSpec) -> ProcessSpec:
        """A first start's spec, with the retry setting restarts need (not in a
        replicated job: its workers fail a dead server over instead of waiting)."""
        if self.max_restarts == 0 or "PSFLEET_RPC_MAX_RETRIES" in spec.env or \
                spec.env.get("PSFLEET_REPLICATION", "1") != "1":  # fail over, not wait
            return spec
        return dataclasses.replace(spec, env={**spec.env,
                                              "PSFLEET_RPC_MAX_RETRIES": _RETRIES_WITH_RESTARTS})

    def restarts(self, spec: ProcessSpec) -> int:
        """Restarts of the child ``spec`` describes so far (``gang``: of the job)."""
        if self.policy == "gang":
            return self.job_restarts
        return self._counts.get((spec.role, spec.index), 0)

    def can_restart(self, spec: ProcessSpec) -> bool:
        return self.restarts(spec) < self.max_restarts

    def decide(self, spec: ProcessSpec, *, workers_done: bool = False,
               a_worker_done: bool = False) -> Action:
        """What to do about the failure of the child ``spec`` describes.

        Args:
            spec: the failed child's spec.
            workers_done: every worker already exited 0 (the job is ending): a
                failure then is never restarted.
            a_worker_done: some worker already exited 0. ``gang`` then does not
                restart: in sync mode that worker passed the job's last barrier, so
                training is over (and a restarted worker 0 would find its run
                finished).
        """
        if workers_done or not self.can_restart(spec):
            return Action.FAIL
        if self.policy == "gang" and a_worker_done:
            return Action.FAIL
        return Action.RESTART_JOB if self.policy == "gang" else Action.RESTART_CHILD

    def restart(self, child: ChildProcess, endpoints: Mapping[int, str], server_num: int,
                cause: str | None = None, who: str | None = None) -> ProcessSpec:
        """``process`` policy: log the failure of ``child`` with its cause, clean up
        after it and return the spec to start in its place.

        Args:
            child: the failed (reaped) child.
            endpoints: server index -> the endpoint it had bound (for port-0 servers).
            server_num: the servers the job started with (indices ``0..server_num-1``;
                ``psfleet grow`` adds the ones after them).
            cause: what happened, when not its exit (``did not answer health checks
                for 30 s; killed``); default from its exit code.
            who: how the child is named, default ``worker 1 (pid 123)``.
        """
        spec = child.spec
        count = self.restarts(spec) + 1
        self._counts[(spec.role, spec.index)] = count
        tail, kept = self.retire(child, f"failed{count}")
        who = who or f"{child.name} (pid {child.pid})"
        lines = [f"fleetrun: {who} {cause_of(child, cause)}; "
                 f"restarting it (restart {count} of --max_restarts {self.max_restarts}). "
                 f"Its log: {kept}"]
        if tail:
            lines.append(f"  last {len(tail)} line(s) of its log:")
            lines.extend(f"    | {line}" for line in tail)
        logger.warning("%s", "\n".join(lines))
        return self.respec(spec, count, endpoints, server_num)

    def begin_job_restart(self) -> int:
        """``gang`` policy: count one more restart of the job; return k (1-based)."""
        self.job_restarts += 1
        return self.job_restarts

    @staticmethod
    def retire(child: ChildProcess, suffix: str) -> tuple[list[str], Path]:
        """Kill what is left of a reaped child's group, close its log and keep it as
        ``<log>.<suffix>``; return the log's last lines and where it is kept."""
        child.flush_log()
        tail = read_tail(child.spec.log_path, _TAIL_LINES)
        child.signal_group(signal.SIGKILL)  # what is left of its process group
        child.close()
        log = child.spec.log_path
        kept = log.with_name(f"{log.name}.{suffix}")
        try:
            log.replace(kept)
        except OSError:
            kept = log
        return tail, kept

    @staticmethod
    def respec(spec: ProcessSpec, count: int, endpoints: Mapping[int, str],
               server_num: int) -> ProcessSpec:
        """``spec`` for its ``count``-th restart: ``PSFLEET_RESTART_NUM=count``, and a
        port-0 server binds the port it had (``endpoints``: index -> host:port). A
        server of a replicated job is also given the endpoints of the job's first
        ``server_num`` servers, the list every worker has: it rejoins by asking the
        others (``psfleet.ps.replica``), and learns of servers added since from them
        (one added by ``psfleet grow`` already has that list)."""
        env = {**spec.env, "PSFLEET_RESTART_NUM": str(count)}
        if spec.role is Role.SERVER and env.get("PADDLE_PORT") == "0":
            endpoint = endpoints.get(spec.index)
            if endpoint is not None:
                env["PADDLE_PORT"] = endpoint.rpartition(":")[2]
        if spec.role is Role.SERVER and env.get("PSFLEET_REPLICATION", "1") != "1" and \
                endpoints and "PADDLE_PSERVERS_IP_PORT_LIST" not in env:
            env["PADDLE_PSERVERS_IP_PORT_LIST"] = ",".join(
                endpoints[i] for i in sorted(endpoints) if i < server_num)
        return dataclasses.replace(spec, env=env)
