"""Pass mode's worker cache: one sparse table's rows of one pass, on a torch device.

``begin_pass`` pulls every row a pass will read, with its rule state, into a
:class:`PassRows`; the pass's steps look rows up there and apply the table's own rule
(``psfleet.ps.table.rules``, the servers' formulas, run on tensors) without any RPC;
``end_pass`` sends back each touched row's change (values and rule state) and the
show/click counts the pass gathered. The seeds' GPUBox keeps a pass's rows in a GPU
hash table the same way (Paddle's ``PSGPUWrapper::BuildGPUTask`` / ``EndPass``).

The rows live in one tensor ``float32[P, dim + state]`` on ``device`` (the CPU, or
``cuda:N``): every operation is a torch call on that tensor, so the code is the same
for any device. Keys stay on the host, in the servers' vectorised hash index
(``psfleet.ps.table.hash_index``: 0.6 ms for a batch of 13k keys among 1M, where a
``np.searchsorted`` over the sorted keys takes 3 ms). The values the pass started
from stay on the host (the delta's base), as do the per-row counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from psfleet.errors import ConfigError, FatalError
from psfleet.ps.table.hash_index import HashIndex
from psfleet.ps.table.rules import Rule

__all__ = ["PassRows", "split_pass"]


class PassRows:
    """The rows of one sparse table for one pass, updated in place on ``device``.

    Not thread safe (one training loop per worker).

    Args:
        keys (uint64[P]): the pass's distinct keys, sorted ascending.
        rows (float32[P, dim + state]): their rows as the servers held them at
            ``begin_pass``: values, then rule state.
        dim: values per row.
        rule: the table's rule (applied to the cached rows at each push).
        device: where the rows live (``torch.device("cpu")``, ``"cuda:0"``, ...).
        label: the table as errors name it.

    Attributes:
        nbytes: bytes the cache holds on the device.
    """

    def __init__(self, keys: np.ndarray, rows: np.ndarray, dim: int, rule: Rule,
                 device: torch.device, label: str) -> None:
        self.keys = keys
        self._index = HashIndex(keys.size)
        self._index.insert_new(keys)  # row i holds keys[i]
        self.dim = dim
        self.rule = rule
        self.label = label
        self.base = rows  # host, float32[P, W]: what the pass started from
        self.data = torch.from_numpy(rows).to(device, copy=True)  # [P, W], updated
        self.device = self.data.device
        self.touched = np.zeros(keys.size, dtype=bool)
        self.shows = np.zeros(keys.size, dtype=np.float32)
        self.clicks = np.zeros(keys.size, dtype=np.float32)
        self.nbytes = self.data.numel() * 4

    def __len__(self) -> int:
        return int(self.keys.size)

    def positions(self, keys: np.ndarray) -> np.ndarray:
        """int64[N]: each of ``keys`` (uint64[N]) as its row number in the cache.

        Raises:
            FatalError: a key is not in this pass (names the table and the key): the
                ids given to ``begin_pass`` must include every id the pass reads.
        """
        pos = self._index.lookup(keys)
        missing = pos < 0
        if missing.any():
            first = int(keys[np.flatnonzero(missing)[0]])
            raise FatalError(
                f"pass mode: table {self.label}: {int(missing.sum())} of {keys.size} ids "
                f"read in this pass were not given to begin_pass (the first is {first}); "
                "begin_pass must be given every id the pass's batches read "
                "(psfleet.nn.pass_ids(model, batches) collects them)")
        return pos.astype(np.int64, copy=False)

    def values(self, keys: np.ndarray) -> torch.Tensor:
        """The current values of ``keys`` (uint64[N], in the pass): a new
        Tensor[N, dim], float32, on the cache's device."""
        pos = torch.from_numpy(self.positions(keys)).to(self.device)
        return self.data.index_select(0, pos)[:, : self.dim]

    def push(self, keys: np.ndarray, grads: torch.Tensor | np.ndarray,
             shows: np.ndarray | None = None, clicks: np.ndarray | None = None) -> None:
        """Apply the rule once to each distinct key's rows with its summed gradient.

        Args:
            keys (uint64[N]): keys in the pass; a key given twice gets the sum of its
                gradients (one rule step, as the servers' merge does).
            grads (Tensor or array [N, dim], float32): their gradients (moved to the
                cache's device).
            shows, clicks (float32[N]) or None: a ``ctr`` table's per-key counts,
                summed per row until ``end_pass`` sends them.

        Raises:
            FatalError: a key is not in this pass.
        """
        pos = self.positions(keys)
        self.touched[pos] = True
        if shows is not None and clicks is not None:
            np.add.at(self.shows, pos, shows)
            np.add.at(self.clicks, pos, clicks)
        g = torch.as_tensor(grads).to(self.device, torch.float32)
        rows, inverse = torch.unique(torch.from_numpy(pos).to(self.device),
                                     return_inverse=True)
        summed = torch.zeros((rows.numel(), self.dim), dtype=torch.float32,
                             device=self.device).index_add_(0, inverse, g)  # [U, dim]
        block = self.data.index_select(0, rows)  # [U, W]
        self.rule.update(block[:, : self.dim], block[:, self.dim:], summed)
        self.data.index_copy_(0, rows, block)

    def sent(self, keys: np.ndarray) -> None:
        """The changes of ``keys`` (uint64[N], in the pass) were applied by the servers:
        :meth:`deltas` leaves them out from now on."""
        self.touched[self.positions(keys)] = False

    def deltas(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What the pass changed: (keys uint64[T], deltas float32[T, W], shows
        float32[T], clicks float32[T]) of the T rows pushed to in the pass and not
        yet :meth:`sent`."""
        touched = np.flatnonzero(self.touched)
        index = torch.from_numpy(touched).to(self.device)
        now = self.data.index_select(0, index).cpu().numpy()
        return (self.keys[touched], now - self.base[touched], self.shows[touched],
                self.clicks[touched])


def split_pass(batch_keys: Sequence[Mapping[int, np.ndarray]], row_bytes: Mapping[int, int],
               budget_bytes: int) -> list[range]:
    """Cut a pass's batches into sub-passes whose distinct rows fit ``budget_bytes``.

    Greedy, in batch order: each sub-pass takes batches while the rows of their
    distinct keys (a key counted once per sub-pass) fit. When every key counted as
    often as it is given fits, the pass is one sub-pass, without the ``np.unique``
    (``begin_pass`` dedups the keys anyway). Vectorised: per table one
    ``np.unique`` over the remaining batches' keys finds the batch where each key
    first appears, so the bytes a sub-pass needs after each batch are one cumulative
    sum.

    Args:
        batch_keys: per batch, per table id, its keys (uint64[N], repeats allowed).
        row_bytes: bytes one cached row of each table takes.
        budget_bytes: ``PassConfig.cache_budget_bytes``.

    Returns:
        The sub-passes as ranges of batch indexes, in order, covering every batch.

    Raises:
        ConfigError: one batch alone needs more than the budget (names its bytes).
    """
    bound = sum(keys.size * row_bytes.get(t, 0) for b in batch_keys for t, keys in b.items())
    if bound <= budget_bytes:  # even with no key repeated it fits: one sub-pass
        return [range(len(batch_keys))] if batch_keys else []
    out: list[range] = []
    start = 0
    while start < len(batch_keys):
        need = np.zeros(len(batch_keys) - start, dtype=np.int64)  # new bytes per batch
        for table_id, width in row_bytes.items():
            parts = [b.get(table_id, np.zeros(0, np.uint64)) for b in batch_keys[start:]]
            if not any(p.size for p in parts):
                continue
            owner = np.repeat(np.arange(len(parts)), [p.size for p in parts])
            _, first = np.unique(np.concatenate(parts), return_index=True)
            need += np.bincount(owner[first], minlength=len(parts)) * width
        total = np.cumsum(need)
        fits = int(np.searchsorted(total, budget_bytes, side="right"))
        if fits == 0:
            raise ConfigError(f"pass mode: batch {start} alone needs {int(total[0])} bytes of "
                              f"rows, above pass_configs.cache_budget_bytes ({budget_bytes}); "
                              "raise the budget or lower the batch size")
        out.append(range(start, start + fits))
        start += fits
    return out
