"""Vocabulary of collective mode: where the ranks meet, and what a rank is.

:class:`RendezvousSpec` is what the environment says (torchrun's or the seeds'
variables, see :mod:`psfleet.collective.rendezvous`); :class:`CollectiveContext` is
the process group this rank joined (:func:`psfleet.collective.init_process_group`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["BACKENDS", "Backend", "BackendChoice", "RendezvousSpec", "CollectiveContext"]

Backend = Literal["gloo", "nccl"]

#: Backends psfleet starts (``auto`` picks one of them by device).
BackendChoice = Literal["auto", "gloo", "nccl"]
BACKENDS: tuple[str, ...] = get_args(BackendChoice)


@dataclass(frozen=True)
class RendezvousSpec:
    """Where and as whom this process joins the job's process group.

    Attributes:
        rank: this process's rank, ``0 <= rank < world_size``.
        world_size: number of ranks.
        local_rank: rank on this node (chooses the GPU), ``>= 0``.
        master_addr: host of the rendezvous store (None: a one-rank job without one).
        master_port: its port, 1..65535 (0 with ``master_addr`` None).
        agent_store: the launcher hosts the store (torchrun, fleetrun): every rank,
            rank 0 too, connects to it as a client.
        restart_count: the launcher's attempt number (prefix of a hosted store's keys).
        source: the variables the rank and world size came from, for messages.
    """

    rank: int
    world_size: int
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int = 0
    agent_store: bool = False
    restart_count: int = 0
    source: str = "defaults"

    @property
    def master_endpoint(self) -> str:
        """``MASTER_ADDR:MASTER_PORT`` (``[v6]:port`` for an IPv6 literal)."""
        host = self.master_addr or "?"
        return f"[{host}]:{self.master_port}" if ":" in host else f"{host}:{self.master_port}"


@dataclass(frozen=True)
class CollectiveContext:
    """The process group this rank joined.

    Attributes:
        rank, world_size, local_rank: as in :class:`RendezvousSpec`.
        backend: ``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors).
        device: where this rank's collective tensors live: ``cpu`` or ``cuda:N``.
    """

    rank: int
    world_size: int
    local_rank: int
    backend: Backend
    device: str
