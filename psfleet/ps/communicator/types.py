"""The communicator contract: how a worker's gradients reach the tables.

A communicator sits between the training loop and a :class:`TableClient`. The loop
pushes each step's gradients (sparse rows and the flat dense gradient) and, after the
step, installs the freshest dense values the communicator has. When pushes are sent,
merged and how often dense values are refreshed is the mode's business: one class per
mode beside this file, chosen by name through :func:`make_communicator`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from psfleet.errors import ConfigError
from psfleet.ps.client import TableClient
from psfleet.ps.types import RuleConfig, SparseTableConfig

__all__ = ["AsyncConfig", "Communicator"]


@dataclass(frozen=True)
class AsyncConfig:
    """Settings of the async communicator (Paddle's ``a_sync_configs``).

    Attributes:
        k_steps: dense values are pulled after every ``k_steps`` sends.
        send_queue_size: steps waiting to be sent before ``end_step`` blocks
            (back-pressure on a worker that outruns the servers; it bounds how stale
            the gradients the servers apply can be).
        max_merge_var_num: queued steps merged (summed) into one send at most.
        thread_pool_size: send threads (each merges and sends on its own).
        send_wait_times: when fewer than ``max_merge_var_num`` steps are queued, a
            send thread waits up to this many 10 ms periods for more to merge
            (0: send at once).
    """

    k_steps: int = 1
    send_queue_size: int = 16
    max_merge_var_num: int = 16
    thread_pool_size: int = 1
    send_wait_times: int = 0

    def __post_init__(self) -> None:
        for name in ("k_steps", "send_queue_size", "max_merge_var_num", "thread_pool_size",
                     "send_wait_times"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "send_wait_times" else 1):
                raise ConfigError(f"strategy.a_sync_configs.{name}: {value!r} must be an "
                                  "integer >= 1 (send_wait_times >= 0)")


class Communicator(ABC):
    """Sends a worker's gradients and brings back fresh parameters.

    Args:
        client: the tables (remote servers or in process).
    """

    def __init__(self, client: TableClient) -> None:
        self.client = client

    def start(self) -> None:
        """Start background work, if the mode has any."""

    def on_sparse_table(self, table_id: int, config: SparseTableConfig) -> None:
        """Called once per sparse table after the servers created it."""

    def on_dense_table(self, table_id: int, rule: RuleConfig, values: np.ndarray) -> None:
        """Called once per dense table with its rule and starting values float32[n]."""

    #: Whether rows may be pulled ahead of the step that uses them (``prefetch``):
    #: only where a step's rows may be a step older than the last push (async).
    prefetches = False

    def pull_sparse(self, table_id: int, keys: np.ndarray, create: bool = True) -> np.ndarray:
        """Rows of ``keys`` (uint64[N]) as float32[N, dim]; blocks until they arrive."""
        return self.client.pull_sparse(table_id, keys, create)

    def start_pull_sparse(self, table_id: int, keys: np.ndarray,
                          create: bool = True) -> Callable[[], np.ndarray]:
        """Issue a pull now; calling the result waits for the rows (see ``prefetches``)."""
        return self.client.start_pull_sparse(table_id, keys, create)

    @abstractmethod
    def push_sparse(self, table_id: int, keys: np.ndarray, grads: np.ndarray) -> None:
        """Hand over gradients float32[N, dim] of distinct keys uint64[N].

        The arrays must not be modified afterwards (they may be sent later).
        """

    @abstractmethod
    def push_dense(self, table_id: int, grads: np.ndarray) -> None:
        """Hand over the flat dense gradient float32[total] of one step."""

    def end_step(self) -> None:
        """Close the step: the pushes since the last call form one training step."""

    @abstractmethod
    def fresh_dense(self, table_id: int) -> np.ndarray | None:
        """Dense values newer than the ones last returned, or None. Call once per step."""

    @abstractmethod
    def flush(self) -> None:
        """Block until every push handed over has been applied by the tables.

        Raises:
            RpcError, RemoteError: a send failed (also raised by later pushes).
        """

    def stop(self) -> None:
        """Flush and end background work. Idempotent."""
        self.flush()
