"""The worker runtime: one object per worker owning its tables and its step.

Built once, at ``fleet.init_worker()``, from one frozen :class:`RuntimeConfig` (role,
strategy, rpc settings, server wait timeout, restart count) and the mode's
:class:`WorkerHooks` (parameter server: :class:`ParameterServerHooks`; collective:
``psfleet.collective.CollectiveHooks``), a :class:`WorkerRuntime` owns:

- the table client (remote servers, or in process when there are none) and the
  communicator of the mode;
- the table registry (:class:`~psfleet.fleet.tables.TableRegistry`: sparse ids by
  embedding name, then the dense table), which it creates on the tables;
- the dense layout and the optimizer hook-up (the dense table starts from the
  optimizer's parameters, every worker installs the values the tables hold);
- the step (:class:`~psfleet.fleet.step.StepCollector`): the embeddings pull through
  it and leave their rows there; ``optimizer.step()`` has it push them.

``psfleet.fleet.Fleet`` is the Paddle-compatible shell over it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from psfleet.errors import ConfigError
from psfleet.fleet.async_momentum import async_dense_rule
from psfleet.fleet.lr_scaling import scaled_rule
from psfleet.fleet.optimizer import DistributedOptimizer
from psfleet.fleet.role_maker import RoleInfo
from psfleet.fleet.step import StepCollector
from psfleet.fleet.strategy import DistributedStrategy
from psfleet.fleet.tables import TableRegistry
from psfleet.job.modes import MODE_SPECS, mode_spec
from psfleet.nn import SparseEmbedding
from psfleet.ps import LocalClient, RemoteClient, TableClient
from psfleet.ps.communicator import Communicator, PassCommunicator, make_communicator
from psfleet.rpc import RpcConfig

__all__ = ["ParameterServerHooks", "RuntimeConfig", "WorkerHooks", "WorkerRuntime"]

logger = logging.getLogger(__name__)

S = TypeVar("S")


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything a worker runtime is built from.

    Attributes:
        role: this worker's place in the job.
        strategy: how the job trains.
        rpc_config: deadlines, retries and auth of calls to the servers.
        wait_timeout_s: how long to wait for the servers to be ready, seconds
            (``psfleet.fleet.server_wait.server_wait_timeout_s``).
        restart_num: how often the launcher restarted this worker (0: first start;
            a restarted worker joins a running job and skips the start barrier).
        done_file: written once this worker passed the stop barrier (fleetrun's
            ``PSFLEET_DONE_FILE``: training is complete, nothing is restarted); None:
            not written.
    """

    role: RoleInfo
    strategy: DistributedStrategy
    rpc_config: RpcConfig
    wait_timeout_s: float
    restart_num: int = 0
    done_file: Path | None = None


class WorkerHooks(Protocol):
    """Where a mode changes the worker runtime (see ``psfleet.collective.hooks``)."""

    is_collective: bool
    tables_in_process: bool
    communicator_mode: str | None
    every_rank_loads: bool

    def wrap_model(self, model: nn.Module) -> nn.Module: ...
    def join(self, communicator: object | None) -> AbstractContextManager[Any]: ...
    def communicator_settings(self, settings: S) -> S: ...
    def initial_dense(self, values: np.ndarray) -> np.ndarray: ...
    def attach(self, communicator: object, step: Callable[[], None]) -> None: ...
    def barrier(self, name: str, client_barrier: Callable[[], None]) -> None: ...
    def close(self) -> None: ...


class ParameterServerHooks:
    """The parameter-server modes' hooks: the model as it is, the tables' barrier."""

    is_collective = False
    tables_in_process = False
    communicator_mode: str | None = None
    every_rank_loads = False

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def join(self, communicator: object | None) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def communicator_settings(self, settings: S) -> S:
        return settings

    def initial_dense(self, values: np.ndarray) -> np.ndarray:
        return values

    def attach(self, communicator: object, step: Callable[[], None]) -> None:
        """Nothing: every worker runs its own steps."""

    def barrier(self, name: str, client_barrier: Callable[[], None]) -> None:
        client_barrier()

    def close(self) -> None:
        """Nothing to leave."""


class WorkerRuntime:
    """One worker's tables, communicator and step (see the module doc).

    Build with :meth:`connect`. Not thread safe: one training loop per process.
    """

    def __init__(self, config: RuntimeConfig, hooks: WorkerHooks, client: TableClient,
                 communicator: Communicator, tables: TableRegistry,
                 optimizer: DistributedOptimizer, mode: str) -> None:
        self.config = config
        self.hooks = hooks
        self.client = client
        self.communicator = communicator
        self.tables = tables
        self.optimizer = optimizer
        self.mode = mode
        sparse = tables.sparse_configs()
        self.step = StepCollector(communicator, {i: c.dim for i, c in sparse.items()},
                                  tables.dense_table_id,
                                  {i: c.name for i, c in sparse.items()
                                   if c.accessor.name == "ctr"})

    @classmethod
    def connect(cls, config: RuntimeConfig, hooks: WorkerHooks,
                optimizer: DistributedOptimizer,
                embeddings: Sequence[SparseEmbedding]) -> WorkerRuntime:
        """Connect to the tables, create them, and bind the embeddings and optimizer.

        Waits for every server with a visible, bounded retry; creates one sparse table
        per embedding and one dense table for the optimizer's parameters; every worker
        then starts from the dense values the tables hold. Blocks on every worker
        (a restarted worker excepted).

        Raises:
            ConfigError: two embeddings share a name, or a setting is out of range.
            ServerNotReadyError: servers not ready within ``config.wait_timeout_s``.
        """
        role, strategy = config.role, config.strategy
        factor = strategy.lr_factor(role.worker_num)
        tables = TableRegistry.of(embeddings, optimizer.rule, factor)
        if factor != 1.0:
            optimizer.dense_rule = scaled_rule(optimizer.rule, factor)
            logger.info("%s with %d workers: learning rates x %.4g (lr_scaling %s): dense "
                        "%g", strategy.mode, role.worker_num, factor, strategy.lr_scaling,
                        optimizer.dense_rule.learning_rate)
        settings = hooks.communicator_settings(strategy.communicator_settings(role.worker_num))
        client: TableClient
        if hooks.tables_in_process or role.is_local:
            client = LocalClient()
            mode = hooks.communicator_mode or (strategy.mode if mode_spec(strategy.mode).passes
                                               else "local")
        else:
            remote = RemoteClient(role.server_endpoints, config.rpc_config, role.worker_index,
                                  incarnation=config.restart_num)
            remote.wait_ready(config.wait_timeout_s)
            client, mode = remote, strategy.mode
        communicator = make_communicator(mode, client, settings)
        dense = strategy.pass_configs.dense_mode if mode_spec(strategy.mode).passes else mode
        step_pushes = dense in MODE_SPECS and mode_spec(dense).step_pushes
        if step_pushes and strategy.a_sync_configs.momentum_correction:
            optimizer.dense_rule = async_dense_rule(optimizer.rule, role.worker_num)
            if optimizer.dense_rule != optimizer.rule:
                logger.info("async with %d workers: dense Adam beta1 %g -> %g (the momentum "
                            "asynchrony adds; a_sync_configs.momentum_correction)",
                            role.worker_num, optimizer.rule.beta1, optimizer.dense_rule.beta1)
        runtime = cls(config, hooks, client, communicator, tables, optimizer, mode)
        runtime._create_tables()
        logger.info("worker %d/%d ready: %s mode, %d sparse tables %s, %d dense parameters, "
                    "servers %s", role.worker_index, role.worker_num, mode,
                    len(tables.embeddings), list(tables.sparse_ids()),
                    sum(p.numel() for p in optimizer.params), list(role.server_endpoints))
        return runtime

    def _create_tables(self) -> None:
        client, communicator, opt = self.client, self.communicator, self.optimizer
        for table_id, config in self.tables.sparse_configs().items():
            client.create_sparse_table(table_id, config)
            communicator.on_sparse_table(table_id, config)
            self.tables.embeddings[table_id].bind(self.step, table_id)
        dense_id = self.tables.dense_table_id
        strategy = self.config.strategy
        client.create_dense_table(
            dense_id, "dense", [tuple(p.shape) for p in opt.params], opt.dense_rule,
            self.hooks.initial_dense(opt.flat_values()), strategy.slicing(),
            strategy.dc_asgd_lambda if strategy.dc_asgd else 0.0)
        if self.config.restart_num == 0:  # a restarted worker joins a job already running
            self.barrier("init_worker")
        values = client.pull_dense(dense_id)
        opt.install(values)
        communicator.on_dense_table(dense_id, opt.dense_rule, values)
        opt.bind(self.step)
        self.hooks.attach(communicator, opt.step)  # collective: a joined rank steps too
        communicator.start()

    @property
    def role(self) -> RoleInfo:
        return self.config.role

    @property
    def strategy(self) -> DistributedStrategy:
        return self.config.strategy

    def server_num(self) -> int:
        return len(self.config.role.server_endpoints)

    def barrier(self, name: str) -> None:
        """Block until every worker (collective: every rank) reaches barrier ``name``."""
        role = self.config.role
        self.communicator.park()
        self.hooks.barrier(name, lambda: self.client.barrier(name, role.worker_index,
                                                             role.worker_num))

    def flush(self) -> None:
        """Block until this worker's pushes so far are applied; install fresh dense values."""
        self.communicator.flush()
        self.optimizer.refresh()

    def reload_dense(self) -> None:
        """Install the dense values the tables hold now, in the optimizer and the
        communicator (after a load into the tables)."""
        self.optimizer.refresh()
        self.communicator.on_dense_table(self.tables.dense_table_id, self.optimizer.dense_rule,
                                         self.optimizer.flat_values())

    def _passes(self, call: str) -> PassCommunicator:
        if not isinstance(self.communicator, PassCommunicator):
            raise ConfigError(f"fleet.{call}: passes exist in pass mode only (strategy mode "
                              f"'gpubox'); this job's mode is {self.mode!r}")
        return self.communicator

    def begin_pass(self, ids: Mapping[str, Any]) -> int:
        """Cache the rows of a pass on this worker (pass mode). Blocks.

        Args:
            ids: per table (embedding name), the keys the pass's batches read:
                Tensor or array of int64 (uint64 bits) or uint64, any shape, repeats
                allowed (``psfleet.nn.pass_ids(model, batches)`` collects them).

        Returns:
            Bytes cached (all tables).

        Raises:
            ConfigError: not pass mode, a name is not a table of this worker (lists
                them), or the rows exceed ``pass_configs.cache_budget_bytes``.
            FatalError: a pass is open.
        """
        passes = self._passes("begin_pass")
        by_name = self.tables.sparse_ids()
        unknown = sorted(set(ids) - set(by_name))
        if unknown:
            raise ConfigError(f"fleet.begin_pass: {unknown} are not tables of this worker; "
                              f"its tables are {sorted(by_name)}")
        return passes.begin_pass({by_name[name]: _keys(value) for name, value in ids.items()})

    def sub_passes(self, batch_ids: Sequence[Mapping[str, Any]]) -> list[range]:
        """A pass's batches cut into sub-passes whose rows fit the cache budget (pass
        mode): ``batch_ids`` per batch, per table name, its keys (as
        :meth:`begin_pass` takes them). Raises ConfigError (not pass mode, an unknown
        table, or one batch above the budget)."""
        passes = self._passes("sub_passes")
        by_name = self.tables.sparse_ids()
        return passes.sub_passes([{by_name[name]: _keys(v) for name, v in ids.items()}
                                  for ids in batch_ids])

    def end_pass(self) -> int:
        """Send the pass's row changes to the servers and empty the cache (pass mode);
        returns the rows pushed. Raises ConfigError (not pass mode), FatalError (no
        pass open)."""
        return self._passes("end_pass").end_pass()

    def stop(self, finish: Callable[[], None] | None = None) -> None:
        """Flush, wait for every worker, then (worker 0) run ``finish`` and stop the
        servers; close.

        ``finish`` (worker 0 only; ignored elsewhere) is the job's last work on the
        tables as trained, e.g. the test evaluation and the export. It runs after the
        stop barrier, while the servers still serve: the other workers have left by
        then, so no barrier deadline (``PSFLEET_RPC_DEADLINE_S``) counts its time and
        a long export cannot fail a finished job (issue 44, finding 3). When
        ``finish`` raises, the servers are left running (the launcher ends a failed
        job) and the error propagates.
        """
        role = self.config.role
        first = role.worker_index == 0
        if finish is None or not first:
            self.communicator.stop()
            self.barrier("stop_worker")
            self._record_done()
        else:
            self.communicator.flush()  # what stop() sends first; it stops after finish
            self.barrier("stop_worker")
            self._record_done()
            finish()
            self.communicator.stop()
        if first:
            self.client.stop_servers(role.worker_index)
        self.client.close()


    def _record_done(self) -> None:
        """Write ``config.done_file`` (the launcher learns that training is complete);
        a failure to write it is logged, not raised (the job still ends)."""
        path = self.config.done_file
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("passed the stop barrier\n")
        except OSError as exc:
            logger.warning("could not write %s (PSFLEET_DONE_FILE): %s", path, exc)


def _keys(value: Any) -> np.ndarray:
    """Keys given as a tensor or array (int64 bits or uint64, any shape) as uint64[N]."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else \
        np.asarray(value)
    if array.dtype not in (np.int64, np.uint64):
        raise ConfigError(f"fleet.begin_pass: ids must be int64 or uint64, got {array.dtype}")
    return np.ascontiguousarray(array).reshape(-1).view(np.uint64)
