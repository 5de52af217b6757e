"""Restarting failed children (``fleetrun --max_restarts N``).

Each server and each worker may be restarted up to N times. A restarted child gets
the environment it had plus ``PSFLEET_RESTART_NUM`` (how many times it was restarted);
a server that had bound a free port (``PADDLE_PORT=0``) binds the port it had, so the
workers' endpoint list stays valid. What a restarted process does is up to the script:
``fleet`` makes a restarted server re-create its tables from the newest checkpoint and
a restarted worker rejoin the running job (``psfleet.fleet.fleet``). With N > 0 every
child also gets ``PSFLEET_RPC_MAX_RETRIES=1000`` (unless set), so workers keep retrying
a server that is being restarted until ``PSFLEET_RPC_DEADLINE_S``.

The failed child's log is kept as ``<log>.failed<n>`` (n = the restart that followed)
and the new process writes ``<log>`` again.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Mapping

from psfleet.errors import ConfigError
from psfleet.launch.process import ChildProcess, describe_exit, read_tail
from psfleet.launch.types import ProcessSpec, Role

__all__ = ["RestartPolicy", "check_max_restarts"]

logger = logging.getLogger(__name__)

_TAIL_LINES = 10
_RETRIES_WITH_RESTARTS = "1000"


def check_max_restarts(value: object) -> int:
    """Validate ``--max_restarts``.

    Raises:
        ConfigError: not an integer >= 0.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"--max_restarts: got {value!r}; allowed: an integer >= 0")
    return value


class RestartPolicy:
    """How many restarts each child has left, and how a restart is started.

    Args:
        max_restarts: restarts allowed per child (0: none).
    """

    def __init__(self, max_restarts: int = 0) -> None:
        self.max_restarts = check_max_restarts(max_restarts)
        self._counts: dict[tuple[Role, int], int] = {}

    def prepare(self, spec: ProcessSpec) -> ProcessSpec:
        """A first start's spec, with the retry setting restarts need."""
        if self.max_restarts == 0 or "PSFLEET_RPC_MAX_RETRIES" in spec.env:
            return spec
        return dataclasses.replace(spec, env={**spec.env,
                                              "PSFLEET_RPC_MAX_RETRIES": _RETRIES_WITH_RESTARTS})

    def restarts(self, spec: ProcessSpec) -> int:
        """Restarts of the child ``spec`` describes so far."""
        return self._counts.get((spec.role, spec.index), 0)

    def can_restart(self, spec: ProcessSpec) -> bool:
        return self.restarts(spec) < self.max_restarts

    def restart(self, child: ChildProcess, endpoints: Mapping[int, str]) -> ProcessSpec:
        """Log the failure of ``child`` with its cause, clean up after it and return
        the spec to start in its place.

        Args:
            child: the failed (reaped) child.
            endpoints: server index -> the endpoint it had bound (for port-0 servers).
        """
        spec = child.spec
        count = self.restarts(spec) + 1
        self._counts[(spec.role, spec.index)] = count
        code = child.returncode
        child.flush_log()
        tail = read_tail(spec.log_path, _TAIL_LINES)
        child.signal_group(signal.SIGKILL)  # what is left of its process group
        child.close()
        kept = spec.log_path.with_name(f"{spec.log_path.name}.failed{count}")
        try:
            spec.log_path.replace(kept)
        except OSError:
            kept = spec.log_path
        lines = [f"fleetrun: {child.name} (pid {child.pid}) failed with "
                 f"{describe_exit(code if code is not None else 0)}; restarting it (restart "
                 f"{count} of --max_restarts {self.max_restarts}). Its log: {kept}"]
        if tail:
            lines.append(f"  last {len(tail)} line(s) of its log:")
            lines.extend(f"    | {line}" for line in tail)
        logger.warning("%s", "\n".join(lines))
        env = {**spec.env, "PSFLEET_RESTART_NUM": str(count)}
        if spec.role is Role.SERVER and env.get("PADDLE_PORT") == "0":
            endpoint = endpoints.get(spec.index)
            if endpoint is not None:
                env["PADDLE_PORT"] = endpoint.rpartition(":")[2]
        return dataclasses.replace(spec, env=env)
