"""Worker-side engines that send gradients and receive parameters, one per mode."""

from psfleet.errors import ConfigError
from psfleet.ps.client import TableClient
from psfleet.ps.communicator.async_mode import AsyncCommunicator
from psfleet.ps.communicator.local_mode import LocalCommunicator
from psfleet.ps.communicator.types import AsyncConfig, Communicator, merge_sparse

__all__ = [
    "AsyncCommunicator",
    "AsyncConfig",
    "Communicator",
    "LocalCommunicator",
    "make_communicator",
    "merge_sparse",
]

_MODES = {"async": AsyncCommunicator, "local": LocalCommunicator}


def make_communicator(mode: str, client: TableClient, config: AsyncConfig) -> Communicator:
    """Build the communicator of ``mode`` (``async``; ``local`` for in-process tables).

    Raises:
        ConfigError: unknown mode (lists the known ones).
    """
    if mode == "async":
        return AsyncCommunicator(client, config)
    if mode == "local":
        return LocalCommunicator(client)
    raise ConfigError(f"mode: {mode!r} is not one of {', '.join(sorted(_MODES))}")
