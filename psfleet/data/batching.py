"""Cutting examples into :class:`~psfleet.data.types.Batch` objects.

:func:`stream_batches` re-cuts a stream of parsed chunks (any sizes) into batches of
``batch_size``; :func:`memory_batches` cuts arrays held in memory, optionally in a
shuffled order. Both can skip the first ``start_batch`` batches (checkpoint resume)
and stop after ``limit`` examples (sync mode: every worker the same count).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt
import torch

from psfleet.data.criteo import ParsedChunk
from psfleet.data.types import Batch
from psfleet.errors import DataError

__all__ = ["batches_per_epoch", "memory_batches", "stream_batches"]


def _batch(labels: npt.NDArray[np.float32], dense: npt.NDArray[np.float32],
           sparse: npt.NDArray[np.uint64]) -> Batch:
    return Batch(torch.from_numpy(np.ascontiguousarray(labels)),
                 torch.from_numpy(np.ascontiguousarray(dense)),
                 torch.from_numpy(np.ascontiguousarray(sparse).view(np.int64)))


def batches_per_epoch(examples: int, batch_size: int, drop_last: bool) -> int:
    """Batches of ``batch_size`` in ``examples`` examples (a last smaller batch counts
    unless ``drop_last``)."""
    full, rest = divmod(examples, batch_size)
    return full if drop_last or rest == 0 else full + 1


def stream_batches(chunks: Iterable[ParsedChunk], batch_size: int, *, drop_last: bool = False,
                   start_batch: int = 0, limit: int | None = None,
                   what: str = "the stream") -> Iterator[Batch]:
    """Batches of ``batch_size`` examples (the last may be smaller unless ``drop_last``).

    Args:
        chunks: parsed chunks in order.
        batch_size: examples per batch.
        drop_last: drop a last, smaller batch.
        start_batch: skip (do not yield) the first ``start_batch`` batches.
        limit: yield exactly ``limit`` examples (then stop reading ``chunks``).
        what: names the data in the error below.

    Raises:
        DataError: ``limit`` is set and the chunks hold fewer examples.
    """
    arrays = tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.uint64]]
    carry: arrays | None = None  # fewer than batch_size examples waiting for more
    seen = 0  # examples taken from chunks so far
    index = 0  # batches cut so far (skipped ones included)

    def emit(part: arrays) -> Batch | None:
        nonlocal index
        index += 1
        return _batch(*part) if index > start_batch else None

    for chunk in chunks:
        size = len(chunk)
        if limit is not None:
            size = min(size, limit - seen)
        if size <= 0:
            if limit is not None and seen >= limit:
                break
            continue
        seen += size
        part: arrays = (chunk.labels[:size], chunk.dense[:size], chunk.sparse[:size])
        pos = 0
        if carry is not None:
            take = min(batch_size - len(carry[0]), size)
            carry = (np.concatenate([carry[0], part[0][:take]]),
                     np.concatenate([carry[1], part[1][:take]]),
                     np.concatenate([carry[2], part[2][:take]]))
            pos = take
            if len(carry[0]) == batch_size:
                batch = emit(carry)
                carry = None
                if batch is not None:
                    yield batch
        while size - pos >= batch_size:
            batch = emit((part[0][pos:pos + batch_size], part[1][pos:pos + batch_size],
                          part[2][pos:pos + batch_size]))
            pos += batch_size
            if batch is not None:
                yield batch
        if pos < size:
            carry = (part[0][pos:], part[1][pos:], part[2][pos:])
        if limit is not None and seen >= limit:
            break
    if limit is not None and seen < limit:
        raise DataError(f"{what} ended after {seen} examples, but {limit} were expected so "
                        "that every worker runs the same number of steps (sync mode); "
                        "malformed lines may have been skipped: fix the data, or use "
                        "reader_type InMemoryDataset, or sync_mode async / geo")
    if carry is not None and not drop_last:
        batch = emit(carry)
        if batch is not None:
            yield batch


def memory_batches(labels: torch.Tensor, dense: torch.Tensor, sparse: torch.Tensor,
                   batch_size: int, order: torch.Tensor | None = None, *,
                   drop_last: bool = False, start_batch: int = 0) -> Iterator[Batch]:
    """Batches of in-memory tensors (labels [N] f32, dense [N, D] f32, sparse [N, S] i64),
    in ``order`` (a permutation [N] int64) or as stored (views, no copy)."""
    size = int(labels.shape[0])
    count = batches_per_epoch(size, batch_size, drop_last)
    for begin in range(start_batch * batch_size, count * batch_size, batch_size):
        end = min(begin + batch_size, size)
        if order is None:
            yield Batch(labels[begin:end], dense[begin:end], sparse[begin:end])
        else:
            index = order[begin:end]
            yield Batch(labels[index], dense[index], sparse[index])
