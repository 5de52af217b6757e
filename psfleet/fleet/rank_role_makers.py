"""Role makers by rank: ``mpirun``'s and ``srun``'s processes.

Ranks ``0 .. server_num-1`` are servers (server index = rank), ranks
``server_num .. size-1`` are workers (``worker_index = rank - server_num``,
``worker_num = size - server_num``). Under ``mpirun`` the server list may be left
unset: the ranks exchange it over MPI (:mod:`psfleet.fleet._mpi`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from psfleet import env
from psfleet.env import int_var
from psfleet.errors import ConfigError
from psfleet.fleet import _mpi
from psfleet.fleet._role_env import server_endpoints
from psfleet.fleet.role_info import RoleInfo, RoleMaker
from psfleet.types import Role

__all__ = ["MPIRoleMaker", "SlurmRoleMaker", "mpi_world_size"]


class _RankRoleMaker(RoleMaker):
    """Role by rank: ranks 0..server_num-1 serve, the rest train (see module doc)."""

    #: (rank variable, size variable) pairs, tried in order.
    _RANK_VARS: tuple[tuple[str, str], ...] = ()
    #: how the user starts such a job, for messages.
    _LAUNCHER = ""

    def __init__(self, server_num: int | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self._server_num = server_num
        self._env = dict(os.environ if environ is None else environ)

    def _rank_and_size(self) -> tuple[int, int, str, str]:
        for rank_var, size_var in self._RANK_VARS:
            has_rank = env.read(rank_var, self._env) is not None
            has_size = env.read(size_var, self._env) is not None
            if has_rank != has_size:
                missing, present = (size_var, rank_var) if has_rank else (rank_var, size_var)
                raise ConfigError(f"{present} is set but {missing} is not: start the job "
                                  f"with {self._LAUNCHER}, which sets both")
            if has_rank:
                rank = int_var(self._env, rank_var, 0) or 0
                size = int_var(self._env, size_var, 1) or 1
                if rank >= size:
                    raise ConfigError(f"{rank_var}: {rank} must be < {size_var} ({size})")
                return rank, size, rank_var, size_var
        looked = ", ".join(f"{r}/{s}" for r, s in self._RANK_VARS)
        raise ConfigError(f"{type(self).__name__}: none of {looked} is set: start the job "
                          f"with {self._LAUNCHER}")

    def serves(self) -> bool:
        return self._rank_and_size()[0] < self._resolve_server_num()[0]

    def _resolve_server_num(self) -> tuple[int, str]:
        if self._server_num is not None:
            if isinstance(self._server_num, bool) or not isinstance(self._server_num, int):
                raise ConfigError(f"server_num: {self._server_num!r} is not an integer")
            if self._server_num < 1:
                raise ConfigError(f"server_num: {self._server_num} must be >= 1")
            return self._server_num, "server_num"
        num = int_var(self._env, "PSFLEET_SERVER_NUM", 1)
        if num is None:
            raise ConfigError(f"{type(self).__name__}: server_num is not given and "
                              "PSFLEET_SERVER_NUM is not set: say how many ranks are servers")
        return num, "PSFLEET_SERVER_NUM"

    @staticmethod
    def _check_size(size: int, size_var: str, server_num: int, num_var: str) -> None:
        if size <= server_num:
            raise ConfigError(f"{size_var} is {size} but {num_var} is {server_num}: no rank "
                              f"is left for a worker; start more than {server_num} processes "
                              "or lower server_num")

    def generate_role(self) -> RoleInfo:
        """Return the role of this rank.

        Raises:
            ConfigError: the rank variables are missing or malformed, server_num is
                missing or leaves no worker, or the server list does not have exactly
                server_num entries.
        """
        server_num, num_var = self._resolve_server_num()
        rank, size, rank_var, size_var = self._rank_and_size()
        self._check_size(size, size_var, server_num, num_var)
        endpoints, source = server_endpoints(self._env)
        if len(endpoints) != server_num:
            raise ConfigError(f"{source} lists {len(endpoints)} servers {list(endpoints)} but "
                              f"{num_var} is {server_num}: list one host:port per server rank")
        return _rank_role(rank, size, server_num, endpoints)


def _rank_role(rank: int, size: int, server_num: int, endpoints: tuple[str, ...],
               auth_token: str | None = None) -> RoleInfo:
    worker_num = size - server_num
    if rank < server_num:
        return RoleInfo(Role.SERVER, 0, worker_num, server_index=rank,
                        server_endpoints=endpoints, bind_endpoint=endpoints[rank],
                        auth_token=auth_token)
    return RoleInfo(Role.WORKER, rank - server_num, worker_num, server_endpoints=endpoints,
                    auth_token=auth_token)


class MPIRoleMaker(_RankRoleMaker):
    """The role from the MPI rank; the server list from the environment or over MPI.

    The rank and size are Open MPI's ``OMPI_COMM_WORLD_RANK`` / ``OMPI_COMM_WORLD_SIZE``,
    else MPICH's, Intel MPI's and other PMI launchers' ``PMI_RANK`` / ``PMI_SIZE``.
    Ranks ``0 .. server_num-1`` are servers (server index = rank), ranks
    ``server_num .. size-1`` workers (``worker_index = rank - server_num``,
    ``worker_num = size - server_num``). For one server and one worker per node, map
    ranks round-robin over the nodes (``mpirun --map-by node``).

    The server list:

    - set (``PADDLE_PSERVERS_IP_PORT_LIST``, or ``PADDLE_PSERVER_IPS`` +
      ``PADDLE_PSERVER_PORT``): each server binds its entry exactly as written; no MPI
      call is made.
    - unset: every rank takes part in one ``allgather`` over ``MPI.COMM_WORLD``
      (mpi4py, ``pip install 'psfleet[mpi]'``; imported only then). A server offers
      ``host:port`` and binds it: the host is ``POD_IP`` / ``PADDLE_CURRENT_IP``, else
      this node's address that other nodes reach (the route's source address; 127.0.0.1
      only on a node with no other); the port ``PADDLE_PORT``, else a free port the OS
      gives (a tiny race window remains until the server binds it, as for torchrun's
      free ``MASTER_PORT``). When ``PSFLEET_AUTH_TOKEN`` is unset, rank 0 generates the
      job's token and the exchange shares it (``RoleInfo.auth_token``; fleet uses it):
      a server on a non-loopback address serves only with one. MPI is initialized for
      the exchange and finalized right after, so that a failing rank cannot hang the
      job (``psfleet.fleet._mpi``). Every rank must see the same server count and
      server-list variables (pass them with ``mpirun -x``).

    Args:
        server_num: how many ranks are servers; ``PSFLEET_SERVER_NUM`` when None.
        environ: the environment to read; ``os.environ`` when None.
        allgather: the exchange's collective, ``allgather(value) -> every rank's value``
            in rank order; mpi4py's ``COMM_WORLD.allgather`` when None.
    """

    _RANK_VARS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"))
    _LAUNCHER = "mpirun (Open MPI, MPICH or Intel MPI)"

    def __init__(self, server_num: int | None = None,
                 environ: Mapping[str, str] | None = None,
                 allgather: _mpi.Allgather | None = None) -> None:
        super().__init__(server_num, environ)
        self._allgather = allgather

    def generate_role(self) -> RoleInfo:
        """Return the role of this rank (collective when the list is exchanged: blocks
        until every rank calls it).

        Raises:
            ConfigError: as :class:`SlurmRoleMaker`; with no server list: mpi4py is not
                installed, or the exchange failed (``psfleet.fleet._mpi.exchange``; every
                rank raises the same message, naming the rank at fault).
        """
        if server_endpoints(self._env)[0]:
            return super().generate_role()
        # Without the rank variables this is no mpirun job: raise before any MPI call.
        rank, size, _, size_var = self._rank_and_size()
        allgather = self._allgather or _mpi.default_allgather()
        # A rank whose own variables are wrong still takes part in the collective (the
        # others would wait for it forever); the exchange raises its problem everywhere.
        problem, server_num = None, 0
        try:
            server_num, num_var = self._resolve_server_num()
            self._check_size(size, size_var, server_num, num_var)
        except ConfigError as e:
            problem = str(e)
        endpoints, token = _mpi.exchange(rank, size, server_num, self._env, allgather, problem)
        return _rank_role(rank, size, server_num, endpoints, token)


class SlurmRoleMaker(_RankRoleMaker):
    """The role from the Slurm task: ``SLURM_PROCID`` / ``SLURM_NTASKS``.

    The same rule as :class:`MPIRoleMaker` with the task id as rank (``SLURM_LOCALID``
    does not matter).

    Args:
        server_num: how many tasks are servers; ``PSFLEET_SERVER_NUM`` when None.
        environ: the environment to read; ``os.environ`` when None.
    """

    _RANK_VARS = (("SLURM_PROCID", "SLURM_NTASKS"),)
    _LAUNCHER = "srun (one task per process, --ntasks set)"


def mpi_world_size(environ: Mapping[str, str] | None = None) -> int:
    """How many ranks ``mpirun`` started (``OMPI_COMM_WORLD_SIZE``, else ``PMI_SIZE``);
    0 when this process is no MPI rank.

    Raises:
        ConfigError: the variable is not a positive integer (names it).
    """
    e = os.environ if environ is None else environ
    for _, size_var in MPIRoleMaker._RANK_VARS:
        size = int_var(e, size_var, 1)
        if size is not None:
            return size
    return 0
