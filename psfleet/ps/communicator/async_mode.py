"""Async mode: a background thread merges queued gradients and sends them.

As Paddle's AsyncCommunicator: the training loop hands each step's gradients to a
bounded queue and goes on; a send thread takes every step queued (up to
``max_merge_var_num``), sums their gradients per table (equal sparse keys summed),
pushes them to the servers, and every ``k_steps`` sends pulls the dense values, which
the loop installs at its next step. The loop waits for the network only when
``send_queue_size`` steps are queued: merging lets the sender keep up with the loop,
and the queue bound caps how stale an applied gradient can be (unbounded staleness
makes Adam diverge).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psfleet.errors import FatalError
from psfleet.ps.client import PushHandle, TableClient
from psfleet.ps.communicator.staleness_bound import StalenessBound
from psfleet.ps.communicator.types import AsyncConfig, Communicator
from psfleet.ps.merge import merge_pushes
from psfleet.ps.routing import RoutedKeys

__all__ = ["AsyncCommunicator"]

logger = logging.getLogger(__name__)


@dataclass
class _Step:
    """The pushes of one or more training steps, per table."""

    sparse_keys: dict[int, list[np.ndarray | RoutedKeys]] = field(
        default_factory=lambda: defaultdict(list))
    sparse_grads: dict[int, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    #: each push's shows and clicks (ctr tables; None: no counts), aligned with sparse_keys
    sparse_shows: dict[int, list[np.ndarray | None]] = field(
        default_factory=lambda: defaultdict(list))
    sparse_clicks: dict[int, list[np.ndarray | None]] = field(
        default_factory=lambda: defaultdict(list))
    dense: dict[int, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    #: the worker's number of the newest step merged in (1 for its first step)
    last: int = 0

    def empty(self) -> bool:
        return not self.sparse_keys and not self.dense

    def absorb(self, other: _Step) -> None:
        for tid, keys in other.sparse_keys.items():
            self.sparse_keys[tid].extend(keys)
            self.sparse_grads[tid].extend(other.sparse_grads[tid])
            self.sparse_shows[tid].extend(other.sparse_shows[tid])  # merged steps sum
            self.sparse_clicks[tid].extend(other.sparse_clicks[tid])  # their counts
        for tid, grads in other.dense.items():
            self.dense[tid].extend(grads)
        self.last = max(self.last, other.last)


_STOP = None


class StalenessStats:
    """How stale the dense values a worker installs are: per install, the worker's own
    steps whose gradients are not in them yet (0: all are; one process is always 0).
    Other workers' pushes are not counted: the worker cannot see them."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.max = 0

    def add(self, steps: int) -> None:
        """Record one install's staleness, in steps (>= 0)."""
        self.count += 1
        self.total += steps
        self.max = max(self.max, steps)

    @property
    def mean(self) -> float:
        """Mean staleness in steps (0.0 before any install)."""
        return self.total / self.count if self.count else 0.0

    def __str__(self) -> str:
        return f"mean {self.mean:.2f} max {self.max} steps over {self.count} installs"


class AsyncCommunicator(Communicator):
    """Sends gradients in the background; see the module docstring.

    Rows may be prefetched (``SparseEmbedding.prefetch``): a step may read rows one
    step older than the last push, as async training already allows.

    With ``config.bounded_staleness`` set, a step waits while this worker is too far
    ahead of the slowest one (SSP, ``psfleet.ps.communicator.staleness_bound``).

    Args:
        client: the tables.
        config: queue size, merge limit, dense pull interval, staleness bound.
        worker_num: the job's workers.
    """

    prefetches = True

    def __init__(self, client: TableClient, config: AsyncConfig | None = None,
                 worker_num: int = 1) -> None:
        super().__init__(client)
        self.config = config or AsyncConfig()
        self.worker_num = worker_num
        self.bound = (None if self.config.bounded_staleness is None else
                      StalenessBound(client, worker_num, self.config.bounded_staleness))
        self._queue: queue.Queue[_Step | None] = queue.Queue(maxsize=self.config.send_queue_size)
        self._open = _Step()
        self._fresh: dict[int, tuple[np.ndarray, int]] = {}  # values, newest step in them
        self._fresh_last: dict[int, int] = {}  # the newest step of values stored so far
        self._steps = 0
        #: dense staleness of each install: the worker's steps not yet in the values
        #: it installs (0: every step so far is in them; the lag behind one process)
        self.staleness = StalenessStats()
        self.local_dense_update = self.config.local_dense_update
        self._fresh_lock = threading.Lock()
        self._sends = 0
        self._count_lock = threading.Lock()
        self.merged_steps = 0
        self._error: BaseException | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        if not self._threads:
            self._threads = [threading.Thread(target=self._run, name=f"psfleet-send-{i}",
                                              daemon=True)
                             for i in range(self.config.thread_pool_size)]
            for thread in self._threads:
                thread.start()
            if self.bound is not None:
                self.bound.start()

    def _check(self) -> None:
        if self._error is not None:
            raise FatalError(f"the communicator's send thread failed: {self._error}") from \
                self._error
        if not self._threads:
            raise FatalError("communicator not started; call fleet.init_worker() first")

    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    grads: np.ndarray, shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> None:
        self._open.sparse_keys[table_id].append(keys)
        self._open.sparse_grads[table_id].append(grads)
        self._open.sparse_shows[table_id].append(shows)
        self._open.sparse_clicks[table_id].append(clicks)

    def push_dense(self, table_id: int, grads: np.ndarray) -> None:
        self._open.dense[table_id].append(grads)

    def end_step(self) -> None:
        """Queue this step's pushes; blocks while ``send_queue_size`` steps wait, and
        with ``bounded_staleness`` while this worker is too far ahead of the others."""
        if self._queue_step() and self.bound is not None:
            self.bound.before_step(self._steps + 1)

    def _queue_step(self) -> bool:
        """Queue the open step (False: it is empty). Blocks while the queue is full."""
        self._check()
        if self._open.empty():
            return False
        self._steps += 1
        step, self._open = self._open, _Step()
        step.last = self._steps
        while True:
            try:
                self._queue.put(step, timeout=1.0)
                return True
            except queue.Full:
                self._check()

    def fresh_dense(self, table_id: int) -> np.ndarray | None:
        self._check()
        with self._fresh_lock:
            fresh = self._fresh.pop(table_id, None)
        if fresh is None:
            return None
        values, last = fresh
        self.fresh_dense_lag = self._steps - last
        self.staleness.add(self.fresh_dense_lag)
        return values

    def flush(self) -> None:
        if not self._threads:
            return
        self._queue_step()
        self._queue.join()
        self._check()
        self.park()

    def park(self) -> None:
        if self.bound is not None and self._threads:
            self.bound.park()

    def stop(self) -> None:
        if not self._threads:
            return
        try:
            self.flush()
        finally:  # end the send threads even when a send failed (flush raises)
            for _ in self._threads:
                self._queue.put(_STOP)
            for thread in self._threads:
                thread.join()
            self._threads = []
            logger.info("async communicator: %d sends, %d steps merged into others; "
                        "dense staleness %s%s", self._sends, self.merged_steps, self.staleness,
                        f"; {self.bound}" if self.bound is not None else "")

    def _collect(self) -> list[_Step | None]:
        """The next queued steps to merge: at least one, at most max_merge_var_num."""
        items = [self._queue.get()]
        waits = 0
        while len(items) < self.config.max_merge_var_num and items[-1] is not _STOP:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                if waits >= self.config.send_wait_times:
                    break
                waits += 1
                time.sleep(0.01)
        return items

    def _run(self) -> None:
        while True:
            items = self._collect()
            steps = [item for item in items if item is not _STOP]
            try:
                if self._error is None and steps:
                    merged = steps[0]
                    for step in steps[1:]:
                        merged.absorb(step)
                    self._send(merged, len(steps))
            except BaseException as exc:  # surfaced to the training loop by _check()
                logger.exception("sending gradients failed")
                self._error = exc
            finally:
                for _ in items:
                    self._queue.task_done()
            if items[-1] is _STOP:
                return

    def _push_options(self, steps: int) -> dict[str, Any]:
        """How a send of ``steps`` merged steps is applied (``TableClient``'s push
        arguments): as it arrives, the table's rule (APPLY)."""
        return {}

    def _start_sparse(self, step: _Step, table_id: int, options: dict[str, Any]
                      ) -> PushHandle:
        """Send one table's merged pushes of ``step`` (with summed counts: ctr)."""
        keys, grads, shows, clicks = merge_pushes(
            step.sparse_keys[table_id], step.sparse_grads[table_id],
            step.sparse_shows[table_id], step.sparse_clicks[table_id])
        if shows is None:  # no counts: exactly the push of a table without them
            return self.client.start_push_sparse(table_id, keys, grads, **options)
        return self.client.start_push_sparse(table_id, keys, grads, shows=shows,
                                             clicks=clicks, **options)

    def _send(self, step: _Step, steps: int) -> None:
        # Every table's push goes out at once; then wait for all of them.
        options = self._push_options(steps)
        pushes = [self._start_sparse(step, table_id, options)
                  for table_id in step.sparse_keys]
        for table_id, grads in step.dense.items():
            total = grads[0] if len(grads) == 1 else np.add.reduce(grads, dtype=np.float32)
            pushes.append(self.client.start_push_dense(table_id, total, **options))
        for push in pushes:
            push.result()
        with self._count_lock:
            self._sends += 1
            self.merged_steps += steps - 1
            pull = bool(step.dense) and self._sends % self.config.k_steps == 0
        if self.bound is not None:
            self.bound.acknowledged(steps)
        if pull:
            for table_id in step.dense:
                values = self.client.pull_dense(table_id)
                with self._fresh_lock:  # with several send threads, keep the newest
                    if step.last > self._fresh_last.get(table_id, 0):
                        self._fresh[table_id] = (values, step.last)
                        self._fresh_last[table_id] = step.last
