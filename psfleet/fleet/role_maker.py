"""Role makers: who this process is (server or worker, which index, which endpoints).

:class:`PaddleCloudRoleMaker` reads the seeds' environment variables (see
``psfleet.env``), so jobs started by ``fleetrun`` or by hand with Paddle's variables
work unchanged. With no role variables and no server list the process is a single
local worker training against in-process tables (``is_local``), so the same script
runs on a laptop and on a cluster.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.rpc import parse_endpoint

__all__ = ["Role", "RoleInfo", "RoleMaker", "PaddleCloudRoleMaker", "UserDefinedRoleMaker"]


class Role(enum.Enum):
    """What a process does in the job."""

    WORKER = "TRAINER"
    SERVER = "PSERVER"


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
    """

    role: Role
    worker_index: int
    worker_num: int
    server_index: int = -1
    server_endpoints: tuple[str, ...] = ()
    bind_endpoint: str | None = None
    endpoint_file: Path | None = None

    @property
    def is_local(self) -> bool:
        """A single worker with no servers: tables live in this process."""
        return self.role is Role.WORKER and not self.server_endpoints


class RoleMaker(ABC):
    """Decides this process's :class:`RoleInfo`."""

    @abstractmethod
    def generate_role(self) -> RoleInfo:
        """Return the role. Raises ConfigError naming what is missing or wrong."""


def _int(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = env.read(name, environ)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}: {raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}: {value} must be >= {minimum}")
    return value


class PaddleCloudRoleMaker(RoleMaker):
    """The role from the seeds' environment variables.

    Reads TRAINING_ROLE / PADDLE_TRAINING_ROLE (PSERVER or TRAINER),
    PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID, POD_IP /
    PADDLE_CURRENT_IP, PADDLE_PORT, PSFLEET_SERVER_INDEX, PSFLEET_ENDPOINT_FILE.

    Args:
        environ: the environment to read; ``os.environ`` when None.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        import os

        self._env = dict(os.environ if environ is None else environ)

    def generate_role(self) -> RoleInfo:
        e = self._env
        raw_role = env.read("TRAINING_ROLE", e) or env.read("PADDLE_TRAINING_ROLE", e)
        endpoints = self._endpoints()
        worker_num = _int(e, "PADDLE_TRAINERS_NUM", 1) or 1
        if raw_role is None:
            raw_role = "TRAINER"
        try:
            role = Role(raw_role.upper())
        except ValueError:
            raise ConfigError(
                f"TRAINING_ROLE: {raw_role!r} is not one of PSERVER, TRAINER") from None
        if role is Role.SERVER:
            return self._server(endpoints, worker_num)
        worker_index = _int(e, "PADDLE_TRAINER_ID", 0)
        if worker_index is None:
            if worker_num > 1:
                raise ConfigError("PADDLE_TRAINER_ID is not set but PADDLE_TRAINERS_NUM is "
                                  f"{worker_num}: set it to this worker's index")
            worker_index = 0
        if worker_index >= worker_num:
            raise ConfigError(f"PADDLE_TRAINER_ID: {worker_index} must be < "
                              f"PADDLE_TRAINERS_NUM ({worker_num})")
        if not endpoints and worker_num > 1:
            raise ConfigError(
                f"PADDLE_TRAINERS_NUM is {worker_num} but PADDLE_PSERVERS_IP_PORT_LIST is "
                "empty: list the servers' host:port, or start the job with fleetrun")
        return RoleInfo(Role.WORKER, worker_index, worker_num, server_endpoints=endpoints)

    def _endpoints(self) -> tuple[str, ...]:
        raw = env.read("PADDLE_PSERVERS_IP_PORT_LIST", self._env) or ""
        endpoints = tuple(p.strip() for p in raw.split(",") if p.strip())
        for endpoint in endpoints:
            parse_endpoint(endpoint, "PADDLE_PSERVERS_IP_PORT_LIST")
        return endpoints

    def _server(self, endpoints: tuple[str, ...], worker_num: int) -> RoleInfo:
        e = self._env
        ip = env.read("POD_IP", e) or env.read("PADDLE_CURRENT_IP", e)
        port = _int(e, "PADDLE_PORT", 0)
        if ip is None or port is None:
            raise ConfigError("TRAINING_ROLE is PSERVER but POD_IP (or PADDLE_CURRENT_IP) "
                              "and PADDLE_PORT are not both set: set the address to bind")
        endpoint = f"{ip}:{port}"
        index = _int(e, "PSFLEET_SERVER_INDEX", 0)
        if index is None:
            if endpoint not in endpoints:
                raise ConfigError(f"this server's endpoint {endpoint} (POD_IP:PADDLE_PORT) is "
                                  f"not in PADDLE_PSERVERS_IP_PORT_LIST {list(endpoints)}")
            index = endpoints.index(endpoint)
        file = env.read("PSFLEET_ENDPOINT_FILE", e)
        return RoleInfo(Role.SERVER, 0, worker_num, server_index=index,
                        server_endpoints=endpoints, bind_endpoint=endpoint,
                        endpoint_file=Path(file) if file else None)


class UserDefinedRoleMaker(RoleMaker):
    """A role given in code, as the seeds' UserDefinedRoleMaker.

    Args:
        current_id: this worker's or server's index.
        role: Role.WORKER or Role.SERVER.
        worker_num: number of workers.
        server_endpoints: every server's ``host:port``.
    """

    def __init__(self, current_id: int, role: Role, worker_num: int,
                 server_endpoints: Sequence[str]) -> None:
        self._args = (current_id, role, worker_num, tuple(server_endpoints))

    def generate_role(self) -> RoleInfo:
        current_id, role, worker_num, endpoints = self._args
        for endpoint in endpoints:
            parse_endpoint(endpoint, "server_endpoints")
        if role is Role.SERVER:
            if not 0 <= current_id < len(endpoints):
                raise ConfigError(f"current_id: {current_id} is not a server index "
                                  f"(0..{len(endpoints) - 1})")
            return RoleInfo(role, 0, worker_num, server_index=current_id,
                            server_endpoints=endpoints, bind_endpoint=endpoints[current_id])
        if not 0 <= current_id < worker_num:
            raise ConfigError(f"current_id: {current_id} must be in 0..{worker_num - 1}")
        return RoleInfo(role, current_id, worker_num, server_endpoints=endpoints)
