"""Role makers: who this process is (server or worker, which index, which endpoints).

Three ways to say it, all producing one :class:`RoleInfo`:

- :class:`PaddleCloudRoleMaker` reads the seeds' environment variables (both
  generations of Paddle Fleet's names, see ``psfleet.env``), so jobs started by
  ``fleetrun`` or by hand with Paddle's variables work unchanged. With no role
  variables and no server list the process is a single local worker training against
  in-process tables (``is_local``), so the same script runs on a laptop and a cluster.
- :class:`MPIRoleMaker` and :class:`SlurmRoleMaker` derive the role from the rank
  ``mpirun`` / ``srun`` gives each process: ranks ``0 .. server_num-1`` are servers
  (server index = rank), ranks ``server_num .. size-1`` are workers
  (``worker_index = rank - server_num``, ``worker_num = size - server_num``). Under
  ``mpirun`` the server list may be left unset: the ranks exchange it over MPI.
- :class:`UserDefinedRoleMaker` takes the role in code.

:func:`default_role_maker` is what ``fleet.init()`` uses when given none: MPIRoleMaker
inside an ``mpirun`` job, else PaddleCloudRoleMaker.

Every inconsistency is a :class:`~psfleet.errors.ConfigError` naming the variable, its
value and what to do; two variables that say the same thing differently are an error,
never a silent choice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from psfleet import env
from psfleet.env import int_var
from psfleet.errors import ConfigError
from psfleet.fleet._role_env import Workers, server_endpoints, workers_of
from psfleet.fleet.rank_role_makers import MPIRoleMaker, SlurmRoleMaker, mpi_world_size
from psfleet.fleet.role_info import RoleInfo, RoleMaker
from psfleet.replication import replication_from_env
from psfleet.rpc import parse_endpoint
from psfleet.types import Role

__all__ = [
    "Role",
    "RoleInfo",
    "RoleMaker",
    "PaddleCloudRoleMaker",
    "MPIRoleMaker",
    "SlurmRoleMaker",
    "UserDefinedRoleMaker",
    "default_role_maker",
    "env_role",
    "mpi_world_size",
]


def env_role(environ: Mapping[str, str] | None = None) -> tuple[Role, str]:
    """The role ``TRAINING_ROLE`` / ``PADDLE_TRAINING_ROLE`` name and the variable that
    named it (TRAINER when neither is set): the one reading of the role for every
    caller, case and surrounding blanks ignored (``pserver`` is ``PSERVER``).

    Raises:
        ConfigError: an unknown role, or the two variables disagree.
    """
    named = [(name, raw) for name in ("TRAINING_ROLE", "PADDLE_TRAINING_ROLE")
             if (raw := env.read(name, environ)) is not None]
    if not named:
        return Role.WORKER, "TRAINING_ROLE"
    if len({raw.strip().upper() for _, raw in named}) > 1:
        raise ConfigError(f"TRAINING_ROLE is {named[0][1]!r} but PADDLE_TRAINING_ROLE is "
                          f"{named[1][1]!r}: set only one, or make them agree")
    name, raw = named[0]
    try:
        return Role(raw.strip().upper()), name
    except ValueError:
        hint = (" (heterogeneous trainers are not supported)"
                if raw.strip().upper() == "HETER_TRAINER" else "")
        raise ConfigError(f"{name}: {raw!r} is not one of PSERVER, TRAINER{hint}") from None


# -- role makers ------------------------------------------------------------------------

class PaddleCloudRoleMaker(RoleMaker):
    """The role from the seeds' environment variables.

    Variables (all declared in ``psfleet.env``; a pair that says the same thing must
    agree, else ConfigError):

    - role: ``TRAINING_ROLE`` / ``PADDLE_TRAINING_ROLE``: ``PSERVER`` or ``TRAINER``
      (any case; ``TRAINER`` when unset).
    - servers: ``PADDLE_PSERVERS_IP_PORT_LIST``, or ``PADDLE_PSERVER_IPS`` +
      ``PADDLE_PSERVER_PORT`` (one port for all IPs, or one per IP).
    - worker count: ``PADDLE_TRAINERS_NUM``, or ``PADDLE_TRAINERS`` (a count, or a comma
      list of IP addresses whose length is the count), or else the length of
      ``PADDLE_TRAINER_IPS``; 1 when none is set. ``PADDLE_TRAINER_IPS``, when set,
      must list one IP per worker.
    - a worker: ``PADDLE_TRAINER_ID`` (required when there is more than one worker).
    - a server: ``POD_IP`` / ``PADDLE_CURRENT_IP`` and ``PADDLE_PORT``; the server index
      is the position of ``ip:port`` in the server list (either IP may match), or
      ``PSFLEET_SERVER_INDEX`` when given (then no list is needed, and without
      ``POD_IP`` / ``PADDLE_PORT`` the server binds its list entry);
      ``PSFLEET_ENDPOINT_FILE`` is where it reports its bound endpoint.

    torchrun's ``RANK`` / ``WORLD_SIZE`` are not read: they belong to collective mode.

    Args:
        environ: the environment to read; ``os.environ`` when None.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._env = dict(os.environ if environ is None else environ)

    def serves(self) -> bool:
        return env_role(self._env)[0] is Role.SERVER

    def generate_role(self) -> RoleInfo:
        """Return the role.

        Raises:
            ConfigError: a variable is malformed, two variables disagree, a trainer id
                is out of range, or a server cannot tell its index.
        """
        e = self._env
        role, role_var = env_role(e)
        endpoints, source = server_endpoints(e)
        workers = workers_of(e)
        if role is Role.SERVER:
            return self._server(role_var, endpoints, source, workers)
        worker_index = int_var(e, "PADDLE_TRAINER_ID", 0)
        if worker_index is None:
            if workers.num > 1:
                raise ConfigError(f"PADDLE_TRAINER_ID is not set but {workers.source} is "
                                  f"{workers.num}: set it to this worker's index")
            worker_index = 0
        if worker_index >= workers.num:
            raise ConfigError(f"PADDLE_TRAINER_ID: {worker_index} must be < {workers.source} "
                              f"({workers.num}): worker indices are 0..{workers.num - 1}")
        if not endpoints and workers.num > 1:
            raise ConfigError(
                f"{workers.source} is {workers.num} but {source} is empty: list the "
                "servers' host:port, or start the job with fleetrun")
        return RoleInfo(Role.WORKER, worker_index, workers.num, server_endpoints=endpoints,
                        worker_ips=workers.ips)

    def _server(self, role_var: str, endpoints: tuple[str, ...], source: str,
                workers: Workers) -> RoleInfo:
        e = self._env
        ips = [ip for name in ("POD_IP", "PADDLE_CURRENT_IP")
               if (ip := env.read(name, e)) is not None]
        port = int_var(e, "PADDLE_PORT", 0, 65535)
        index = int_var(e, "PSFLEET_SERVER_INDEX", 0)
        if index is None and not endpoints:
            raise ConfigError(
                f"{role_var} is PSERVER but no server list is set: set "
                "PADDLE_PSERVERS_IP_PORT_LIST (or PADDLE_PSERVER_IPS + PADDLE_PSERVER_PORT) "
                "to every server's host:port, or PSFLEET_SERVER_INDEX")
        if index is not None and endpoints and index >= len(endpoints) and \
                replication_from_env(len(endpoints), e) == 1:
            raise ConfigError(f"PSFLEET_SERVER_INDEX: {index} must be < the {len(endpoints)} "
                              f"servers in {source} (a server is added to a running job only "
                              "with PSFLEET_REPLICATION >= 2: psfleet grow)")
        if not ips or port is None:
            if index is None or not endpoints or index >= len(endpoints):
                raise ConfigError(f"{role_var} is PSERVER but POD_IP (or PADDLE_CURRENT_IP) "
                                  "and PADDLE_PORT are not both set: set the address to bind")
            bind = endpoints[index]
        else:
            candidates = [f"{ip}:{port}" for ip in dict.fromkeys(ips)]
            matches = [c for c in candidates if c in endpoints]
            if index is None:
                if not matches:
                    raise ConfigError(
                        f"this server's endpoint {' or '.join(candidates)} (POD_IP:PADDLE_PORT)"
                        f" is not in {source} {list(endpoints)}: set POD_IP and PADDLE_PORT to "
                        "one of its entries, or PSFLEET_SERVER_INDEX")
                index = endpoints.index(matches[0])
            elif matches and endpoints.index(matches[0]) != index:
                raise ConfigError(
                    f"PSFLEET_SERVER_INDEX is {index} but POD_IP:PADDLE_PORT {matches[0]} is "
                    f"entry {endpoints.index(matches[0])} of {source}: make them agree")
            bind = matches[0] if matches else candidates[0]
        file = env.read("PSFLEET_ENDPOINT_FILE", e)
        return RoleInfo(Role.SERVER, 0, workers.num, server_index=index,
                        server_endpoints=endpoints, bind_endpoint=bind,
                        endpoint_file=Path(file) if file else None, worker_ips=workers.ips,
                        worker_num_given=workers.given)


def default_role_maker(environ: Mapping[str, str] | None = None,
                       server_num: int | None = None) -> tuple[RoleMaker, str]:
    """The role maker ``fleet.init()`` uses when given none, and why (for its log).

    - ``TRAINING_ROLE`` or ``PADDLE_TRAINING_ROLE`` set: :class:`PaddleCloudRoleMaker`
      (fleetrun's children and jobs started by hand, also inside an ``mpirun`` job).
    - else Open MPI's (``OMPI_COMM_WORLD_*``) or PMI's (``PMI_RANK`` / ``PMI_SIZE``)
      rank variables set: :class:`MPIRoleMaker`, ``PSFLEET_SERVER_NUM`` ranks serving.
      When it is unset, half the ranks (rounded down; workers get the odd one) serve,
      the count of Paddle's MPISymetricRoleMaker, which made half the ranks servers
      (``python/paddle/fluid/incubate/fleet/base/role_maker.py``; there the even
      ranks, here ranks ``0 .. size/2-1``); a job of one rank (``mpirun -np 1``) has
      none and trains alone, as without ``mpirun`` (:class:`PaddleCloudRoleMaker`).
      ``server_num``, when given (the YAML runner's ``cluster.server_num``), is the
      count instead, and ``PSFLEET_SERVER_NUM`` must agree with it if set.
    - else :class:`PaddleCloudRoleMaker`.

    Raises:
        ConfigError: the rank variables or PSFLEET_SERVER_NUM are malformed, or
            PSFLEET_SERVER_NUM disagrees with ``server_num``.
    """
    e = dict(os.environ if environ is None else environ)
    named = [n for n in ("TRAINING_ROLE", "PADDLE_TRAINING_ROLE") if env.read(n, e) is not None]
    launched = [n for pair in MPIRoleMaker._RANK_VARS for n in pair
                if env.read(n, e) is not None]
    if named:
        over = f", which wins over {launched[0]}" if launched else ""
        return PaddleCloudRoleMaker(e), f"{named[0]} is set{over}"
    if not launched:
        return PaddleCloudRoleMaker(e), "no TRAINING_ROLE and no MPI rank variable is set"
    _, size, rank_var, size_var = MPIRoleMaker(1, e)._rank_and_size()
    mpi = f"{rank_var} is set (mpirun) and no TRAINING_ROLE"
    from_env = int_var(e, "PSFLEET_SERVER_NUM", 1)
    if server_num is not None:
        if from_env is not None and from_env != server_num:
            raise ConfigError(f"PSFLEET_SERVER_NUM is {from_env} but the job's server count "
                              f"is {server_num}: unset PSFLEET_SERVER_NUM, or make them agree")
        return MPIRoleMaker(server_num, e), f"{mpi}; server_num {server_num} given"
    if from_env is not None:
        return MPIRoleMaker(environ=e), f"{mpi}; PSFLEET_SERVER_NUM: {from_env} ranks serve"
    if size == 1:
        return PaddleCloudRoleMaker(e), (f"{mpi}; one rank ({size_var} is 1) and no "
                                         "PSFLEET_SERVER_NUM: it trains alone")
    return MPIRoleMaker(size // 2, e), (f"{mpi}; no PSFLEET_SERVER_NUM: half of the {size} "
                                        f"ranks ({size // 2}) serve")


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

    def serves(self) -> bool:
        return self._args[1] is Role.SERVER

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
