"""The argv and environment of each child: what a server and a worker are told.

The variables follow the seeds (PaddlePaddle Fleet's ``PADDLE_*``) plus psfleet's own
(declared in :mod:`psfleet.env`); the full table is in the manual,
:mod:`psfleet.launch.main`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from psfleet.launch.cluster import JobLayout, plan_job
from psfleet.launch.types import LaunchConfig, ProcessSpec, Role

__all__ = ["JOB_VARIABLES", "server_spec", "worker_spec"]

#: Variables describing a job. Inherited values are dropped so a child never sees a
#: stale role from an enclosing job; the launcher sets the ones that apply.
JOB_VARIABLES: frozenset[str] = frozenset(
    (
        "TRAINING_ROLE", "PADDLE_TRAINING_ROLE", "PADDLE_PSERVERS_IP_PORT_LIST",
        "PADDLE_PSERVER_IPS", "PADDLE_PSERVER_PORT", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINERS",
        "PADDLE_TRAINER_ID", "PADDLE_TRAINER_IPS", "POD_IP", "PADDLE_CURRENT_IP", "PADDLE_PORT",
        "PSFLEET_SERVER_INDEX", "PSFLEET_ENDPOINT_FILE", "PSFLEET_RESTART_NUM",
        "PSFLEET_LAUNCHER_PID", "PSFLEET_DONE_FILE",
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    )
)  # fmt: skip


def _base_env(
    layout: JobLayout, host: str, environ: Mapping[str, str] | None, config: LaunchConfig
) -> dict[str, str]:
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if k not in JOB_VARIABLES}
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PSFLEET_REPLICATION"] = str(config.replication or 1)
    if config.shares:
        env["PSFLEET_SHARES"] = str(config.shares)
    env["POD_IP"] = host
    env["PADDLE_CURRENT_IP"] = host
    env["PADDLE_TRAINERS_NUM"] = str(len(layout.workers))
    env["PADDLE_TRAINER_IPS"] = ",".join(layout.worker_hosts)
    return env


def server_spec(
    config: LaunchConfig,
    index: int,
    environ: Mapping[str, str] | None = None,
    *,
    layout: JobLayout | None = None,
    added_to: Sequence[str] = (),
) -> ProcessSpec:
    """The spec of server ``index``.

    It binds ``POD_IP:PADDLE_PORT``. With port 0 (a one-host job without
    ``--start_port``) it reports the port it got in ``PSFLEET_ENDPOINT_FILE``;
    otherwise it is also told every server's endpoint.

    Args:
        config: the job.
        index: global server index.
        environ: the environment to inherit; ``os.environ`` when None.
        layout: the job's layout; :func:`plan_job` of ``config`` when None.
        added_to: the running job's servers' endpoints, for a server added to it
            (``index`` past them; ``psfleet grow``): it binds a free port on the first
            server's host and joins them.
    """
    layout = layout if layout is not None else plan_job(config)
    slot = layout.servers[0 if added_to else index]
    port = 0 if added_to else slot.port
    env = _base_env(layout, slot.host, environ, config)
    env.update(
        TRAINING_ROLE=Role.SERVER.paddle_name,
        PADDLE_TRAINING_ROLE=Role.SERVER.paddle_name,
        PADDLE_PORT=str(port),
        PSFLEET_SERVER_INDEX=str(index),
    )
    if port == 0:
        env["PSFLEET_ENDPOINT_FILE"] = str(config.endpoint_file(index))
    if added_to:
        env["PADDLE_PSERVERS_IP_PORT_LIST"] = ",".join(added_to)
    elif layout.endpoints_known:
        env["PADDLE_PSERVERS_IP_PORT_LIST"] = ",".join(layout.server_endpoints)
    return _spec(config, Role.SERVER, index, env, tee=False)


def worker_spec(
    config: LaunchConfig,
    index: int,
    endpoints: Sequence[str],
    environ: Mapping[str, str] | None = None,
    *,
    layout: JobLayout | None = None,
    tee: bool | None = None,
) -> ProcessSpec:
    """The spec of worker ``index``.

    Args:
        config: the job.
        index: global worker index (``PADDLE_TRAINER_ID``).
        endpoints: the servers' endpoints in server-index order (empty: no servers,
            and ``PADDLE_PSERVERS_IP_PORT_LIST`` is left unset).
        environ: the environment to inherit; ``os.environ`` when None.
        layout: the job's layout; :func:`plan_job` of ``config`` when None.
        tee: copy its output to the launcher's stdout; when None, for worker 0 if
            ``config.tee_worker_0``.
    """
    layout = layout if layout is not None else plan_job(config)
    env = _base_env(layout, layout.workers[index].host, environ, config)
    env.update(
        TRAINING_ROLE=Role.WORKER.paddle_name,
        PADDLE_TRAINING_ROLE=Role.WORKER.paddle_name,
        PADDLE_TRAINER_ID=str(index),
        PSFLEET_DONE_FILE=str(config.done_file(index)),
    )
    if endpoints:
        env["PADDLE_PSERVERS_IP_PORT_LIST"] = ",".join(endpoints)
    if layout.endpoints_known and layout.servers:
        # The launcher does not wait for servers whose ports are fixed (they may be on
        # other nodes): the workers wait, as long as --server_wait_timeout_s says.
        env.setdefault("PSFLEET_SERVER_WAIT_TIMEOUT_S", f"{config.server_wait_timeout_s:g}")
    if tee is None:
        tee = index == 0 and config.tee_worker_0
    return _spec(config, Role.WORKER, index, env, tee=tee)


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
