"""The arguments every cluster route takes: the config, its overrides and the job's
name, working directory and server port (``psfleet k8s``, ``psfleet slurm``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from psfleet.cluster.job import DEFAULT_PORT, MAX_NAME_LEN, ClusterJob, load_cluster_job

__all__ = ["add_job_arguments", "job_from_args"]


def add_job_arguments(parser: argparse.ArgumentParser, workdir: str | None,
                      workdir_default: str) -> None:
    """Add ``-m``, ``-o``, ``--name``, ``--workdir`` and ``--port`` to ``parser``.

    Args:
        workdir: ``--workdir``'s default value (None: the route works it out).
        workdir_default: what the help says the default is.
    """
    parser.add_argument("-m", "--config", required=True, type=Path, help="the YAML config")
    parser.add_argument("-o", "--override", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config value in every "
                        "process, e.g. -o cluster.worker_num=4")
    parser.add_argument("--name", help="the job's name: lowercase letters, digits and '-', "
                        f"at most {MAX_NAME_LEN} characters (default: from the config's "
                        "file name); it names the run folder unless the config sets "
                        "runner.run_name")
    parser.add_argument("--workdir", default=workdir,
                        help="the processes' working directory, where config.yaml is put; "
                        "the config's relative paths are relative to it (default "
                        f"{workdir_default})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"the servers' port (default {DEFAULT_PORT}); where servers "
                        "share a host (Slurm), server i takes PORT+i")


def job_from_args(args: argparse.Namespace, launcher: str) -> ClusterJob:
    """The job the arguments describe. Raises ConfigError naming the flag or key."""
    return load_cluster_job(args.config, args.override, name=args.name,
                            workdir=args.workdir, port=args.port, launcher=launcher)
