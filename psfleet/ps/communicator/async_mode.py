"""Async mode: a background thread merges queued gradients and sends them.

As Paddle's AsyncCommunicator: the training loop hands each step's gradients to a
bounded queue and goes on; a send thread takes everything queued (up to
``max_merge_var_num`` steps), sums gradients per table (equal sparse keys summed),
pushes them to the servers, and every ``k_steps`` pushes pulls the dense values,
which the loop installs at its next step. The loop never waits for the network
unless the queue is full (back-pressure).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import defaultdict

import numpy as np

from psfleet.errors import FatalError
from psfleet.ps.client import TableClient
from psfleet.ps.communicator.types import AsyncConfig, Communicator, merge_sparse

__all__ = ["AsyncCommunicator"]

logger = logging.getLogger(__name__)

_SPARSE, _DENSE, _STOP = 0, 1, 2


class AsyncCommunicator(Communicator):
    """Sends gradients in the background; see the module docstring.

    Args:
        client: the tables.
        config: queue size, merge limit and dense pull interval.
    """

    def __init__(self, client: TableClient, config: AsyncConfig | None = None) -> None:
        super().__init__(client)
        self.config = config or AsyncConfig()
        # One queue item is one push; a step makes one per sparse table + one dense.
        self._queue: queue.Queue[tuple[int, int, np.ndarray, np.ndarray]] = queue.Queue(
            maxsize=self.config.send_queue_size * 4)
        self._fresh: dict[int, np.ndarray] = {}
        self._fresh_lock = threading.Lock()
        self._dense_pushes: dict[int, int] = defaultdict(int)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="psfleet-send", daemon=True)
            self._thread.start()

    def _check(self) -> None:
        if self._error is not None:
            raise FatalError(f"the communicator's send thread failed: {self._error}") from \
                self._error

    def _put(self, item: tuple[int, int, np.ndarray, np.ndarray]) -> None:
        self._check()
        if self._thread is None:
            raise FatalError("communicator not started; call fleet.init_worker() first")
        while True:
            try:
                self._queue.put(item, timeout=1.0)
                return
            except queue.Full:
                self._check()

    def push_sparse(self, table_id: int, keys: np.ndarray, grads: np.ndarray) -> None:
        self._put((_SPARSE, table_id, keys, grads))

    def push_dense(self, table_id: int, grads: np.ndarray) -> None:
        self._put((_DENSE, table_id, grads, grads))

    def fresh_dense(self, table_id: int) -> np.ndarray | None:
        self._check()
        with self._fresh_lock:
            return self._fresh.pop(table_id, None)

    def flush(self) -> None:
        if self._thread is not None:
            self._queue.join()
        self._check()

    def stop(self) -> None:
        if self._thread is None:
            return
        self.flush()
        self._queue.put((_STOP, 0, np.empty(0), np.empty(0)))
        self._thread.join()
        self._thread = None

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.config.max_merge_var_num * 2:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                if self._error is None:
                    self._send([item for item in batch if item[0] != _STOP])
            except BaseException as exc:  # surfaced to the training loop by _check()
                logger.exception("sending gradients failed")
                self._error = exc
            finally:
                for _ in batch:
                    self._queue.task_done()
            if any(item[0] == _STOP for item in batch):
                return

    def _send(self, batch: list[tuple[int, int, np.ndarray, np.ndarray]]) -> None:
        sparse_keys: dict[int, list[np.ndarray]] = defaultdict(list)
        sparse_grads: dict[int, list[np.ndarray]] = defaultdict(list)
        dense: dict[int, list[np.ndarray]] = defaultdict(list)
        for kind, table_id, a, b in batch:
            if kind == _SPARSE:
                sparse_keys[table_id].append(a)
                sparse_grads[table_id].append(b)
            else:
                dense[table_id].append(a)
        for table_id, keys in sparse_keys.items():
            self.client.push_sparse(table_id, *merge_sparse(keys, sparse_grads[table_id]))
        for table_id, grads in dense.items():
            total = grads[0] if len(grads) == 1 else np.add.reduce(grads, dtype=np.float32)
            self.client.push_dense(table_id, total)
            self._dense_pushes[table_id] += 1
            if self._dense_pushes[table_id] >= self.config.k_steps:
                self._dense_pushes[table_id] = 0
                values = self.client.pull_dense(table_id)
                with self._fresh_lock:
                    self._fresh[table_id] = values
