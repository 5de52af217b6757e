"""DistributedStrategy: how a job trains (mode and communicator settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from psfleet.ps.communicator import AsyncConfig

__all__ = ["DistributedStrategy", "AsyncSettings"]


class AsyncSettings(BaseModel):
    """Paddle's ``a_sync_configs`` (see ``psfleet.ps.communicator.AsyncConfig``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    k_steps: int = Field(1, ge=1)
    send_queue_size: int = Field(16, ge=1)
    max_merge_var_num: int = Field(16, ge=1)


class DistributedStrategy(BaseModel):
    """How the job trains.

    Attributes:
        mode: ``async`` (the parameter-server mode available in this release).
        a_sync_configs: the async communicator's settings.
        server_wait_timeout_s: how long workers wait for servers to be ready, seconds;
            None reads PSFLEET_SERVER_WAIT_TIMEOUT_S (default 300).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["async"] = "async"
    a_sync_configs: AsyncSettings = AsyncSettings()
    server_wait_timeout_s: float | None = Field(None, gt=0)

    def async_config(self) -> AsyncConfig:
        """The communicator's config."""
        return AsyncConfig(**self.a_sync_configs.model_dump())
