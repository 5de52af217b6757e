"""In-memory reader of raw Criteo files, split across workers by line.

Worker ``k`` of ``worker_num`` reads the lines whose global line number (0-based,
counted across the file list in order) is ``k`` modulo ``worker_num``, so every line
is read by exactly one worker whatever the file sizes. The worker's share is parsed
once (:func:`psfleet.data.criteo.parse_lines`) and kept in memory; each epoch yields
:class:`~psfleet.data.batch.Batch` objects, shuffled with ``shuffle_seed + epoch`` when
a seed is given. A streaming QueueDataset for data that does not fit in memory is a
separate component.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from psfleet.data.batch import Batch
from psfleet.data.batching import batches_per_epoch, memory_batches
from psfleet.data.compression import open_data_file
from psfleet.data.criteo import parse_lines
from psfleet.data.types import ParsedChunk
from psfleet.errors import ConfigError, DataError

__all__ = ["CriteoReader"]

logger = logging.getLogger(__name__)


def _read_lines(path: Path) -> list[str]:
    """All lines of ``path`` without their ``\\n`` (invalid UTF-8 bytes become U+FFFD);
    a compressed file is decompressed (:func:`psfleet.data.compression.open_data_file`)."""
    if path.is_dir():
        raise DataError(
            f"data file {str(path)!r} is a directory; pass its files, e.g. list_data_files(path)"
        )
    if not path.is_file():
        raise DataError(f"data file {str(path)!r} does not exist; check the path")
    try:
        with open_data_file(path) as stream:
            text = stream.read().decode("utf-8", errors="replace")
    except OSError as exc:
        raise DataError(f"data file {str(path)!r} cannot be read: {exc}") from exc
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if not lines:
        raise DataError(f"data file {str(path)!r} is empty (no lines); remove it from the list")
    return lines


_PARSE_CHUNK_LINES = 32_768


class CriteoReader:
    """Batches of one worker's share of raw Criteo files, held in memory.

    Reads and parses the files when constructed (blocks). Iterating is not thread
    safe; iterate from one thread. All workers must pass the same ``files`` in the same
    order and the same ``worker_num``.

    Args:
        files: raw Criteo TSV files, in a fixed order
                (:func:`psfleet.data.files.list_data_files`).
        batch_size: examples per batch, >= 1.
        worker_index: this worker, ``0 <= worker_index < worker_num``.
        worker_num: number of workers sharing the files.
        shuffle_seed: if given, each epoch's order is a permutation seeded with
            ``shuffle_seed + epoch`` (see :meth:`set_epoch`); otherwise file order.
        drop_last: drop the last batch when it is smaller than ``batch_size``.
        strict: raise on a malformed line instead of skipping it.

    Raises:
        ConfigError: if ``batch_size``, ``worker_index`` or ``worker_num`` is invalid
            or ``files`` is empty.
        DataError: if a file is missing, a directory, unreadable or empty, or (with
            ``strict``) holds a malformed line.
    """

    def __init__(
        self,
        files: Sequence[str | Path],
        batch_size: int,
        worker_index: int = 0,
        worker_num: int = 1,
        shuffle_seed: int | None = None,
        drop_last: bool = False,
        *,
        strict: bool = False,
    ) -> None:
        if isinstance(files, (str, Path)):
            files = [files]
        if not files:
            raise ConfigError("files: the file list is empty; pass at least one data file")
        if batch_size < 1:
            raise ConfigError(f"batch_size: {batch_size!r} must be >= 1")
        if worker_num < 1:
            raise ConfigError(f"worker_num: {worker_num!r} must be >= 1")
        if not 0 <= worker_index < worker_num:
            raise ConfigError(
                f"worker_index: {worker_index!r} must be in 0..{worker_num - 1} "
                f"(worker_num={worker_num})"
            )
        self.files = [Path(f) for f in files]
        self.batch_size = batch_size
        self.worker_index = worker_index
        self.worker_num = worker_num
        self.shuffle_seed = shuffle_seed
        self.drop_last = drop_last
        self._epoch = 0
        self._start_batch = 0
        self._malformed = 0
        self._total_lines = 0
        self._examples = self._load(strict)

    def _load(self, strict: bool) -> ParsedChunk:
        chunks: list[ParsedChunk] = []
        global_offset = 0
        for path in self.files:
            lines = _read_lines(path)
            start = (self.worker_index - global_offset) % self.worker_num
            mine = lines[start :: self.worker_num]
            malformed = 0
            # Parse in pieces: the parser's per-field Python objects would otherwise
            # hold ~10 KB per line at once (2 GB of peak RSS per 200k lines).
            for first in range(0, len(mine), _PARSE_CHUNK_LINES):
                chunk = parse_lines(
                    mine[first : first + _PARSE_CHUNK_LINES],
                    str(path),
                    first_line_no=start + 1 + first * self.worker_num,
                    line_step=self.worker_num,
                    strict=strict,
                )
                malformed += chunk.malformed
                chunks.append(chunk)
            if malformed:
                logger.warning(
                    "%s: skipped %d malformed lines of %d read by worker %d",
                    path,
                    malformed,
                    len(mine),
                    self.worker_index,
                )
            self._malformed += malformed
            global_offset += len(lines)
            del lines, mine
        self._total_lines = global_offset
        examples = ParsedChunk.concat(chunks) if chunks else parse_lines([], "")
        if len(examples) == 0:
            logger.warning(
                "worker %d of %d has no examples in %d files (%d lines in all)",
                self.worker_index,
                self.worker_num,
                len(self.files),
                global_offset,
            )
        logger.info(
            "worker %d of %d: %d examples from %d files (%d malformed lines skipped)",
            self.worker_index,
            self.worker_num,
            len(examples),
            len(self.files),
            self._malformed,
        )
        return examples

    @property
    def num_examples(self) -> int:
        """Well-formed examples in this worker's share."""
        return len(self._examples)

    @property
    def total_lines(self) -> int:
        """Lines in all files, every worker's share included (for global throughput)."""
        return self._total_lines

    @property
    def malformed_lines(self) -> int:
        """Lines of this worker's share skipped as malformed."""
        return self._malformed

    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch` (0 initially)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle permutation of the next iterations (``shuffle_seed + epoch``).

        Has no effect on the order without ``shuffle_seed``.
        """
        self._epoch = epoch

    def set_start_batch(self, batches: int) -> None:
        """Make the next iteration skip its first ``batches`` batches (resume); later
        iterations start at 0.

        Raises:
            ConfigError: negative count.
        """
        if batches < 0:
            raise ConfigError(f"start batch: {batches!r} must be >= 0")
        self._start_batch = batches

    @property
    def num_batches(self) -> int:
        """Batches per epoch."""
        return batches_per_epoch(self.num_examples, self.batch_size, self.drop_last)

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.num_batches

    def truncate(self, num_examples: int) -> int:
        """Keep only the first ``num_examples`` examples of this worker's share.

        Sync training needs every worker to run the same number of steps; shares
        differ by one line when the line count is not a multiple of worker_num.

        Returns:
            How many examples were dropped.
        """
        dropped = max(self.num_examples - num_examples, 0)
        if dropped:
            self._examples = self._examples.slice(0, num_examples)
        return dropped

    def __iter__(self) -> Iterator[Batch]:
        """Yield one epoch of batches (CPU tensors; unshuffled batches are views)."""
        order = None
        if self.shuffle_seed is not None:
            rng = np.random.default_rng(self.shuffle_seed + self._epoch)
            order = rng.permutation(self.num_examples)
        start, self._start_batch = self._start_batch, 0
        return memory_batches(self._examples, self.batch_size, order,
                              drop_last=self.drop_last, start_batch=start)
