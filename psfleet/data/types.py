"""Vocabulary of the data layer: the :class:`Batch` every reader yields, the
:class:`Reader` protocol every training reader implements, and the :class:`RawChunk`
a source hands to a parser.

A batch holds one mini-batch of CTR examples as CPU tensors:

- ``labels``  (Tensor[B], float32): click labels, 0.0 or 1.0.
- ``dense``   (Tensor[B, num_dense], float32): transformed dense features.
- ``sparse``  (Tensor[B, num_slots], int64): feature keys, one per slot. Keys are
  uint64 values stored bit for bit in int64 (torch has no uint64 arithmetic);
  ``batch.sparse.numpy().view(np.uint64)`` gives the keys back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pyarrow as pa
import torch
from torch import Tensor

from psfleet.errors import ConfigError

__all__ = ["Batch", "RawChunk", "Reader"]


@dataclass(frozen=True)
class Batch:
    """One mini-batch of examples (immutable; the tensors are not copied).

    Attributes:
        labels (Tensor[B], float32): click labels, 0.0 or 1.0.
        dense (Tensor[B, num_dense], float32): dense features.
        sparse (Tensor[B, num_slots], int64): feature keys (uint64 bits in int64).

    Raises:
        ConfigError: on construction, if the shapes or dtypes do not match the above.
    """

    labels: Tensor
    dense: Tensor
    sparse: Tensor

    def __post_init__(self) -> None:
        checks = (
            ("labels", self.labels, 1, torch.float32),
            ("dense", self.dense, 2, torch.float32),
            ("sparse", self.sparse, 2, torch.int64),
        )
        for name, tensor, ndim, dtype in checks:
            if tensor.dim() != ndim or tensor.dtype != dtype:
                raise ConfigError(
                    f"Batch.{name}: expected a {ndim}-D {dtype} tensor, got shape "
                    f"{tuple(tensor.shape)} dtype {tensor.dtype}"
                )
        size = self.labels.shape[0]
        if self.dense.shape[0] != size or self.sparse.shape[0] != size:
            raise ConfigError(
                f"Batch: labels, dense and sparse must have the same batch size; got "
                f"{size}, {self.dense.shape[0]} and {self.sparse.shape[0]}"
            )

    def __len__(self) -> int:
        """The batch size B."""
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class RawChunk:
    """Whole input lines (or rows) of one file, as read, before parsing.

    Attributes:
        source: the file name, for messages (``source:line``).
        first_line_no: 1-based line (row) number in the file of the first kept line.
        line_step: line-number distance between consecutive kept lines.
        lines: kept lines (rows) in ``payload``.
        read_lines: lines of the file this chunk consumed, every worker's included
            (for the job's total).
        payload: ``bytes`` of ``\\n``-separated lines (text formats), or a
            ``pyarrow.Table`` of rows (Parquet).
        header: the file's header line (without ``\\n``) when the format has one.
    """

    source: str
    first_line_no: int
    line_step: int
    lines: int
    read_lines: int
    payload: bytes | pa.Table
    header: bytes | None = None


@runtime_checkable
class Reader(Protocol):
    """What every training reader offers (CriteoReader, QueueDataset,
    InMemoryDataset, the torch DataLoader reader).

    For a given (files, worker_index, worker_num, epoch, seed, config) the sequence of
    batches is deterministic, whatever the thread timing, so that
    :meth:`set_start_batch` resumes exactly.
    """

    def __iter__(self) -> Iterator[Batch]:
        """One epoch of batches (CPU tensors). Iterate from one thread."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (its shuffle order, if any)."""
        ...

    def set_start_batch(self, batches: int) -> None:
        """Make the next iteration of the current epoch skip its first ``batches``
        batches without yielding them (checkpoint resume); later epochs start at 0."""
        ...

    @property
    def num_batches(self) -> int | None:
        """Batches of one epoch, or None while unknown (a stream not read yet)."""
        ...

    @property
    def num_examples(self) -> int | None:
        """This worker's examples of one epoch, or None while unknown."""
        ...

    def __len__(self) -> int:
        """:attr:`num_batches`; raises TypeError while it is unknown."""
        ...

    @property
    def total_lines(self) -> int:
        """Input lines of one epoch over all workers (the job's, for global examples/s)."""
        ...
