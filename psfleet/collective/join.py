"""Uneven inputs: a rank that runs out of batches keeps answering the others.

:class:`JoinContext` is torch's ``Join`` (``torch.distributed.algorithms.join``) over
the data-parallel model and the sparse communicator, which also marks the rank as
joined while it shadows the others' steps (:attr:`ExampleCounter.joined`): the
gradient hook then keeps the averaged dense gradient for the joined rank's own
update (see :mod:`psfleet.collective.ddp`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from torch.distributed.algorithms.join import Join, Joinable

from psfleet.collective.ddp import ExampleCounter

__all__ = ["JoinContext"]


class JoinContext:
    """``with JoinContext([model, communicator], counter): <training loop>``.

    The model (DistributedDataParallel) must come first: it notifies the context at
    the start of each step (its forward), before any of the step's collectives.

    Args:
        joinables: the torch Joinables of the loop, the model first.
        counter: this rank's example counter (shared with the model and communicator).
    """

    def __init__(self, joinables: Sequence[Joinable], counter: ExampleCounter) -> None:
        self._join = Join(list(joinables))
        self._counter = counter

    def __enter__(self) -> JoinContext:
        self._join.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        """Shadow the other ranks' steps until every rank is done. Blocks."""
        self._counter.joined = kind is None
        try:
            self._join.__exit__(kind, value, traceback)
        finally:
            self._counter.joined = False
