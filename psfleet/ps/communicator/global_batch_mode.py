"""Async mode with global batch aggregation (GBA, ``a_sync_configs.global_batch_aggregation``).

The worker runs as in async mode (a send thread, merged steps, dense values pulled
every ``k_steps`` sends, no wait for other workers), but its pushes are AGGREGATE
pushes: each server gathers ``worker_num`` batches from whichever workers push and
applies their mean once (``psfleet.ps.global_batch``), so the tables take sync mode's
steps of one global batch while no worker waits for another (Su et al. 2022, "GBA: A
Tuning-free Approach to Switch between Synchronous and Asynchronous Training for
Recommendation Models", NeurIPS). A flush (end of an epoch, a save, ``stop``) also
makes the servers apply the partial global batch they hold, so no gradient this
worker pushed stays unapplied.

The worker's own dense steps (``local_dense_update``) and the momentum correction
apply as in async mode (measured to help here too; docs/modes.md). A global batch a
send completes may be applied after the dense pull that follows it, so a worker's
own steps may be missing from values counted as holding them (``fresh_dense_lag``
undercounts): the local update then keeps less of its own movement, never twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from psfleet.ps.client import TableClient
from psfleet.ps.communicator.async_mode import AsyncCommunicator
from psfleet.ps.communicator.types import AsyncConfig
from psfleet.ps.types import PushMode, RuleConfig, SparseTableConfig

__all__ = ["GlobalBatchCommunicator"]


class GlobalBatchCommunicator(AsyncCommunicator):
    """The async communicator whose pushes the servers gather into global batches.

    Args:
        client: the tables.
        config: the async settings (``max_staleness``: global batches of staleness
            past which the servers decay a push).
        worker_num: the job's workers: the batches of one global batch.
    """

    def __init__(self, client: TableClient, config: AsyncConfig, worker_num: int) -> None:
        super().__init__(client, config, worker_num)
        self._table_ids: list[int] = []

    def on_sparse_table(self, table_id: int, config: SparseTableConfig) -> None:
        self._table_ids.append(table_id)

    def on_dense_table(self, table_id: int, rule: RuleConfig, values: np.ndarray) -> None:
        self._table_ids.append(table_id)

    def _push_options(self, steps: int) -> dict[str, Any]:
        return {"mode": PushMode.AGGREGATE, "worker_num": self.worker_num, "batches": steps,
                "max_staleness": self.config.max_staleness}

    def flush(self) -> None:
        """Send every step queued, then have the servers apply their partial global
        batches. Blocks.

        Raises:
            RpcError, RemoteError: a send failed.
        """
        super().flush()
        if self._threads and self._table_ids:
            self.client.start_apply_global_batches(self._table_ids, self.worker_num).result()
