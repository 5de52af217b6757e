"""The job a cluster manager runs: a validated config and the command of its processes.

Every route (Kubernetes, Slurm) starts the same processes ``fleetrun`` starts on one
host: ``psfleet train -m CONFIG`` with the seeds' role variables
(:mod:`psfleet.launch.specs`). The config file is placed at ``<workdir>/config.yaml``
inside the container or on the nodes, so its relative paths (data, run folders,
checkpoints) mean the same there as beside the file on the user's machine: the
config is validated here with ``<workdir>`` as its folder, which is how the processes
will read it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from psfleet.errors import ConfigError
from psfleet.job.modes import mode_spec
from psfleet.rec.config import TrainConfig
from psfleet.rec.config_load import config_from_mapping, read_yaml

__all__ = ["DEFAULT_PORT", "CONFIG_NAME", "ClusterJob", "load_cluster_job"]

#: The servers' port when ``--port`` is not given (the seeds' examples use 6170).
DEFAULT_PORT = 6170
#: The file name of the config in the job's working directory.
CONFIG_NAME = "config.yaml"
#: A DNS-1035 label (RFC 1035): Kubernetes object and host names, Slurm job names.
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
#: The longest job name: ``<name>-server-<index>`` must stay a 63-character label.
MAX_NAME_LEN = 40


@dataclass(frozen=True)
class ClusterJob:
    """A parameter-server job as a cluster manager runs it.

    Attributes:
        name: the job's name (a DNS-1035 label of at most 40 characters); also the
            run folder's name (``runner.run_name``) unless the config names one.
        config: the config validated with ``workdir`` as its folder: its paths are
            the ones the processes use.
        config_text: the YAML file as written (what the processes read).
        overrides: ``-o section.key=value`` assignments every process is given.
        workdir: the processes' working directory, where ``config.yaml`` lies.
        port: the port every server binds (1..65535).
    """

    name: str
    config: TrainConfig
    config_text: str
    overrides: tuple[str, ...]
    workdir: str
    port: int = DEFAULT_PORT

    @property
    def server_num(self) -> int:
        """``cluster.server_num``."""
        return self.config.cluster.server_num

    @property
    def worker_num(self) -> int:
        """``cluster.worker_num``."""
        return self.config.cluster.worker_num

    @property
    def config_path(self) -> str:
        """Where the processes read the config: ``<workdir>/config.yaml``."""
        return str(PurePosixPath(self.workdir) / CONFIG_NAME)

    @property
    def run_name(self) -> str:
        """The run folder's name: the config's ``runner.run_name``, else the job name."""
        return self.config.runner.run_name or self.name

    def train_argv(self) -> list[str]:
        """The command of every server and worker (the role comes from the environment)."""
        argv = ["psfleet", "train", "-m", self.config_path]
        for assignment in (*self.overrides, f"runner.run_name={self.run_name}"):
            argv += ["-o", assignment]
        return argv

    @property
    def checkpoint_dir(self) -> str | None:
        """``runner.checkpoint.checkpoint_dir`` as the processes see it, or None."""
        checkpoint = self.config.runner.checkpoint
        return None if checkpoint is None else checkpoint.checkpoint_dir


def _check_name(name: str, flag: str) -> str:
    if len(name) > MAX_NAME_LEN or not _NAME.match(name):
        raise ConfigError(
            f"{flag}: {name!r} is not a job name: use lowercase letters, digits and '-', "
            f"starting with a letter, at most {MAX_NAME_LEN} characters (it names "
            "hosts and Kubernetes objects)")
    return name


def _default_name(config_file: Path) -> str:
    """A job name from the config's file name (``config_gpubox.yaml`` ->
    ``config-gpubox``), or its folder's when the file is plain ``config.yaml``
    (``ctr/config.yaml`` -> ``ctr``)."""
    stem = config_file.stem
    if stem.lower() == "config" and config_file.absolute().parent.name:
        stem = config_file.absolute().parent.name
    slug = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")
    slug = slug if slug[:1].isalpha() else f"psfleet-{slug}".rstrip("-")
    return slug[:MAX_NAME_LEN].rstrip("-")


def load_cluster_job(config_file: Path, overrides: Sequence[str] = (), *,
                     name: str | None = None, workdir: str,
                     port: int = DEFAULT_PORT, launcher: str = "this route") -> ClusterJob:
    """Read and check a config for a cluster job.

    Args:
        config_file: the YAML config (``-m``).
        overrides: ``section.key=value`` assignments (``-o``), given to every process.
        name: the job name (``--name``); from the config's file name when None.
        workdir: the processes' working directory, an absolute POSIX path.
        port: the servers' port.
        launcher: the route, for messages (``psfleet k8s render``).

    Raises:
        ConfigError: the config is invalid (as ``psfleet train`` says), its model is
            unknown or rejects the tables, its mode has no servers (collective, or
            ``cluster.server_num`` 0), ``cluster.tls: self-signed`` is set (a local
            job's certificate), ``cluster.replication`` above 1 (not on these routes
            yet), or the name, workdir or port is malformed; each message names the
            flag or key.
    """
    raw, _ = read_yaml(config_file)
    if not PurePosixPath(workdir).is_absolute():
        raise ConfigError(f"--workdir: {workdir!r} must be an absolute path (e.g. /workspace)")
    if isinstance(port, bool) or not 1 <= port <= 65535:
        raise ConfigError(f"--port: {port} must be in 1..65535")
    config = config_from_mapping(raw, Path(workdir), str(config_file), overrides)
    if not mode_spec(config.runner.sync_mode).servers:
        raise ConfigError(
            f"runner.sync_mode: collective has no servers; {launcher} renders parameter-"
            "server jobs. Run collective jobs with torchrun-based operators (Kubeflow "
            "PyTorchJob / TrainJob, srun torchrun): see docs/cluster.md")
    if config.cluster.server_num == 0:
        raise ConfigError(
            f"cluster.server_num: 0 trains in one process; {launcher} needs a job with "
            "servers: set cluster.server_num >= 1 (e.g. -o cluster.server_num=2)")
    if config.cluster.tls is not None:
        raise ConfigError(
            "cluster.tls: self-signed makes a certificate for a job on one host; on a "
            "cluster give every process your certificate with the PSFLEET_TLS_* "
            "variables (docs/security.md) and remove cluster.tls")
    if (config.cluster.replication or 1) > 1:
        raise ConfigError(
            f"cluster.replication: {config.cluster.replication}: {launcher} jobs keep one "
            "copy of each share in this release (a server the cluster restarts recovers "
            "from the newest checkpoint, runner.checkpoint); set cluster.replication: 1, or "
            "run the job with fleetrun or psfleet train, where a dead server's shares are "
            "served by their other copy (docs/fault-tolerance.md)")
    job_name = _check_name(name, "--name") if name is not None else _check_name(
        _default_name(config_file), f"--name (from {config_file.name})")
    from psfleet.rec.preflight import check_model  # builds the model: imports torch

    check_model(config)  # the data files are the cluster's: only the model is checked here
    return ClusterJob(job_name, config, config_file.read_text(), tuple(overrides),
                      workdir, port)
