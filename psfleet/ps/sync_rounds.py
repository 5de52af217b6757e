"""Sync-mode rounds on a server: wait for every worker's push of a step, apply once.

Each (table, step) is a round. Every worker contributes its payload; the last one to
arrive merges them and applies the update. Waiting is a long poll
(``psfleet.ps.wait_budget``): a contribution waits at most ``max_wait_s`` and answers
"pending" otherwise, and the worker then polls (:meth:`SyncRounds.poll`) until the
round is applied, so no handler thread stays blocked for long whatever the worker
count. A worker that never comes makes the others fail after ``timeout_s`` with an
error naming it, instead of waiting forever.

Membership is by (worker index, incarnation) as at barriers
(``psfleet.ps.coordination.Barrier``): a restarted worker's push of a step replaces
its dead predecessor's, whose calls are then refused; a round its predecessor
completed without being told counts as done for it (its gradient of the step is in),
while a step its predecessor was told of is a new round (a job restarted from an
older checkpoint runs its steps again). A contribution is named by its push id, so a
retried push (its reply lost) is the same contribution, not a second one.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from psfleet.errors import RemoteError
from psfleet.ps.coordination import describe_missing
from psfleet.ps.wait_budget import WaitBudget

__all__ = ["SyncRounds"]

P = TypeVar("P")

#: Applied rounds remembered so that a late poll or retry of them answers done.
_KEEP_FINISHED = 4096


class _Round(Generic[P]):
    def __init__(self, worker_num: int) -> None:
        self.worker_num = worker_num
        self.payloads: dict[int, P] = {}
        self.incarnations: dict[int, int] = {}
        self.idents: dict[int, Hashable] = {}  # worker -> its push id
        self.started_s: dict[int, float] = {}
        self.told: set[int] = set()  # workers answered "applied"
        self.done = False
        self.error: BaseException | None = None


class SyncRounds(Generic[P]):
    """Rounds keyed by (table id, step). Thread safe; a call waits at most the
    budget's ``max_wait_s``.

    Args:
        timeout_s: how long a contribution waits for the other workers, seconds.
        budget: how many calls may wait at once, and how long.
    """

    def __init__(self, timeout_s: float, budget: WaitBudget | None = None) -> None:
        self._timeout_s = timeout_s
        self._budget = budget or WaitBudget()
        self._cond = threading.Condition()
        self._rounds: dict[tuple[int, int], _Round[P]] = {}
        self._finished: OrderedDict[tuple[int, int], _Round[P]] = OrderedDict()
        self._closed = False

    @property
    def used(self) -> bool:
        """Whether any round was contributed to."""
        with self._cond:
            return bool(self._rounds or self._finished)

    def close(self) -> None:
        """Fail every waiting contributor (the server is stopping). Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def contribute(self, table_id: int, step: int, worker_index: int, worker_num: int,
                   payload: P, apply: Callable[[list[P]], None], incarnation: int = 0,
                   ident: Hashable = None) -> bool:
        """Add ``payload`` to the round; the last contributor calls ``apply(payloads)``
        (``payloads`` ordered by worker index). Waits at most the budget's wait.

        Args:
            incarnation: the worker's restart number; a newer one's payload replaces
                an older one's.
            ident: names this contribution (the push id): the same ident again is a
                retry (its payload is ignored), another ident of the same worker
                and incarnation is a second push of the step (an error).

        Returns:
            True when the round was applied; False: :meth:`poll` until it is.

        Raises:
            RemoteError: a worker pushed twice, worker counts disagree, a newer
                incarnation of this worker pushed since, the server is stopping,
                or ``apply`` failed (every contributor gets the error).
        """
        key = (table_id, step)
        with self._cond:
            if self._closed:
                raise RemoteError(f"sync step {step} of table {table_id}: the server is "
                                  "stopping")
            finished = self._finished.get(key)
            if finished is not None and worker_index in finished.incarnations:
                self._check_current(finished, key, worker_index, incarnation, ident,
                                    replace_ok=True)
                if (incarnation == finished.incarnations[worker_index]
                        or worker_index not in finished.told):
                    # A retry of a push whose round is applied, or a restarted worker's
                    # push of a step its dead predecessor's push completed unheard of.
                    finished.incarnations[worker_index] = incarnation
                    finished.idents[worker_index] = ident
                    return self._outcome(finished, key, worker_index)
                del self._finished[key]  # a newer incarnation runs this step again
            round_ = self._rounds.setdefault(key, _Round(worker_num))
            if round_.worker_num != worker_num:
                raise RemoteError(f"table {table_id} step {step}: worker {worker_index} says "
                                  f"worker_num={worker_num}, another said {round_.worker_num}")
            known = worker_index in round_.payloads
            if known:
                self._check_current(round_, key, worker_index, incarnation, ident,
                                    replace_ok=True)
            if not known or incarnation > round_.incarnations[worker_index]:
                round_.payloads[worker_index] = payload
                round_.incarnations[worker_index] = incarnation
                round_.idents[worker_index] = ident
                round_.started_s[worker_index] = time.monotonic()
                if known:
                    self._cond.notify_all()  # the replaced contribution's waiter fails
            if len(round_.payloads) == worker_num:
                del self._rounds[key]
                self._finished[key] = round_
                while len(self._finished) > _KEEP_FINISHED:
                    self._finished.popitem(last=False)
                try:
                    apply([round_.payloads[w] for w in sorted(round_.payloads)])
                except BaseException as exc:
                    round_.error = exc
                    raise
                finally:
                    round_.done = True
                    round_.payloads = {}  # the round's memory goes with its update
                    self._cond.notify_all()
                round_.told.add(worker_index)
                return True
            return self._wait(round_, key, worker_index, ident)

    def poll(self, table_id: int, step: int, worker_index: int, incarnation: int = 0,
             ident: Hashable = None) -> bool:
        """Whether this worker's contribution ``ident`` to the round was applied;
        waits at most the budget's wait.

        Raises:
            RemoteError: the server knows no such contribution (it restarted, or the
                push timed out: push again), a newer incarnation pushed since, the
                other workers did not push within ``timeout_s`` (names them), the
                server is stopping, or the round's update failed.
        """
        key = (table_id, step)
        with self._cond:
            round_ = self._rounds.get(key) or self._finished.get(key)
            if round_ is None or worker_index not in round_.incarnations:
                raise RemoteError(
                    f"sync step {step} of table {table_id}: this server has no push of "
                    f"worker {worker_index} to wait for (it restarted, or the push timed "
                    "out); push the step again")
            self._check_current(round_, key, worker_index, incarnation, ident,
                                replace_ok=False)
            if round_.done:
                return self._outcome(round_, key, worker_index)
            return self._wait(round_, key, worker_index, ident)

    def _wait(self, round_: _Round[P], key: tuple[int, int], worker_index: int,
              ident: Hashable) -> bool:
        """Wait (the caller holds the lock) for the round, within the budget."""

        def ended() -> bool:
            return round_.done or self._closed or round_.idents.get(worker_index) != ident

        if not ended():
            self._budget.wait_for(self._cond, ended)
        table_id, step = key
        if round_.done:
            return self._outcome(round_, key, worker_index)
        if round_.idents.get(worker_index) != ident:
            raise RemoteError(self._replaced(key, worker_index, round_))
        if self._closed:
            raise RemoteError(f"sync step {step} of table {table_id}: the server is stopping")
        if time.monotonic() - round_.started_s[worker_index] > self._timeout_s:
            missing = describe_missing(round_.payloads.keys(), round_.worker_num)
            raise RemoteError(
                f"sync step {step} of table {table_id}: workers {missing} did not push "
                f"within {self._timeout_s:.0f} s; check their logs (workerlog.N). In sync "
                "mode every worker must run the same number of steps")
        return False

    def _check_current(self, round_: _Round[P], key: tuple[int, int], worker_index: int,
                       incarnation: int, ident: Hashable, replace_ok: bool) -> None:
        """Refuse a call of an older incarnation, or a second push of the step."""
        table_id, step = key
        known = round_.incarnations[worker_index]
        if incarnation < known:
            raise RemoteError(self._replaced(key, worker_index, round_, incarnation))
        if incarnation == known and round_.idents[worker_index] != ident:
            raise RemoteError(f"table {table_id} step {step}: worker {worker_index} "
                              "pushed twice in one sync step")
        if incarnation > known and not replace_ok:
            raise RemoteError(f"sync step {step} of table {table_id}: worker "
                              f"{worker_index} incarnation {incarnation} polls a push it "
                              "never made; push the step again")

    @staticmethod
    def _replaced(key: tuple[int, int], worker_index: int, round_: _Round[P],
                  incarnation: int | None = None) -> str:
        table_id, step = key
        which = "" if incarnation is None else f" incarnation {incarnation}"
        return (f"sync step {step} of table {table_id}: worker {worker_index}{which} was "
                f"replaced by its incarnation {round_.incarnations.get(worker_index)} (a "
                "restarted copy of this worker, PSFLEET_RESTART_NUM); this process is "
                "stale and must exit")

    @staticmethod
    def _outcome(round_: _Round[P], key: tuple[int, int], worker_index: int) -> bool:
        """True (the round is applied, ``worker_index`` is told so), or its error."""
        round_.told.add(worker_index)
        if round_.error is not None:
            table_id, step = key
            raise RemoteError(f"sync step {step} of table {table_id} failed: {round_.error}")
        return True
