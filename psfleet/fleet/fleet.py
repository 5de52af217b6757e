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
import logging
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.join import Joinable

from psfleet import collective, env, logs
from psfleet.errors import ConfigError, FatalError
from psfleet.fleet.optimizer import DistributedOptimizer
from psfleet.fleet.persistence import PersistenceMixin, restart_num
from psfleet.fleet.role_maker import PaddleCloudRoleMaker, Role, RoleInfo, RoleMaker
from psfleet.fleet.strategy import DistributedStrategy
from psfleet.nn import live_embeddings
from psfleet.ps import LocalClient, RemoteClient, TableClient, run_server
from psfleet.ps.communicator import CollectiveCommunicator, Communicator, make_communicator
from psfleet.rpc import RpcConfig, parse_endpoint

__all__ = ["Fleet"]

logger = logging.getLogger(__name__)


class Fleet(PersistenceMixin):
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

