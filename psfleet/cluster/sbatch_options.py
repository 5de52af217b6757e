"""The ``#SBATCH`` options of a job's script: ``psfleet slurm render``'s flags and the
config's ``cluster.resources``, checked (:mod:`psfleet.cluster.slurm` renders the rest).

Resources: every task of the job's one step gets the larger of the server's and the
worker's request: ``--cpus-per-task`` = the CPUs rounded up, ``--mem-per-cpu`` = the
memory over those CPUs (MiB, rounded up), ``--gpus-per-task`` = the GPUs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from psfleet.cluster.job import ClusterJob
from psfleet.errors import ConfigError
from psfleet.rec.cluster_config import PodResources

__all__ = ["SlurmOptions", "parse_time", "sbatch_directives", "task_resources"]

#: A Slurm partition, account or QOS name (a partition may be a comma list).
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+@-]*(,[A-Za-z0-9_][A-Za-z0-9_.+@-]*)*$")
#: Slurm's time limit forms (sbatch --time), each as a regex of its fields.
_TIME_FORMS = (
    re.compile(r"^(?P<m>\d+)$"),
    re.compile(r"^(?P<m>\d+):(?P<s>\d{1,2})$"),
    re.compile(r"^(?P<h>\d+):(?P<m>\d{1,2}):(?P<s>\d{1,2})$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2})$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2}):(?P<m>\d{1,2})$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2}):(?P<m>\d{1,2}):(?P<s>\d{1,2})$"),
)
_TIME_HELP = ("minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED, with "
              "minutes and seconds below 60 after the first field")
#: sbatch options ``--sbatch`` may not set, and what sets them instead.
_RESERVED = {
    "job-name": "--name", "ntasks": "cluster.server_num + cluster.worker_num",
    "nodes": "--nodes", "partition": "--partition", "time": "--time",
    "account": "--account", "cpus-per-task": "cluster.resources",
    "mem": "cluster.resources", "mem-per-cpu": "cluster.resources",
    "gpus-per-task": "cluster.resources", "chdir": "--workdir (the script cds there)",
}
_SHORT = {"J": "job-name", "n": "ntasks", "N": "nodes", "p": "partition", "t": "time",
          "A": "account", "c": "cpus-per-task", "D": "chdir", "o": "output", "e": "error"}
_MIB = 1 << 20
_MEMORY_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                 "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


@dataclass(frozen=True)
class SlurmOptions:
    """Where and how long the job runs (``#SBATCH`` lines).

    Attributes:
        partition: ``--partition`` (None: the cluster's default).
        time: ``--time``, checked by :func:`parse_time` (None: the partition's default).
        nodes: ``--nodes``, 1 .. the job's task count (None: as Slurm chooses).
        account: ``--account`` (None: the user's default).
        setup: shell lines run in the batch script before the step, e.g. ``module load
            python`` or ``source ~/venv/bin/activate``; the tasks inherit the
            environment they leave (``psfleet`` must be on the PATH).
        sbatch: more sbatch options, one each, e.g. ``--qos=high``; an ``--output`` or
            ``--error`` replaces the default batch output.
    """

    partition: str | None = None
    time: str | None = None
    nodes: int | None = None
    account: str | None = None
    setup: tuple[str, ...] = field(default=())
    sbatch: tuple[str, ...] = field(default=())


def parse_time(text: str) -> str:
    """Check a Slurm time limit (sbatch ``--time``); returns it as given.

    Raises:
        ConfigError: not one of Slurm's forms (see :data:`_TIME_HELP`), or zero; names
            ``--time`` and the value.
    """
    if text.strip().upper() in ("UNLIMITED", "INFINITE"):
        return text.strip()
    for form in _TIME_FORMS:
        match = form.match(text)
        if match is None:
            continue
        fields = {k: int(v) for k, v in match.groupdict().items() if v is not None}
        first = next(k for k in "dhms" if k in fields)
        limits = {"h": 24 if "d" in fields else None, "m": 60, "s": 60}
        for key, limit in limits.items():
            if key != first and key in fields and limit is not None and fields[key] >= limit:
                unit = {"h": "hours", "m": "minutes", "s": "seconds"}[key]
                raise ConfigError(f"--time: {text!r}: {unit} {fields[key]} must be below "
                                  f"{limit} ({_TIME_HELP})")
        if not any(fields.values()):
            raise ConfigError(f"--time: {text!r} is zero; give a positive time limit "
                              f"({_TIME_HELP})")
        return text
    raise ConfigError(f"--time: {text!r} is not a Slurm time limit: {_TIME_HELP}")


def _option_name(option: str) -> str:
    """``--qos=high`` -> ``qos``; ``-p x`` / ``-px`` -> ``partition``."""
    if option.startswith("--"):
        return option[2:].split("=", 1)[0].split(None, 1)[0]
    return _SHORT.get(option[1:2], option[1:2])


def _check_options(job: ClusterJob, options: SlurmOptions) -> None:
    tasks = job.server_num + job.worker_num
    if options.nodes is not None and (isinstance(options.nodes, bool)
                                      or not 1 <= options.nodes <= tasks):
        raise ConfigError(
            f"--nodes: {options.nodes} must be in 1..{tasks}: the job has {tasks} tasks "
            f"({job.server_num} servers + {job.worker_num} workers), one process each")
    for flag, value in (("--partition", options.partition), ("--account", options.account)):
        if value is not None and not _SLURM_NAME.match(value):
            raise ConfigError(f"{flag}: {value!r} is not a Slurm name: letters, digits, "
                              "'_', '.', '+', '@', '-' (a partition may be a comma list)")
    if options.time is not None:
        parse_time(options.time)
    for line in options.setup:
        if "\n" in line or "\r" in line or not line.strip():
            raise ConfigError(f"--setup: {line!r} must be one non-empty shell line; give "
                              "--setup once per line")
    for option in options.sbatch:
        if not option.startswith("-") or option.strip("-") == "" or any(
                c in option for c in "\n\r"):
            raise ConfigError(f"--sbatch: {option!r} is not one sbatch option (e.g. "
                              "--sbatch=--qos=high)")
        name = _option_name(option)
        if name in _RESERVED:
            raise ConfigError(f"--sbatch: {option!r} sets {name}, which "
                              f"{_RESERVED[name]} sets; use that instead")


def _cpus(quantity: str | None) -> float:
    if quantity is None:
        return 0.0
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def _bytes(quantity: str | None) -> float:
    if quantity is None:
        return 0.0
    match = re.match(r"^(\d+(?:\.\d+)?)([A-Za-z]*)$", quantity)
    if match is None or match.group(2) not in _MEMORY_UNITS:  # validated on load
        raise ConfigError(f"cluster.resources: {quantity!r} is not a memory quantity")
    return float(match.group(1)) * _MEMORY_UNITS[match.group(2)]


def task_resources(server: PodResources, worker: PodResources) -> list[str]:
    """The per-task sbatch options of ``cluster.resources`` (see the module doc):
    ``--cpus-per-task``, ``--mem-per-cpu`` (MiB), ``--gpus-per-task``, each only when
    either role sets it."""
    cpus = max(_cpus(server.cpu), _cpus(worker.cpu))
    memory = max(_bytes(server.memory), _bytes(worker.memory))
    gpus = max(server.gpu, worker.gpu)
    per_task = max(1, math.ceil(cpus))
    out = [f"--cpus-per-task={per_task}"] if cpus else []
    if memory:
        out.append(f"--mem-per-cpu={max(1, math.ceil(memory / per_task / _MIB))}M")
    if gpus:
        out.append(f"--gpus-per-task={gpus}")
    return out


def sbatch_directives(job: ClusterJob, options: SlurmOptions) -> list[str]:
    """The script's ``#SBATCH`` options, in order.

    Raises:
        ConfigError: a malformed or out-of-range option, or an ``--sbatch`` option that
            a flag or the config sets (named).
    """
    _check_options(job, options)
    resources = job.config.cluster.resources
    out = [f"--job-name={job.name}", f"--ntasks={job.server_num + job.worker_num}"]
    if not any(_option_name(o) in ("output", "error") for o in options.sbatch):
        out.append(f"--output={job.name}-%j.out")
    for flag, value in (("--nodes", options.nodes), ("--partition", options.partition),
                        ("--time", options.time), ("--account", options.account)):
        if value is not None:
            out.append(f"{flag}={value}")
    out += task_resources(resources.server, resources.worker)
    out += options.sbatch
    return out
