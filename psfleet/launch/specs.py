"""The argv and environment of each child: what a server and a worker are told.

The variables follow the seeds (PaddlePaddle Fleet's ``PADDLE_*``) plus psfleet's own
(declared in :mod:`psfleet.env`); the full table is in the manual,
:mod:`psfleet.launch.main`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from psfleet.launch.types import LOCAL_HOST, LaunchConfig, ProcessSpec, Role

__all__ = ["JOB_VARIABLES", "server_spec", "worker_spec"]

#: Variables describing a job. Inherited values are dropped so a child never sees a
#: stale role from an enclosing job; the launcher sets the ones that apply.
JOB_VARIABLES: frozenset[str] = frozenset(
    (
        "TRAINING_ROLE", "PADDLE_TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST",
        "PADDLE_PSERVER_IPS", "PADDLE_PSERVER_PORT", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINERS",
        "PADDLE_TRAINER_ID", "PADDLE_TRAINER_IPS", "POD_IP", "PADDLE_CURRENT_IP", "PADDLE_PORT",
        "PSFLEET_SERVER_INDEX", "PSFLEET_ENDPOINT_FILE",
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    )
)  # fmt: skip


def _base_env(config: LaunchConfig, environ: Mapping[str, str] | None) -> dict[str, str]:
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k not in JOB_VARIABLES}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["POD_IP"] = LOCAL_HOST
    env["PADDLE_CURRENT_IP"] = LOCAL_HOST
    env["PADDLE_TRAINERS_NUM"] = str(config.worker_num)
    return env


def server_spec(
    config: LaunchConfig, index: int, environ: Mapping[str, str] | None = None
) -> ProcessSpec:
    """The spec of server ``index``: it binds port 0 and reports it in its endpoint file.

    Args:
        config: the job.
        index: server index, 0 .. server_num-1.
        environ: the environment to inherit; ``os.environ`` when None.
    """
    env = _base_env(config, environ)
    env.update(
        TRAINING_ROLE=Role.SERVER.paddle_name,
        PADDLE_TRAINING_ROLE=Role.SERVER.paddle_name,
        PADDLE_PORT="0",
        PSFLEET_SERVER_INDEX=str(index),
        PSFLEET_ENDPOINT_FILE=str(config.endpoint_file(index)),
    )
    return _spec(config, Role.SERVER, index, env, tee=False)


def worker_spec(
    config: LaunchConfig,
    index: int,
    endpoints: Sequence[str],
    environ: Mapping[str, str] | None = None,
) -> ProcessSpec:
    """The spec of worker ``index``; worker 0's output is teed if the config says so.

    Args:
        config: the job.
        index: worker index, 0 .. worker_num-1 (``PADDLE_TRAINER_ID``).
        endpoints: the servers' endpoints in server-index order (empty: no servers,
            and ``PADDLE_PSERVERS_IP_PORT_LIST`` is left unset).
        environ: the environment to inherit; ``os.environ`` when None.
    """
    env = _base_env(config, environ)
    env.update(
        TRAINING_ROLE=Role.WORKER.paddle_name,
        PADDLE_TRAINING_ROLE=Role.WORKER.paddle_name,
        PADDLE_TRAINER_ID=str(index),
    )
    if endpoints:
        env["PADDLE_PSERVERS_IP_PORT_LIST"] = ",".join(endpoints)
    return _spec(config, Role.WORKER, index, env, tee=index == 0 and config.tee_worker_0)


def _spec(
    config: LaunchConfig, role: Role, index: int, env: dict[str, str], *, tee: bool
) -> ProcessSpec:
    return ProcessSpec(
        role=role,
        index=index,
        argv=(config.python_executable, *config.command),
        env=env,
        log_path=config.log_file(role, index),
        tee=tee,
    )
