"""Cutting examples into :class:`~psfleet.data.batch.Batch` objects.

:func:`stream_batches` re-cuts a stream of parsed chunks (any sizes) into batches of
``batch_size``; :func:`memory_batches` cuts arrays held in memory, optionally in a
shuffled order. Both can skip the first ``start_batch`` batches (checkpoint resume)
and stop after ``limit`` examples (sync mode: every worker the same count).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from psfleet.data.batch import Batch
from psfleet.data.types import ParsedChunk
from psfleet.errors import DataError

__all__ = ["batches_per_epoch", "memory_batches", "stream_batches"]


def batches_per_epoch(examples: int, batch_size: int, drop_last: bool) -> int:
    """Batches of ``batch_size`` in ``examples`` examples (a last smaller batch counts
    unless ``drop_last``)."""
    full, rest = divmod(examples, batch_size)
    return full if drop_last or rest == 0 else full + 1


def stream_batches(chunks: Iterable[ParsedChunk], batch_size: int, *, drop_last: bool = False,
                   start_batch: int = 0, limit: int | None = None,
                   what: str = "the stream", multi: Sequence[str] = ()) -> Iterator[Batch]:
    """Batches of ``batch_size`` examples (the last may be smaller unless ``drop_last``).

    Args:
        chunks: parsed chunks in order.
        batch_size: examples per batch.
        drop_last: drop a last, smaller batch.
        start_batch: skip (do not yield) the first ``start_batch`` batches.
        limit: yield exactly ``limit`` examples (then stop reading ``chunks``).
        what: names the data in the error below.
        multi: the names of the multi-valued features (the parser's schema).

    Raises:
        DataError: ``limit`` is set and the chunks hold fewer examples.
    """
    carry: ParsedChunk | None = None  # fewer than batch_size examples waiting for more
    seen = 0  # examples taken from chunks so far
    index = 0  # batches cut so far (skipped ones included)

    def emit(part: ParsedChunk) -> Batch | None:
        nonlocal index
        index += 1
        return Batch.of_chunk(part, multi) if index > start_batch else None

    for chunk in chunks:
        size = len(chunk)
        if limit is not None:
            size = min(size, limit - seen)
        if size <= 0:
            if limit is not None and seen >= limit:
                break
            continue
        seen += size
        pos = 0
        if carry is not None:
            take = min(batch_size - len(carry), size)
            carry = ParsedChunk.concat([carry, chunk.slice(0, take)])
            pos = take
            if len(carry) == batch_size:
                batch = emit(carry)
                carry = None
                if batch is not None:
                    yield batch
        while size - pos >= batch_size:
            batch = emit(chunk.slice(pos, pos + batch_size))
            pos += batch_size
            if batch is not None:
                yield batch
        if pos < size:
            carry = chunk.slice(pos, size)
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


def memory_batches(examples: ParsedChunk, batch_size: int,
                   order: npt.NDArray[np.int64] | None = None, *, drop_last: bool = False,
                   start_batch: int = 0, multi: Sequence[str] = ()) -> Iterator[Batch]:
    """Batches of in-memory examples, in ``order`` (a permutation int64 [N]) or as
    stored (views, no copy); ``multi`` names the multi-valued features."""
    size = len(examples)
    count = batches_per_epoch(size, batch_size, drop_last)
    for begin in range(start_batch * batch_size, count * batch_size, batch_size):
        end = min(begin + batch_size, size)
        if order is None:
            yield Batch.of_chunk(examples.slice(begin, end), multi)
        else:
            yield Batch.of_chunk(examples.take(order[begin:end]), multi)
