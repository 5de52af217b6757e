"""Communicators registered by name: each mode's, and ``local`` (one worker on
in-process tables)."""

from __future__ import annotations

from collections.abc import Callable

from psfleet.errors import ConfigError
from psfleet.ps.client import TableClient
from psfleet.ps.communicator.async_mode import AsyncCommunicator
from psfleet.ps.communicator.collective_mode import CollectiveCommunicator
from psfleet.ps.communicator.geo_mode import GeoCommunicator
from psfleet.ps.communicator.global_batch_mode import GlobalBatchCommunicator
from psfleet.ps.communicator.local_mode import LocalCommunicator, simulated_staleness
from psfleet.ps.communicator.pass_mode import PassCommunicator
from psfleet.ps.communicator.sync_mode import SyncCommunicator
from psfleet.ps.communicator.types import Communicator, CommunicatorSettings

__all__ = ["make_communicator", "COMMUNICATORS"]


COMMUNICATORS: dict[str, Callable[[TableClient, CommunicatorSettings], Communicator]] = {
    "local": lambda client, settings: LocalCommunicator(client, simulated_staleness()),
    "async": lambda client, settings: (
        GlobalBatchCommunicator(client, settings.async_config, settings.worker_num)
        if settings.async_config.global_batch_aggregation
        else AsyncCommunicator(client, settings.async_config, settings.worker_num)),
    "sync": lambda client, settings: SyncCommunicator(client, settings.worker_num),
    "geo": lambda client, settings: GeoCommunicator(client, settings.geo_step,
                                                    settings.worker_num),
    "collective": lambda client, settings: CollectiveCommunicator(
        client, settings.example_count, settings.device),
    "gpubox": lambda client, settings: PassCommunicator(
        client, COMMUNICATORS[settings.pass_config.dense_mode](client, settings),
        settings.pass_config, settings.worker_num),
}



def make_communicator(mode: str, client: TableClient,
                      settings: CommunicatorSettings) -> Communicator:
    """Build the communicator of ``mode``: ``async``, ``sync``, ``geo``, ``gpubox``
    (pass mode, ``psfleet.ps.communicator.pass_mode``), ``local`` (one worker on
    in-process tables) or ``collective`` (every rank holds the tables).

    Raises:
        ConfigError: unknown mode (lists the known ones).
    """
    try:
        factory = COMMUNICATORS[mode]
    except KeyError:
        raise ConfigError(f"mode: {mode!r} is not one of "
                          f"{', '.join(sorted(COMMUNICATORS))}") from None
    return factory(client, settings)
