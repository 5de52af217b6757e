"""Run a parameter-server job on this host: servers first, then workers, then clean up.

:func:`launch_local` is the Python API (the YAML runner calls it); ``fleetrun`` parses
its flags into a :class:`~psfleet.launch.types.LaunchConfig` and calls :func:`run_job`.
The lifecycle, failure handling and exit codes are described in the manual,
:mod:`psfleet.launch.main`.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from psfleet.errors import ConfigError, LaunchError
from psfleet.fleet.server_wait import server_wait_timeout_s as resolve_server_wait
from psfleet.launch._signals import SignalCatcher
from psfleet.launch.cluster import JobLayout, plan_job
from psfleet.launch.console import ConsoleFilter
from psfleet.launch.endpoints import clean_endpoint_dir
from psfleet.launch.grow import clean_control_dir
from psfleet.launch.job import EXIT_FAILURE, Job
from psfleet.launch.restarts import RestartPolicy
from psfleet.launch.security import prepare_security
from psfleet.launch.types import LaunchConfig, ProcessSpec

__all__ = ["launch_local", "run_job", "run_workers", "EXIT_FAILURE"]

logger = logging.getLogger(__name__)


def launch_local(
    command: Sequence[str],
    server_num: int,
    worker_num: int,
    log_dir: Path,
    *,
    server_wait_timeout_s: float | None = None,
    stop_grace_s: float = 10.0,
    python_executable: str | None = None,
    tee_worker_0: bool = True,
    max_restarts: int = 0,
    tee_stream: BinaryIO | None = None,
    tls: str | None = None,
    storage_roots: Sequence[str | Path] = (),
    restart_policy: str = "process",
    checkpoint_dir: str | None = None,
    replication: int | None = None,
    shares: int | None = None,
) -> int:
    """Run ``server_num`` servers and ``worker_num`` workers on this host; return the exit code.

    Every child runs ``python_executable *command``. Blocks until the job ends and every
    child's process group is gone. Catches SIGINT / SIGTERM while it runs when called
    from the main thread (forwarding them to the children).

    Args:
        command: the argv after the interpreter, e.g. ``["train.py", "--epochs", "2"]``
            or ``["-m", "psfleet.cli.main", "train", "-m", "cfg.yaml"]``.
        server_num: number of servers, >= 0.
        worker_num: number of workers, >= 1.
        log_dir: directory for ``serverlog.N`` / ``workerlog.N``; created if missing.
        server_wait_timeout_s: bound on waiting for the servers' endpoints, seconds;
            None: ``PSFLEET_SERVER_WAIT_TIMEOUT_S`` (``fleet.server_wait``).
        stop_grace_s: time processes get to exit before they are killed.
        python_executable: interpreter of the children; ``sys.executable`` when None.
        tee_worker_0: also copy worker 0's output to this process's stdout.
        max_restarts: restarts allowed per server and per worker when it fails
            (``process``) or per job (``gang``) (:mod:`psfleet.launch.restarts`); 0:
            the first failure ends the job.
        tee_stream: where worker 0's output is copied; this process's stdout when
            None. A :class:`~psfleet.launch.console.ConsoleFilter` shows only what the
            console level asks for, and nothing once a signal stops the job.
        tls: ``"self-signed"``: every channel of the job is TLS with a pair made for
            it in ``log_dir/tls/``; None: the ``PSFLEET_TLS_*`` variables apply
            (``psfleet.launch.security``).
        storage_roots: folders (paths or fsspec URL prefixes) the servers' Save and
            Load may use besides the working folder and ``log_dir``, e.g. the job's
            model and checkpoint folders.
        restart_policy: what a failure restarts: ``"process"`` (the failed child;
            async and GEO jobs) or ``"gang"`` (every server and worker, from the
            newest complete checkpoint; sync jobs).
        checkpoint_dir: the job's checkpoint folder, named in the line of a ``gang``
            restart; None: ``PSFLEET_CHECKPOINT_DIR``.
        replication: servers holding each share (``LaunchConfig.replication``); None:
            ``PSFLEET_REPLICATION``.
        shares: shares of the tables (``LaunchConfig.shares``); None:
            ``PSFLEET_SHARES``.

    The job's servers need a token: ``PSFLEET_AUTH_TOKEN``, or one generated for the
    job and given to every child in its environment.

    Returns:
        0 when every worker exited 0; 1 when a child failed or a server never reported
        its endpoint (the root cause is logged); 128 + signum after SIGINT / SIGTERM.

    Raises:
        ConfigError: an argument is out of range, ``log_dir`` cannot be created,
            ``tls`` is not None or ``"self-signed"``, ``restart_policy`` is unknown, or
            ``PSFLEET_HEALTH_TIMEOUT_S`` is not in (0, 30].
        OSError: a child could not be started (after stopping the ones started).
    """
    config = LaunchConfig(
        command=tuple(command),
        server_num=server_num,
        worker_num=worker_num,
        log_dir=Path(log_dir),
        server_wait_timeout_s=resolve_server_wait(server_wait_timeout_s),
        stop_grace_s=stop_grace_s,
        tee_worker_0=tee_worker_0,
        python_executable=python_executable or sys.executable,
        replication=replication,
        shares=shares,
    )
    return run_job(config, tee_stream, max_restarts=max_restarts, tls=tls,
                   storage_roots=storage_roots, restart_policy=restart_policy,
                   checkpoint_dir=checkpoint_dir)


def run_job(config: LaunchConfig, tee_stream: BinaryIO | None = None,
            max_restarts: int = 0, *, tls: str | None = None,
            storage_roots: Sequence[str | Path] = (), restart_policy: str = "process",
            checkpoint_dir: str | None = None) -> int:
    """Run the job ``config`` describes; see :func:`launch_local` for the contract.

    Args:
        config: the validated launch configuration.
        tee_stream: where worker 0's output is copied; this process's stdout when None.
        max_restarts: restarts allowed per child (``fleetrun --max_restarts``).
        tls: ``fleetrun --tls`` (see :func:`launch_local`).
        storage_roots: extra Save/Load roots (see :func:`launch_local`).
        restart_policy: ``fleetrun --restart_policy`` (see :func:`launch_local`).
        checkpoint_dir: the job's checkpoint folder (see :func:`launch_local`).

    Raises:
        ConfigError: a bad value, or a job with processes on other nodes and no
            ``PSFLEET_AUTH_TOKEN`` (``psfleet.launch.security``); nothing is started.
    """
    policy = RestartPolicy(max_restarts, restart_policy)
    config = dataclasses.replace(config, log_dir=config.log_dir.resolve())
    layout = plan_job(config)
    log_dir = config.log_dir
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        if not layout.endpoints_known:
            clean_endpoint_dir(config.endpoint_dir)
        clean_control_dir(log_dir)
    except OSError as e:
        raise ConfigError(
            f"--log_dir: cannot create or clean {str(log_dir)!r} ({e}); give a writable directory"
        ) from e
    try:
        security = prepare_security(config, layout, tls=tls, storage_roots=storage_roots)
    except OSError as e:
        raise ConfigError(f"--log_dir: cannot write the job's token or TLS files to "
                          f"{str(log_dir)!r} ({e}); give a writable directory") from e
    if config.is_multi_node:
        logger.info(
            "this node (%s) runs %s of a job of %d server(s) and %d worker(s): "
            "--servers=%s --workers=%s",
            ",".join(layout.node_addresses),
            layout.describe_node(),
            len(layout.servers),
            len(layout.workers),
            ",".join(config.servers),
            ",".join(config.workers),
        )
    logger.info(
        "launching %d server(s) and %d worker(s) on %s: %s %s "
        "(log_dir=%s, server_wait_timeout_s=%s, stop_grace_s=%s)",
        len(layout.local_servers),
        len(layout.local_workers),
        ",".join(layout.node_addresses),
        config.python_executable,
        " ".join(config.command),
        log_dir,
        config.server_wait_timeout_s,
        config.stop_grace_s,
    )
    tee = config.tee_worker_0 and bool(layout.local_workers)
    logger.info(
        "logs: %s/serverlog.N and %s/workerlog.N%s",
        log_dir,
        log_dir,
        f"; worker {layout.local_workers[0]}'s output follows" if tee else "",
    )
    try:
        job = Job(config, layout, tee_stream, restart_policy=policy,
                  environ=security.child_environ(), checkpoint_dir=checkpoint_dir)
        return _run(job)
    finally:
        security.cleanup()


def run_workers(
    config: LaunchConfig,
    layout: JobLayout,
    make_spec: Callable[[int, bool], ProcessSpec],
    tee_stream: BinaryIO | None = None,
) -> int:
    """Start and supervise workers whose specs the caller builds (no servers).

    The same lifecycle, logs, failure summary and exit codes as :func:`run_job`;
    used by the collective launcher (:mod:`psfleet.launch.collective`).

    Args:
        config: the job (command, log_dir, stop_grace_s, tee_worker_0, ...).
        layout: the workers; those in ``layout.local_workers`` start, in order.
        make_spec: ``(global index, tee) -> ProcessSpec`` of one worker.
        tee_stream: where the first worker's output is copied; stdout when None.
    """
    return _run(Job(config, layout, tee_stream, make_spec))


def _run(job: Job) -> int:
    """Run ``job`` with signals caught; stop every child whatever happens.

    After SIGINT / SIGTERM a :class:`ConsoleFilter` tee is silenced before the
    children are signalled: what they print while stopping stays in their logs.
    """
    with SignalCatcher() as signals:
        try:
            return job.run(signals)
        except LaunchError as e:
            logger.error("fleetrun: %s", e)
            return EXIT_FAILURE
        finally:
            if signals.signum is not None and isinstance(job.tee_stream, ConsoleFilter):
                job.tee_stream.suppress()
            job.stop_all(signals)
