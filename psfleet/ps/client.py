"""The worker's view of the tables: create, pull, push, barrier, save, stop.

:class:`TableClient` is the one client: it routes keys to servers by virtual bucket,
cuts the dense vector into blocks, numbers pushes (at-most-once, see
``psfleet.ps.push_ledger``) and fans requests out to every server at once. Its
servers are reached through transports (``psfleet.ps.transport``):
``psfleet.ps.clients.RemoteClient`` over gRPC, ``psfleet.ps.clients.LocalClient`` by
direct calls into an in-process ``TableService`` (``server_num: 0``), so
single-machine training runs the same server code as a distributed job.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from psfleet.checkpoint.storage import FileDigest
from psfleet.errors import ConfigError, FatalError
from psfleet.ps.handles import PullHandle, PushHandle, wait_all
from psfleet.ps.lifecycle_service import check_show_clicks
from psfleet.ps.persist_delta import check_save_mode
from psfleet.ps.routing import BucketRouter, DenseLayout, RoutedKeys
from psfleet.ps.table.rules import make_rule
from psfleet.ps.transport import Transport
from psfleet.ps.types import (
    DenseTableConfig,
    PushMeta,
    PushMode,
    RuleConfig,
    SaveMode,
    SlicingConfig,
    SparseTableConfig,
)
from psfleet.ps.wait_budget import poll_until_done
from psfleet.rpc import codec
from psfleet.rpc import messages as msg

__all__ = ["TableClient", "PullHandle", "PushHandle"]

logger = logging.getLogger(__name__)


class TableClient:
    """Tables as a worker sees them, on the servers behind ``transports``. Thread safe.

    Args:
        transports: one per server, in server-index order.
        worker_index: this worker's index, sent with pushes and dense pulls.
        incarnation: this worker process's restart number (``PSFLEET_RESTART_NUM``;
            0: first start). At barriers a newer incarnation of a worker replaces
            an older one's arrival (``psfleet.ps.coordination.Barrier``).
    """

    def __init__(self, transports: Sequence[Transport], worker_index: int = 0,
                 incarnation: int = 0) -> None:
        self._servers = list(transports)
        self.incarnation = incarnation
        self._barrier_lock = threading.Lock()
        self._barrier_seqs: dict[str, int] = {}  # barrier name -> arrivals so far
        self.endpoints = [t.endpoint for t in self._servers]
        self.worker_index = worker_index
        self._client_id = secrets.randbits(63) | 1  # never 0 (0: a push without id)
        self._seq = itertools.count(1)
        self._routers: dict[int, BucketRouter] = {}
        self._dims: dict[int, int] = {}
        self._state_widths: dict[int, int] = {}  # sparse table id -> rule state floats
        self._layouts: dict[int, DenseLayout] = {}

    @property
    def share_num(self) -> int:
        """Shares the tables are cut into: one per transport (a save writes
        ``server-<share>/`` folders, one per share)."""
        return len(self._servers)

    def _push(self, table_id: int, mode: PushMode, step: int, worker_num: int,
              batches: int = 1, max_staleness: int = 0) -> PushMeta:
        """One push's description, with a new push id (the same on every server the
        push goes to)."""
        return PushMeta(table_id=table_id, mode=mode, worker_index=self.worker_index,
                        step=step, worker_num=worker_num,
                        push_id=(self._client_id, next(self._seq)), batches=batches,
                        max_staleness=max_staleness)

    def _all(self, method: str, requests: Sequence[object]) -> list[object]:
        """One call per server, in parallel; every call has ended when this returns or
        raises (see :func:`_wait_all`)."""
        return wait_all([c.start(method, r)
                          for c, r in zip(self._servers, requests, strict=True)])

    def create_sparse_table(self, table_id: int, config: SparseTableConfig) -> None:
        """Create the table on every server (no-op where it exists with this config).

        Raises:
            ConfigError: it exists with another config.
        """
        num = len(self._servers)
        self._all("CreateTable", [msg.CreateTableRequest(
            table_id=table_id, config_json=config.model_dump_json(), server_index=s,
            server_num=num) for s in range(num)])
        self._routers[table_id] = BucketRouter(config.num_buckets, len(self._servers))
        self._dims[table_id] = config.dim
        self._state_widths[table_id] = make_rule(config.rule).state_width(config.dim)

    def create_dense_table(self, table_id: int, name: str, shapes: Sequence[tuple[int, ...] | int],
                           rule: RuleConfig, init_values: np.ndarray,
                           slicing: SlicingConfig | None = None,
                           dc_asgd_lambda: float = 0.0) -> None:
        """Create a dense table holding parameters of the given shapes.

        Args:
            shapes: each dense parameter's shape, in order.
            init_values (float32[total]): used only by the first creator.
            slicing: how the parameters are cut into blocks placed on servers
                (None: SlicingConfig defaults).
            dc_asgd_lambda: DC-ASGD's lambda for async pushes (0: off).
        """
        layout = DenseLayout(shapes, len(self._servers), slicing, name)
        parts = layout.scatter(np.asarray(init_values, dtype=np.float32))
        requests = [
            msg.CreateTableRequest(
                table_id=table_id,
                config_json=DenseTableConfig(
                    name=name, size=layout.server_size(s), rule=rule,
                    dc_asgd_lambda=dc_asgd_lambda).model_dump_json(),
                init_values=codec.floats_to_bytes(parts[s]), server_index=s,
                server_num=len(self._servers),
                dense_index=layout.server_index(s).astype("<i8").tobytes())
            for s in range(len(self._servers))
        ]
        self._all("CreateTable", requests)
        self._layouts[table_id] = layout

    def route(self, table_id: int, keys: np.ndarray | RoutedKeys) -> RoutedKeys:
        """``keys`` (uint64[N]) with the server each goes to; routed keys of this table
        are returned as they are (a key is hashed once per step, not per call).

        Raises:
            FatalError: the table was not created by this client.
        """
        router = self._routers.get(table_id)
        if router is None:
            raise FatalError(f"sparse table {table_id} was not created by this worker; "
                             "fleet.init_worker() creates the tables")
        if isinstance(keys, RoutedKeys) and keys.router is router:
            return keys
        return router.route(keys.keys if isinstance(keys, RoutedKeys) else keys)

    def _layout(self, table_id: int) -> DenseLayout:
        layout = self._layouts.get(table_id)
        if layout is None:
            raise FatalError(f"dense table {table_id} was not created by this worker; "
                             "fleet.init_worker() creates the tables")
        return layout

    def pull_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    create: bool = True, with_state: bool = False) -> np.ndarray:
        """Rows of ``keys`` (uint64[N], or routed by :meth:`route`): float32[N, dim]
        (``with_state``: float32[N, :meth:`row_width`], values and rule state). Blocks.

        Args:
            create: create missing rows (training); False returns the initial
                values of missing rows without storing them (evaluation).
            with_state: also pull the rows' rule state (pass mode's worker cache).
        """
        return cast(np.ndarray, self.start_pull_sparse(table_id, keys, create,
                                                       with_state).result())

    def row_width(self, table_id: int) -> int:
        """Floats of a whole row of sparse table ``table_id``: dim + rule state."""
        return self._dims[table_id] + self._state_widths[table_id]

    def start_pull_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                          create: bool = True, with_state: bool = False) -> PullHandle:
        """Issue :meth:`pull_sparse` to every server at once and return without
        waiting for the rows."""
        routed = self.route(table_id, keys)
        keys, positions = routed.keys, routed.positions
        dim = self.row_width(table_id) if with_state else self._dims[table_id]
        pending = [(pos, c.start_pull_sparse(table_id, keys[pos], create, dim, with_state))
                   for c, pos in zip(self._servers, positions, strict=True) if pos.size]

        def collect() -> np.ndarray:
            if len(pending) == 1 and pending[0][0].size == keys.size:
                rows: np.ndarray = pending[0][1].result()
                return rows if rows.flags.writeable else rows.copy()  # a decoded buffer
            out = np.empty((keys.size, dim), dtype=np.float32)
            for pos, call in pending:
                out[pos] = call.result()
            return out

        return PullHandle(routed, collect)

    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys, grads: np.ndarray,
                    mode: PushMode = PushMode.APPLY, step: int = 0, worker_num: int = 1,
                    shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> None:
        """:meth:`start_push_sparse` and wait for it. Blocks."""
        self.start_push_sparse(table_id, keys, grads, mode, step, worker_num,
                               shows, clicks).result()

    def start_push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                          grads: np.ndarray, mode: PushMode = PushMode.APPLY, step: int = 0,
                          worker_num: int = 1, shows: np.ndarray | None = None,
                          clicks: np.ndarray | None = None, *, batches: int = 1,
                          max_staleness: int = 0) -> PushHandle:
        """Send float32[N, dim] gradients (or deltas) of distinct keys uint64[N] to
        their servers at once; the handle's ``result()`` waits until they applied them.

        Args:
            keys: the keys, or the keys routed by :meth:`route` (a pull's
                ``PullHandle.keys``).
            mode: APPLY, SYNC (returns once every worker's push of ``step`` was
                applied; every server gets a push, empty or not), DELTA,
                ROW_DELTA (values float32[N, :meth:`row_width`]) or AGGREGATE
                (gathered into a global batch, ``psfleet.ps.global_batch``; every
                server gets a push, empty or not, so every server counts it).
            step: SYNC: the step number, equal on every worker.
            worker_num: SYNC: how many workers push each step; AGGREGATE: the
                batches of a global batch.
            shows, clicks (float32[N] each, both or neither): per-key show and click
                counts for tables with the ``ctr`` accessor (APPLY and SYNC: with the
                gradients; DELTA: added to the rows' statistics; a SYNC round sums
                the workers' counts). None: no counts (the push costs what it did).
            batches: AGGREGATE: the worker batches the gradients sum (>= 1).
            max_staleness: AGGREGATE: global batches of staleness past which the
                servers decay the gradients (0: never).

        Raises:
            ConfigError: values, shows or clicks of the wrong shape, only one of the
                counts given, or NaN, Inf or negative counts (names it; nothing is sent).
        """
        routed = self.route(table_id, keys)
        keys, positions = routed.keys, routed.positions
        expected = (keys.size, self.row_width(table_id) if mode == PushMode.ROW_DELTA
                    else self._dims[table_id])
        if grads.shape != expected:
            raise ConfigError(f"push to sparse table {table_id}: values of shape "
                              f"{grads.shape}, expected {expected} (one row per key)")
        counts = check_show_clicks(table_id, keys.size, _floats(shows), _floats(clicks))
        push = self._push(table_id, mode, step, worker_num, batches, max_staleness)
        every = mode == PushMode.AGGREGATE  # each server counts each batch
        whole = len(positions) == 1  # one server: the arrays as they are
        if mode == PushMode.SYNC:  # a round counts every worker's push: every server
            requests = [msg.PushSparseRequest(
                table_id=table_id, keys=codec.keys_to_bytes(keys if whole else keys[pos]),
                grads=codec.floats_to_bytes(grads if whole else grads[pos]),
                **self._sync_fields(push)) for pos in positions]
            if counts is not None:
                for request, pos in zip(requests, positions, strict=True):
                    request.shows = codec.floats_to_bytes(counts[0] if whole else counts[0][pos])
                    request.clicks = codec.floats_to_bytes(counts[1] if whole
                                                           else counts[1][pos])
            return self._start_sync(push, requests, msg.PushSparseRequest)
        if counts is None:
            return PushHandle([
                c.start_push_sparse(push, keys if whole else keys[pos],
                                    grads if whole else grads[pos])
                for c, pos in zip(self._servers, positions, strict=True) if pos.size or every
            ])
        return PushHandle([
            c.start_push_sparse(push, keys if whole else keys[pos],
                                grads if whole else grads[pos],
                                counts[0] if whole else counts[0][pos],
                                counts[1] if whole else counts[1][pos])
            for c, pos in zip(self._servers, positions, strict=True) if pos.size or every
        ])

    def pull_dense(self, table_id: int) -> np.ndarray:
        """The whole dense vector, float32[total]. Blocks."""
        layout = self._layout(table_id)
        parts = wait_all([c.start_pull_dense(table_id, self.worker_index)
                           for c in self._servers])
        return layout.gather(parts)

    def push_dense(self, table_id: int, grads: np.ndarray, mode: PushMode = PushMode.APPLY,
                   step: int = 0, worker_num: int = 1) -> None:
        """:meth:`start_push_dense` and wait for it. Blocks."""
        self.start_push_dense(table_id, grads, mode, step, worker_num).result()

    def start_push_dense(self, table_id: int, grads: np.ndarray,
                         mode: PushMode = PushMode.APPLY, step: int = 0,
                         worker_num: int = 1, *, batches: int = 1,
                         max_staleness: int = 0) -> PushHandle:
        """Send the gradient (or delta) float32[total] of the dense vector, each block to
        its server, at once; the handle's ``result()`` waits until they applied it.

        ``mode``, ``step``, ``worker_num``, ``batches`` and ``max_staleness`` as for
        :meth:`start_push_sparse`.
        """
        parts = self._layout(table_id).scatter(grads)
        push = self._push(table_id, mode, step, worker_num, batches, max_staleness)
        if mode == PushMode.SYNC:
            return self._start_sync(push, [msg.PushDenseRequest(
                table_id=table_id, grads=codec.floats_to_bytes(p), **self._sync_fields(push))
                for p in parts], msg.PushDenseRequest)
        return PushHandle([c.start_push_dense(push, p)
                           for c, p in zip(self._servers, parts, strict=True)])

    def start_apply_global_batches(self, table_ids: Sequence[int], worker_num: int
                                   ) -> PushHandle:
        """Make every server apply the partial global batch it gathered for each of
        ``table_ids`` (AGGREGATE pushes of no batches: a worker's flush, so no pushed
        gradient stays unapplied at the end of an epoch or before a save).

        Args:
            table_ids: sparse or dense tables created through this client.
            worker_num: the batches of a global batch, as in the table's pushes.
        """
        calls = []
        for table_id in table_ids:
            push = self._push(table_id, PushMode.AGGREGATE, 0, worker_num, batches=0)
            if table_id in self._layouts:
                calls += [c.start_push_dense(push, np.empty(0, np.float32))
                          for c in self._servers]
            else:
                empty = np.empty((0, self._dims[table_id]), np.float32)
                calls += [c.start_push_sparse(push, np.empty(0, np.uint64), empty)
                          for c in self._servers]
        return PushHandle(calls)

    def _sync_fields(self, push: PushMeta) -> dict[str, Any]:
        """The fields of a SYNC push message besides its payload."""
        client_id, seq = push.push_id
        return {"worker_index": push.worker_index, "step": push.step, "mode": msg.SYNC,
                "worker_num": push.worker_num, "incarnation": self.incarnation,
                "push_id": msg.PushId(client_id=client_id, seq=seq)}

    def _start_sync(self, push: PushMeta, requests: Sequence[Any],
                    kind: type[msg.PushSparseRequest] | type[msg.PushDenseRequest]
                    ) -> PushHandle:
        """Send a SYNC push's message to each server; the handle polls each server
        whose round is not applied yet (the same push, ``poll`` set, no payload)."""
        method = "PushSparse" if kind is msg.PushSparseRequest else "PushDense"
        poll_request = kind(table_id=push.table_id, poll=True, **self._sync_fields(push))

        def poller(server: Transport) -> Callable[[], bool]:
            return lambda: bool(server.start(method, poll_request).result().done)

        return PushHandle([c.start(method, r) for c, r in zip(self._servers, requests,
                                                               strict=True)],
                          [poller(c) for c in self._servers])

    def _dense_index(self, server: int) -> list[msg.DenseIndex]:
        return [msg.DenseIndex(table_id=tid, index=layout.server_index(server).astype(
            "<i8").tobytes()) for tid, layout in self._layouts.items()]

    def _request_id(self) -> msg.PushId:
        """A new id for an admin call (the same on every server it goes to; a retry
        of the call reuses it, so the servers run it once)."""
        return msg.PushId(client_id=self._client_id, seq=next(self._seq))

    def save(self, dirname: str, mode: SaveMode = "full") -> list[FileDigest]:
        """Every server writes its tables (values, optimizer state) under ``dirname``.

        Call on one worker after every worker flushed (see ``psfleet.ps.persist``).

        Args:
            dirname: a local path or an fsspec URL the servers can write.
            mode: ``full`` (every row, rule state and statistics; checkpoints),
                ``base`` or ``delta`` (``psfleet.ps.persist_delta``).

        Returns:
            The files written with their checksums, when the tables report them.

        Raises:
            ConfigError: an unknown ``mode``, or ``delta`` with a sparse table
                without the ctr accessor (names it).
        """
        check_save_mode(mode, f"save({dirname!r})")
        request_id = self._request_id()
        replies = self._all("Save", [msg.SaveRequest(dirname=dirname, server_index=s,
                                                     dense=self._dense_index(s), mode=mode,
                                                     request_id=request_id)
                                     for s in range(len(self._servers))])
        return [FileDigest(f.path, f.size, f.sha256)
                for r in replies for f in r.files]  # type: ignore[attr-defined]

    def load(self, dirname: str) -> None:
        """Every server loads its share of a save (any server count) into its tables:
        a full or base save replaces them, a delta save is applied on top
        (``psfleet.ps.persist_delta``).

        Raises:
            DataError, RemoteError: a table is missing from the save or does not fit.
        """
        self._all("Load", [msg.LoadRequest(dirname=dirname, server_index=s,
                                           server_num=len(self._servers),
                                           dense=self._dense_index(s))
                           for s in range(len(self._servers))])

    def barrier(self, name: str, worker_index: int, worker_num: int) -> None:
        """Block until all ``worker_num`` workers called barrier ``name``.

        A long poll on server 0 (``psfleet.ps.wait_budget``): the same request (this
        client's incarnation and its arrival number at ``name``) is sent until the
        server answers done, so a waiting worker holds no server thread for long.

        Raises:
            RemoteError: the others did not arrive within the server's barrier
                timeout (names them), the server is stopping, or a restarted copy of
                this worker (newer incarnation) arrived since (this process is stale).
        """
        with self._barrier_lock:
            seq = self._barrier_seqs[name] = self._barrier_seqs.get(name, 0) + 1
        request = msg.BarrierRequest(name=name, worker_index=worker_index,
                                     worker_num=worker_num, incarnation=self.incarnation,
                                     seq=seq)
        server = self._servers[0]
        poll_until_done(lambda: bool(server.start("Barrier", request).result().done))

    def clock(self, worker_num: int, steps: int, parked: bool | None = None, need: int = 0
              ) -> tuple[bool, int]:
        """One call of bounded staleness's long poll on server 0 (``psfleet.ps.clocks``):
        report this worker's clock and, with ``need`` > 0, wait a little (at most the
        server's ``max_wait_s``) until every worker's clock reached it.

        Args:
            worker_num: workers of the job.
            steps: this worker's steps the servers acknowledged.
            parked: True: this worker holds no one back from now on (it waits for
                the others); False: it does again; None: as it was.
            need: the slowest clock to wait for; 0: only report.

        Returns:
            ``(done, slowest)``: whether the slowest clock reached ``need`` (False: call
            again, with this worker's clock as it is then), and the slowest clock of the
            workers heard from and not parked (``need`` when there is none).

        Raises:
            RemoteError: the slowest workers did not reach ``need`` within the server's
                barrier timeout (names them), the server is stopping, or a restarted
                copy of this worker reported since (this process is stale).
        """
        reply = self._servers[0].start("Clock", msg.ClockRequest(
            worker_index=self.worker_index, worker_num=worker_num,
            incarnation=self.incarnation, steps=steps, need=need,
            parking={None: msg.KEEP_PARKING, True: msg.PARK, False: msg.RESUME}[parked])
            ).result()
        return bool(reply.done), int(reply.slowest)

    def stop_servers(self, worker_index: int) -> None:
        """Tell every server to stop serving."""
        self._all("Stop", [msg.StopRequest(worker_index=worker_index)] * len(self._servers))
        logger.info("told servers %s to stop", self.endpoints)

    def shrink(self, table_id: int | None = None) -> int:
        """Every server shrinks its share of sparse table ``table_id`` (None: of every
        sparse table): show/click decay, then rows below the accessor's
        ``delete_threshold`` or unseen longer than ``delete_after_unseen_days`` are
        deleted (tables without the ``ctr`` accessor are unchanged). Blocks.

        Returns:
            The rows deleted on all servers.

        Raises:
            RemoteError: ``table_id`` is not a sparse table.
        """
        request = msg.ShrinkRequest(all_tables=table_id is None, table_id=table_id or 0,
                                    request_id=self._request_id())
        replies: list[Any] = self._all("Shrink", [request] * len(self._servers))
        return sum(int(r.deleted) for r in replies)

    def age_one_day(self, table_id: int | None = None) -> None:
        """Every server adds one to the unseen_days of every row of sparse table
        ``table_id`` (None: of every sparse table); a day or pass boundary. Blocks.

        Raises:
            RemoteError: ``table_id`` is not a sparse table.
        """
        request = msg.AgeOneDayRequest(all_tables=table_id is None, table_id=table_id or 0,
                                       request_id=self._request_id())
        self._all("AgeOneDay", [request] * len(self._servers))

    def stats(self) -> list[msg.StatsResponse]:
        """Each server's table statistics (rows, bytes)."""
        return self._all("Stats", [msg.StatsRequest()] * len(self._servers))  # type: ignore[return-value]

    def close(self) -> None:
        """Release the connections."""
        for c in self._servers:
            c.close()


def _floats(counts: np.ndarray | None) -> np.ndarray | None:
    """``counts`` as a contiguous float32 array (None stays None)."""
    return None if counts is None else np.ascontiguousarray(counts, dtype=np.float32)
