"""Local mode: every push is applied before the step returns (one worker, no lag).

Used for single-process training against in-process tables (``server_num: 0``), the
reference the distributed modes are measured against.

With a simulated staleness (``PSFLEET_SIMULATE_STALENESS=STEPS[:dense|:sparse]``)
every push (or only the dense or the sparse ones) is applied ``STEPS`` steps late, in
order: the next steps compute on values that miss the last ``STEPS`` steps, as an
async worker's do. One process then measures, deterministically, what that much
staleness costs a model (docs/modes.md), without a cluster and without the timing
noise of real async runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal

import numpy as np

from psfleet.env import read
from psfleet.errors import ConfigError
from psfleet.ps.client import TableClient
from psfleet.ps.communicator.types import Communicator
from psfleet.ps.routing import RoutedKeys

__all__ = ["LocalCommunicator", "Staleness", "simulated_staleness"]

Staleness = tuple[int, Literal["all", "dense", "sparse"]]


def simulated_staleness(value: str | None = None) -> Staleness:
    """``PSFLEET_SIMULATE_STALENESS`` (or ``value``) as (steps >= 0, which pushes).

    Raises:
        ConfigError: not ``STEPS``, ``STEPS:dense`` or ``STEPS:sparse`` (names the
            variable and the value).
    """
    text = read("PSFLEET_SIMULATE_STALENESS") if value is None else value
    if not text:
        return 0, "all"
    steps, colon, which = text.partition(":")
    if not steps.strip().isdigit() or (colon and which not in ("dense", "sparse")):
        raise ConfigError(f"PSFLEET_SIMULATE_STALENESS: {text!r} is not STEPS, STEPS:dense "
                          "or STEPS:sparse (STEPS an integer >= 0)")
    return int(steps), which or "all"  # type: ignore[return-value]


class LocalCommunicator(Communicator):
    """Applies pushes synchronously; dense values are fresh after every push.

    Args:
        client: the in-process tables.
        staleness: (steps, which pushes) to apply late (:func:`simulated_staleness`);
            (0, "all"): every push at once.
    """

    def __init__(self, client: TableClient, staleness: Staleness = (0, "all")) -> None:
        super().__init__(client)
        self._dirty: set[int] = set()
        self._delay, which = staleness
        self._late = {kind: self._delay > 0 and which in ("all", kind)
                      for kind in ("dense", "sparse")}
        self._late_now: list[Callable[[], None]] = []  # this step's late pushes
        self._late_steps: deque[list[Callable[[], None]]] = deque()  # earlier steps'

    def _push(self, kind: str, push: Callable[[], None]) -> None:
        if self._late[kind]:
            self._late_now.append(push)
        else:
            push()

    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    grads: np.ndarray, shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> None:
        self._push("sparse", lambda: self.client.push_sparse(table_id, keys, grads,
                                                             shows=shows, clicks=clicks))

    def push_dense(self, table_id: int, grads: np.ndarray) -> None:
        self._push("dense", lambda: self.client.push_dense(table_id, grads))
        self._dirty.add(table_id)

    def end_step(self) -> None:
        """Apply the pushes of the step ``staleness`` steps back (none without it)."""
        if self._delay:
            self._late_steps.append(self._late_now)
            self._late_now = []
            while len(self._late_steps) > self._delay:
                self._apply(self._late_steps.popleft())

    @staticmethod
    def _apply(pushes: list[Callable[[], None]]) -> None:
        for push in pushes:
            push()

    def fresh_dense(self, table_id: int) -> np.ndarray | None:
        if table_id not in self._dirty:
            return None
        self._dirty.discard(table_id)
        return self.client.pull_dense(table_id)

    def flush(self) -> None:
        """Apply every push still held back (simulated staleness); else nothing waits."""
        self._late_steps.append(self._late_now)
        self._late_now = []
        while self._late_steps:
            self._apply(self._late_steps.popleft())
