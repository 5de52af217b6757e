"""The server: tables behind the rpc service, and the process's serving loop.

:class:`PsHandler` implements every rpc of ``psfleet.proto`` over a registry of
tables; :func:`run_server` serves it until a worker sends ``Stop`` or the process
gets SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import numpy as np
from pydantic import ValidationError

from psfleet.checkpoint import CheckpointStore
from psfleet.errors import ConfigError, RemoteError
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.merge import merge_sparse
from psfleet.ps.persist import (
    load_server,
    saved_dense_index,
    saved_table_configs,
    snapshot_tables,
    write_snapshot,
)
from psfleet.ps.sparse_table import SparseTable
from psfleet.ps.sync_rounds import SyncRounds
from psfleet.ps.types import SparseTableConfig, table_config_from_json
from psfleet.rpc import RpcConfig, RunningServer, codec, serve
from psfleet.rpc import messages as msg
from psfleet.rpc.endpoint_file import write_endpoint_file

__all__ = ["PsHandler", "start_server", "run_server"]

logger = logging.getLogger(__name__)

Table = SparseTable | DenseTable
_T = TypeVar("_T", SparseTable, DenseTable)


class _Barrier:
    """A reusable barrier for ``worker_num`` workers, keyed by name on server 0."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._arrived: dict[str, set[int]] = {}
        self._generation: dict[str, int] = {}
        self._closed = False

    def close(self) -> None:
        """Release every waiter with an error (the server is stopping). Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait(self, name: str, worker_index: int, worker_num: int, timeout_s: float) -> None:
        with self._cond:
            arrived = self._arrived.setdefault(name, set())
            generation = self._generation.get(name, 0)
            arrived.add(worker_index)
            if len(arrived) >= worker_num:
                self._arrived[name] = set()
                self._generation[name] = generation + 1
                self._cond.notify_all()
                return
            done = self._cond.wait_for(
                lambda: self._closed or self._generation.get(name, 0) != generation,
                timeout=timeout_s)
            if self._closed and self._generation.get(name, 0) == generation:
                raise RemoteError(f"barrier {name!r}: the server is stopping")
            if not done:
                missing = sorted(set(range(worker_num)) - self._arrived.get(name, set()))
                raise RemoteError(
                    f"barrier {name!r}: workers {missing} did not arrive within "
                    f"{timeout_s:.0f} s; check their logs (workerlog.N)"
                )


class _PushGate:
    """Keeps table writes out while a snapshot is copied.

    Every push (apply, delta, or a sync round's mean) runs inside :meth:`write`; a
    save runs its copy inside :meth:`closed`, which waits for the writes in progress
    to finish and holds new ones back until the copy is done. So a snapshot holds
    every table's values and rule state as of one moment of this server (no push half
    applied, no table copied before and another after a push).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if self._active == 0:
                    self._cond.notify_all()

    @contextmanager
    def closed(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)  # one snapshot at a time
            self._closed = True
            self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()


class PsHandler:
    """The rpc methods of one server. Thread safe.

    Args:
        barrier_timeout_s: how long a Barrier call, or a sync-mode push, waits for
            the other workers.
        preload_dir: a save (``fleet.save_persistables``) each table is loaded from
            when the workers create it (``fleet.init_server(dirname)``).
    """

    def __init__(self, barrier_timeout_s: float = 180.0,
                 preload_dir: Path | str | None = None) -> None:
        self.tables: dict[int, Table] = {}
        self.preload_dir = preload_dir
        self._tables_lock = threading.Lock()
        self._gate = _PushGate()
        self._barrier = _Barrier()
        self._barrier_timeout_s = barrier_timeout_s
        self._sparse_rounds: SyncRounds[tuple[np.ndarray, np.ndarray]] = SyncRounds(
            barrier_timeout_s)
        self._dense_rounds: SyncRounds[np.ndarray] = SyncRounds(barrier_timeout_s)
        self._sparse_push_modes = {msg.APPLY: self._sparse_apply, msg.SYNC: self._sparse_sync,
                                   msg.DELTA: self._sparse_delta}
        self._dense_push_modes = {msg.APPLY: self._dense_apply, msg.SYNC: self._dense_sync,
                                  msg.DELTA: self._dense_delta}
        self.stop_requested = threading.Event()

    def _table(self, table_id: int, kind: type[_T]) -> _T:
        table = self.tables.get(table_id)
        if table is None:
            raise RemoteError(f"no table {table_id} on this server; workers create tables "
                              "in init_worker() before pulling or pushing")
        if not isinstance(table, kind):
            raise RemoteError(f"table {table_id} is not a {kind.__name__}")
        return table

    def CreateTable(self, request: msg.CreateTableRequest) -> msg.CreateTableResponse:  # noqa: N802
        try:
            config = table_config_from_json(request.config_json)
        except ValidationError as exc:
            raise ConfigError(f"table {request.table_id}: invalid config: {exc}") from None
        with self._tables_lock:
            existing = self.tables.get(request.table_id)
            if existing is not None:
                if existing.config != config:
                    raise ConfigError(
                        f"table {request.table_id} exists with config {existing.config!r}; "
                        f"a worker sent {config!r}. Every worker must build the same model"
                    )
                return msg.CreateTableResponse(created=False)
            table: Table = (
                SparseTable(config) if isinstance(config, SparseTableConfig)
                else DenseTable(config, codec.floats_from_bytes(request.init_values)))
            if self.preload_dir is not None:
                index = {request.table_id: np.frombuffer(request.dense_index, dtype="<i8")}
                loaded = load_server({request.table_id: table}, self.preload_dir,
                                     request.server_index, max(request.server_num, 1), index)
                logger.info("table %d: loaded %s from %s", request.table_id, loaded,
                            self.preload_dir)
            self.tables[request.table_id] = table
        logger.info("created table %d: %r", request.table_id, config)
        return msg.CreateTableResponse(created=True)

    def PullSparse(self, request: msg.PullSparseRequest) -> msg.PullSparseResponse:  # noqa: N802
        table = self._table(request.table_id, SparseTable)
        values = table.pull(codec.keys_from_bytes(request.keys), create=request.create)
        return msg.PullSparseResponse(values=codec.floats_to_bytes(values), dim=table.dim)

    # -- pushes: one method per push mode (APPLY async, SYNC rounds, DELTA geo) ---------
    def PushSparse(self, request: msg.PushSparseRequest) -> msg.Empty:  # noqa: N802
        table = self._table(request.table_id, SparseTable)
        keys = codec.keys_from_bytes(request.keys)
        values = codec.floats_from_bytes(request.grads, table.dim)
        self._sparse_push_modes[request.mode](request, table, keys, values)
        return msg.Empty()

    def _sparse_apply(self, request: msg.PushSparseRequest, table: SparseTable,
                      keys: np.ndarray, grads: np.ndarray) -> None:
        with self._gate.write():
            table.push(keys, grads)

    def _sparse_delta(self, request: msg.PushSparseRequest, table: SparseTable,
                      keys: np.ndarray, deltas: np.ndarray) -> None:
        with self._gate.write():
            table.add(keys, deltas)

    def _sparse_sync(self, request: msg.PushSparseRequest, table: SparseTable,
                     keys: np.ndarray, grads: np.ndarray) -> None:
        def apply_mean(pushes: list[tuple[np.ndarray, np.ndarray]]) -> None:
            merged_keys, summed = merge_sparse([k for k, _ in pushes], [g for _, g in pushes])
            with self._gate.write():
                table.push(merged_keys, summed / np.float32(len(pushes)))

        self._sparse_rounds.contribute(request.table_id, request.step, request.worker_index,
                                       request.worker_num, (keys, grads), apply_mean)

    def PullDense(self, request: msg.PullDenseRequest) -> msg.PullDenseResponse:  # noqa: N802
        table = self._table(request.table_id, DenseTable)
        values = table.pull(request.worker_index)
        return msg.PullDenseResponse(values=codec.floats_to_bytes(values))

    def PushDense(self, request: msg.PushDenseRequest) -> msg.Empty:  # noqa: N802
        table = self._table(request.table_id, DenseTable)
        self._dense_push_modes[request.mode](request, table,
                                             codec.floats_from_bytes(request.grads))
        return msg.Empty()

    def _dense_apply(self, request: msg.PushDenseRequest, table: DenseTable,
                     grads: np.ndarray) -> None:
        with self._gate.write():
            table.push(grads, request.worker_index)

    def _dense_delta(self, request: msg.PushDenseRequest, table: DenseTable,
                     deltas: np.ndarray) -> None:
        with self._gate.write():
            table.add(deltas)

    def _dense_sync(self, request: msg.PushDenseRequest, table: DenseTable,
                    grads: np.ndarray) -> None:
        def apply_mean(pushes: list[np.ndarray]) -> None:
            mean = np.add.reduce(pushes, dtype=np.float32) / np.float32(len(pushes))
            with self._gate.write():
                table.push(mean)

        self._dense_rounds.contribute(request.table_id, request.step, request.worker_index,
                                      request.worker_num, grads, apply_mean)

    def Barrier(self, request: msg.BarrierRequest) -> msg.Empty:  # noqa: N802
        if request.worker_index >= request.worker_num:
            raise ConfigError(f"barrier {request.name!r}: worker_index {request.worker_index}"
                              f" >= worker_num {request.worker_num}")
        self._barrier.wait(request.name, request.worker_index, request.worker_num,
                           self._barrier_timeout_s)
        return msg.Empty()

    @staticmethod
    def _dense_index(entries: Iterable[msg.DenseIndex]) -> dict[int, np.ndarray]:
        return {e.table_id: np.frombuffer(e.index, dtype="<i8") for e in entries}

    def Save(self, request: msg.SaveRequest) -> msg.SaveResponse:  # noqa: N802
        """Copy every table at one moment (pushes held back), then write the copy."""
        with self._tables_lock:
            tables = dict(self.tables)
        with self._gate.closed():
            snapshot = snapshot_tables(tables)
        try:
            digests = write_snapshot(snapshot, request.dirname, request.server_index,
                                     self._dense_index(request.dense))
        except OSError as exc:
            raise RemoteError(f"save to {request.dirname!r} failed: {exc}") from None
        logger.info("saved %d tables to %s/server-%d", len(tables), request.dirname,
                    request.server_index)
        return msg.SaveResponse(files=[msg.FileDigest(path=d.path, size=d.size,
                                                      sha256=d.sha256) for d in digests])

    def Load(self, request: msg.LoadRequest) -> msg.Empty:  # noqa: N802
        with self._tables_lock:
            tables = dict(self.tables)
        loaded = load_server(tables, request.dirname, request.server_index,
                             request.server_num, self._dense_index(request.dense))
        logger.info("loaded from %s: %s rows/elements per table", request.dirname, loaded)
        return msg.Empty()

    def recover(self, checkpoint_dir: str, server_index: int) -> bool:
        """Re-create this server's tables from the newest complete checkpoint (a server
        restarted by the launcher: the workers created its tables before it died).

        Returns:
            False when there is no complete checkpoint (tables stay empty).

        Raises:
            DataError: the checkpoint has no tables of this server index.
        """
        latest = CheckpointStore(checkpoint_dir).latest()
        if latest is None:
            logger.warning("restart: no complete checkpoint in %s; this server starts empty",
                           checkpoint_dir)
            return False
        server_num = latest.manifest.server_num
        created: dict[int, Table] = {}
        for table_id, config in saved_table_configs(latest.storage, server_index).items():
            if isinstance(config, SparseTableConfig):
                created[table_id] = SparseTable(config)
            else:
                created[table_id] = DenseTable(config, np.zeros(config.size, np.float32))
        index = {tid: saved_dense_index(latest.storage, server_index, tid)
                 for tid, t in created.items() if isinstance(t, DenseTable)}
        loaded = load_server(created, latest.storage, server_index, server_num, index)
        with self._tables_lock:
            self.tables.update(created)
        logger.info("restart: server %d of %d recovered %d tables from checkpoint %s "
                    "(step %d): %s rows/elements per table", server_index, server_num,
                    len(created), latest.storage.url, latest.manifest.step, loaded)
        return True

    def Stats(self, request: msg.StatsRequest) -> msg.StatsResponse:  # noqa: N802
        with self._tables_lock:
            items = list(self.tables.items())
        return msg.StatsResponse(tables=[
            msg.TableStats(table_id=tid, name=t.config.name, rows=len(t),
                           memory_bytes=t.memory_bytes) for tid, t in items])

    def close(self) -> None:
        """Fail the calls blocked in a Barrier or a sync round (the server is stopping)."""
        self._barrier.close()
        self._sparse_rounds.close()
        self._dense_rounds.close()

    def Stop(self, request: msg.StopRequest) -> msg.Empty:  # noqa: N802
        logger.info("stop requested by worker %d", request.worker_index)
        self.stop_requested.set()
        return msg.Empty()


def start_server(host: str, port: int, config: RpcConfig,
                 handler: PsHandler | None = None) -> tuple[PsHandler, RunningServer]:
    """Start a server in this process and return at once (tests, embedding).

    Raises:
        ConfigError: the port cannot be bound.
    """
    handler = handler or PsHandler(barrier_timeout_s=config.deadline_s)
    return handler, serve(handler, host, port, config)


def run_server(host: str, port: int, config: RpcConfig,
               endpoint_file: Path | None = None, preload_dir: Path | str | None = None,
               recover: tuple[str, int] | None = None) -> None:
    """Serve until a worker sends Stop or the process gets SIGTERM/SIGINT. Blocks.

    Args:
        host: address to bind.
        port: port to bind; 0 asks the OS for a free one.
        config: rpc settings.
        endpoint_file: where to write the bound ``host:port`` once listening.
        preload_dir: a save to load each table from when it is created.
        recover: ``(checkpoint_dir, server_index)``: a restarted server first
            re-creates its tables from the newest complete checkpoint there
            (:meth:`PsHandler.recover`), then listens.

    Raises:
        ConfigError: the port cannot be bound.
        DataError: ``recover`` names a checkpoint without this server's tables.
    """
    handler = PsHandler(config.deadline_s, preload_dir)
    if recover is not None:
        handler.recover(*recover)
    handler, server = start_server(host, port, config, handler)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: handler.stop_requested.set())
    if endpoint_file is not None:
        write_endpoint_file(endpoint_file, server.host, server.port)
    try:
        while not handler.stop_requested.wait(0.5):
            pass
    finally:
        handler.close()  # a blocked Barrier or sync push would keep the process alive
        server.stop(grace_s=2.0)
        stats = {tid: len(t) for tid, t in handler.tables.items()}
        logger.info("server %s stopped; rows per table: %s", server.endpoint, stats)
