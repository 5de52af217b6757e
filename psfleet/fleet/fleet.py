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

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from psfleet import logs
from psfleet.checkpoint import CheckpointConfig, Cursor
from psfleet.collective import CollectiveHooks
from psfleet.errors import ConfigError, FatalError
from psfleet.export import InferenceManifest
from psfleet.fleet.optimizer import DistributedOptimizer
from psfleet.fleet.persistence import Persistence
from psfleet.fleet.process_role import ProcessRole
from psfleet.fleet.role_info import done_file, restart_num
from psfleet.fleet.role_maker import Role, RoleInfo, RoleMaker
from psfleet.fleet.runtime import (
    ParameterServerHooks,
    RuntimeConfig,
    WorkerHooks,
    WorkerRuntime,
)
from psfleet.fleet.server_wait import server_wait_timeout_s
from psfleet.fleet.strategy import DistributedStrategy
from psfleet.job.modes import mode_spec
from psfleet.nn import SparseEmbedding, live_embeddings
from psfleet.ps import TableClient
from psfleet.ps.types import RuleConfig, SaveMode
from psfleet.rpc import messages as msg

__all__ = ["Fleet"]

logger = logging.getLogger(__name__)


class Fleet(ProcessRole):
    """The seeds' ``fleet`` object: role, strategy and the server side
    (:class:`~psfleet.fleet.process_role.ProcessRole`), and a shell over the worker
    runtime.

    Before ``init_worker`` it gathers what the runtime is built from (role, strategy,
    optimizer, model); ``init_worker`` builds the :class:`WorkerRuntime`, and the
    worker-side methods delegate to it (saving and loading to its
    :class:`Persistence`). What collective mode changes is in its hooks
    (``psfleet.collective.CollectiveHooks``), chosen once at :meth:`init`.
    """

    def _clear(self) -> None:
        super()._clear()
        self._hooks: WorkerHooks = ParameterServerHooks()
        self._optimizer: DistributedOptimizer | None = None
        self._model: nn.Module | None = None
        self._runtime: WorkerRuntime | None = None
        self._persistence: Persistence | None = None

    # -- role -------------------------------------------------------------------------
    def init(self, role_maker: RoleMaker | None = None,
             strategy: DistributedStrategy | None = None, is_collective: bool = False) -> None:
        """Decide this process's role (from the environment by default).

        The parameter-server modes: as :meth:`ProcessRole.init
        <psfleet.fleet.process_role.ProcessRole.init>` (the role maker chosen when none
        is given, and the role logged).

        Collective mode (``is_collective=True`` or ``strategy.mode == "collective"``):
        no servers; this process is a rank of a torch.distributed process group
        created from the environment (``psfleet.collective.rendezvous_from_env``);
        worker_index / worker_num are the rank / world size.

        Raises:
            ConfigError: called twice, or the environment is inconsistent (names the
                variable), or is_collective=True with a parameter-server strategy, or
                MPIRoleMaker could not exchange the server list (names the fix).
            FatalError: collective mode: the rendezvous endpoint cannot be reached
                within PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S (names it).
        """
        if is_collective or (strategy is not None and not mode_spec(strategy.mode).servers):
            self._refuse_second_init()
            self._init_collective(role_maker, strategy)
            return
        super().init(role_maker, strategy)

    def _init_collective(self, role_maker: RoleMaker | None,
                         strategy: DistributedStrategy | None) -> None:
        if role_maker is not None:
            raise ConfigError("role_maker: not used in collective mode; the rank and world size "
                              "come from RANK / WORLD_SIZE (or PADDLE_TRAINER_ID / "
                              "PADDLE_TRAINERS_NUM): drop role_maker")
        if strategy is not None and mode_spec(strategy.mode).servers:
            raise ConfigError(f"strategy.mode is {strategy.mode!r} but is_collective=True: use "
                              "DistributedStrategy(mode='collective') or drop is_collective")
        logs.setup_logging()
        self.strategy = strategy or DistributedStrategy(mode="collective")
        hooks = CollectiveHooks.connect(self.strategy.collective_backend)
        self._hooks = hooks
        self._role = RoleInfo(Role.WORKER, hooks.context.rank, hooks.context.world_size)
        logs.set_role(f"worker:{hooks.context.rank}")

    def is_collective(self) -> bool:
        """Whether this process trains in collective mode (after :meth:`init`)."""
        return self._hooks.is_collective

    # -- worker -----------------------------------------------------------------------
    def distributed_model(self, model: nn.Module) -> nn.Module:
        """The model to train with; its SparseEmbeddings are the worker's tables.

        Collective mode: moves ``model`` to this rank's device and wraps it in
        DistributedDataParallel whose gradient all-reduce is weighted by each rank's
        example count (``psfleet.collective.ddp``); run the training forward through
        the returned module. Every rank must call it, at the same point. In the
        parameter-server modes it returns ``model`` itself, so one script runs in both.
        Either way ``init_worker`` then creates tables for this model's embeddings
        only (without this call: for every embedding alive in the process).

        Raises:
            FatalError: :meth:`init` was not called.
        """
        self.role  # noqa: B018  (raises before init)
        self._model = model
        return self._hooks.wrap_model(model)

    def join(self) -> AbstractContextManager[Any]:
        """A context for a training loop whose ranks may run different step counts.

        Collective mode: torch's ``Join`` over the model from :meth:`distributed_model`
        and the sparse communicator; a rank that finishes its batches early keeps
        answering the others' all-reduces and all-gathers (contributing no examples)
        until every rank is done. Other modes: a context that does nothing.

        Raises:
            FatalError: collective mode and :meth:`init_worker` was not called.
        """
        return self._hooks.join(self._runtime.communicator if self._runtime else None)

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer | None = None,
                              strategy: DistributedStrategy | None = None, *,
                              params: Iterable[torch.Tensor] | None = None,
                              rule: RuleConfig | None = None) -> DistributedOptimizer:
        """Wrap ``optimizer``; its type and settings become the tables' rule. Or give
        ``params`` and ``rule`` instead of an optimizer (see DistributedOptimizer).

        Raises:
            ConfigError: the optimizer has no table rule, or neither (or both) of
                ``optimizer`` and ``params`` with ``rule`` were given, or ``strategy``
                is collective and fleet.init() was not (or the reverse).
        """
        if strategy is not None:
            if (not mode_spec(strategy.mode).servers) != self._hooks.is_collective:
                raise ConfigError(f"strategy.mode {strategy.mode!r} does not match "
                                  "fleet.init(): pass the strategy to fleet.init() instead")
            self.strategy = strategy
        self._optimizer = DistributedOptimizer(optimizer, params=params, rule=rule)
        return self._optimizer

    def init_worker(self) -> None:
        """Connect to the servers (or in-process tables) and create the tables.

        Builds the worker runtime (:class:`~psfleet.fleet.runtime.WorkerRuntime`):
        waits for every server with a visible, bounded retry; creates one sparse
        table per SparseEmbedding (ids by name) and one dense table for the
        optimizer's parameters; every worker starts from the dense values the
        servers hold.

        Raises:
            ConfigError: called on a server, or two embeddings share a name.
            FatalError: distributed_optimizer() was not called first.
            ServerNotReadyError: servers not ready within the wait timeout.
        """
        role = self.role
        if role.role is not Role.WORKER:
            raise ConfigError("init_worker() called on a server")
        if self._optimizer is None:
            raise FatalError("call fleet.distributed_optimizer(optimizer) before "
                             "fleet.init_worker(): the optimizer decides the tables' rule")
        config = RuntimeConfig(role, self.strategy, self.rpc_config,
                               server_wait_timeout_s(self.strategy.server_wait_timeout_s),
                               restart_num(), done_file())
        embeddings = (live_embeddings() if self._model is None else
                      [m for m in self._model.modules() if isinstance(m, SparseEmbedding)])
        self._runtime = WorkerRuntime.connect(config, self._hooks, self._optimizer, embeddings)
        self._persistence = Persistence(self._runtime)

    def _require_runtime(self) -> WorkerRuntime:
        if self._runtime is None:
            raise FatalError("call fleet.init_worker() first")
        return self._runtime

    @property
    def client(self) -> TableClient:
        """The tables (after init_worker)."""
        return self._require_runtime().client

    def server_stats(self) -> list[msg.StatsResponse]:
        """Every server's ``Stats`` (after init_worker), in server-index order: per table
        rows, bytes, pull and push counts, and the server's uptime; in-process tables
        (``server_num`` 0) answer as one server.

        Raises:
            FatalError: before init_worker, or in collective mode (no servers).
            RpcError: a server did not answer.
        """
        return self._require_runtime().client.stats()

    # -- the row lifecycle of ctr tables (psfleet.ps.lifecycle_service) -------------------
    def _lifecycle_call(self, call: Any) -> Any:
        """Run ``call(client)`` once for the job, between two barriers: on the first
        worker after flushing its pushes (servers), or on every rank's own tables
        (collective: they stay identical). Returns ``call``'s result there, else None."""
        client = self.client
        self.flush()
        self.barrier_worker()
        result = None
        if self.is_collective() or self.is_first_worker():
            result = call(client)
        self.barrier_worker()
        return result

    def shrink(self, threshold: float | None = None) -> int:
        """Shrink every sparse table with the ``ctr`` accessor, as Paddle's
        ``fleet.shrink()``: show and click decay by ``show_click_decay_rate``, then the
        rows scoring below ``delete_threshold`` or unseen for more than
        ``delete_after_unseen_days`` days are deleted (CtrCommonAccessor::Shrink).
        Every worker calls it (it holds barriers); blocks until done everywhere.

        Args:
            threshold: ignored, as by Paddle's MemorySparseTable (thresholds are the
                accessor config's); a value is logged as a warning.

        Returns:
            The rows deleted, on the first worker (collective: every rank, its own
            tables); 0 on the other workers.

        Raises:
            FatalError: before init_worker.
        """
        if threshold is not None:
            logger.warning("fleet.shrink(threshold=%r): the threshold is not used; "
                           "shrink follows each table's accessor config "
                           "(delete_threshold, delete_after_unseen_days)", threshold)
        deleted = self._lifecycle_call(lambda client: client.shrink())
        if deleted is not None:
            logger.info("shrink deleted %d rows", deleted)
        return int(deleted or 0)

    def set_date(self, table_id: int | None = None, day_id: int | str | None = None) -> None:
        """Start a new day (or pass) for sparse table ``table_id`` (None: every
        sparse table), as Paddle's ``fleet.set_date``: every row's unseen_days grows
        by one (rows pushed since then count 0 again), which ``shrink`` compares with
        ``delete_after_unseen_days``. Each call is one day, whatever ``day_id``
        (logged only). Every worker calls it (barriers); blocks.

        Raises:
            FatalError: before init_worker.
            RemoteError: ``table_id`` is not a sparse table.
        """
        self._lifecycle_call(lambda client: client.age_one_day(table_id))
        logger.info("set_date %s: table %s aged one day", day_id,
                    "all" if table_id is None else table_id)

    def barrier_worker(self) -> None:
        """Block until every worker reaches this call (collective: every rank)."""
        if self._runtime is not None:  # which parks the communicator first
            self._runtime.barrier("barrier_worker")
            return
        role = self.role  # before init_worker: collective ranks meet without tables
        self._hooks.barrier("barrier_worker", lambda: self.client.barrier(
            "barrier_worker", role.worker_index, role.worker_num))

    def begin_pass(self, ids: Mapping[str, Any]) -> int:
        """Pass mode (strategy mode ``gpubox``): pull the rows of a pass's ids, with
        their optimizer state, into this worker's cache; the steps until
        :meth:`end_pass` read and update them there. See ``WorkerRuntime.begin_pass``
        (arguments, errors); ``psfleet.nn.pass_ids(model, batches)`` collects ``ids``.
        """
        return self._require_runtime().begin_pass(ids)

    def sub_passes(self, batch_ids: Sequence[Mapping[str, Any]]) -> list[range]:
        """Pass mode: a pass's batches (per batch, per table name, its ids) cut into
        sub-passes whose rows fit ``pass_configs.cache_budget_bytes``; begin and end a
        pass around each (``WorkerRuntime.sub_passes``)."""
        return self._require_runtime().sub_passes(batch_ids)

    def end_pass(self) -> int:
        """Pass mode: push the pass's row changes to the servers, empty the cache;
        returns the rows pushed (``WorkerRuntime.end_pass``)."""
        return self._require_runtime().end_pass()

    def flush(self) -> None:
        """Block until this worker's pushes so far are applied; install fresh dense values.

        Other workers' pushes may still be in flight: call :meth:`barrier_worker`
        after every worker flushed, then ``optimizer.refresh()``, to see them all.
        """
        if self._runtime is not None:
            self._runtime.flush()

    def stop_worker(self, finish: Callable[[], None] | None = None) -> None:
        """Flush pushes, wait for every worker, then (worker 0) stop the servers.

        Args:
            finish: worker 0's last work on the tables as trained (evaluation,
                export), run once every worker has arrived and before the servers
                stop. The other workers return without waiting for it, so no
                barrier deadline counts its time. Other workers' ``finish`` is not
                called. Raises what ``finish`` raises (the servers then keep
                running; the launcher ends the failed job).

        Collective mode: after the barrier every rank leaves the process group (rank
        0 after ``finish``).
        """
        if self._runtime is not None:
            self._runtime.stop(finish)
        elif finish is not None and self.is_first_worker():
            finish()
        self._hooks.close()
        self._runtime = self._persistence = None

    def reset(self) -> None:
        """Forget this process's run, so that :meth:`init` can start another one (the
        Python API's ``psfleet.train`` called twice in one process).

        After :meth:`stop_worker` this only clears the role, strategy, optimizer and
        model. A run that ended early (an exception before stop_worker) still holds its
        worker runtime: its communicator is stopped (pending pushes are sent if the
        servers still answer; a failure is logged, not raised) and its connections are
        closed; its servers are not stopped (the launcher ends a failed job's servers).
        A collective rank leaves its process group.
        """
        runtime = self._runtime
        if runtime is not None:
            try:
                runtime.communicator.stop()
            except Exception as exc:  # the run already failed; say why this did too
                logger.warning("fleet.reset: pending pushes not sent: %s", exc)
            finally:
                runtime.client.close()
        if self._hooks.is_collective and torch.distributed.is_initialized():
            self._hooks.close()
        self._clear()

    # -- saving and loading (psfleet.fleet.persistence.Persistence) --------------------
    def _require_persistence(self) -> Persistence:
        if self._persistence is None:
            raise FatalError("call fleet.init_worker() first")
        return self._persistence

    def save_persistables(self, dirname: str, mode: SaveMode = "full") -> None:
        """See :meth:`Persistence.save_persistables` (``mode``: full, base or delta)."""
        self._require_persistence().save_persistables(dirname, mode)

    def load_model(self, dirname: str) -> None:
        """See :meth:`Persistence.load_model`."""
        self._require_persistence().load_model(dirname)

    def save_inference_model(self, dirname: str, model: torch.nn.Module,
                             example_inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
                             metadata: dict[str, object] | None = None) -> InferenceManifest:
        """See :meth:`Persistence.save_inference_model`."""
        return self._require_persistence().save_inference_model(dirname, model,
                                                                example_inputs, metadata)

    def save_checkpoint(self, config: CheckpointConfig, cursor: Cursor,
                        extra: dict[str, object] | None = None) -> str | None:
        """See :meth:`Persistence.save_checkpoint`."""
        return self._require_persistence().save_checkpoint(config, cursor, extra)

    def load_checkpoint(self, config: CheckpointConfig | str) -> Cursor | None:
        """See :meth:`Persistence.load_checkpoint`."""
        return self._require_persistence().load_checkpoint(config)
