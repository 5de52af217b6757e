"""This process's part of a YAML runner job: its role maker and strategy, and
:func:`run`, which serves or trains.

A server's part needs no torch (:class:`~psfleet.fleet.process_role.ProcessRole`):
:func:`run` decides the role from the environment before anything imports torch, so a
server process starts in about a second and holds only its tables; workers (and a
process training alone) import the trainer.
"""

from __future__ import annotations

import logging
from typing import Any

from psfleet.errors import ConfigError
from psfleet.fleet.process_role import ProcessRole
from psfleet.fleet.role_maker import (
    MPIRoleMaker,
    RoleMaker,
    default_role_maker,
    mpi_world_size,
)
from psfleet.job.modes import mode_spec
from psfleet.rec.config import TrainConfig, strategy_of

__all__ = ["role_maker_of", "run", "serve"]

logger = logging.getLogger(__name__)


def run(config: TrainConfig) -> dict[str, Any] | None:
    """Run this process's part of the job described by ``config``: a server serves
    until the workers stop it (:func:`serve`); a worker trains, and with no job
    environment the process trains alone against in-process tables
    (:func:`psfleet.rec.trainer.train`).

    Returns:
        On worker 0, the metrics written to ``<run folder>/metrics.json``;
        otherwise None.

    Raises:
        ConfigError, DataError: bad configuration, environment or data (names the
            field, variable or file).
        TrainingInterrupted: as :func:`psfleet.rec.trainer.train`.
    """
    role_maker = role_maker_of(config)
    if mode_spec(config.runner.sync_mode).servers and (
            role_maker or default_role_maker()[0]).serves():
        server = ProcessRole()
        server.init(role_maker, strategy_of(config))
        serve(config, server)
        return None
    from psfleet.rec.trainer import train  # torch: only a process that trains pays it

    return train(config, role_maker)


def serve(config: TrainConfig, server: ProcessRole) -> None:
    """Serve this server's share of the tables until a worker stops the job. No model
    or optimizer: the workers create the tables (``fleet.init_worker``). Saves and loads
    go to the checkpoint folder and this run's folders only. Blocks.

    Args:
        config: the checked runner config.
        server: this process's role, initialized (``ProcessRole.init``) as a server.
    """
    runner = config.runner
    checkpoint = runner.checkpoint
    server.init_server(checkpoint_dir=checkpoint.checkpoint_dir if checkpoint else None,
                       storage_roots=[str(runner.model_save_path), str(runner.model_dir)])
    server.run_server()


def role_maker_of(config: TrainConfig) -> RoleMaker | None:
    """This process's role maker under ``mpirun`` (from the rank, ``cluster.server_num``
    ranks serving); None otherwise: ``fleet.init`` then reads the role from the
    environment (fleetrun's or the seeds' variables, torchrun's in collective mode).

    Raises:
        ConfigError: under ``mpirun``, the rank count is not ``cluster.server_num +
            cluster.worker_num`` (names both keys and the count), or
            ``cluster.replication`` is above 1.
    """
    cluster = config.cluster
    if not mode_spec(config.runner.sync_mode).servers:
        return None
    role_maker, why = default_role_maker(server_num=cluster.server_num or None)
    if not isinstance(role_maker, MPIRoleMaker):
        return None
    logger.info("role maker %s (%s)", type(role_maker).__name__, why)
    ranks = mpi_world_size()
    if (cluster.replication or 1) > 1:
        raise ConfigError(
            f"cluster.replication: {cluster.replication} under mpirun: a rank that dies ends "
            "every rank, so a second copy of a share cannot keep the job going; set "
            "cluster.replication: 1, or run the job with fleetrun or psfleet train "
            "(docs/fault-tolerance.md)")
    if ranks != cluster.server_num + cluster.worker_num:
        raise ConfigError(
            f"mpirun started {ranks} ranks but cluster.server_num + cluster.worker_num is "
            f"{cluster.server_num} + {cluster.worker_num}: start that many (mpirun -np "
            f"{cluster.server_num + cluster.worker_num}) or override them (-o "
            "cluster.server_num=S -o cluster.worker_num=W)")
    return role_maker
