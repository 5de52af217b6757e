"""The dense table: this server's blocks of a model's dense parameters, flattened.

The values are one float32 vector with its rule state beside it; a push applies the
rule to the whole vector under one lock (dense updates are a few vector operations,
far cheaper than the message that carries them).
"""

from __future__ import annotations

import threading

import numpy as np

from psfleet.errors import RemoteError
from psfleet.ps.rules import make_rule
from psfleet.ps.types import DenseTableConfig

__all__ = ["DenseTable"]


class DenseTable:
    """A dense table on one server. Thread safe.

    Args:
        config: the table's size (floats on this server) and rule.
        init_values (float32[size]): initial values (copied).

    Raises:
        RemoteError: ``init_values`` does not have ``config.size`` elements.
    """

    def __init__(self, config: DenseTableConfig, init_values: np.ndarray) -> None:
        if init_values.size != config.size:
            raise RemoteError(
                f"dense table {config.name!r}: {init_values.size} initial values sent, "
                f"expected {config.size}"
            )
        self.config = config
        self.rule = make_rule(config.rule)
        self._lock = threading.Lock()
        self._w = np.array(init_values, dtype=np.float32).reshape(1, -1)
        self._state = self.rule.init_state(1, config.size)

    def __len__(self) -> int:
        return self.config.size

    @property
    def memory_bytes(self) -> int:
        """Bytes of values and state."""
        return int(self._w.nbytes + self._state.nbytes)

    def pull(self) -> np.ndarray:
        """A copy of the values, float32[size]."""
        with self._lock:
            return self._w[0].copy()

    def push(self, grads: np.ndarray) -> None:
        """Apply one rule step with ``grads`` (float32[size]).

        Raises:
            RemoteError: wrong number of gradients.
        """
        if grads.size != self.config.size:
            raise RemoteError(
                f"dense table {self.config.name!r}: {grads.size} gradients pushed, "
                f"expected {self.config.size}"
            )
        with self._lock:
            self.rule.update(self._w, self._state, grads.reshape(1, -1))

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of (values float32[size], state float32[state_width(size)])."""
        with self._lock:
            return self._w[0].copy(), self._state[0].copy()
