"""The seeds' low-level (Fluid) API: DistributeTranspiler over the public fleet API.

A Fluid job started by hand on each node translates line for line::

    t = fleet.DistributeTranspiler(config=fleet.DistributeTranspilerConfig())
    t.transpile(trainer_id, program=(model, optimizer), pservers="10.0.0.1:6174,...",
                trainers=2, sync_mode=True)
    if role == "PSERVER":
        pserver_prog = t.get_pserver_program(current_endpoint)
        startup_prog = t.get_startup_program(current_endpoint, pserver_prog)
        exe = fleet.Executor()
        exe.run(startup_prog)                      # fleet.init(server role), init_server
        exe.run(pserver_prog)                      # run_server: blocks until stopped
    else:
        trainer_prog = t.get_trainer_program()
        model, optimizer = trainer_prog.start()    # Fluid: exe.run(startup program)
        ...train; optimizer.step() pushes...       # Fluid: exe.run(trainer_prog, feed)
        trainer_prog.stop()                        # worker 0 stops every server

The programs call only the public API of the process-wide fleet (``fleet.init`` with a
:class:`UserDefinedRoleMaker` and a :class:`DistributedStrategy`, ``distributed_optimizer``,
``init_server`` / ``run_server``, ``init_worker`` / ``stop_worker``), so ``fleet.flush()``
or ``fleet.save_persistables()`` work in a transpiled job too. ``sync_mode`` True is
fleet's ``sync`` mode, False ``async`` (GEO is not part of the transpiler).
``mode="nccl2"`` is fleet's collective mode: no servers; rank, world size and the
rendezvous (first of ``trainers`` when it lists endpoints) come from ``transpile``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

import psfleet.fleet as fleet
from psfleet import logs
from psfleet.errors import ConfigError, FatalError
from psfleet.fleet.optimizer import DistributedOptimizer
from psfleet.fleet.role_maker import Role, UserDefinedRoleMaker
from psfleet.fleet.strategy import DistributedStrategy
from psfleet.fleet.transpiler_config import DistributeTranspilerConfig
from psfleet.job.modes import mode_spec
from psfleet.rpc import parse_endpoint

__all__ = ["DistributeTranspiler", "DistributeTranspilerConfig", "Executor",
           "PServerProgram", "PServerStartupProgram", "TrainerProgram"]

logger = logging.getLogger(__name__)


class Executor:
    """The seeds' ``fluid.Executor(place)`` for transpiled programs (``place`` unused)."""

    def __init__(self, place: object = None) -> None:
        self.place = place

    def run(self, program: PServerStartupProgram | PServerProgram) -> None:
        """Run a program from :class:`DistributeTranspiler` (see each ``run``)."""
        program.run()


@dataclass
class PServerStartupProgram:
    """Starts this process as server ``endpoint``: ``fleet.init`` and ``init_server``."""

    endpoint: str
    _transpiler: DistributeTranspiler
    done: bool = False

    def run(self) -> None:
        """Take the server role (once). Raises ConfigError if fleet.init already ran."""
        if not self.done:
            t = self._transpiler
            fleet.init(UserDefinedRoleMaker(t.endpoints.index(self.endpoint), Role.SERVER,
                                            t.worker_num, t.endpoints), t.strategy)
            fleet.init_server()
            self.done = True


@dataclass
class PServerProgram:
    """Serves ``endpoint``'s share of every table until worker 0's ``stop()``."""

    endpoint: str
    startup: PServerStartupProgram

    def run(self) -> None:
        """Run the startup program if it has not run, then serve. Blocks."""
        self.startup.run()
        fleet.run_server()


class TrainerProgram:
    """A worker's model and optimizer over the fleet API (see the module doc).

    Call :meth:`start` before training (Fluid's ``exe.run(startup_program)``) and
    :meth:`stop` after (worker 0 then stops every server). Each blocks until every
    worker (every rank in nccl2 mode) calls it.
    """

    def __init__(self, transpiler: DistributeTranspiler) -> None:
        self._t = transpiler
        self.model: nn.Module | None = None
        self.optimizer: DistributedOptimizer | None = None

    def start(self, model: nn.Module | None = None,
              optimizer: torch.optim.Optimizer | None = None
              ) -> tuple[nn.Module, DistributedOptimizer]:
        """Join the job (fleet.init, distributed_optimizer, distributed_model, init_worker).

        Args:
            model, optimizer: what to train; default: transpile's ``program``.

        Returns:
            The model to run forward through (DDP in nccl2 mode) and the optimizer
            whose ``step()`` pushes gradients.

        Raises:
            ConfigError: no model/optimizer here or in transpile, or started twice.
            ServerNotReadyError: servers not ready within the wait timeout.
        """
        if self.optimizer is not None:
            raise ConfigError("TrainerProgram.start(): already started")
        t = self._t
        if t.program is not None:
            model = t.program[0] if model is None else model
            optimizer = t.program[1] if optimizer is None else optimizer
        if model is None or optimizer is None:
            raise ConfigError("TrainerProgram.start(): pass model and optimizer, here or as "
                              "transpile(program=(model, optimizer))")
        if t.strategy is not None and not mode_spec(t.strategy.mode).servers:  # nccl2
            t.export_collective_env()
            fleet.init(is_collective=True, strategy=t.strategy)
        else:
            fleet.init(UserDefinedRoleMaker(t.trainer_id, Role.WORKER, t.worker_num,
                                            t.endpoints), t.strategy)
        self.optimizer = fleet.distributed_optimizer(optimizer)
        self.model = fleet.distributed_model(model)
        fleet.init_worker()
        return self.model, self.optimizer

    def stop(self) -> None:
        """Flush, wait for every worker, and (worker 0) stop the servers."""
        if self.optimizer is None:
            raise FatalError("TrainerProgram.stop(): call start() first")
        fleet.stop_worker()


class DistributeTranspiler:
    """The seeds' DistributeTranspiler (see the module doc).

    Args:
        config: the settings; defaults when None.
    """

    def __init__(self, config: DistributeTranspilerConfig | None = None) -> None:
        self.config = config or DistributeTranspilerConfig()
        self.strategy: DistributedStrategy | None = None

    def transpile(self, trainer_id: int,
                  program: tuple[nn.Module, torch.optim.Optimizer] | None = None,
                  pservers: str = "127.0.0.1:6174", trainers: int | str = 1,
                  sync_mode: bool = True, startup_program: None = None,
                  current_endpoint: str = "127.0.0.1:6174") -> None:
        """Record and check the job's layout. Does not communicate.

        Args:
            trainer_id: this trainer's index, 0 .. trainers-1 (servers: any, e.g. 0).
            program: ``(model, optimizer)`` the trainer program trains, or None to
                pass them to :meth:`TrainerProgram.start`.
            pservers: every server's ``host:port``, comma separated (pserver mode).
            trainers: the trainer count, or a comma list of trainer endpoints (nccl2:
                the first is the rendezvous endpoint) or IPs (pserver mode: a count).
            sync_mode: fleet's ``sync`` mode if True, else ``async`` (pserver mode).
            startup_program: must be None (the workers initialise the tables).
            current_endpoint: nccl2 mode with listed trainers: this trainer's entry.
                Not used in pserver mode (the server names itself in
                :meth:`get_pserver_program`).

        Raises:
            ConfigError: a malformed or inconsistent argument (names it).
        """
        c = self.config
        if startup_program is not None:
            raise ConfigError("startup_program: psfleet has no startup program (workers "
                              "create the tables at start()): drop it")
        if program is not None and not (
                isinstance(program, tuple) and len(program) == 2
                and isinstance(program[0], nn.Module)
                and isinstance(program[1], torch.optim.Optimizer)):
            raise ConfigError(f"program: {program!r} is not a (model, optimizer) pair")
        listed = [p.strip() for p in trainers.split(",") if p.strip()] if isinstance(
            trainers, str) else []
        if not listed and (isinstance(trainers, bool) or not isinstance(trainers, int)
                           or trainers < 1):
            raise ConfigError(f"trainers: {trainers!r} is neither a count >= 1 nor a comma "
                              "list of trainer endpoints or IPs")
        worker_num = len(listed) or int(trainers)
        if isinstance(trainer_id, bool) or not isinstance(trainer_id, int) or not (
                0 <= trainer_id < worker_num):
            raise ConfigError(f"trainer_id: {trainer_id!r} must be in 0..{worker_num - 1} "
                              f"(trainers: {trainers!r})")
        if c.enable_dc_asgd and (sync_mode or c.mode == "nccl2"):
            raise ConfigError("config.enable_dc_asgd compensates async delays: use it with "
                              "mode='pserver' and sync_mode=False")
        self.trainer_id, self.worker_num, self.program = trainer_id, worker_num, program
        self.trainer_endpoints: list[str] = []
        self.endpoints: list[str] = []
        if c.mode == "nccl2":
            self._nccl2(listed, current_endpoint)
            self.strategy = DistributedStrategy(mode="collective")
        else:
            self._pservers(pservers)
            self.strategy = DistributedStrategy(
                mode="sync" if sync_mode else "async", slice_var_up=c.slice_var_up,
                split_method=c.split_method, min_block_size=c.min_block_size,
                dc_asgd=c.enable_dc_asgd)
        if c.print_log:
            logs.setup_logging()
        logger.log(logging.INFO if c.print_log else logging.DEBUG,
                   "transpiled: %s mode, trainer_id %d of %d, servers %s, strategy %s", c.mode,
                   trainer_id, worker_num, self.endpoints, self.strategy.model_dump())

    def _pservers(self, pservers: str) -> None:
        endpoints = [p.strip() for p in str(pservers).split(",") if p.strip()]
        if not endpoints:
            raise ConfigError(f"pservers: {pservers!r} lists no server host:port")
        for endpoint in endpoints:
            if parse_endpoint(endpoint, "pservers")[1] == 0:
                raise ConfigError(f"pservers: {endpoint!r} has port 0; give each server a "
                                  "fixed port")
        if len(set(endpoints)) != len(endpoints):
            raise ConfigError(f"pservers: {pservers!r} lists an endpoint twice")
        self.endpoints = endpoints

    def _nccl2(self, listed: list[str], current_endpoint: str) -> None:
        for endpoint in listed:
            parse_endpoint(endpoint, "trainers (nccl2 mode: every trainer's host:port)")
        if listed and current_endpoint.strip() != listed[self.trainer_id]:
            raise ConfigError(f"current_endpoint: {current_endpoint!r} is not entry "
                              f"{self.trainer_id} (trainer_id) of trainers, "
                              f"{listed[self.trainer_id]!r}")
        self.trainer_endpoints = listed

    def export_collective_env(self) -> None:
        """nccl2 mode: put this trainer's rank, world size and endpoints in os.environ,
        where fleet's collective rendezvous reads them.

        Raises:
            ConfigError: a variable is already set to another value (names it).
        """
        values = {"PADDLE_TRAINER_ID": str(self.trainer_id),
                  "PADDLE_TRAINERS_NUM": str(self.worker_num)}
        if self.trainer_endpoints:
            values["PADDLE_TRAINER_ENDPOINTS"] = ",".join(self.trainer_endpoints)
            values["PADDLE_CURRENT_ENDPOINT"] = self.trainer_endpoints[self.trainer_id]
        for name, value in values.items():
            if os.environ.get(name, value).strip() not in ("", value):
                raise ConfigError(f"{name} is {os.environ[name]!r} but transpile() says "
                                  f"{value!r}: unset it or make them agree")
        os.environ.update(values)

    def get_pserver_program(self, endpoint: str) -> PServerProgram:
        """The program serving ``endpoint`` (one of ``pservers``).

        Raises:
            ConfigError: ``endpoint`` is not in ``pservers``, or mode is nccl2.
        """
        if self.strategy is None:
            raise FatalError("call DistributeTranspiler.transpile() first")
        if not mode_spec(self.strategy.mode).servers:
            raise ConfigError("config.mode was 'nccl2' at transpile(): there are no servers; "
                              "run get_trainer_program() on every trainer")
        endpoint = endpoint.strip()
        if endpoint not in self.endpoints:
            raise ConfigError(f"endpoint: {endpoint!r} is not one of pservers {self.endpoints}")
        return PServerProgram(endpoint, PServerStartupProgram(endpoint, self))

    def get_startup_program(self, endpoint: str, pserver_program: PServerProgram | None = None,
                            startup_program: None = None) -> PServerStartupProgram:
        """The startup program of server ``endpoint`` (of ``pserver_program`` if given).

        Raises:
            ConfigError: ``pserver_program`` serves another endpoint.
        """
        program = pserver_program or self.get_pserver_program(endpoint)
        if program.endpoint != endpoint.strip():
            raise ConfigError(f"endpoint: {endpoint!r} but pserver_program serves "
                              f"{program.endpoint!r}")
        return program.startup

    def get_trainer_program(self, wait_port: bool = True) -> TrainerProgram:
        """This trainer's program. ``wait_port``: always on (PSFLEET_SERVER_WAIT_TIMEOUT_S)."""
        if self.strategy is None:
            raise FatalError("call DistributeTranspiler.transpile() first")
        return TrainerProgram(self)
