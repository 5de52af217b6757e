"""Which files and lines a worker reads (the ``split_file_list`` rule).

- ``split_file_list: False``: worker ``k`` reads whole files ``k, k+W, k+2W, ...`` of
  the list (``W`` = worker_num). Fewer files than workers is an error: a worker would
  have nothing to read.
- ``split_file_list: True``: every worker reads every file and keeps line ``i``
  (0-based) of file ``f`` (0-based position in the list) when ``(i + f) % W == k``.
  Shifting by ``f`` spreads the leftover lines of each file over the workers; the rule
  needs no line counts, so it works on streams (``pipe_command`` output) too.

A compressed file (``.gz``, ``.zst``, ... :mod:`psfleet.data.compression`) cannot be
seeked, and the rule needs no seeking: with ``split_file_list: True`` every worker
decompresses the whole file and keeps its lines (each file is decompressed
``worker_num`` times in all, once per worker, in parallel); with ``False`` a file is
decompressed by its one worker. Give a job several compressed files and
``split_file_list: False`` when decompression is the bottleneck.

Either way every line of every file is read by exactly one worker. All workers must
pass the same file list in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from psfleet.data.compression import open_data_file
from psfleet.errors import ConfigError, DataError

__all__ = ["WorkerShare", "count_lines", "plan_share", "share_lines"]

_COUNT_BLOCK_BYTES = 1 << 22


@dataclass(frozen=True)
class WorkerShare:
    """What one worker reads.

    Attributes:
        files: ``(file position in the job's list, path)`` this worker opens, in order.
        worker_index: this worker.
        worker_num: workers sharing the list.
        split_lines: True when the worker keeps every ``worker_num``-th line of each
            file (``split_file_list: True``); False when it reads its files whole.
    """

    files: tuple[tuple[int, Path], ...]
    worker_index: int
    worker_num: int
    split_lines: bool

    @property
    def line_step(self) -> int:
        """Distance between two kept lines of a file (1 when files are read whole)."""
        return self.worker_num if self.split_lines else 1

    def first_kept(self, file_position: int, line_index: int) -> int:
        """Offset from ``line_index`` of the first line at or after it that this worker
        keeps in the file at ``file_position`` (0 when files are read whole)."""
        if not self.split_lines:
            return 0
        return (self.worker_index - file_position - line_index) % self.worker_num


def plan_share(files: Sequence[str | Path], worker_index: int, worker_num: int,
               split_file_list: bool) -> WorkerShare:
    """The files and lines of worker ``worker_index`` (module docstring rule).

    Raises:
        ConfigError: empty list, bad index or worker count, or (``split_file_list``
            False) fewer files than workers.
    """
    paths = [Path(f) for f in files]
    if not paths:
        raise ConfigError("files: the file list is empty; pass at least one data file")
    if worker_num < 1:
        raise ConfigError(f"worker_num: {worker_num!r} must be >= 1")
    if not 0 <= worker_index < worker_num:
        raise ConfigError(f"worker_index: {worker_index!r} must be in 0..{worker_num - 1}")
    if split_file_list:
        chosen = tuple(enumerate(paths))
    else:
        if len(paths) < worker_num:
            raise ConfigError(
                f"split_file_list: False gives each worker whole files, but there are "
                f"{len(paths)} files for {worker_num} workers; split the data into at "
                f"least {worker_num} files, or set split_file_list: True (every worker "
                "reads its share of the lines of every file)")
        chosen = tuple((i, p) for i, p in enumerate(paths) if i % worker_num == worker_index)
    return WorkerShare(chosen, worker_index, worker_num, split_file_list)


def share_lines(line_count: int, file_position: int, worker_index: int, worker_num: int,
                split_lines: bool) -> int:
    """How many of a file's ``line_count`` lines worker ``worker_index`` keeps."""
    if not split_lines:
        return line_count if file_position % worker_num == worker_index else 0
    first = (worker_index - file_position) % worker_num
    return max(0, (line_count - first + worker_num - 1) // worker_num)


def count_lines(path: Path) -> int:
    """Lines in a file (a last line without ``\\n`` counts). Reads it once, blocks; a
    compressed file is decompressed (:func:`psfleet.data.compression.open_data_file`).

    Raises:
        DataError: the file cannot be read, or is corrupt compressed data.
    """
    lines, last = 0, b"\n"
    try:
        with open_data_file(path) as f:
            while block := f.read(_COUNT_BLOCK_BYTES):
                lines += block.count(b"\n")
                last = block[-1:]
    except OSError as exc:
        raise DataError(f"data file {str(path)!r} cannot be read: {exc}") from exc
    return lines + (last != b"\n")
