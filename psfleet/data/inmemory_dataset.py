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

from psfleet.data.batch import Batch
from psfleet.data.batching import batches_per_epoch, memory_batches
from psfleet.data.dataset_base import DatasetBase
from psfleet.data.exchange import FileExchange
from psfleet.data.jagged_rows import JaggedRows
from psfleet.data.parsers import Parser
from psfleet.data.types import ParsedChunk
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
        self._examples: ParsedChunk | None = None
        self._preload: threading.Thread | None = None
        self._preload_error: BaseException | None = None

    # -- loading -----------------------------------------------------------------------
    def load_into_memory(self) -> None:
        """Read and parse this worker's share (blocks; replaces what was loaded).

        Raises:
            ConfigError, DataError: bad file list, unreadable file, failing pipe
                command, or a malformed line with ``strict``.
        """
        chunks = list(self._pass())
        self._examples = (ParsedChunk.concat(chunks) if chunks
                          else ParsedChunk.empty(self.parser.schema))
        logger.info("worker %d of %d: %d examples in memory from %d files",
                    self.worker_index, self.worker_num, self.get_memory_data_size(),
                    len(self.share().files))

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
        self._examples = None

    def _loaded(self) -> ParsedChunk:
        if self._examples is None:
            raise FatalError("InMemoryDataset: no data in memory; call load_into_memory() "
                             "(or preload_into_memory() + wait_preload_done()) first")
        return self._examples

    def get_memory_data_size(self, exchange: FileExchange | None = None) -> int:
        """Examples in memory on this worker, or on all workers with ``exchange`` (a
        collective: every worker must call it then)."""
        local = len(self._loaded())
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
        examples = self._loaded()
        order = np.random.default_rng([seed, self.worker_index]).permutation(len(examples))
        self._examples = examples.take(order)

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
        examples = self._loaded()
        count = len(examples)
        counts = exchange.all_gather("global_shuffle_counts", count)
        offset = sum(counts[: self.worker_index])
        order = np.random.default_rng([seed, self.worker_index]).permutation(count)
        dest = (offset + np.arange(count)) % self.worker_num
        parts = [_to_arrays(examples.take(order[dest == d])) for d in range(self.worker_num)]
        received = ParsedChunk.concat([_from_arrays(r) for r in
                                       exchange.all_to_all("global_shuffle", parts)])
        final = np.random.default_rng([seed, self.worker_index, 1]).permutation(len(received))
        self._examples = received.take(final)
        logger.info("global_shuffle: worker %d of %d now holds %d of %d examples",
                    self.worker_index, self.worker_num, len(final), sum(counts))

    # -- sync mode ---------------------------------------------------------------------
    def truncate(self, examples: int) -> int:
        """Keep only the first ``examples`` examples (sync mode: equal steps on every
        worker). Returns how many were dropped."""
        loaded = self._loaded()
        dropped = max(len(loaded) - examples, 0)
        if dropped:
            self._examples = loaded.slice(0, examples)
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
        examples = self._loaded()
        order = None
        if self.shuffle_seed is not None:
            order = np.random.default_rng(self.shuffle_seed + self.epoch).permutation(
                len(examples))
        return memory_batches(examples, self.batch_size, order, drop_last=self.drop_last,
                              start_batch=self._take_start_batch(),
                              multi=self.parser.schema.multi)


def _to_arrays(examples: ParsedChunk) -> dict[str, np.ndarray]:
    """The arrays of ``examples`` by name, for the exchange's files."""
    arrays: dict[str, np.ndarray] = {"labels": examples.labels, "dense": examples.dense,
                                     "sparse": examples.sparse}
    if examples.jagged is not None:
        arrays |= {"values": examples.jagged.values, "lengths": examples.jagged.lengths}
        if examples.jagged.weights is not None:
            arrays["weights"] = examples.jagged.weights
    return arrays


def _from_arrays(arrays: dict[str, np.ndarray]) -> ParsedChunk:
    """The inverse of :func:`_to_arrays`."""
    jagged = (JaggedRows(arrays["values"], arrays["lengths"], arrays.get("weights"))
              if "values" in arrays else None)
    return ParsedChunk(arrays["labels"], arrays["dense"], arrays["sparse"], 0,
                       len(arrays["labels"]), jagged)
