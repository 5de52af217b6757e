"""Collective mode: the torch.distributed process group and data-parallel helpers.

The names below are imported on first use (:mod:`psfleet._lazy`): a module that
reads one type (``psfleet.collective.types``, the strategy's backend choice) does not
import torch.
"""

from typing import TYPE_CHECKING

from psfleet._lazy import lazy_exports

if TYPE_CHECKING:
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

__getattr__ = lazy_exports(__name__, {
    "BACKENDS": "psfleet.collective.types",
    "Backend": "psfleet.collective.types",
    "BackendChoice": "psfleet.collective.types",
    "CollectiveContext": "psfleet.collective.types",
    "CollectiveHooks": "psfleet.collective.hooks",
    "ExampleCounter": "psfleet.collective.ddp",
    "JoinContext": "psfleet.collective.join",
    "RendezvousSpec": "psfleet.collective.types",
    "barrier": "psfleet.collective.process_group",
    "broadcast_from_rank0": "psfleet.collective.process_group",
    "choose_backend": "psfleet.collective.process_group",
    "destroy_process_group": "psfleet.collective.process_group",
    "init_process_group": "psfleet.collective.process_group",
    "rendezvous_from_env": "psfleet.collective.rendezvous",
    "weighted_allreduce_hook": "psfleet.collective.ddp",
    "wrap_model": "psfleet.collective.ddp",
})
