"""The dense table: this server's blocks of a model's dense parameters, flattened.

The values are one float32 vector with its rule state beside it; a push applies the
rule to the whole vector under one lock (dense updates are a few vector operations,
far cheaper than the message that carries them).
"""

from __future__ import annotations

import threading

import numpy as np

from psfleet.errors import InvalidRequestError, RemoteError, clip_text
from psfleet.ps.table.rules import make_rule
from psfleet.ps.types import DenseTableConfig

__all__ = ["DenseTable", "dc_asgd_compensate"]


def dc_asgd_compensate(grads: np.ndarray, current: np.ndarray, seen: np.ndarray,
                       lam: float) -> np.ndarray:
    """Delay-compensated gradient of DC-ASGD.

    Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay Compensation",
    ICML 2017, eq. 9 (DC-ASGD-c): a worker computed ``g`` at the values it pulled
    (``seen``), which the other workers have since moved to ``current``; the
    first-order correction with the diagonal outer-product approximation of the
    Hessian is ``g + lambda * g * g * (current - seen)``.

    Args:
        grads (float32[n]): the worker's gradient.
        current (float32[n]): the values now.
        seen (float32[n]): the values the worker computed ``grads`` at.
        lam: the variance-control parameter lambda (>= 0).

    Returns:
        float32[n], a new array.
    """
    return (grads + np.float32(lam) * grads * grads * (current - seen)).astype(np.float32)


class DenseTable:
    """A dense table on one server. Thread safe.

    Args:
        config: the table's size (floats on this server) and rule.
        init_values (float32[size]): initial values (copied).

    Raises:
        InvalidRequestError: ``init_values`` does not have ``config.size`` elements.
    """

    def __init__(self, config: DenseTableConfig, init_values: np.ndarray) -> None:
        if init_values.size != config.size:
            raise InvalidRequestError(
                f"dense table {clip_text(repr(config.name))}: {init_values.size} initial "
                f"values sent, "
                f"expected {config.size}"
            )
        self.config = config
        self._label = clip_text(repr(config.name))  # the name as error messages quote it
        self.rule = make_rule(config.rule)
        self._lock = threading.Lock()
        self._w = np.array(init_values, dtype=np.float32).reshape(1, -1)
        self._state = self.rule.init_state(1, config.size)
        self._seen: dict[int, np.ndarray] = {}  # DC-ASGD: values each worker last pulled

    def __len__(self) -> int:
        return self.config.size

    @property
    def memory_bytes(self) -> int:
        """Bytes of values and state."""
        return int(self._w.nbytes + self._state.nbytes)

    def pull(self, worker_index: int | None = None) -> np.ndarray:
        """A copy of the values, float32[size].

        With DC-ASGD on, the copy is also kept as what ``worker_index`` last saw.
        """
        with self._lock:
            values = self._w[0].copy()
            if self.config.dc_asgd_lambda > 0 and worker_index is not None:
                self._seen[worker_index] = values.copy()
            return values

    def _check(self, values: np.ndarray, what: str) -> None:
        if values.size != self.config.size:
            raise InvalidRequestError(f"dense table {self._label}: {values.size} {what} "
                              f"pushed, expected {self.config.size}")

    def push(self, grads: np.ndarray, worker_index: int | None = None) -> None:
        """Apply one rule step with ``grads`` (float32[size]).

        With DC-ASGD on (``dc_asgd_lambda`` > 0) and a known ``worker_index``, the
        gradient is first compensated for the worker's delay (:func:`dc_asgd_compensate`).

        Raises:
            InvalidRequestError: wrong number of gradients.
        """
        self._check(grads, "gradients")
        with self._lock:
            seen = self._seen.get(worker_index) if worker_index is not None else None
            if seen is not None:
                grads = dc_asgd_compensate(grads, self._w[0], seen,
                                           self.config.dc_asgd_lambda)
            self.rule.update(self._w, self._state, grads.reshape(1, -1))

    def assign(self, values: np.ndarray) -> None:
        """Set the values (float32[size]); rule state is kept (a GEO worker's copy)."""
        self._check(values, "values")
        with self._lock:
            self._w[0] = values

    def add(self, deltas: np.ndarray) -> None:
        """Add ``deltas`` (float32[size]) to the values; no rule (GEO mode)."""
        self._check(deltas, "deltas")
        with self._lock:
            self._w[0] += deltas

    def load(self, values: np.ndarray, state: np.ndarray) -> None:
        """Set values float32[size] and rule state float32[state_width(size)].

        Raises:
            RemoteError: a size differs from this table's.
        """
        self._check(values, "saved values")
        if state.size != self._state.shape[1]:
            raise RemoteError(f"dense table {self._label}: saved optimizer state has "
                              f"{state.size} floats, this rule needs {self._state.shape[1]}")
        with self._lock:
            self._w[0] = values
            self._state[0] = state

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of (values float32[size], state float32[state_width(size)])."""
        with self._lock:
            return self._w[0].copy(), self._state[0].copy()
