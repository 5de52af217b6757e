"""DistributedStrategy: how a job trains (mode, communicator, slicing, DC-ASGD,
learning-rate scaling).

Field names follow the seeds' ``DistributedStrategy`` / ``StrategyFactory`` so a
Paddle user finds them where they expect. Every field is validated when the strategy
is made; an error names the field and the allowed values.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from psfleet.collective.types import BackendChoice
from psfleet.errors import ConfigError
from psfleet.fleet.lr_scaling import LrScaling, check_lr_scaling, lr_factor
from psfleet.job.modes import mode_spec
from psfleet.ps.communicator.types import (
    GEO_STEP,
    AsyncConfig,
    CommunicatorSettings,
    PassConfig,
    check_async_only,
)
from psfleet.ps.types import SlicingConfig, SplitMethod
from psfleet.types import Mode

__all__ = ["DistributedStrategy", "AsyncSettings", "StrategyFactory"]


#: The seeds' name of the async settings: the one model the communicator takes too.
AsyncSettings = AsyncConfig


_SLICING = SlicingConfig.model_fields


def _slicing_field(name: str) -> Any:
    """SlicingConfig's declaration of field ``name`` (its default and constraints)."""
    return _SLICING[name]


class DistributedStrategy(BaseModel):
    """How the job trains.

    Attributes:
        mode: ``sync`` (all workers' step-t gradients averaged and applied once:
            equal to one process with the global batch), ``async`` (gradients
            applied as they arrive, merged in a send queue) or ``geo`` (local
            training, deltas exchanged every ``geo_step`` steps) for the parameter
            server; ``gpubox`` (pass mode: between ``fleet.begin_pass`` and
            ``fleet.end_pass`` a pass's rows are cached on the worker, no sparse RPC
            per step; ``psfleet.ps.communicator.pass_mode``); ``collective`` for
            all-reduce data parallelism without servers (every rank holds the model;
            same as ``fleet.init(is_collective=True)``).
        geo_step: steps between GEO syncs (PaddleRec's default 400).
        a_sync_configs: the async communicator's settings
            (``psfleet.ps.communicator.AsyncConfig``, the same model it takes).
        pass_configs: pass mode's settings (``psfleet.ps.communicator.PassConfig``:
            the dense path, the cache's device and byte budget).
        slice_var_up, split_method, min_block_size: how dense parameters are cut
            into blocks and placed on servers (``psfleet.ps.types.SlicingConfig``).
        dc_asgd: delay-compensated async SGD for dense parameters on the servers
            (Zheng et al. 2017); async mode only.
        dc_asgd_lambda: its variance-control lambda (0.04, MXNet's DCASGD default).
        lr_scaling: ``none``, ``sqrt`` or ``linear``: every table's learning rate times
            1, sqrt(W) or W for W workers, in the modes whose updates average the
            workers' batches (sync, geo, collective, async with global batch
            aggregation; ``psfleet.fleet.lr_scaling``); ``auto`` (default): ``sqrt``
            in geo and with global batch aggregation, ``none`` otherwise.
        server_wait_timeout_s: how long workers wait for servers to be ready,
            seconds; None reads PSFLEET_SERVER_WAIT_TIMEOUT_S (default 300).
        collective_backend: collective mode's torch.distributed backend: ``gloo``
            (CPU), ``nccl`` (GPU), or ``auto`` (PSFLEET_COLLECTIVE_BACKEND, whose
            default picks nccl when the process sees a GPU, else gloo).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = "async"
    geo_step: int = Field(GEO_STEP, ge=1)
    a_sync_configs: AsyncConfig = AsyncConfig()
    pass_configs: PassConfig = PassConfig()
    # The seeds' flat names; default and constraints are SlicingConfig's (declared once).
    slice_var_up: bool = _slicing_field("slice_var_up")
    split_method: SplitMethod = _slicing_field("split_method")
    min_block_size: int = _slicing_field("min_block_size")
    dc_asgd: bool = False
    dc_asgd_lambda: float = Field(0.04, gt=0)
    lr_scaling: LrScaling = "auto"
    server_wait_timeout_s: float | None = Field(None, gt=0)
    collective_backend: BackendChoice = "auto"

    @model_validator(mode="after")
    def _mode_specific_settings(self) -> DistributedStrategy:
        if self.dc_asgd and not mode_spec(self.mode).step_pushes:
            raise ValueError(f"dc_asgd compensates async delays; mode is {self.mode!r}")
        check_async_only(self.mode, self.a_sync_configs)
        check_lr_scaling(self.lr_scaling, self.mode,
                         self.a_sync_configs.global_batch_aggregation)
        return self

    def lr_factor(self, worker_num: int) -> float:
        """The factor of every table's learning rate with ``worker_num`` workers
        (:attr:`lr_scaling`; 1.0 when nothing is scaled)."""
        return lr_factor(self.lr_scaling, self.mode, worker_num,
                         self.a_sync_configs.global_batch_aggregation)

    def communicator_settings(self, worker_num: int) -> CommunicatorSettings:
        """What the communicator of :attr:`mode` needs."""
        return CommunicatorSettings(self.a_sync_configs, self.geo_step, worker_num,
                                    pass_config=self.pass_configs)

    def slicing(self) -> SlicingConfig:
        """The dense block layout settings."""
        return SlicingConfig(**self.model_dump(include=set(_SLICING)))


class StrategyFactory:
    """The seeds' constructors of the three parameter-server strategies."""

    @staticmethod
    def create_sync_strategy() -> DistributedStrategy:
        return DistributedStrategy(mode="sync")

    @staticmethod
    def create_async_strategy() -> DistributedStrategy:
        return DistributedStrategy(mode="async")

    @staticmethod
    def create_geo_strategy(geo_step: int = GEO_STEP) -> DistributedStrategy:
        """GEO strategy exchanging deltas every ``geo_step`` steps.

        Raises:
            ConfigError: ``geo_step`` < 1.
        """
        if geo_step < 1:
            raise ConfigError(f"geo_step: {geo_step!r} must be an integer >= 1")
        return DistributedStrategy(mode="geo", geo_step=geo_step)
