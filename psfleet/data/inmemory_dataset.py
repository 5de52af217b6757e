"""InMemoryDataset: the worker's share parsed once and held in memory, shuffled.

PaddlePaddle's in-memory dataset: ``load_into_memory`` (or ``preload_into_memory``
then ``wait_preload_done``), ``local_shuffle``, ``global_shuffle``,
``get_memory_data_size``, ``release_memory``. Each epoch yields batches in a
permutation seeded with ``shuffle_seed + epoch`` when a seed is set (as CriteoReader).

global_shuffle (balanced, deterministic)
    Worker ``k`` holding ``n_k`` examples permutes them with the seed ``(seed, k)``
    and deals them round-robin, starting at its global offset ``n_0 + .. + n_{k-1}``,
    to the ``W`` workers; the parts travel through a shared directory
    (:class:`~psfleet.data.exchange.FileExchange`); each worker concatenates what it
    received in source order and permutes it with the seed ``(seed, k, 1)``. So every
    worker ends with a uniformly random ``1/W`` of the union, ``floor(N/W)`` or
    ``ceil(N/W)`` examples, the same for a given seed whatever the timing; the multiset
    of examples is unchanged. (Paddle sends each example to a random worker, which
    leaves unequal shares; dealing keeps sync-mode steps equal.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from psfleet.data.batching import batches_per_epoch, memory_batches
from psfleet.data.dataset_base import DatasetBase
from psfleet.data.exchange import FileExchange
from psfleet.data.parsers import Parser
from psfleet.data.types import Batch
from psfleet.errors import ConfigError, FatalError

__all__ = ["InMemoryDataset"]

logger = logging.getLogger(__name__)


class InMemoryDataset(DatasetBase):
    """An in-memory reader of one worker's share (module docstring); arguments as
    :class:`~psfleet.data.dataset_base.DatasetBase` plus ``shuffle_seed`` (None: no
    per-epoch shuffle). Iterate from one thread.
    """

    def __init__(self, batch_size: int, parser: str | Parser = "criteo",
                 parser_options: object = None, *, shuffle_seed: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(batch_size, parser, parser_options, **kwargs)
        self.shuffle_seed = shuffle_seed
        self._labels: torch.Tensor | None = None
        self._dense: torch.Tensor | None = None
        self._sparse: torch.Tensor | None = None
        self._preload: threading.Thread | None = None
        self._preload_error: BaseException | None = None

    # -- loading -----------------------------------------------------------------------
    def load_into_memory(self) -> None:
        """Read and parse this worker's share (blocks; replaces what was loaded).

        Raises:
            ConfigError, DataError: bad file list, unreadable file, failing pipe
                command, or a malformed line with ``strict``.
        """
        labels, dense, sparse = [], [], []
        for chunk in self._pass():
            labels.append(chunk.labels)
            dense.append(chunk.dense)
            sparse.append(chunk.sparse)
        self._install(
            np.concatenate(labels) if labels else np.zeros(0, np.float32),
            np.concatenate(dense) if dense else np.zeros((0, self.parser.num_dense),
                                                         np.float32),
            np.concatenate(sparse) if sparse else np.zeros((0, self.parser.num_slots),
                                                           np.uint64))
        logger.info("worker %d of %d: %d examples in memory from %d files",
                    self.worker_index, self.worker_num, self.get_memory_data_size(),
                    len(self.share().files))

    def _install(self, labels: npt.NDArray[np.float32], dense: npt.NDArray[np.float32],
                 sparse: npt.NDArray[np.uint64]) -> None:
        self._labels = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32))
        self._dense = torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32))
        self._sparse = torch.from_numpy(np.ascontiguousarray(sparse).view(np.int64))

    def preload_into_memory(self) -> None:
        """Start :meth:`load_into_memory` in a background thread; returns at once."""
        if self._preload is not None:
            raise ConfigError("preload_into_memory(): a preload is already running; call "
                              "wait_preload_done() first")
        self._preload_error = None

        def run() -> None:
            try:
                self.load_into_memory()
            except BaseException as exc:  # re-raised by wait_preload_done
                self._preload_error = exc

        self._preload = threading.Thread(target=run, name="psfleet-preload", daemon=True)
        self._preload.start()

    def wait_preload_done(self) -> None:
        """Block until the preload finished; re-raise its error, if any."""
        if self._preload is None:
            raise ConfigError("wait_preload_done(): call preload_into_memory() first")
        self._preload.join()
        self._preload = None
        if self._preload_error is not None:
            error, self._preload_error = self._preload_error, None
            raise error

    def release_memory(self) -> None:
        """Drop the examples held in memory."""
        self._labels = self._dense = self._sparse = None

    def _arrays(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._labels is None or self._dense is None or self._sparse is None:
            raise FatalError("InMemoryDataset: no data in memory; call load_into_memory() "
                             "(or preload_into_memory() + wait_preload_done()) first")
        return self._labels, self._dense, self._sparse

    def get_memory_data_size(self, exchange: FileExchange | None = None) -> int:
        """Examples in memory on this worker, or on all workers with ``exchange`` (a
        collective: every worker must call it then)."""
        local = int(self._arrays()[0].shape[0])
        if exchange is None:
            return local
        return sum(exchange.all_gather("memory_size", local))

    @property
    def num_examples(self) -> int:
        """Examples in memory on this worker."""
        return self.get_memory_data_size()

    # -- shuffling ---------------------------------------------------------------------
    def local_shuffle(self, seed: int = 0) -> None:
        """Permute this worker's examples in place (seeded: deterministic)."""
        labels, dense, sparse = self._arrays()
        order = torch.from_numpy(np.random.default_rng([seed, self.worker_index]).permutation(
            labels.shape[0]))
        self._labels, self._dense, self._sparse = labels[order], dense[order], sparse[order]

    def global_shuffle(self, exchange: FileExchange, seed: int = 0) -> None:
        """Exchange examples so each worker holds a random 1/W of the union (module
        docstring). A collective: every worker calls it with the same seed. Blocks.

        Raises:
            ConfigError: ``exchange`` is for another worker index or count.
            DataError: the exchange directory cannot be written or read.
        """
        if (exchange.worker_index, exchange.worker_num) != (self.worker_index,
                                                             self.worker_num):
            raise ConfigError("global_shuffle: the exchange is for worker "
                              f"{exchange.worker_index}/{exchange.worker_num}, the dataset "
                              f"for {self.worker_index}/{self.worker_num}")
        labels, dense, sparse = (t.numpy() for t in self._arrays())
        count = labels.shape[0]
        counts = exchange.all_gather("global_shuffle_counts", count)
        offset = sum(counts[: self.worker_index])
        order = np.random.default_rng([seed, self.worker_index]).permutation(count)
        dest = (offset + np.arange(count)) % self.worker_num
        parts = []
        for d in range(self.worker_num):
            mine = order[dest == d]
            parts.append({"labels": labels[mine], "dense": dense[mine], "sparse": sparse[mine]})
        received = exchange.all_to_all("global_shuffle", parts)
        new_labels = np.concatenate([r["labels"] for r in received])
        new_dense = np.concatenate([r["dense"] for r in received])
        new_sparse = np.concatenate([r["sparse"] for r in received])
        final = np.random.default_rng([seed, self.worker_index, 1]).permutation(len(new_labels))
        self._install(new_labels[final], new_dense[final], new_sparse[final])
        logger.info("global_shuffle: worker %d of %d now holds %d of %d examples",
                    self.worker_index, self.worker_num, len(final), sum(counts))

    # -- sync mode ---------------------------------------------------------------------
    def truncate(self, examples: int) -> int:
        """Keep only the first ``examples`` examples (sync mode: equal steps on every
        worker). Returns how many were dropped."""
        labels, dense, sparse = self._arrays()
        dropped = max(int(labels.shape[0]) - examples, 0)
        if dropped:
            self._labels, self._dense, self._sparse = (labels[:examples], dense[:examples],
                                                       sparse[:examples])
        return dropped

    # -- Reader protocol ---------------------------------------------------------------
    @property
    def num_batches(self) -> int:
        """Batches of one epoch."""
        return batches_per_epoch(self.num_examples, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        """Batches of one epoch."""
        return self.num_batches

    def __iter__(self) -> Iterator[Batch]:
        """One epoch of batches, shuffled with ``shuffle_seed + epoch`` if a seed is set."""
        labels, dense, sparse = self._arrays()
        order = None
        if self.shuffle_seed is not None:
            rng = np.random.default_rng(self.shuffle_seed + self.epoch)
            order = torch.from_numpy(rng.permutation(int(labels.shape[0])))
        return memory_batches(labels, dense, sparse, self.batch_size, order,
                              drop_last=self.drop_last, start_batch=self._take_start_batch())
