"""Collective mode: every rank holds every table; sparse gradients are all-gathered.

There are no servers. Each rank keeps the whole sparse and dense tables in process
(rows are initialised by key, so they start equal everywhere). Dense gradients
arrive already averaged over the ranks (DistributedDataParallel with an
example-weighted hook, ``psfleet.collective.ddp``) and are applied to the local
dense table. At the end of each step the sparse rows' gradients go to every rank:
each rank contributes ``(keys, n_r * grads)`` per table (``n_r`` its examples, the
grads being the mean over its batch), all-gathers them, sums equal keys and divides
by ``N = sum_r n_r``, which is the gradient of the union batch, and applies it to
its own table with the table's rule. Every rank applies the same update, in the same
order, so the tables stay identical without ever being sent.

The communicator is a torch ``Joinable``: inside ``Join([ddp_model, communicator])``
(``fleet.join()``) a rank that ran out of batches shadows each step of the others by
running :attr:`CollectiveCommunicator.shadow_step` (the optimizer's step: no rows of
its own, count 0, the dense gradient the others averaged), so uneven batch counts do
not hang and the joined rank applies the same updates as the others.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from psfleet.errors import ConfigError
from psfleet.ps.client import TableClient
from psfleet.ps.communicator.local_mode import LocalCommunicator
from psfleet.ps.merge import merge_sparse
from psfleet.ps.routing import RoutedKeys, keys_of
from psfleet.ps.types import SparseTableConfig

__all__ = ["CollectiveCommunicator"]

_KEY_WORDS = 2  # a uint64 key travels as two int32 words


class _ShadowHook(JoinHook):
    """A joined rank's side of each step: the all-gathers, contributing nothing."""

    def __init__(self, communicator: CollectiveCommunicator) -> None:
        self.communicator = communicator

    def main_hook(self) -> None:
        self.communicator.shadow()


class CollectiveCommunicator(LocalCommunicator, Joinable):
    """All-gathers sparse gradients; applies every update locally (see module doc).

    Args:
        client: the in-process tables (``LocalClient``), the whole model.
        example_count: returns this rank's examples of the step and starts the next
            (``ExampleCounter.take``).
        device: where collective tensors live: ``cpu`` (gloo) or ``cuda:N`` (nccl).
        group: the process group; the default group when None.

    Raises:
        ConfigError: ``example_count`` is None.
    """

    def __init__(self, client: TableClient, example_count: Callable[[], int] | None,
                 device: str = "cpu", group: dist.ProcessGroup | None = None) -> None:
        LocalCommunicator.__init__(self, client)
        Joinable.__init__(self)
        if example_count is None:
            raise ConfigError("the collective communicator needs the example count of each "
                              "step (fleet.init(is_collective=True) provides it)")
        self._example_count = example_count
        self._device = torch.device(device)
        self._group = group
        self._dims: dict[int, int] = {}
        self._pending: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = defaultdict(
            lambda: ([], []))
        self.steps = 0
        #: Runs one step on a joined rank (fleet sets the optimizer's ``step``); None:
        #: only the sparse exchange.
        self.shadow_step: Callable[[], None] | None = None
        self._shadowing = False

    def shadow(self) -> None:
        """A joined rank's side of one step of the others (see the module doc)."""
        self._shadowing = True
        try:
            if self.shadow_step is not None:
                self.shadow_step()
            else:
                self.exchange(0, {})
        finally:
            self._shadowing = False

    def on_sparse_table(self, table_id: int, config: SparseTableConfig) -> None:
        self._dims[table_id] = config.dim

    #: Every rank holds its own tables: no show/click counts are sent.
    takes_counts = False

    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    grads: np.ndarray, shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> None:
        pending_keys, pending_grads = self._pending[table_id]
        pending_keys.append(keys_of(keys))
        pending_grads.append(grads)

    def end_step(self) -> None:
        """Exchange and apply this step's sparse gradients. Blocks on every rank's step.

        Every rank must end the same number of steps, or run inside
        ``Join([ddp_model, communicator])`` (``fleet.join()``).
        """
        if not self._shadowing:
            Join.notify_join_context(self)
        count = self._example_count()
        mine = {tid: merge_sparse(*self._pending[tid]) for tid in self._dims
                if self._pending[tid][0]}
        self._pending.clear()
        self.exchange(count, mine)
        self.steps += 1

    def exchange(self, count: int, mine: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """All-gather every table's ``(keys, count * grads)``; apply the union's mean.

        Args:
            count: this rank's examples in the step (0 on a joined rank).
            mine: table id -> (uint64[K] distinct keys, float32[K, dim] mean gradients);
                tables missing contribute nothing.
        """
        if not self._dims:
            return
        tables = sorted(self._dims)
        empty = (np.zeros(0, np.uint64), np.zeros((0, 1), np.float32))
        sizes = torch.tensor([count] + [mine.get(t, empty)[0].size for t in tables],
                             dtype=torch.int64)
        all_sizes = self._all_gather(sizes).tolist()  # [W][1 + T]
        total = sum(row[0] for row in all_sizes)
        for column, table_id in enumerate(tables, start=1):
            dim = self._dims[table_id]
            keys, grads = mine.get(table_id, (np.zeros(0, np.uint64),
                                              np.zeros((0, dim), np.float32)))
            longest = max(row[column] for row in all_sizes)
            if longest == 0:
                continue
            packed = np.zeros((longest, _KEY_WORDS + dim), np.int32)  # [maxK, 2 + dim]
            packed[: keys.size, :_KEY_WORDS] = keys.view(np.int32).reshape(-1, _KEY_WORDS)
            packed[: keys.size, _KEY_WORDS:] = (grads * np.float32(count)).view(np.int32)
            gathered = self._all_gather(torch.from_numpy(packed)).numpy()  # [W, maxK, 2+dim]
            all_keys, all_grads = [], []
            for rank, row in enumerate(all_sizes):
                part = np.ascontiguousarray(gathered[rank, : row[column]])
                all_keys.append(part[:, :_KEY_WORDS].copy().view(np.uint64).reshape(-1))
                all_grads.append(part[:, _KEY_WORDS:].copy().view(np.float32))
            union_keys, union_grads = merge_sparse(all_keys, all_grads)
            union_grads = union_grads / np.float32(max(total, 1))
            self.client.push_sparse(table_id, union_keys, union_grads.astype(np.float32))

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` (same shape everywhere), stacked in rank order (CPU)."""
        local = tensor.to(self._device)
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(self._group))]
        dist.all_gather(parts, local, group=self._group)
        return torch.stack(parts).cpu()

    # -- torch Joinable --------------------------------------------------------------
    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _ShadowHook(self)

    @property
    def join_device(self) -> torch.device:
        return self._device

    @property
    def join_process_group(self) -> Any:
        return self._group if self._group is not None else dist.group.WORLD
