"""Collective mode: the torch.distributed process group and data-parallel helpers."""

from psfleet.collective.ddp import ExampleCounter, weighted_allreduce_hook, wrap_model
from psfleet.collective.hooks import CollectiveHooks
from psfleet.collective.join import JoinContext
from psfleet.collective.process_group import (
    barrier,
    broadcast_from_rank0,
    choose_backend,
    destroy_process_group,
    init_process_group,
)
from psfleet.collective.rendezvous import rendezvous_from_env
from psfleet.collective.types import (
    BACKENDS,
    Backend,
    BackendChoice,
    CollectiveContext,
    RendezvousSpec,
)

__all__ = [
    "BACKENDS",
    "BackendChoice",
    "Backend",
    "CollectiveContext",
    "CollectiveHooks",
    "ExampleCounter",
    "JoinContext",
    "RendezvousSpec",
    "barrier",
    "broadcast_from_rank0",
    "choose_backend",
    "destroy_process_group",
    "init_process_group",
    "rendezvous_from_env",
    "weighted_allreduce_hook",
    "wrap_model",
]
