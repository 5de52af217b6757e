"""The communicator contract: how a worker's gradients reach the tables.

A communicator sits between the training loop and a :class:`TableClient`. The loop
pushes each step's gradients (sparse rows and the flat dense gradient) and, after the
step, installs the freshest dense values the communicator has. When pushes are sent,
merged and how often dense values are refreshed is the mode's business: one class per
mode beside this file, chosen by name through :func:`make_communicator`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from psfleet.job.modes import mode_spec
from psfleet.ps.routing import RoutedKeys
from psfleet.ps.types import RuleConfig, SparseTableConfig

if TYPE_CHECKING:  # the client imports the tables (and torch); a config check needs neither
    from psfleet.ps.client import PullHandle, TableClient

__all__ = ["GEO_STEP", "AsyncConfig", "Communicator", "CommunicatorSettings", "PassConfig",
           "check_async_only"]

#: Steps between GEO syncs unless set (PaddleRec's default ``geo_step``).
GEO_STEP = 400


_AT_LEAST_ONE = ("k_steps", "send_queue_size", "max_merge_var_num", "thread_pool_size")


class AsyncConfig(BaseModel):
    """Settings of the async communicator: Paddle's ``strategy.a_sync_configs``.

    Declared once: ``DistributedStrategy.a_sync_configs`` is this model, and the async
    communicator takes it as it is. Frozen; unknown keys are errors; every error names
    the field as ``strategy.a_sync_configs.<name>``.

    Attributes:
        k_steps: dense values are pulled after every ``k_steps`` sends (>= 1).
        send_queue_size: steps waiting to be sent before ``end_step`` blocks
            (back-pressure on a worker that outruns the servers; it bounds how stale
            the gradients the servers apply can be) (>= 1).
        max_merge_var_num: queued steps merged (summed) into one send at most (>= 1).
        thread_pool_size: send threads (each merges and sends on its own) (>= 1).
        send_wait_times: when fewer than ``max_merge_var_num`` steps are queued, a
            send thread waits up to this many 10 ms periods for more to merge
            (0: send at once) (>= 0).
        local_dense_update: the worker also applies its dense gradient to its own
            parameters at once (the dense table's rule) and keeps those steps on top
            of the servers' values until they include them
            (``psfleet.fleet.dense_lag``); False: it computes on the servers' values
            as they arrive, its own last steps missing (Paddle's behaviour).
        momentum_correction: with W workers, the dense table's Adam beta1 is lowered
            by the momentum asynchrony adds, to max(0, beta1 - (1 - 1/W))
            (``psfleet.fleet.async_momentum``; Mitliagkas et al. 2016); False: the
            optimizer's beta1 as given.
        global_batch_aggregation: GBA (Su et al. 2022): the servers gather W batches'
            gradients from whichever workers push and apply their mean once, sync
            mode's global batch with no worker waiting for another
            (``psfleet.ps.communicator.global_batch_mode``); ``lr_scaling: auto``
            then scales the learning rate by sqrt(W), as in sync. False: each push
            is applied as it arrives.
        max_staleness: with ``global_batch_aggregation``, a gradient computed on
            values more than this many global batches old is scaled by
            max_staleness / staleness (``psfleet.ps.global_batch``; 0: never) (>= 0).
        bounded_staleness: SSP (Ho et al. 2013): a worker waits before step ``t``
            until every worker's steps up to ``t - 1 - bounded_staleness`` are
            applied on the servers (``psfleet.ps.clocks``; 0: each step reads every
            worker's earlier steps, as in sync mode); None: no worker waits (>= 0).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    k_steps: int = 1
    send_queue_size: int = 16
    max_merge_var_num: int = 16
    thread_pool_size: int = 1
    send_wait_times: int = 0
    local_dense_update: bool = True
    momentum_correction: bool = True
    global_batch_aggregation: bool = False
    max_staleness: int = 4
    bounded_staleness: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ValueError(f"strategy.a_sync_configs.{unknown[0]}: unknown setting; "
                                 f"the settings are {', '.join(cls.model_fields)}")
        return data

    @field_validator(*_AT_LEAST_ONE, "send_wait_times", "max_staleness", "bounded_staleness")
    @classmethod
    def _in_range(cls, value: int | None, info: ValidationInfo) -> int | None:
        least = 1 if info.field_name in _AT_LEAST_ONE else 0
        if value is not None and value < least:
            raise ValueError(f"strategy.a_sync_configs.{info.field_name}: {value!r} must be "
                             f"an integer >= {least}")
        return value


def check_async_only(mode: str, config: AsyncConfig) -> None:
    """Refuse global batch aggregation and bounded staleness outside async mode, which
    alone sends its pushes step by step (a setting another mode would silently ignore).

    Raises:
        ValueError: ``config.global_batch_aggregation`` or ``config.bounded_staleness``
            is set and ``mode`` is not ``async`` (the message names the setting and
            what to change).
    """
    if mode_spec(mode).step_pushes:
        return
    if config.global_batch_aggregation:
        raise ValueError(f"a_sync_configs.global_batch_aggregation: gathers the pushes of "
                         f"async mode; mode is {mode!r}: set the mode to async or turn "
                         "the setting off")
    if config.bounded_staleness is not None:
        raise ValueError(f"a_sync_configs.bounded_staleness: bounds how far async mode's "
                         f"workers run ahead of each other; mode is {mode!r}: set the mode "
                         "to async or remove the setting")


class PassConfig(BaseModel):
    """Settings of pass mode (``mode: gpubox``): the worker cache and the dense path.

    Declared once: ``DistributedStrategy.pass_configs`` is this model. Frozen; unknown
    keys are errors.

    Attributes:
        dense_mode: how dense parameters train between passes' boundaries: ``async``
            (pushed every step, applied as they arrive), ``sync`` (every worker's
            step averaged, as sync mode) or ``geo`` (each worker steps its own copy
            and the copies' changes are averaged on the servers every ``geo_step``
            steps and at each pass's end, as GEO mode: no RPC per step at all).
        cache_budget_bytes: bytes of rows (values and rule state, all tables) one
            worker's cache may hold; a pass whose rows need more is split into
            sub-passes that each fit (>= 1 MiB; default 1 GiB).
        device: where the cache lives: ``cpu``, or ``cuda``/``cuda:N`` (a GPU must
            be present).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    dense_mode: Literal["async", "sync", "geo"] = "async"
    cache_budget_bytes: int = Field(1 << 30, ge=1 << 20)
    device: str = "cpu"

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        kind, _, index = value.partition(":")
        if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
            raise ValueError("must be cpu, cuda or cuda:N")
        return value


class Communicator(ABC):
    """Sends a worker's gradients and brings back fresh parameters.

    Args:
        client: the tables (remote servers or in process).
    """

    def __init__(self, client: TableClient) -> None:
        self.client = client

    def start(self) -> None:
        """Start background work, if the mode has any."""

    def on_sparse_table(self, table_id: int, config: SparseTableConfig) -> None:
        """Called once per sparse table after the servers created it."""

    def on_dense_table(self, table_id: int, rule: RuleConfig, values: np.ndarray) -> None:
        """Called once per dense table with its rule and starting values float32[n]."""

    #: Whether rows may be pulled ahead of the step that uses them (``prefetch``):
    #: only where a step's rows may be a step older than the last push (async).
    prefetches = False

    def pull_sparse(self, table_id: int, keys: np.ndarray, create: bool = True) -> np.ndarray:
        """Rows of ``keys`` (uint64[N]) as float32[N, dim]; blocks until they arrive."""
        return self.client.pull_sparse(table_id, keys, create)

    def start_pull_sparse(self, table_id: int, keys: np.ndarray,
                          create: bool = True) -> PullHandle:
        """Pull the rows of ``keys`` (uint64[N]) as a handle (a future): its
        ``result()`` waits for float32[N, dim]; dropping it unused is harmless.

        The pull is sent now and overlaps whatever runs until ``result()``; the
        handle's ``keys`` carry their routing for the step's push. A mode with a row
        source of its own (GEO's local copy) overrides this.
        """
        return self.client.start_pull_sparse(table_id, keys, create)

    #: Whether the worker's optimizer also steps its dense parameters locally and keeps
    #: its own steps that :meth:`fresh_dense`'s values miss (``fresh_dense_lag``) on
    #: top of them (``psfleet.fleet.dense_lag``): async with ``local_dense_update``.
    local_dense_update = False

    #: This worker's last steps missing from the values :meth:`fresh_dense` last
    #: returned (0 in the modes whose values hold every step).
    fresh_dense_lag = 0

    #: Whether pushes carry the ``ctr`` tables' show and click counts to the tables
    #: (every mode with servers; not collective, whose ranks hold no servers' tables).
    takes_counts = True

    #: Whether :meth:`push_sparse` takes gradients as torch tensors, repeated keys
    #: allowed (pass mode's device cache), rather than merged float32 arrays.
    takes_tensors = False

    @abstractmethod
    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    grads: np.ndarray, shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> None:
        """Hand over gradients float32[N, dim] of distinct keys uint64[N] (or the keys
        routed by their pull, ``PullHandle.keys``), and for a table with the ``ctr``
        accessor its per-key show and click counts (float32[N] each, both or
        neither; ``TableClient.push_sparse``). Every push of a ctr table carries
        counts; merged pushes sum them per key like the gradients.

        The arrays must not be modified afterwards (they may be sent later).
        """

    @abstractmethod
    def push_dense(self, table_id: int, grads: np.ndarray) -> None:
        """Hand over the flat dense gradient float32[total] of one step."""

    def end_step(self) -> None:
        """Close the step: the pushes since the last call form one training step."""

    @abstractmethod
    def fresh_dense(self, table_id: int) -> np.ndarray | None:
        """Dense values newer than the ones last returned, or None. Call once per step."""

    @abstractmethod
    def flush(self) -> None:
        """Block until every push handed over has been applied by the tables.

        Raises:
            RpcError, RemoteError: a send failed (also raised by later pushes).
        """

    def park(self) -> None:
        """This worker is about to wait for the others (a barrier): it must hold none
        of them back meanwhile (bounded staleness, ``AsyncConfig.bounded_staleness``).
        Nothing to do in most modes."""

    def stop(self) -> None:
        """Flush and end background work. Idempotent."""
        self.flush()


@dataclass(frozen=True)
class CommunicatorSettings:
    """What the modes' constructors need: async settings, geo_step, worker count, pass
    mode's settings, and for collective mode the step's example count
    (``ExampleCounter.take``) and the device of collective tensors (``cpu`` or
    ``cuda:N``)."""

    async_config: AsyncConfig = AsyncConfig()
    geo_step: int = GEO_STEP
    worker_num: int = 1
    example_count: Callable[[], int] | None = None
    device: str = "cpu"
    pass_config: PassConfig = PassConfig()
