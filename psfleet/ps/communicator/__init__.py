"""Worker-side engines that send gradients and receive parameters, one per mode."""

from psfleet.ps.communicator.async_mode import AsyncCommunicator
from psfleet.ps.communicator.collective_mode import CollectiveCommunicator
from psfleet.ps.communicator.geo_mode import GeoCommunicator
from psfleet.ps.communicator.global_batch_mode import GlobalBatchCommunicator
from psfleet.ps.communicator.local_mode import LocalCommunicator
from psfleet.ps.communicator.pass_mode import PassCommunicator
from psfleet.ps.communicator.registry import MODES, CommunicatorSettings, make_communicator
from psfleet.ps.communicator.sync_mode import SyncCommunicator
from psfleet.ps.communicator.types import GEO_STEP, AsyncConfig, Communicator, PassConfig
from psfleet.ps.merge import merge_sparse

__all__ = [
    "GEO_STEP",
    "MODES",
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
