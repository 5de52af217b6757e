"""This process's role in a parameter-server job, and the server side of the fleet API.

:class:`ProcessRole` is what ``fleet.init`` decides (role, strategy, rpc settings) and
all a server needs (``init_server``, ``run_server``). It imports no torch: the YAML
runner's servers use it alone (``psfleet.rec.roles``), so a server process starts in
about a second and holds its tables without torch's memory.
:class:`~psfleet.fleet.fleet.Fleet` extends it with collective mode and the worker side.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from psfleet import env, logs
from psfleet.errors import ConfigError, FatalError
from psfleet.fleet.role_info import RoleInfo, RoleMaker, restart_num
from psfleet.fleet.role_maker import default_role_maker
from psfleet.fleet.strategy import DistributedStrategy
from psfleet.ps.replica.host import Layout
from psfleet.ps.server import run_server
from psfleet.replication import replication_from_env, shares_from_env
from psfleet.rpc import RpcConfig, parse_endpoint
from psfleet.types import Role

__all__ = ["ProcessRole"]

logger = logging.getLogger(__name__)


class ProcessRole:
    """Role, strategy and rpc settings of this process, and its server side."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._role: RoleInfo | None = None
        self.strategy = DistributedStrategy()
        self.rpc_config = RpcConfig()
        self._preload_dir: Path | None = None
        self._checkpoint_dir: str | None = None

    def _refuse_second_init(self) -> None:
        if self._role is not None:
            raise ConfigError("fleet.init() was already called in this process; call "
                              "fleet.reset() first to start another run")

    # -- role -------------------------------------------------------------------------
    def init(self, role_maker: RoleMaker | None = None,
             strategy: DistributedStrategy | None = None) -> None:
        """Decide this process's parameter-server role (from the environment by
        default).

        With no ``role_maker``, :func:`~psfleet.fleet.role_maker.default_role_maker`
        chooses: MPIRoleMaker inside an ``mpirun`` job (MPI rank variables set, no
        ``TRAINING_ROLE``), else PaddleCloudRoleMaker; the choice and why is logged
        (INFO). An MPIRoleMaker that exchanges the server list is collective: every
        rank must call init.

        Raises:
            ConfigError: called twice, or the environment is inconsistent (names the
                variable), or MPIRoleMaker could not exchange the server list (names
                the fix).
        """
        self._refuse_second_init()
        why = None
        if role_maker is None:
            role_maker, why = default_role_maker()
        self._role = role = role_maker.generate_role()
        self.strategy = strategy or self.strategy
        self.rpc_config = RpcConfig.from_env()
        if role.auth_token is not None and self.rpc_config.auth_token is None:
            # The token the MPI ranks shared: this process's calls carry it, and so do
            # those of code that builds its config from the environment (the runner's
            # readers) and of child processes, as fleetrun's children get theirs.
            self.rpc_config = dataclasses.replace(self.rpc_config, auth_token=role.auth_token)
            os.environ["PSFLEET_AUTH_TOKEN"] = role.auth_token
        logs.setup_logging()
        logs.set_role(f"server:{role.server_index}" if role.role is Role.SERVER
                      else f"worker:{role.worker_index}")
        if why is not None:
            logger.info("fleet.init: role maker %s (%s)", type(role_maker).__name__, why)
        # The effective settings, once, in the log (a console shows them with -v).
        where = (f"server {role.server_index}, binds {role.bind_endpoint}"
                 if role.role is Role.SERVER else f"worker {role.worker_index} of "
                 f"{role.worker_num}, servers {','.join(role.server_endpoints) or 'none'}")
        logger.info("fleet.init: %s; strategy %s", where, self.strategy.model_dump())

    @property
    def role(self) -> RoleInfo:
        """This process's role. Raises FatalError before :meth:`init`."""
        if self._role is None:
            raise FatalError("call fleet.init() first")
        return self._role

    def is_server(self) -> bool:
        return self.role.role is Role.SERVER

    def is_worker(self) -> bool:
        return self.role.role is Role.WORKER

    def is_first_worker(self) -> bool:
        return self.is_worker() and self.role.worker_index == 0

    def worker_index(self) -> int:
        return self.role.worker_index

    def worker_num(self) -> int:
        return self.role.worker_num

    def server_num(self) -> int:
        return len(self.role.server_endpoints)

    def server_endpoints(self) -> list[str]:
        return list(self.role.server_endpoints)

    # -- server -----------------------------------------------------------------------
    def init_server(self, dirname: str | None = None,
                    checkpoint_dir: str | None = None,
                    storage_roots: Sequence[str | Path] = ()) -> None:
        """Prepare the server. Tables are created by the workers at init_worker.

        Args:
            dirname: a save (``save_persistables``) to load every table from when the
                workers create it; this server keeps its share (any server count).
            checkpoint_dir: where the job's checkpoints are (``CheckpointConfig``;
                default ``PSFLEET_CHECKPOINT_DIR``). A server the launcher restarted
                (``PSFLEET_RESTART_NUM`` > 0) re-creates its tables from the newest
                complete checkpoint there before it listens. Its Save and Load may
                use this folder besides ``PSFLEET_STORAGE_ROOTS`` (docs/security.md).
            storage_roots: more folders (paths or fsspec URL prefixes) the workers'
                Save and Load may use on this server, e.g. the job's model folder
                (``save_persistables``); besides ``PSFLEET_STORAGE_ROOTS`` (default:
                the working folder) and ``checkpoint_dir``.

        Raises:
            ConfigError: this process is not a server, or ``dirname`` has no manifest.
        """
        if not self.is_server():
            raise ConfigError("init_server() called on a worker")
        if dirname is not None:
            if not (Path(dirname) / "manifest.json").is_file():
                raise ConfigError(f"init_server(dirname={dirname!r}): no manifest.json there; "
                                  "pass a folder written by fleet.save_persistables()")
            self._preload_dir = Path(dirname)
        self._checkpoint_dir = checkpoint_dir or env.read("PSFLEET_CHECKPOINT_DIR")
        # The workers' checkpoint and model Saves go there (psfleet.rpc.access).
        extra = [*map(str, storage_roots), *([str(self._checkpoint_dir)]
                                             if self._checkpoint_dir is not None else [])]
        if extra:
            self.rpc_config = self.rpc_config.with_storage_roots(*extra)

    def run_server(self) -> None:
        """Serve tables until a worker's stop_worker() (or SIGTERM). Blocks."""
        role = self.role
        if role.bind_endpoint is None:
            raise ConfigError("run_server() called on a worker")
        host, port = parse_endpoint(role.bind_endpoint, "POD_IP:PADDLE_PORT")
        recover = rejoin = None
        replication = replication_from_env(len(role.server_endpoints))
        shares = shares_from_env(len(role.server_endpoints), replication)
        layout = Layout(tuple(role.server_endpoints), role.server_index, replication, shares)
        if (restart_num() > 0 or layout.added) and replication > 1:
            # the others fill it, or it is added to the job (psfleet.ps.replica)
            if not role.server_endpoints:
                raise ConfigError("PADDLE_PSERVERS_IP_PORT_LIST: a server restarted in or "
                                  "added to a replicated job (PSFLEET_REPLICATION > 1) needs "
                                  "the job's servers' endpoints to join them")
            rejoin = (layout, restart_num())
        elif restart_num() > 0:
            if self._checkpoint_dir is None:
                logger.warning("restarted server without a checkpoint_dir: it starts with "
                               "no tables; workers' calls to it will fail")
            else:
                recover = (self._checkpoint_dir, role.server_index)
        # The job's worker count, when its environment gave it (fleetrun, slurm and k8s
        # set PADDLE_TRAINERS_NUM on servers): a request naming another is refused, so no
        # call can fix it for the job (a random Barrier fixed it at 255 once). Not given
        # (the seeds' variables default to 1): the first Barrier or sync push fixes it.
        run_server(host, port, self.rpc_config, role.endpoint_file, self._preload_dir,
                   recover, server_index=role.server_index, rejoin=rejoin,
                   replication=replication,
                   job_worker_num=role.worker_num if role.worker_num_given else None)
