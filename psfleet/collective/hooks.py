"""What collective mode changes in a worker, in one object chosen at ``fleet.init``.

The worker runtime (``psfleet.fleet.runtime``) asks its hooks at each point where the
modes differ; :class:`CollectiveHooks` is collective mode's answer (the
parameter-server modes' is ``psfleet.fleet.runtime.ParameterServerHooks``):

- every rank holds every table in process, and its communicator is ``collective``
  (sparse gradients all-gathered, ``psfleet.ps.communicator.collective_mode``) with
  this rank's example count and device;
- the model is wrapped for data parallelism (:func:`~psfleet.collective.wrap_model`),
  and a training loop runs inside :class:`~psfleet.collective.JoinContext`;
- the dense table starts from rank 0's values; barriers are the process group's;
- every rank loads a save or checkpoint into its own tables; the end leaves the
  process group.

This module imports nothing of ``psfleet.ps``: the communicator it gets is duck-typed
(a torch ``Joinable`` with a ``shadow_step`` attribute).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import numpy as np
from torch import nn
from torch.distributed.algorithms.join import Joinable

from psfleet.collective.ddp import ExampleCounter, wrap_model
from psfleet.collective.join import JoinContext
from psfleet.collective.process_group import (
    barrier,
    broadcast_from_rank0,
    destroy_process_group,
    init_process_group,
)
from psfleet.collective.types import CollectiveContext
from psfleet.errors import FatalError

__all__ = ["CollectiveHooks"]

logger = logging.getLogger(__name__)

S = TypeVar("S")


class CollectiveHooks:
    """Collective mode's side of the worker runtime (see the module doc).

    Args:
        context: the process group this rank joined.
    """

    is_collective = True
    #: Every rank holds every table in process (no servers).
    tables_in_process = True
    #: The communicator mode this rank uses, whatever the strategy's PS mode says.
    communicator_mode: str | None = "collective"
    #: Every rank loads a save into its own tables (not only worker 0).
    every_rank_loads = True

    def __init__(self, context: CollectiveContext) -> None:
        self.context = context
        self.examples = ExampleCounter()
        self._model: nn.Module | None = None

    @classmethod
    def connect(cls, backend: str = "auto") -> CollectiveHooks:
        """Join the job's process group from the environment. Blocks until every rank
        joined (see :func:`~psfleet.collective.init_process_group` for the errors)."""
        context = init_process_group(backend=None if backend == "auto" else backend)
        logger.info("collective mode, rank %d of %d, backend %s on %s", context.rank,
                    context.world_size, context.backend, context.device)
        return cls(context)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """DDP with example-weighted all-reduce, on this rank's device."""
        self._model = wrap_model(model, self.examples, self.context.device)
        return self._model

    def join(self, communicator: object | None) -> AbstractContextManager[Any]:
        """torch's Join over the wrapped model and the sparse communicator.

        Raises:
            FatalError: no communicator yet (``fleet.init_worker`` not called).
        """
        if not isinstance(communicator, Joinable):
            raise FatalError("call fleet.init_worker() before fleet.join()")
        joinables: list[Joinable] = [self._model] if isinstance(self._model, Joinable) else []
        return JoinContext([*joinables, communicator], self.examples)

    def communicator_settings(self, settings: S) -> S:
        """``settings`` with this rank's example count and device."""
        return dataclasses.replace(settings, example_count=self.examples.take,  # type: ignore[type-var]
                                   device=self.context.device)

    def initial_dense(self, values: np.ndarray) -> np.ndarray:
        """Rank 0's starting dense values, on every rank. Blocks."""
        return broadcast_from_rank0(values, self.context.device)

    def attach(self, communicator: object, step: Callable[[], None]) -> None:
        """A joined rank shadows the others' steps by running the optimizer's ``step``."""
        if hasattr(communicator, "shadow_step"):
            communicator.shadow_step = step

    def barrier(self, name: str, client_barrier: Callable[[], None]) -> None:
        """The process group's barrier (``client_barrier`` is not needed)."""
        barrier()

    def close(self) -> None:
        """Leave the process group (after the stop barrier)."""
        destroy_process_group()
