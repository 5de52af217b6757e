"""Sync-mode rounds on a server: wait for every worker's push of a step, apply once.

Each (table, step) is a round. Every worker contributes its payload; the last one to
arrive merges them and applies the update, then every contributor returns. A worker
that never comes makes the others fail after ``timeout_s`` with an error naming it,
instead of waiting forever.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from psfleet.errors import RemoteError
from psfleet.ps.coordination import describe_missing

__all__ = ["SyncRounds"]

P = TypeVar("P")


class _Round(Generic[P]):
    def __init__(self, worker_num: int) -> None:
        self.worker_num = worker_num
        self.payloads: dict[int, P] = {}
        self.done = False
        self.error: BaseException | None = None


class SyncRounds(Generic[P]):
    """Rounds keyed by (table id, step). Thread safe; contributors block.

    Args:
        timeout_s: how long a contributor waits for the other workers, seconds.
    """

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._rounds: dict[tuple[int, int], _Round[P]] = {}
        self._closed = False

    def close(self) -> None:
        """Fail every waiting contributor (the server is stopping). Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def contribute(self, table_id: int, step: int, worker_index: int, worker_num: int,
                   payload: P, apply: Callable[[list[P]], None]) -> None:
        """Add ``payload`` to the round; the last contributor calls ``apply(payloads)``.

        Blocks until the round is applied. ``payloads`` are ordered by worker index.

        Raises:
            RemoteError: the other workers did not arrive within the timeout (names
                them), a worker pushed twice, worker counts disagree, or ``apply``
                failed (every contributor gets the error).
        """
        key = (table_id, step)
        with self._cond:
            round_ = self._rounds.setdefault(key, _Round(worker_num))
            if round_.worker_num != worker_num:
                raise RemoteError(f"table {table_id} step {step}: worker {worker_index} says "
                                  f"worker_num={worker_num}, another said {round_.worker_num}")
            if worker_index in round_.payloads:
                raise RemoteError(f"table {table_id} step {step}: worker {worker_index} "
                                  "pushed twice in one sync step")
            round_.payloads[worker_index] = payload
            if len(round_.payloads) == worker_num:
                del self._rounds[key]
                try:
                    apply([round_.payloads[w] for w in sorted(round_.payloads)])
                except BaseException as exc:
                    round_.error = exc
                    raise
                finally:
                    round_.done = True
                    self._cond.notify_all()
                return
            if not self._cond.wait_for(lambda: round_.done or self._closed,
                                       timeout=self._timeout_s):
                missing = describe_missing(round_.payloads.keys(), worker_num)
                raise RemoteError(
                    f"sync step {step} of table {table_id}: workers {missing} did not push "
                    f"within {self._timeout_s:.0f} s; check their logs (workerlog.N). In sync "
                    "mode every worker must run the same number of steps")
            if not round_.done:
                raise RemoteError(f"sync step {step} of table {table_id}: the server is stopping")
            if round_.error is not None:
                raise RemoteError(f"sync step {step} of table {table_id} failed: "
                                  f"{round_.error}")
