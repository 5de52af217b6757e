"""QueueDataset: batches streamed from the files, never all in memory.

PaddlePaddle's streaming dataset: ``set_filelist``, ``set_pipe_command``,
``set_thread_num``; each epoch reads the worker's share again (files, or each file
piped through the command), parses chunks in ``thread_num`` threads and yields batches
in a fixed order (:mod:`psfleet.data.pipeline`; bounded queue = back-pressure). No
shuffling: the order is the files' order. Use InMemoryDataset to shuffle.

Example::

    dataset = QueueDataset(batch_size=512, parser="slot", worker_index=k, worker_num=W)
    dataset.set_filelist(files)
    dataset.set_pipe_command("python my_reader.py")
    dataset.set_thread_num(2)
    for batch in dataset: ...
"""

from __future__ import annotations

from collections.abc import Iterator

from psfleet.data.batch import Batch
from psfleet.data.batching import batches_per_epoch, stream_batches
from psfleet.data.dataset_base import DatasetBase
from psfleet.errors import ConfigError

__all__ = ["QueueDataset"]


class QueueDataset(DatasetBase):
    """A streaming reader of one worker's share (module docstring); arguments as
    :class:`~psfleet.data.dataset_base.DatasetBase`. Iterate from one thread."""

    _limit: int | None = None
    _known_batches: int | None = None

    def set_example_limit(self, examples: int | None) -> None:
        """Yield exactly ``examples`` examples per epoch (sync mode: the same number of
        steps on every worker); an epoch with fewer raises DataError. None: no limit.

        Raises:
            ConfigError: negative count.
        """
        if examples is not None and examples < 0:
            raise ConfigError(f"example limit: {examples!r} must be >= 0")
        self._limit = examples

    @property
    def num_examples(self) -> int | None:
        """Examples of one epoch: the limit if set, else the count of the last complete
        pass, else None (not read yet)."""
        if self._limit is not None:
            return self._limit
        last = self.last_pass
        return last.examples if last is not None and last.complete else None

    @property
    def num_batches(self) -> int | None:
        """Batches of one epoch, or None while unknown (module docstring)."""
        examples = self.num_examples
        if examples is None:
            return None
        return batches_per_epoch(examples, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        """Batches of one epoch.

        Raises:
            TypeError: unknown before the first complete pass (use num_batches).
        """
        batches = self.num_batches
        if batches is None:
            raise TypeError("QueueDataset: the number of batches is unknown until a pass "
                            "has read the stream; use num_batches (None while unknown)")
        return batches

    def __iter__(self) -> Iterator[Batch]:
        """Stream one epoch of batches (skipping a start batch set by set_start_batch)."""
        return stream_batches(self._pass(), self.batch_size, drop_last=self.drop_last,
                              start_batch=self._take_start_batch(), limit=self._limit,
                              what=f"worker {self.worker_index}'s share of the data",
                              multi=self.parser.schema.multi)
