"""What a role maker decides: :class:`RoleInfo`, and the :class:`RoleMaker` interface
(the role makers are in :mod:`psfleet.fleet.role_maker`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.types import Role

__all__ = ["RoleInfo", "RoleMaker", "done_file", "restart_num"]


@dataclass(frozen=True)
class RoleInfo:
    """This process's place in the job.

    Attributes:
        role: server or worker.
        worker_index: this worker's index (0 for servers).
        worker_num: number of workers in the job.
        server_index: this server's index (-1 for workers).
        server_endpoints: every server's ``host:port`` in index order (may be empty
            on a server started with port 0 by fleetrun, which reports its port).
        bind_endpoint: ``host:port`` a server binds (None for workers).
        endpoint_file: where a server writes its bound endpoint (fleetrun).
        worker_ips: every worker's IP in index order, when the job lists them
            (``PADDLE_TRAINER_IPS`` or ``PADDLE_TRAINERS`` as a list), else empty.
        auth_token: the job's shared secret when the role maker made one (MPIRoleMaker's
            exchange, with ``PSFLEET_AUTH_TOKEN`` unset), else None. Never in the repr.
        worker_num_given: whether the job said ``worker_num`` (a launched server gets
            ``PADDLE_TRAINERS_NUM``); False: the default of 1, no variable set. A server
            is told the count only when it was given (``run_server``).
    """

    role: Role
    worker_index: int
    worker_num: int
    server_index: int = -1
    server_endpoints: tuple[str, ...] = ()
    bind_endpoint: str | None = None
    endpoint_file: Path | None = None
    worker_ips: tuple[str, ...] = ()
    auth_token: str | None = field(default=None, repr=False)
    worker_num_given: bool = True

    @property
    def is_local(self) -> bool:
        """A single worker with no servers: tables live in this process."""
        return self.role is Role.WORKER and not self.server_endpoints


class RoleMaker(ABC):
    """Decides this process's :class:`RoleInfo`."""

    @abstractmethod
    def generate_role(self) -> RoleInfo:
        """Return the role. Raises ConfigError naming what is missing or wrong."""

    def serves(self) -> bool:
        """Whether this process is a server, decided before the role is generated, from
        what is cheap to read (no MPI exchange): the runner starts a server without
        torch (``psfleet.rec.roles``). This default generates the role.

        Raises:
            ConfigError: as :meth:`generate_role`.
        """
        return self.generate_role().role is Role.SERVER


def done_file() -> Path | None:
    """Where this worker records that it passed the job's stop barrier
    (``PSFLEET_DONE_FILE``, set by fleetrun); None: nowhere."""
    raw = env.read("PSFLEET_DONE_FILE")
    return Path(raw) if raw else None


def restart_num() -> int:
    """How many times the launcher restarted this process (``PSFLEET_RESTART_NUM``)."""
    raw = env.read("PSFLEET_RESTART_NUM") or "0"
    try:
        return max(int(raw), 0)
    except ValueError:
        raise ConfigError(f"PSFLEET_RESTART_NUM: {raw!r} is not an integer") from None
