"""Vocabulary of the data layer: the :class:`RawChunk` a source hands to a parser, the
:class:`ParsedChunk` a parser returns, the :class:`FeatureSchema` naming its columns
and the :class:`Reader` protocol every training reader implements. Readers yield a
:class:`~psfleet.data.batch.Batch` (its own module: only it needs torch), which holds
one mini-batch of CTR examples as CPU tensors:

- ``labels``  (Tensor[B], float32): click labels, 0.0 or 1.0.
- ``dense``   (Tensor[B, num_dense], float32): transformed dense features.
- ``sparse``  (Tensor[B, num_slots], int64): feature keys, one per single-valued slot.
  Keys are uint64 values stored bit for bit in int64 (torch has no uint64
  arithmetic); ``batch.sparse.numpy().view(np.uint64)`` gives the keys back.
- ``jagged``  (:class:`~psfleet.data.jagged.KeyedJagged` or None): the multi-valued
  (variable-length) slots, TorchRec's KeyedJaggedTensor layout; None when the data
  has none.

Which slot is which is the parser's :class:`FeatureSchema`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from psfleet.data.jagged_rows import JaggedRows

if TYPE_CHECKING:
    from psfleet.data.batch import Batch

__all__ = ["FeatureSchema", "ParsedChunk", "RawChunk", "Reader"]


@dataclass(frozen=True)
class FeatureSchema:
    """The features a parser yields, by name, in the order of the arrays.

    Attributes:
        dense: names of the dense features (the columns of ``dense``).
        sparse: names of the single-valued sparse slots (the columns of ``sparse``).
        multi: names of the multi-valued slots (the keys of ``jagged``).
        weighted: whether multi-valued ids carry a weight each (libSVM values).
    """

    dense: tuple[str, ...]
    sparse: tuple[str, ...]
    multi: tuple[str, ...] = ()
    weighted: bool = False

    @property
    def features(self) -> tuple[str, ...]:
        """Every sparse feature: the single-valued slots, then the multi-valued ones."""
        return self.sparse + self.multi


@dataclass(frozen=True)
class ParsedChunk:
    """The well-formed examples of a run of lines (any parser's output).

    Attributes:
        labels (ndarray[N], float32): 0.0 / 1.0.
        dense (ndarray[N, num_dense], float32): dense features.
        sparse (ndarray[N, num_slots], uint64): keys of the single-valued slots.
        malformed (int): lines skipped as malformed.
        lines (int): input lines the chunk was parsed from (well-formed + malformed);
            -1 when the caller did not say.
        jagged: keys of the multi-valued slots (example-major), or None when the
            parser has none.
    """

    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]
    sparse: npt.NDArray[np.uint64]
    malformed: int
    lines: int = -1
    jagged: JaggedRows | None = None

    @classmethod
    def empty(cls, schema: FeatureSchema, malformed: int = 0, lines: int = 0) -> ParsedChunk:
        """No examples, with the arrays shaped for ``schema``."""
        return cls(np.zeros(0, np.float32), np.zeros((0, len(schema.dense)), np.float32),
                   np.zeros((0, len(schema.sparse)), np.uint64), malformed, lines,
                   JaggedRows.empty(len(schema.multi), schema.weighted) if schema.multi
                   else None)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def slice(self, start: int, stop: int) -> ParsedChunk:
        """Examples ``start .. stop - 1`` (views; counts dropped)."""
        return ParsedChunk(self.labels[start:stop], self.dense[start:stop],
                           self.sparse[start:stop], 0, stop - start,
                           None if self.jagged is None else self.jagged.slice(start, stop))

    def take(self, index: npt.NDArray[np.int64]) -> ParsedChunk:
        """Examples ``index`` (int64 [K]) in that order (copies; counts dropped)."""
        return ParsedChunk(self.labels[index], self.dense[index], self.sparse[index], 0,
                           len(index), None if self.jagged is None else self.jagged.take(index))

    @staticmethod
    def concat(parts: Sequence[ParsedChunk]) -> ParsedChunk:
        """The examples of ``parts`` (at least one) one after the other; counts summed."""
        if len(parts) == 1:
            return parts[0]
        jagged = [p.jagged for p in parts if p.jagged is not None]
        return ParsedChunk(np.concatenate([p.labels for p in parts]),
                           np.concatenate([p.dense for p in parts]),
                           np.concatenate([p.sparse for p in parts]),
                           sum(p.malformed for p in parts),
                           sum(max(p.lines, 0) for p in parts),
                           JaggedRows.concat(jagged) if jagged else None)


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
        line_nos: the file line each kept record starts on, when records of the
            payload span lines (quoted line breaks, :mod:`psfleet.data.records`);
            None: record ``i`` is on line ``first_line_no + i * line_step``. Its
            ``lines`` then counts records, and so does ``read_lines``.
    """

    source: str
    first_line_no: int
    line_step: int
    lines: int
    read_lines: int
    payload: bytes | pa.Table
    header: bytes | None = None
    line_nos: npt.NDArray[np.int64] | None = None

    def line_no(self, row: int) -> int:
        """The 1-based file line that kept record (row) ``row`` starts on."""
        if self.line_nos is not None:
            return int(self.line_nos[row])
        return self.first_line_no + row * self.line_step


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
