"""The table service: one server's tables and the requests that read and change them.

See :class:`TableService`. ``psfleet.ps.server`` serves it over gRPC;
``psfleet.ps.transport.InProcessTransport`` calls it in the worker's own process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import numpy as np
from pydantic import ValidationError

from psfleet.errors import (
    ConfigError,
    InvalidRequestError,
    RemoteError,
    ResourceExhaustedError,
    clip_text,
)
from psfleet.ps.clocks import WorkerClocks
from psfleet.ps.coordination import Barrier, PushGate
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.lifecycle_service import (
    check_show_clicks,
    decode_counts,
    lifecycle_stats,
)
from psfleet.ps.persist import load_server
from psfleet.ps.persist_delta import (
    ModeSnapshot,
    saved_mode,
    snapshot_mode,
)
from psfleet.ps.push_ledger import PushLedger
from psfleet.ps.push_modes import PushModes
from psfleet.ps.request_checks import (
    JobWorkers,
    check_name,
    check_placement,
    check_pull_size,
    check_table_config,
    config_difference,
    count_non_finite,
)
from psfleet.ps.request_counters import RequestCounters, RequestCounts
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.table_admin import TableAdmin
from psfleet.ps.types import (
    PushMeta,
    PushMode,
    ServerLimits,
    SparseTableConfig,
    table_config_from_json,
)
from psfleet.ps.wait_budget import WaitBudget
from psfleet.rpc import codec
from psfleet.rpc import messages as msg

__all__ = ["TableService", "Table"]

logger = logging.getLogger(__name__)

Table = SparseTable | DenseTable
_T = TypeVar("_T", SparseTable, DenseTable)


class TableService:
    """One server's tables and everything done to them. Thread safe.

    The one implementation of the server side: tables and their rules, the push
    modes (APPLY, SYNC rounds, DELTA), DC-ASGD, barriers, save/load, stats, and
    at-most-once pushes (:class:`~psfleet.ps.push_ledger.PushLedger`). One method per
    rpc of ``psfleet.proto``, each taking the request message and returning the
    response. gRPC serves it to remote workers (``psfleet.ps.server``); a worker
    with no servers calls it directly (``psfleet.ps.transport.InProcessTransport``):
    the transport is the only difference between the two.

    Args:
        barrier_timeout_s: how long a Barrier call, or a sync-mode push, waits for
            the other workers.
        preload_dir: a save (``fleet.save_persistables``) each table is loaded from
            when the workers create it (``fleet.init_server(dirname)``).
        limits: what one request may ask for (dims, bucket counts, worker counts,
            pull sizes); checked before anything is allocated
            (``psfleet.ps.request_checks`` documents the policies, NaN/Inf included).
        job_worker_num: the job's worker count; None: fixed by the first Barrier or
            SYNC push.
        wait_budget: how many calls may wait for other workers at once, and how
            long each (``psfleet.ps.wait_budget``); give a gRPC server at most half
            of its ``server_threads``. None: ``WaitBudget()`` (16 slots, 0.5 s).

    A request outside the limits, undecodable or carrying NaN/Inf raises
    ``InvalidRequestError`` and changes nothing; out of memory raises
    ``ResourceExhaustedError`` naming the table (rows created all or none per shard;
    a push spanning shards may have reached those before the failing one).
    ``counters`` (:class:`~psfleet.ps.request_counters.RequestCounters`) counts the
    pulls and pushes served, per table (the server's /metrics reads them).
    """

    def __init__(self, barrier_timeout_s: float = 180.0,
                 preload_dir: Path | str | None = None,
                 limits: ServerLimits | None = None,
                 job_worker_num: int | None = None,
                 wait_budget: WaitBudget | None = None) -> None:
        self.tables: dict[int, Table] = {}
        #: dense table id -> the flat indexes (int64[n]) of the elements it holds
        self.dense_index: dict[int, np.ndarray] = {}
        self.preload_dir = preload_dir
        self.limits = limits or ServerLimits()
        self._workers = JobWorkers(self.limits, job_worker_num)
        self._non_finite: dict[int, int] = {}  # table id -> pushes rejected for NaN/Inf
        self._non_finite_lock = threading.Lock()
        self._tables_lock = threading.Lock()
        self._gate = PushGate()
        self.wait_budget = wait_budget or WaitBudget()
        self._barrier = Barrier(self.wait_budget, self._workers.last_progress_s)
        self._clocks = WorkerClocks(self.wait_budget)
        self._ledger = PushLedger()
        self.counters = RequestCounters()
        self.started_s = time.monotonic()
        self._barrier_timeout_s = barrier_timeout_s
        self._modes = PushModes(self._gate, barrier_timeout_s, self.wait_budget)
        self.stop_requested = threading.Event()
        self._admin = TableAdmin(self.tables, self._tables_lock, self._gate)

    @property
    def barrier_timeout_s(self) -> float:
        """How long a Barrier call, or a sync-mode push, waits for the others, seconds."""
        return self._barrier_timeout_s

    def _table(self, table_id: int, kind: type[_T]) -> _T:
        table = self.tables.get(table_id)
        if table is None:
            raise RemoteError(f"no table {table_id} on this server; workers create tables "
                              "in init_worker() before pulling or pushing")
        if not isinstance(table, kind):
            raise RemoteError(f"table {table_id} is not a {kind.__name__}")
        return table

    @contextmanager
    def _memory_guard(self, what: str, table_id: int) -> Iterator[None]:
        """Turn a MemoryError into a ResourceExhaustedError naming the table and size."""
        try:
            yield
        except MemoryError as exc:
            table = self.tables.get(table_id)
            size = ("not created" if table is None else
                    f"{table.config.name!r}, {len(table)} rows, {table.memory_bytes} bytes")
            logger.error("%s on table %d (%s): out of memory: %s", what, table_id, size, exc)
            raise ResourceExhaustedError(
                f"{what} on table {table_id} ({size}): the server ran out of memory "
                f"({exc}); its rows and index are whole. Give the server more memory, add "
                "servers, or send fewer keys per call") from None

    def _reject_non_finite(self, what: str, table_id: int, values: np.ndarray) -> None:
        """Reject ``values`` holding NaN/Inf (counted in Stats); see request_checks."""
        bad = count_non_finite(values)
        if bad:
            with self._non_finite_lock:
                self._non_finite[table_id] = self._non_finite.get(table_id, 0) + 1
            name = getattr(self.tables.get(table_id), "config", None)
            raise InvalidRequestError(
                f"{what} to table {table_id}{f' ({name.name!r})' if name else ''}: {bad} of "
                f"{values.size} values are NaN or Inf; the push is rejected whole. Check "
                "the model's loss and learning rate (a diverging model), or clip gradients")

    def CreateTable(self, request: msg.CreateTableRequest) -> msg.CreateTableResponse:  # noqa: N802
        try:
            config = table_config_from_json(request.config_json)
        except ValidationError as exc:
            raise InvalidRequestError(
                f"table {request.table_id}: invalid config: {exc}") from None
        check_table_config(request.table_id, config, self.limits)
        init_values = codec.floats_from_bytes(request.init_values)
        self._reject_non_finite("CreateTable initial values", request.table_id, init_values)
        dense_index = codec.int64s_from_bytes(request.dense_index)
        with self._tables_lock, self._memory_guard("CreateTable", request.table_id):
            existing = self.tables.get(request.table_id)
            if existing is not None:
                if existing.config != config:
                    raise ConfigError(
                        f"table {request.table_id} ({clip_text(repr(existing.config.name))}) "
                        "exists with another config: "
                        f"{config_difference(existing.config, config)}. Every worker must "
                        "build the same model")
                return msg.CreateTableResponse(created=False)
            # A new table only (O(1) under the lock): an existing one's conflict says more.
            check_name(f"table {request.table_id}", config.name, self.limits)
            check_placement(f"table {request.table_id}", request.server_index,
                            request.server_num, self.limits)
            table: Table = (
                SparseTable(config) if isinstance(config, SparseTableConfig)
                else DenseTable(config, init_values))
            if self.preload_dir is not None:
                if saved_mode(self.preload_dir) == "delta":
                    raise ConfigError(f"init_server({self.preload_dir!r}): a delta save; "
                                      "start from its base save, then load_model() each "
                                      "delta in order")
                index = {request.table_id: dense_index}
                loaded = load_server({request.table_id: table}, self.preload_dir,
                                     request.server_index, max(request.server_num, 1), index)
                logger.info("table %d: loaded %s from %s", request.table_id, loaded,
                            self.preload_dir)
            self.tables[request.table_id] = table
            if isinstance(table, DenseTable):
                self.dense_index[request.table_id] = dense_index
        logger.info("created table %d: %r", request.table_id, config)
        return msg.CreateTableResponse(created=True)

    # -- the hot path: typed methods (the in-process transport calls these directly;
    # the rpc methods below decode a message and call them) ----------------------------
    def pull_sparse(self, table_id: int, keys: np.ndarray, create: bool,
                    with_state: bool = False) -> np.ndarray:
        """Rows of ``keys`` (uint64[N]) of sparse table ``table_id``: float32[N, dim]
        (``with_state``: float32[N, dim + state width], values and rule state).

        Raises:
            RemoteError: no such sparse table.
            InvalidRequestError: a reserved key, or the response would be larger
                than ``limits.max_pull_bytes``.
            ResourceExhaustedError: out of memory (names the table).
        """
        table = self._table(table_id, SparseTable)
        check_pull_size(table_id, keys.size,
                        table.dim + (table.state_width if with_state else 0), self.limits)
        with self._memory_guard("pull", table_id):
            rows = table.pull(keys, create=create, with_state=with_state)
        self.counters.count_pull(table_id, keys.size)
        return rows

    def push_sparse(self, push: PushMeta, keys: np.ndarray, values: np.ndarray,
                    incarnation: int = 0, shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> bool:
        """Apply a push of float32[N, dim] gradients (or GEO deltas) of keys uint64[N]
        (a repeated key's values are summed) as ``push.mode`` says, once per
        ``push.push_id``.

        SYNC is one step of a long poll (``psfleet.ps.sync_rounds``): it adds the push
        to the round of ``push.step`` (a newer ``incarnation`` of the worker replaces
        an older one's push) and waits at most ``wait_budget.max_wait_s``.

        ``shows`` and ``clicks`` (float32[N] each, both or neither) are per-key counts
        for a ``ctr`` accessor (``psfleet.ps.lifecycle_service``): APPLY passes them
        to ``SparseTable.push``, DELTA to ``update_stats``, and a SYNC round sums them
        over the workers' pushes (its gradients are averaged).

        Returns:
            True when the push is applied (SYNC: its round); False: SYNC, poll with
            :meth:`poll_sync_push` until True.

        Raises:
            RemoteError: no such table, or a sync round failed.
            InvalidRequestError: a shape mismatch, NaN/Inf values, worker counts
                outside the job's, or shows/clicks of another length than the keys',
                non-finite or negative (names the field).
            ResourceExhaustedError: out of memory (names the table).
        """
        table = self._table(push.table_id, SparseTable)
        self._check_push(push, values)
        counts = (None if shows is None and clicks is None
                  else check_show_clicks(push.table_id, keys.size, shows, clicks))
        with self._memory_guard("push", push.table_id):
            if push.mode == PushMode.SYNC:  # a round, idempotent by push id (SyncRounds)
                done = self._modes.sparse_sync(push, table, keys, values, incarnation, counts)
            else:
                apply = self._modes.sparse[push.mode]
                self._ledger.run_once(*push.push_id,
                                      lambda: apply(push, table, keys, values, counts))
                done = True
        self.counters.count_push(push.table_id, keys.size)
        return done

    def poll_sync_push(self, push: PushMeta, incarnation: int = 0) -> bool:
        """Whether SYNC push ``push`` (its round: table, step, worker, push id) is
        applied; waits at most ``wait_budget.max_wait_s``. Sparse or dense table.

        Raises:
            RemoteError: no such table or push (push again), a newer incarnation
                pushed since, the others did not push within the barrier timeout
                (names them), or the round failed.
        """
        table = self.tables.get(push.table_id)
        modes = self._modes
        rounds = modes.dense_rounds if isinstance(table, DenseTable) else modes.sparse_rounds
        self._workers.check(f"push to table {push.table_id}", push.worker_index,
                            push.worker_num)
        return rounds.poll(push.table_id, push.step, push.worker_index, incarnation,
                           push.push_id)

    def _check_push(self, push: PushMeta, values: np.ndarray) -> None:
        what = f"push to table {push.table_id}"
        if push.mode in (PushMode.SYNC, PushMode.AGGREGATE):
            self._workers.check(what, push.worker_index, push.worker_num)
        else:
            self._workers.check_index(what, push.worker_index)
        self._reject_non_finite("push", push.table_id, values)
        self._workers.note_progress(push.worker_index)  # training: barriers wait for it

    def pull_dense(self, table_id: int, worker_index: int) -> np.ndarray:
        """This server's blocks of dense table ``table_id``: float32[n] (a copy).
        Raises InvalidRequestError when ``worker_index`` is outside the job's."""
        table = self._table(table_id, DenseTable)
        self._workers.check_index(f"dense pull of table {table_id}", worker_index)
        self._workers.note_progress(worker_index)
        values = table.pull(worker_index)
        self._modes.global_batches.note_pull(worker_index)  # GBA: the worker's token
        self.counters.count_pull(table_id, values.size)
        return values

    def push_dense(self, push: PushMeta, values: np.ndarray, incarnation: int = 0) -> bool:
        """Apply a push of float32[n] gradients (or deltas) to dense table
        ``push.table_id`` as ``push.mode`` says, once per ``push.push_id``. Returns
        and raises as :meth:`push_sparse`."""
        table = self._table(push.table_id, DenseTable)
        if push.mode == PushMode.ROW_DELTA:
            raise InvalidRequestError(f"push to dense table {push.table_id}: ROW_DELTA "
                                      "pushes rows of sparse tables only")
        self._check_push(push, values)
        with self._memory_guard("push", push.table_id):
            if push.mode == PushMode.SYNC:  # a round, idempotent by push id (SyncRounds)
                done = self._modes.dense_sync(push, table, values, incarnation)
            else:
                apply = self._modes.dense[push.mode]
                self._ledger.run_once(*push.push_id, lambda: apply(push, table, values))
                done = True
        self.counters.count_push(push.table_id, values.size)
        return done

    def PullSparse(self, request: msg.PullSparseRequest) -> msg.PullSparseResponse:  # noqa: N802
        values = self.pull_sparse(request.table_id, codec.keys_from_bytes(request.keys),
                                  request.create, request.with_state)
        return msg.PullSparseResponse(values=codec.floats_to_bytes(values),
                                      dim=values.shape[1])

    def PushSparse(self, request: msg.PushSparseRequest) -> msg.PushResponse:  # noqa: N802
        if request.poll:  # a SYNC push's long poll: no payload
            return msg.PushResponse(done=self.poll_sync_push(_push_meta(request),
                                                             request.incarnation))
        table = self._table(request.table_id, SparseTable)
        shows = decode_counts(request.table_id, "shows", request.shows)
        clicks = decode_counts(request.table_id, "clicks", request.clicks)
        push = _push_meta(request)
        width = table.dim + (table.state_width if push.mode == PushMode.ROW_DELTA else 0)
        return msg.PushResponse(done=self.push_sparse(
            push, codec.keys_from_bytes(request.keys),
            codec.floats_from_bytes(request.grads, width), request.incarnation,
            shows, clicks))

    def PullDense(self, request: msg.PullDenseRequest) -> msg.PullDenseResponse:  # noqa: N802
        values = self.pull_dense(request.table_id, request.worker_index)
        return msg.PullDenseResponse(values=codec.floats_to_bytes(values))

    def PushDense(self, request: msg.PushDenseRequest) -> msg.PushResponse:  # noqa: N802
        if request.poll:  # a SYNC push's long poll: no payload
            return msg.PushResponse(done=self.poll_sync_push(_push_meta(request),
                                                             request.incarnation))
        return msg.PushResponse(done=self.push_dense(
            _push_meta(request), codec.floats_from_bytes(request.grads),
            request.incarnation))

    def Barrier(self, request: msg.BarrierRequest) -> msg.BarrierResponse:  # noqa: N802
        """One step of a barrier's long poll (``psfleet.ps.coordination.Barrier``):
        ``done`` false means call again. Waits at most ``wait_budget.max_wait_s``."""
        self._workers.check(f"barrier {request.name!r}", request.worker_index,
                            request.worker_num)
        check_name("Barrier", request.name, self.limits)
        done = self._barrier.arrive(request.name, request.worker_index, request.worker_num,
                                    self._barrier_timeout_s, request.incarnation, request.seq)
        return msg.BarrierResponse(done=done)

    def Clock(self, request: msg.ClockRequest) -> msg.ClockResponse:  # noqa: N802
        """One step of bounded staleness's long poll (``psfleet.ps.clocks``): records
        the worker's clock; ``done`` false means call again. Waits at most
        ``wait_budget.max_wait_s``."""
        self._workers.check("bounded staleness", request.worker_index, request.worker_num)
        parked = {msg.PARK: True, msg.RESUME: False}.get(request.parking)
        done, slowest = self._clocks.tick(
            request.worker_index, request.worker_num, request.incarnation, request.steps,
            parked, request.need, self._barrier_timeout_s)
        # A restarted worker's clock adds to its predecessor's: keep it a uint64.
        return msg.ClockResponse(done=done, slowest=min(slowest, (1 << 64) - 1))

    @staticmethod
    def _dense_index(entries: Iterable[msg.DenseIndex]) -> dict[int, np.ndarray]:
        return {e.table_id: codec.int64s_from_bytes(e.index) for e in entries}

    def Save(self, request: msg.SaveRequest) -> msg.SaveResponse:  # noqa: N802
        """Write every table (``psfleet.ps.table_admin.TableAdmin.save``)."""
        return self._admin.save(request)

    def Load(self, request: msg.LoadRequest) -> msg.Empty:  # noqa: N802
        """Replace the tables by a save, or apply a delta (``TableAdmin.load``)."""
        return self._admin.load(request)

    def copy_snapshot(self) -> tuple[ModeSnapshot, dict[int, np.ndarray],
                                     list[tuple[int, int]]]:
        """Every table at one moment (pushes held back), as a full save copies them,
        with the dense tables' flat indexes and the ids of the pushes applied so far:
        what a new copy of this server's share is filled from (``psfleet.ps.replica``).
        GBA's partial global batches are applied first (a copy holds no partial
        batch, so both copies gather the next one from the same point).
        """
        with self._tables_lock:
            tables = dict(self.tables)
            index = dict(self.dense_index)
        self._modes.apply_partial_global_batches(tables)
        with self._gate.closed():
            return snapshot_mode(tables, "full"), index, self._ledger.applied()

    def adopt(self, tables: dict[int, Table], dense_index: dict[int, np.ndarray],
              applied: list[tuple[int, int]]) -> None:
        """Take ``tables`` (read from a copy, :meth:`copy_snapshot`) as this service's,
        with the pushes the copy holds (their retries are not applied again)."""
        with self._tables_lock:
            self.tables.update(tables)
            self.dense_index.update(dense_index)
        self._ledger.mark_applied(applied)

    def coordination_state(self) -> str:
        """The barriers' arrivals and crossings and the workers' clocks, as JSON: what a
        new copy of this share takes with its tables, so that, once it serves, a worker
        not yet told of a crossing is told, and bounded staleness goes on where it was."""
        return json.dumps({"barriers": self._barrier.state(), "clocks": self._clocks.state()})

    def adopt_coordination(self, text: str) -> None:
        """Take :meth:`coordination_state` of another copy (nothing when ``text`` is
        empty)."""
        if text:
            state = json.loads(text)
            self._barrier.adopt_state(state["barriers"])
            self._clocks.adopt_state(state["clocks"])

    def drop_tables(self) -> None:
        """Forget every table (this process's copy of its share was released: another
        server holds it now); :meth:`adopt` fills the service again."""
        with self._tables_lock:
            self.tables.clear()
            self.dense_index.clear()

    def has_sync_rounds(self) -> bool:
        """Whether any sync-mode round was contributed to here (a sync-mode job)."""
        return self._modes.sparse_rounds.used or self._modes.dense_rounds.used

    def recover(self, checkpoint_dir: str, server_index: int) -> bool:
        """Re-create this server's tables from the newest complete checkpoint
        (``TableAdmin.recover``); False when there is none."""
        return self._admin.recover(checkpoint_dir, server_index)

    def Stats(self, request: msg.StatsRequest) -> msg.StatsResponse:  # noqa: N802
        with self._tables_lock:
            items = list(self.tables.items())
        counts = self.counters.snapshot()
        return msg.StatsResponse(uptime_s=time.monotonic() - self.started_s, tables=[
            msg.TableStats(table_id=tid, name=t.config.name, rows=len(t),
                           memory_bytes=t.memory_bytes,
                           rejected_non_finite=self._non_finite.get(tid, 0),
                           **lifecycle_stats(t),
                           **dataclasses.asdict(counts.get(tid, RequestCounts())))
            for tid, t in items])

    def Shrink(self, request: msg.ShrinkRequest) -> msg.ShrinkResponse:  # noqa: N802
        """Decay show/click and delete rows (``TableAdmin.shrink``)."""
        return self._admin.shrink(request)

    def AgeOneDay(self, request: msg.AgeOneDayRequest) -> msg.Empty:  # noqa: N802
        """Every row one day older (``TableAdmin.age_one_day``)."""
        return self._admin.age_one_day(request)

    def close(self) -> None:
        """Fail the calls blocked in a Barrier, a sync round or a bounded staleness wait
        (the server is stopping)."""
        self._barrier.close()
        self._clocks.close()
        self._modes.sparse_rounds.close()
        self._modes.dense_rounds.close()
        if self._modes.global_batches.decayed:
            logger.info("global batch aggregation: %d pushes were decayed for staleness "
                        "(a_sync_configs.max_staleness)", self._modes.global_batches.decayed)

    def Stop(self, request: msg.StopRequest) -> msg.Empty:  # noqa: N802
        logger.info("stop requested by worker %d", request.worker_index)
        self.stop_requested.set()
        return msg.Empty()


def _push_meta(request: msg.PushSparseRequest | msg.PushDenseRequest) -> PushMeta:
    """What a push message says besides its payload.

    Raises:
        InvalidRequestError: an unknown push mode.
    """
    try:
        mode = PushMode(request.mode)
    except ValueError:
        raise InvalidRequestError(f"push to table {request.table_id}: unknown push mode "
                          f"{request.mode!r}; one of {[m.name for m in PushMode]}") from None
    return PushMeta(table_id=request.table_id, mode=mode, worker_index=request.worker_index,
                    step=request.step, worker_num=request.worker_num,
                    push_id=(request.push_id.client_id, request.push_id.seq),
                    batches=request.batches, max_staleness=request.max_staleness)
