"""The Fleet: one API for servers and workers, as the seeds' ``fleet`` object.

The paradigm (the same script runs as server and as worker, and alone on a laptop)::

    fleet.init()                                      # role from the environment
    model = DNN(SparseEmbedding(dim=9), ...)
    optimizer = fleet.distributed_optimizer(torch.optim.Adam(model.parameters()))
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()                            # blocks until workers stop it
    else:
        fleet.init_worker()                           # connect, create tables
        for batch in reader:
            loss = ...; optimizer.zero_grad(); loss.backward(); optimizer.step()
        fleet.stop_worker()                           # flush, stop servers

Collective mode (``fleet.init(is_collective=True)``): no servers; every rank trains
``fleet.distributed_model(model)`` (DDP, example-weighted all-reduce) inside
``with fleet.join():`` on in-process tables kept identical on every rank
(``psfleet.collective``, ``psfleet.ps.communicator.collective_mode``). In the
parameter-server modes ``distributed_model`` returns the model and ``join`` does
nothing, so one script runs in both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.join import Joinable

from psfleet import collective, env, logs
from psfleet.checkpoint import (
    CheckpointConfig,
    CheckpointError,
    CheckpointStore,
    Cursor,
    FileDigest,
    Manifest,
    Storage,
)
from psfleet.checkpoint.compat import check_compatible
from psfleet.checkpoint.cursors import (
    read_cursors,
    read_resume_name,
    write_cursor,
    write_resume_name,
)
from psfleet.checkpoint.storage import sha256_of
from psfleet.errors import ConfigError, FatalError, PsfleetError
from psfleet.export import InferenceManifest
from psfleet.export import save_inference_model as _save_inference_model
from psfleet.fleet.optimizer import DistributedOptimizer
from psfleet.fleet.role_maker import PaddleCloudRoleMaker, Role, RoleInfo, RoleMaker
from psfleet.fleet.strategy import DistributedStrategy
from psfleet.nn import live_embeddings
from psfleet.ps import LocalClient, RemoteClient, TableClient, run_server
from psfleet.ps.communicator import CollectiveCommunicator, Communicator, make_communicator
from psfleet.ps.persist import FORMAT_VERSION
from psfleet.rpc import RpcConfig, parse_endpoint

__all__ = ["Fleet", "restart_num"]

logger = logging.getLogger(__name__)


def restart_num() -> int:
    """How many times the launcher restarted this process (``PSFLEET_RESTART_NUM``)."""
    raw = env.read("PSFLEET_RESTART_NUM") or "0"
    try:
        return max(int(raw), 0)
    except ValueError:
        raise ConfigError(f"PSFLEET_RESTART_NUM: {raw!r} is not an integer") from None


def _digests(storage: Storage) -> list[FileDigest]:
    """Checksums of every file under ``storage`` (tables written in this process)."""
    root = storage.root.rstrip("/") + "/"
    out = []
    for path in storage.fs.find(storage.root):
        rel = path[len(root):] if path.startswith(root) else path
        size, digest = sha256_of(storage, rel)
        out.append(FileDigest(rel, size, digest))
    return out


class Fleet:
    """Process-wide training state: role, strategy, tables, communicator."""

    def __init__(self) -> None:
        self._role: RoleInfo | None = None
        self.strategy = DistributedStrategy()
        self.rpc_config = RpcConfig()
        self._optimizer: DistributedOptimizer | None = None
        self._client: TableClient | None = None
        self._communicator: Communicator | None = None
        self._preload_dir: Path | None = None
        self._checkpoint_dir: str | None = None
        self._collective: collective.CollectiveContext | None = None
        self._examples = collective.ExampleCounter()
        self._model: nn.Module | None = None

    # -- role -------------------------------------------------------------------------
    def init(self, role_maker: RoleMaker | None = None,
             strategy: DistributedStrategy | None = None, is_collective: bool = False) -> None:
        """Decide this process's role (from the environment by default).

        Collective mode (``is_collective=True`` or ``strategy.mode == "collective"``):
        no servers; this process is a rank of a torch.distributed process group
        created from the environment (``psfleet.collective.rendezvous_from_env``);
        worker_index / worker_num are the rank / world size.

        Raises:
            ConfigError: called twice, or the environment is inconsistent (names the
                variable), or is_collective=True with a parameter-server strategy.
            FatalError: collective mode: the rendezvous endpoint cannot be reached
                within PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S (names it).
        """
        if self._role is not None:
            raise ConfigError("fleet.init() was already called in this process")
        if is_collective or (strategy is not None and strategy.mode == "collective"):
            self._init_collective(role_maker, strategy)
            return
        self._role = (role_maker or PaddleCloudRoleMaker()).generate_role()
        self.strategy = strategy or self.strategy
        self.rpc_config = RpcConfig.from_env()
        logs.setup_logging()
        role = self._role
        logs.set_role(f"server:{role.server_index}" if role.role is Role.SERVER
                      else f"worker:{role.worker_index}")
        logger.info("fleet.init: %s, strategy %s", role, self.strategy.model_dump())

    def _init_collective(self, role_maker: RoleMaker | None,
                         strategy: DistributedStrategy | None) -> None:
        if role_maker is not None:
            raise ConfigError("role_maker: not used in collective mode; the rank and world size "
                              "come from RANK / WORLD_SIZE (or PADDLE_TRAINER_ID / "
                              "PADDLE_TRAINERS_NUM): drop role_maker")
        if strategy is not None and strategy.mode != "collective":
            raise ConfigError(f"strategy.mode is {strategy.mode!r} but is_collective=True: use "
                              "DistributedStrategy(mode='collective') or drop is_collective")
        logs.setup_logging()
        self.strategy = strategy or DistributedStrategy(mode="collective")
        backend = self.strategy.collective_backend
        context = collective.init_process_group(backend=None if backend == "auto" else backend)
        self._collective = context
        self._role = RoleInfo(Role.WORKER, context.rank, context.world_size)
        logs.set_role(f"worker:{context.rank}")
        logger.info("fleet.init: collective mode, rank %d of %d, backend %s on %s",
                    context.rank, context.world_size, context.backend, context.device)

    def is_collective(self) -> bool:
        """Whether this process trains in collective mode (after :meth:`init`)."""
        return self._collective is not None

    @property
    def role(self) -> RoleInfo:
        """This process's role. Raises FatalError before :meth:`init`."""
        if self._role is None:
            raise FatalError("call fleet.init() first")
        return self._role

    def is_server(self) -> bool:
        return self.role.role is Role.SERVER

    def is_worker(self) -> bool:
        return self.role.role is Role.WORKER

    def is_first_worker(self) -> bool:
        return self.is_worker() and self.role.worker_index == 0

    def worker_index(self) -> int:
        return self.role.worker_index

    def worker_num(self) -> int:
        return self.role.worker_num

    def server_num(self) -> int:
        return len(self.role.server_endpoints)

    def server_endpoints(self) -> list[str]:
        return list(self.role.server_endpoints)

    # -- server -----------------------------------------------------------------------
    def init_server(self, dirname: str | None = None,
                    checkpoint_dir: str | None = None) -> None:
        """Prepare the server. Tables are created by the workers at init_worker.

        Args:
            dirname: a save (``save_persistables``) to load every table from when the
                workers create it; this server keeps its share (any server count).
            checkpoint_dir: where the job's checkpoints are (``CheckpointConfig``;
                default ``PSFLEET_CHECKPOINT_DIR``). A server the launcher restarted
                (``PSFLEET_RESTART_NUM`` > 0) re-creates its tables from the newest
                complete checkpoint there before it listens.

        Raises:
            ConfigError: this process is not a server, or ``dirname`` has no manifest.
        """
        if not self.is_server():
            raise ConfigError("init_server() called on a worker")
        if dirname is not None:
            if not (Path(dirname) / "manifest.json").is_file():
                raise ConfigError(f"init_server(dirname={dirname!r}): no manifest.json there; "
                                  "pass a folder written by fleet.save_persistables()")
            self._preload_dir = Path(dirname)
        self._checkpoint_dir = checkpoint_dir or env.read("PSFLEET_CHECKPOINT_DIR")

    def run_server(self) -> None:
        """Serve tables until a worker's stop_worker() (or SIGTERM). Blocks."""
        role = self.role
        if role.bind_endpoint is None:
            raise ConfigError("run_server() called on a worker")
        host, port = parse_endpoint(role.bind_endpoint, "POD_IP:PADDLE_PORT")
        recover = None
        if restart_num() > 0:
            if self._checkpoint_dir is None:
                logger.warning("restarted server without a checkpoint_dir: it starts with "
                               "no tables; workers' calls to it will fail")
            else:
                recover = (self._checkpoint_dir, role.server_index)
        run_server(host, port, self.rpc_config, role.endpoint_file, self._preload_dir,
                   recover)

    # -- worker -----------------------------------------------------------------------
    def distributed_model(self, model: nn.Module) -> nn.Module:
        """The model to train with: wrapped for data parallelism in collective mode.

        Collective mode: moves ``model`` to this rank's device and wraps it in
        DistributedDataParallel whose gradient all-reduce is weighted by each rank's
        example count (``psfleet.collective.ddp``); run the training forward through
        the returned module. Every rank must call it, at the same point. In the
        parameter-server modes it returns ``model`` itself, so one script runs in both.

        Raises:
            FatalError: :meth:`init` was not called.
        """
        self.role  # noqa: B018  (raises before init)
        if self._collective is None:
            return model
        self._model = collective.wrap_model(model, self._examples, self._collective.device)
        return self._model

    def join(self) -> AbstractContextManager[Any]:
        """A context for a training loop whose ranks may run different step counts.

        Collective mode: torch's ``Join`` over the model from :meth:`distributed_model`
        and the sparse communicator; a rank that finishes its batches early keeps
        answering the others' all-reduces and all-gathers (contributing no examples)
        until every rank is done. Other modes: a context that does nothing.

        Raises:
            FatalError: collective mode and :meth:`init_worker` was not called.
        """
        if self._collective is None:
            return contextlib.nullcontext()
        communicator = self._communicator
        if not isinstance(communicator, Joinable):
            raise FatalError("call fleet.init_worker() before fleet.join()")
        joinables = [m for m in (self._model,) if isinstance(m, Joinable)]
        return collective.JoinContext([*joinables, communicator], self._examples)

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer,
                              strategy: DistributedStrategy | None = None
                              ) -> DistributedOptimizer:
        """Wrap ``optimizer``; its type and settings become the tables' rule.

        Raises:
            ConfigError: the optimizer has no table rule.
        """
        if strategy is not None:
            if (strategy.mode == "collective") != (self._collective is not None):
                raise ConfigError(f"strategy.mode {strategy.mode!r} does not match "
                                  "fleet.init(): pass the strategy to fleet.init() instead")
            self.strategy = strategy
        self._optimizer = DistributedOptimizer(optimizer)
        return self._optimizer

    def init_worker(self) -> None:
        """Connect to the servers (or in-process tables) and create the tables.

        Waits for every server with a visible, bounded retry; creates one sparse
        table per SparseEmbedding and one dense table for the optimizer's
        parameters; every worker starts from the dense values the servers hold.

        Raises:
            FatalError: distributed_optimizer() was not called first.
            ServerNotReadyError: servers not ready within the wait timeout.
        """
        role = self.role
        if role.role is not Role.WORKER:
            raise ConfigError("init_worker() called on a server")
        if self._optimizer is None:
            raise FatalError("call fleet.distributed_optimizer(optimizer) before "
                             "fleet.init_worker(): the optimizer decides the tables' rule")
        client: TableClient
        strategy = self.strategy
        settings = strategy.communicator_settings(role.worker_num)
        if self._collective is not None:  # every rank holds every table
            client, mode = LocalClient(), "collective"
            settings = dataclasses.replace(settings, example_count=self._examples.take,
                                           device=self._collective.device)
        elif role.is_local:
            client, mode = LocalClient(), "local"
        else:
            remote = RemoteClient(role.server_endpoints, self.rpc_config, role.worker_index)
            remote.wait_ready(self._wait_timeout_s())
            client, mode = remote, strategy.mode
        communicator = make_communicator(mode, client, settings)
        embeddings = live_embeddings()
        opt = self._optimizer
        for table_id, embedding in enumerate(embeddings):
            config = embedding.table_config(opt.rule)
            client.create_sparse_table(table_id, config)
            communicator.on_sparse_table(table_id, config)
            embedding.bind(communicator, table_id)
        dense_id = len(embeddings)
        initial = opt.flat_values()
        if self._collective is not None:  # every rank's table starts from rank 0's values
            initial = collective.broadcast_from_rank0(initial, self._collective.device)
        client.create_dense_table(
            dense_id, "dense", [tuple(p.shape) for p in opt.params], opt.rule,
            initial, strategy.slicing(),
            strategy.dc_asgd_lambda if strategy.dc_asgd else 0.0)
        if restart_num() == 0:  # a restarted worker joins a job already running
            self._barrier("init_worker", client)
        values = client.pull_dense(dense_id)
        opt.install(values)
        communicator.on_dense_table(dense_id, opt.rule, values)
        opt.bind(communicator, embeddings, dense_id)
        if isinstance(communicator, CollectiveCommunicator):  # a joined rank steps too
            communicator.shadow_step = opt.step
        communicator.start()
        self._client, self._communicator = client, communicator
        logger.info("worker %d/%d ready: %s mode, %d sparse tables, %d dense parameters, "
                    "servers %s", role.worker_index, role.worker_num, mode, len(embeddings),
                    sum(p.numel() for p in opt.params), list(role.server_endpoints))

    def _wait_timeout_s(self) -> float:
        if self.strategy.server_wait_timeout_s is not None:
            return self.strategy.server_wait_timeout_s
        raw = env.read("PSFLEET_SERVER_WAIT_TIMEOUT_S") or "300"
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"PSFLEET_SERVER_WAIT_TIMEOUT_S: {raw!r} is not seconds") from None

    @property
    def client(self) -> TableClient:
        """The tables (after init_worker)."""
        if self._client is None:
            raise FatalError("call fleet.init_worker() first")
        return self._client

    def barrier_worker(self) -> None:
        """Block until every worker reaches this call (collective: every rank)."""
        self._barrier("barrier_worker", None)

    def _barrier(self, name: str, client: TableClient | None) -> None:
        if self._collective is not None:
            collective.barrier()
        else:
            (client or self.client).barrier(name, self.role.worker_index, self.role.worker_num)

    def flush(self) -> None:
        """Block until this worker's pushes so far are applied; install fresh dense values.

        Other workers' pushes may still be in flight: call :meth:`barrier_worker`
        after every worker flushed, then ``optimizer.refresh()``, to see them all.
        """
        if self._communicator is not None:
            self._communicator.flush()
        if self._optimizer is not None:
            self._optimizer.refresh()

    def save_persistables(self, dirname: str) -> None:
        """Save every table (values and optimizer state) to ``dirname``.

        Call on one worker (``is_first_worker()``), after ``barrier_worker()`` when
        every worker's updates must be in it. This worker's pushes are flushed first.
        Each server writes its share; this worker writes ``manifest.json``.

        Raises:
            FatalError: init_worker() was not called.
            OSError: ``dirname`` cannot be written.
        """
        self.flush()
        self.client.save(dirname)
        embeddings = live_embeddings()
        manifest = {
            "format_version": FORMAT_VERSION, "server_num": max(self.server_num(), 1),
            "worker_num": self.worker_num(), "mode": self.strategy.mode,
            "sparse_tables": {e.name: i for i, e in enumerate(embeddings)},
            "dense_shapes": [list(p.shape) for p in self._require_optimizer().params],
        }
        (Path(dirname) / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        logger.info("saved tables to %s", dirname)

    def load_model(self, dirname: str) -> None:
        """Load a save into the servers' tables; every worker calls it after init_worker.

        Worker 0 asks every server to load its share (the save may come from another
        server count); then every worker takes the loaded dense values.

        Raises:
            ConfigError: ``dirname`` has no manifest.json.
            DataError, RemoteError: a table is missing from the save or does not fit
                (names the table and both values).
        """
        if not (Path(dirname) / "manifest.json").is_file():
            raise ConfigError(f"load_model({dirname!r}): no manifest.json there; pass a "
                              "folder written by fleet.save_persistables()")
        role = self.role
        if role.worker_index == 0 or self._collective is not None:  # collective: every rank
            self.client.load(dirname)
        self._barrier("load_model", self.client)
        optimizer = self._require_optimizer()
        optimizer.refresh()
        if self._communicator is not None:
            self._communicator.on_dense_table(len(live_embeddings()), optimizer.rule,
                                              optimizer.flat_values())

    def save_inference_model(self, dirname: str, model: torch.nn.Module,
                             example_inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
                             metadata: dict[str, object] | None = None) -> InferenceManifest:
        """Export ``model`` for serving: dense tower (torch.export) and sparse rows (.npy).

        Call on one worker (``is_first_worker()``) after ``flush()`` and
        ``barrier_worker()`` when every worker's updates must be in it; this worker's
        pushes are flushed and its dense parameters refreshed first. Works with
        servers (they write their rows to a staging folder in ``dirname``, so they
        must be able to write there) and with in-process tables. Layout and loading:
        :mod:`psfleet.export` (``load_inference_model``, ``psfleet predict``).

        Args:
            dirname: the model directory (local path or fsspec URL).
            model: ``(sparse_ids int64[B, S], dense float32[B, F]) -> logits[B]``
                through its SparseEmbeddings.
            example_inputs: one batch (only shapes past the batch dimension matter);
                None: from ``model.num_slots`` / ``model.num_dense``.
            metadata: JSON-serialisable, stored in ``manifest.json``.

        Returns:
            The manifest written.

        Raises:
            FatalError: init_worker() was not called, or torch.export failed.
            ConfigError: the model cannot be exported (see ``export_dense_tower``).
            OSError: ``dirname`` cannot be written.
        """
        self.flush()
        opt = self._require_optimizer()
        tables = {e.name: (i, e.table_config(opt.rule))
                  for i, e in enumerate(live_embeddings())}
        return _save_inference_model(dirname, model, self.client, tables, example_inputs,
                                     metadata)

    # -- checkpoints ------------------------------------------------------------------
    def _table_configs(self) -> dict[str, dict[str, object]]:
        rule = self._require_optimizer().rule
        return {e.name: e.table_config(rule).model_dump(mode="json")
                for e in live_embeddings()}

    def save_checkpoint(self, config: CheckpointConfig, cursor: Cursor,
                        extra: dict[str, object] | None = None) -> str | None:
        """Take a checkpoint; every worker calls it at the same point of training.

        Each worker flushes its pushes and publishes its cursor; once all did, worker 0
        has every server copy its tables at one moment (pushes held back) and write
        them, writes the manifest (step, cursors, table configs, strategy, checksums)
        and publishes the checkpoint atomically, keeping the last
        ``max_num_checkpoints``. The workers continue when it is published. In sync
        mode every worker is at the same step, so the checkpoint is globally
        consistent; in async mode each server's copy is consistent.

        A failed write (full or read-only storage) is logged as an error naming the
        cause, its temporary folder is removed and training continues: the previous
        checkpoints stay intact and loadable.

        Args:
            config: where and how many to keep.
            cursor: this worker's position: epoch, batches done in it, steps done.
            extra: free-form values stored in the manifest (worker 0's).

        Returns:
            On worker 0, the published checkpoint's URL (None if it failed); None on
            other workers.

        Raises:
            FatalError: init_worker() was not called.
        """
        role = self.role
        store = CheckpointStore(config.checkpoint_dir, config.max_num_checkpoints)
        self.flush()
        write_cursor(store.storage, role.worker_index, cursor)
        self._barrier("checkpoint.begin", self.client)
        url = None
        if role.worker_index == 0:
            url = self._write_checkpoint(store, cursor, extra or {})
        self._barrier("checkpoint.end", self.client)
        return url

    def _write_checkpoint(self, store: CheckpointStore, cursor: Cursor,
                          extra: dict[str, object]) -> str | None:
        role = self.role
        optimizer = self._require_optimizer()
        pending = None
        try:
            cursors = read_cursors(store.storage, role.worker_num)
            pending = store.begin(cursor.step)
            digests = self.client.save(pending.storage.url)
            pending.add(digests if digests is not None else _digests(pending.storage))
            manifest = Manifest(
                step=cursor.step, epoch=cursor.epoch, batch=cursor.batch,
                server_num=max(self.server_num(), 1), worker_num=role.worker_num,
                mode=self.strategy.mode if self.server_num() else "local",
                strategy=self.strategy.model_dump(mode="json"),
                sparse_tables={name: {**c, "table_id": i} for i, (name, c) in
                               enumerate(self._table_configs().items())},
                dense={"table_id": len(live_embeddings()),
                       "shapes": [list(p.shape) for p in optimizer.params],
                       "rule": optimizer.rule.model_dump(mode="json")},
                cursors=cursors, extra=extra)
            url = store.commit(pending, manifest)
        except (OSError, PsfleetError) as exc:
            if pending is not None:
                store.abort(pending)
            logger.error("checkpoint at step %d FAILED, training goes on and the previous "
                         "checkpoints in %s stay intact: %s", cursor.step, store.storage.url,
                         exc)
            return None
        logger.info("checkpoint at epoch %d batch %d (step %d) written to %s", cursor.epoch,
                    cursor.batch, cursor.step, url)
        return url

    def load_checkpoint(self, config: CheckpointConfig | str) -> Cursor | None:
        """Resume from the newest complete checkpoint; every worker calls it after
        init_worker (the servers may be more or fewer than when it was written).

        Worker 0 picks the newest checkpoint whose files all verify (a damaged one is
        skipped with a warning naming the file), checks that it fits the model, and
        has every server load its buckets and dense blocks; then every worker takes
        the loaded dense values and its cursor. A worker the launcher restarted
        (``PSFLEET_RESTART_NUM`` > 0) rejoins a running job instead: it loads nothing
        into the servers and only takes its cursor.

        Returns:
            This worker's cursor in the checkpoint (None when there is none yet).
            Also sets the optimizer's step count.

        Raises:
            CheckpointError: the checkpoint does not fit the model (names the table and
                both values), or the worker count changed in the middle of an epoch.
        """
        url = config if isinstance(config, str) else config.checkpoint_dir
        store = CheckpointStore(url)
        role = self.role
        optimizer = self._require_optimizer()
        if restart_num() > 0:
            latest = store.latest()
            if latest is None:
                return None
            logger.info("restarted worker %d rejoins from checkpoint %s", role.worker_index,
                        latest.storage.url)
            return self._cursor_of(latest.manifest, latest.storage.url)
        # Collective: every rank holds all tables in process, so every rank loads them.
        if role.worker_index == 0 or self._collective is not None:
            latest = store.latest()
            if latest is not None:
                check_compatible(latest.manifest, latest.storage.url, self._table_configs(),
                                 [list(p.shape) for p in optimizer.params],
                                 optimizer.rule.model_dump(mode="json"))
                self.client.load(latest.storage.url)
                logger.info("resumed tables from checkpoint %s (step %d, %d server(s) then, "
                            "%d now)", latest.storage.url, latest.manifest.step,
                            latest.manifest.server_num, max(self.server_num(), 1))
            if role.worker_index == 0:
                write_resume_name(store.storage, latest.name if latest else None)
        self._barrier("load_checkpoint", self.client)
        name = read_resume_name(store.storage)
        if name is None:
            return None
        optimizer.refresh()
        if self._communicator is not None:
            self._communicator.on_dense_table(len(live_embeddings()), optimizer.rule,
                                              optimizer.flat_values())
        storage = store.storage.child(name)
        manifest = Manifest.model_validate_json(storage.read_bytes("manifest.json"))
        return self._cursor_of(manifest, storage.url)

    def _cursor_of(self, manifest: Manifest, where: str) -> Cursor:
        role = self.role
        if manifest.worker_num == role.worker_num and role.worker_index < len(manifest.cursors):
            cursor = manifest.cursors[role.worker_index]
        elif manifest.batch == 0:  # an epoch boundary: any worker count may go on
            cursor = Cursor(epoch=manifest.epoch, batch=0, step=manifest.step)
        else:
            raise CheckpointError(
                f"checkpoint {where} was taken in the middle of epoch {manifest.epoch} with "
                f"worker_num {manifest.worker_num}; this job has worker_num "
                f"{role.worker_num}. Resume with {manifest.worker_num} workers, or from a "
                "checkpoint taken at an epoch end")
        self._require_optimizer().steps = cursor.step
        return cursor

    def _require_optimizer(self) -> DistributedOptimizer:
        if self._optimizer is None:
            raise FatalError("call fleet.distributed_optimizer(optimizer) first")
        return self._optimizer

    def stop_worker(self) -> None:
        """Flush pushes, wait for every worker, then (worker 0) stop the servers.

        Collective mode: after the barrier every rank leaves the process group.
        """
        if self._communicator is not None:
            self._communicator.stop()
        if self._client is not None:
            role = self.role
            self._barrier("stop_worker", self._client)
            if role.worker_index == 0:
                self._client.stop_servers(role.worker_index)
            self._client.close()
        if self._collective is not None:
            collective.destroy_process_group()
        self._client = self._communicator = None

