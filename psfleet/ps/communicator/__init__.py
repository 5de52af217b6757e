"""Worker-side engines that send gradients and receive parameters, one per mode.

The names below are imported on first use (:mod:`psfleet._lazy`): a config check
that reads ``psfleet.ps.communicator.types`` does not import the engines and torch.
"""

from typing import TYPE_CHECKING

from psfleet._lazy import lazy_exports

if TYPE_CHECKING:
    from psfleet.ps.communicator.async_mode import AsyncCommunicator
    from psfleet.ps.communicator.collective_mode import CollectiveCommunicator
    from psfleet.ps.communicator.geo_mode import GeoCommunicator
    from psfleet.ps.communicator.global_batch_mode import GlobalBatchCommunicator
    from psfleet.ps.communicator.local_mode import LocalCommunicator
    from psfleet.ps.communicator.pass_mode import PassCommunicator
    from psfleet.ps.communicator.registry import COMMUNICATORS, make_communicator
    from psfleet.ps.communicator.sync_mode import SyncCommunicator
    from psfleet.ps.communicator.types import (
        GEO_STEP,
        AsyncConfig,
        Communicator,
        CommunicatorSettings,
        PassConfig,
    )
    from psfleet.ps.merge import merge_sparse

__all__ = [
    "GEO_STEP",
    "COMMUNICATORS",
    "AsyncCommunicator",
    "AsyncConfig",
    "CollectiveCommunicator",
    "Communicator",
    "CommunicatorSettings",
    "GeoCommunicator",
    "GlobalBatchCommunicator",
    "LocalCommunicator",
    "PassCommunicator",
    "PassConfig",
    "SyncCommunicator",
    "make_communicator",
    "merge_sparse",
]

__getattr__ = lazy_exports(__name__, {
    "AsyncCommunicator": "psfleet.ps.communicator.async_mode",
    "AsyncConfig": "psfleet.ps.communicator.types",
    "CollectiveCommunicator": "psfleet.ps.communicator.collective_mode",
    "Communicator": "psfleet.ps.communicator.types",
    "CommunicatorSettings": "psfleet.ps.communicator.types",
    "GEO_STEP": "psfleet.ps.communicator.types",
    "GeoCommunicator": "psfleet.ps.communicator.geo_mode",
    "GlobalBatchCommunicator": "psfleet.ps.communicator.global_batch_mode",
    "LocalCommunicator": "psfleet.ps.communicator.local_mode",
    "COMMUNICATORS": "psfleet.ps.communicator.registry",
    "PassCommunicator": "psfleet.ps.communicator.pass_mode",
    "PassConfig": "psfleet.ps.communicator.types",
    "SyncCommunicator": "psfleet.ps.communicator.sync_mode",
    "make_communicator": "psfleet.ps.communicator.registry",
    "merge_sparse": "psfleet.ps.merge",
})
