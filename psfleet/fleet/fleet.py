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
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from psfleet import env, logs
from psfleet.errors import ConfigError, FatalError
from psfleet.fleet.optimizer import DistributedOptimizer
from psfleet.fleet.role_maker import PaddleCloudRoleMaker, Role, RoleInfo, RoleMaker
from psfleet.fleet.strategy import DistributedStrategy
from psfleet.nn import live_embeddings
from psfleet.ps import LocalClient, RemoteClient, TableClient, run_server
from psfleet.ps.communicator import Communicator, make_communicator
from psfleet.ps.persist import FORMAT_VERSION
from psfleet.rpc import RpcConfig, parse_endpoint

__all__ = ["Fleet"]

logger = logging.getLogger(__name__)


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

    # -- role -------------------------------------------------------------------------
    def init(self, role_maker: RoleMaker | None = None,
             strategy: DistributedStrategy | None = None, is_collective: bool = False) -> None:
        """Decide this process's role (from the environment by default).

        Raises:
            ConfigError: called twice, collective mode asked for, or the environment
                is inconsistent (names the variable).
        """
        if self._role is not None:
            raise ConfigError("fleet.init() was already called in this process")
        if is_collective:
            raise ConfigError("is_collective=True: collective mode is not available in this "
                              "release; use the parameter server (the default)")
        self._role = (role_maker or PaddleCloudRoleMaker()).generate_role()
        self.strategy = strategy or self.strategy
        self.rpc_config = RpcConfig.from_env()
        logs.setup_logging()
        role = self._role
        logs.set_role(f"server:{role.server_index}" if role.role is Role.SERVER
                      else f"worker:{role.worker_index}")
        logger.info("fleet.init: %s, strategy %s", role, self.strategy.model_dump())

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
    def init_server(self, dirname: str | None = None) -> None:
        """Prepare the server. Tables are created by the workers at init_worker.

        Args:
            dirname: a save (``save_persistables``) to load every table from when the
                workers create it; this server keeps its share (any server count).

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

    def run_server(self) -> None:
        """Serve tables until a worker's stop_worker() (or SIGTERM). Blocks."""
        role = self.role
        if role.bind_endpoint is None:
            raise ConfigError("run_server() called on a worker")
        host, port = parse_endpoint(role.bind_endpoint, "POD_IP:PADDLE_PORT")
        run_server(host, port, self.rpc_config, role.endpoint_file, self._preload_dir)

    # -- worker -----------------------------------------------------------------------
    def distributed_optimizer(self, optimizer: torch.optim.Optimizer,
                              strategy: DistributedStrategy | None = None
                              ) -> DistributedOptimizer:
        """Wrap ``optimizer``; its type and settings become the tables' rule.

        Raises:
            ConfigError: the optimizer has no table rule.
        """
        if strategy is not None:
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
        if role.is_local:
            client, mode = LocalClient(), "local"
        else:
            remote = RemoteClient(role.server_endpoints, self.rpc_config, role.worker_index)
            remote.wait_ready(self._wait_timeout_s())
            client, mode = remote, strategy.mode
        communicator = make_communicator(mode, client,
                                         strategy.communicator_settings(role.worker_num))
        embeddings = live_embeddings()
        opt = self._optimizer
        for table_id, embedding in enumerate(embeddings):
            config = embedding.table_config(opt.rule)
            client.create_sparse_table(table_id, config)
            communicator.on_sparse_table(table_id, config)
            embedding.bind(communicator, table_id)
        dense_id = len(embeddings)
        client.create_dense_table(
            dense_id, "dense", [tuple(p.shape) for p in opt.params], opt.rule,
            opt.flat_values(), strategy.slicing(),
            strategy.dc_asgd_lambda if strategy.dc_asgd else 0.0)
        client.barrier("init_worker", role.worker_index, role.worker_num)
        values = client.pull_dense(dense_id)
        opt.install(values)
        communicator.on_dense_table(dense_id, opt.rule, values)
        opt.bind(communicator, embeddings, dense_id)
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
        """Block until every worker reaches this call."""
        self.client.barrier("barrier_worker", self.role.worker_index, self.role.worker_num)

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
        if role.worker_index == 0:
            self.client.load(dirname)
        self.client.barrier("load_model", role.worker_index, role.worker_num)
        optimizer = self._require_optimizer()
        optimizer.refresh()
        if self._communicator is not None:
            self._communicator.on_dense_table(len(live_embeddings()), optimizer.rule,
                                              optimizer.flat_values())

    def _require_optimizer(self) -> DistributedOptimizer:
        if self._optimizer is None:
            raise FatalError("call fleet.distributed_optimizer(optimizer) first")
        return self._optimizer

    def stop_worker(self) -> None:
        """Flush pushes, wait for every worker, then (worker 0) stop the servers."""
        if self._communicator is not None:
            self._communicator.stop()
        if self._client is not None:
            role = self.role
            self._client.barrier("stop_worker", role.worker_index, role.worker_num)
            if role.worker_index == 0:
                self._client.stop_servers(role.worker_index)
            self._client.close()
        self._client = self._communicator = None

