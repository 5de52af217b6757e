"""The communicator contract: how a worker's gradients reach the tables.

A communicator sits between the training loop and a :class:`TableClient`. The loop
pushes each step's gradients (sparse rows and the flat dense gradient) and, after the
step, installs the freshest dense values the communicator has. When pushes are sent,
merged and how often dense values are refreshed is the mode's business: one class per
mode beside this file, chosen by name through :func:`make_communicator`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from psfleet.errors import ConfigError
from psfleet.ps.client import TableClient

__all__ = ["AsyncConfig", "Communicator", "merge_sparse"]


@dataclass(frozen=True)
class AsyncConfig:
    """Settings of the async communicator (Paddle's ``a_sync_configs``).

    Attributes:
        k_steps: dense values are pulled after every ``k_steps`` sends.
        send_queue_size: steps waiting to be sent before ``end_step`` blocks
            (back-pressure on a worker that outruns the servers; it bounds how stale
            the gradients the servers apply can be).
        max_merge_var_num: queued steps merged (summed) into one send at most.
    """

    k_steps: int = 1
    send_queue_size: int = 16
    max_merge_var_num: int = 16

    def __post_init__(self) -> None:
        for name in ("k_steps", "send_queue_size", "max_merge_var_num"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"strategy.a_sync_configs.{name}: {value!r} must be an "
                                  "integer >= 1")


class Communicator(ABC):
    """Sends a worker's gradients and brings back fresh parameters.

    Args:
        client: the tables (remote servers or in process).
    """

    def __init__(self, client: TableClient) -> None:
        self.client = client

    def start(self) -> None:
        """Start background work, if the mode has any."""

    def pull_sparse(self, table_id: int, keys: np.ndarray, create: bool = True) -> np.ndarray:
        """Rows of ``keys`` (uint64[N]) as float32[N, dim]; blocks until they arrive."""
        return self.client.pull_sparse(table_id, keys, create)

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


def merge_sparse(keys: list[np.ndarray], grads: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sum gradients of equal keys across pushes.

    Args:
        keys: uint64 arrays [N_i].
        grads: float32 arrays [N_i, dim], aligned with ``keys``.

    Returns:
        (uint64[U], float32[U, dim]): distinct keys (sorted) and their summed gradients.
    """
    if len(keys) == 1:
        return keys[0], grads[0]
    all_keys = np.concatenate(keys)
    all_grads = np.concatenate(grads)
    uniq, inverse = np.unique(all_keys, return_inverse=True)
    summed = np.zeros((uniq.size, all_grads.shape[1]), dtype=np.float32)
    # summed[inverse[i]] += all_grads[i], vectorised (numpy's add.at is far slower).
    torch.from_numpy(summed).index_add_(0, torch.from_numpy(inverse.astype(np.int64)),
                                        torch.from_numpy(all_grads))
    return uniq, summed
