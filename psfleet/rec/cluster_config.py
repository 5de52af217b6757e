"""The runner's ``cluster`` section: how many servers and workers, and what each needs.

``resources`` is read by the cluster routes (``psfleet k8s render``, ``psfleet slurm
render``, :mod:`psfleet.cluster`); a local job ignores it.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from psfleet.replication import MAX_SHARES, check_replication, check_shares

__all__ = ["PodResources", "ClusterResources", "ClusterConfig"]

#: A Kubernetes CPU quantity: cores (``2``, ``0.5``) or millicores (``500m``).
_CPU = re.compile(r"^(\d+(\.\d+)?|\d+m)$")
#: A Kubernetes memory quantity: bytes with an optional binary or decimal suffix.
_MEMORY = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PodResources(_Section):
    """What one server or one worker process needs.

    Attributes:
        cpu: cores, as Kubernetes writes them (``"4"``, ``"0.5"``, ``"500m"``); the
            request and the limit. Slurm gets ``--cpus-per-task`` (rounded up).
        memory: bytes with a suffix (``"8Gi"``, ``"512Mi"``); the request and the
            limit. Slurm gets ``--mem-per-cpu`` (the memory over the task's CPUs).
        gpu: GPUs (``nvidia.com/gpu`` on Kubernetes, ``--gpus-per-task`` on Slurm).

    On Slurm every task gets the larger of the server's and the worker's request
    (:mod:`psfleet.cluster.sbatch_options`).
    """

    cpu: str | None = None
    memory: str | None = None
    gpu: int = Field(0, ge=0)

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: object) -> object:
        text = str(value) if isinstance(value, (int, float)) and not isinstance(
            value, bool) else value
        if isinstance(text, str) and not _CPU.match(text):
            raise ValueError(f"{text!r} is not a CPU quantity: cores (2, 0.5) or millicores "
                             "(500m)")
        return text

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: object) -> object:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if isinstance(text, str) and not _MEMORY.match(text):
            raise ValueError(f"{text!r} is not a memory quantity: bytes with a suffix, e.g. "
                             "8Gi, 512Mi")
        return text


class ClusterResources(_Section):
    """``cluster.resources``: ``server`` and ``worker``, each a :class:`PodResources`."""

    server: PodResources = PodResources()
    worker: PodResources = PodResources()


class ClusterConfig(_Section):
    """``cluster``: ``server_num`` 0 trains in one process; >= 1 starts a local job.

    ``server_wait_timeout_s``: how long workers (and the launcher) wait for the servers
    to be ready, seconds; unset: ``PSFLEET_SERVER_WAIT_TIMEOUT_S`` (default 300), as
    resolved by :func:`psfleet.fleet.server_wait.server_wait_timeout_s`.
    ``max_restarts``: restarts allowed per server and per worker that fails
    (``fleetrun --max_restarts``); useful with ``runner.checkpoint``.
    ``tls``: ``self-signed`` makes every channel of a local job TLS, with a certificate
    made for the job in its log folder (``fleetrun --tls self-signed``); unset: the
    ``PSFLEET_TLS_*`` variables decide (docs/security.md). Not used in one process.
    ``resources``: CPU, memory and GPUs per server and per worker, for the cluster
    routes (docs/cluster.md).
    ``replication``: servers holding each share of the tables (``fleetrun
    --replication``), at most ``server_num``; unset: ``PSFLEET_REPLICATION`` (default
    1). With 2 a dead server's shares are served by their other copies and the job
    goes on without waiting; with ``max_restarts`` the server is restarted and rejoins
    (docs/fault-tolerance.md).
    ``shares``: shares the tables are cut into (``fleetrun --shares``), at least
    ``server_num``; more needs ``replication`` >= 2, and lets ``psfleet grow`` add a
    server to the running job, which takes its part of them; unset: ``PSFLEET_SHARES``
    (default: one per server).
    """

    server_num: int = Field(0, ge=0, le=64)
    worker_num: int = Field(1, ge=1, le=64)
    server_wait_timeout_s: float | None = Field(None, gt=0)
    max_restarts: int = Field(0, ge=0)
    tls: Literal["self-signed"] | None = None
    resources: ClusterResources = ClusterResources()
    replication: int | None = Field(None, ge=1, le=64)
    shares: int | None = Field(None, ge=1, le=MAX_SHARES)

    @model_validator(mode="after")
    def _replication_fits(self) -> ClusterConfig:
        if self.replication is not None:
            check_replication(self.replication, max(self.server_num, 1), "cluster.replication")
        if self.shares is not None and self.server_num:
            # unset replication is PSFLEET_REPLICATION's, checked when the job starts
            check_shares(self.shares, self.server_num, self.replication or 2, "cluster.shares")
        return self
