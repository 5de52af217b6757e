"""Local mode: every push is applied before the step returns (one worker, no lag).

Used for single-process training against in-process tables (``server_num: 0``), the
reference the distributed modes are measured against.
"""

from __future__ import annotations

import numpy as np

from psfleet.ps.client import TableClient
from psfleet.ps.communicator.types import Communicator
from psfleet.ps.routing import RoutedKeys

__all__ = ["LocalCommunicator"]


class LocalCommunicator(Communicator):
    """Applies pushes synchronously; dense values are fresh after every push."""

    def __init__(self, client: TableClient) -> None:
        super().__init__(client)
        self._dirty: set[int] = set()

    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    grads: np.ndarray, shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> None:
        self.client.push_sparse(table_id, keys, grads, shows=shows, clicks=clicks)

    def push_dense(self, table_id: int, grads: np.ndarray) -> None:
        self.client.push_dense(table_id, grads)
        self._dirty.add(table_id)

    def fresh_dense(self, table_id: int) -> np.ndarray | None:
        if table_id not in self._dirty:
            return None
        self._dirty.discard(table_id)
        return self.client.pull_dense(table_id)

    def flush(self) -> None:
        """Nothing is pending: pushes were applied when made."""
