"""What QueueDataset and InMemoryDataset share: settings (PaddlePaddle's
``dataset.set_*`` names), the worker's share, epoch and resume position, the pass
with its ``dataset_debug`` timing, and the job's line count."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from psfleet.data.compression import codec_of
from psfleet.data.parsers import Parser, make_parser, quoted_records
from psfleet.data.pipeline import PassStats, parse_share
from psfleet.data.records import count_records
from psfleet.data.split import WorkerShare, count_lines, plan_share, share_lines
from psfleet.data.types import ParsedChunk
from psfleet.errors import ConfigError, DataError

__all__ = ["DatasetBase"]

logger = logging.getLogger(__name__)


class DatasetBase:
    """Settings and bookkeeping of a dataset (see QueueDataset / InMemoryDataset).

    Args:
        batch_size: examples per batch, >= 1.
        parser: a registered parser name or a :class:`~psfleet.data.parsers.Parser`.
        parser_options: the named parser's options (``SlotFormatConfig``, ``ColumnsConfig``,
            ``LibsvmConfig``).
        worker_index: this worker, ``0 <= worker_index < worker_num``.
        worker_num: workers sharing the file list.
        split_file_list: False: whole files per worker; True: every worker reads its
            share of the lines of every file (:mod:`psfleet.data.split`).
        pipe_command: shell command every text file is piped through, or None.
        thread_num: parse threads (>= 1).
        strict: raise on a malformed line instead of skipping it.
        debug: log reader timing after each pass (``dataset_debug``).
        drop_last: drop the last batch if it is smaller than ``batch_size``.
        pipe_cwd: working directory of the pipe command (None: this process's).
        max_malformed_fraction: the largest fraction (0..1) of this worker's lines of a
            pass that may be malformed (skipped); above it the pass ends with a
            DataError giving the counts and the first bad line (``runner.
            max_malformed_fraction``). 1.0 never fails; 0.0 fails on any malformed line
            (after the pass, unlike ``strict``, which stops at the first).

    Raises:
        ConfigError: a bad setting (names it).
    """

    def __init__(self, batch_size: int, parser: str | Parser = "criteo",
                 parser_options: object = None, *, worker_index: int = 0, worker_num: int = 1,
                 split_file_list: bool = True, pipe_command: str | None = None,
                 thread_num: int = 1, strict: bool = False, debug: bool = False,
                 drop_last: bool = False, pipe_cwd: str | Path | None = None,
                 max_malformed_fraction: float = 0.01) -> None:
        self.parser = make_parser(parser, parser_options) if isinstance(parser, str) else parser
        self.set_batch_size(batch_size)
        self.set_thread_num(thread_num)
        if worker_num < 1 or not 0 <= worker_index < worker_num:
            raise ConfigError(f"worker_index / worker_num: {worker_index!r} / {worker_num!r} "
                              "must satisfy 0 <= worker_index < worker_num")
        self.worker_index, self.worker_num = worker_index, worker_num
        self.split_file_list = split_file_list
        self.pipe_command = pipe_command
        self.pipe_cwd = None if pipe_cwd is None else Path(pipe_cwd)
        self.strict, self.debug, self.drop_last = strict, debug, drop_last
        if not 0.0 <= max_malformed_fraction <= 1.0:
            raise ConfigError(f"max_malformed_fraction: {max_malformed_fraction!r} must be a "
                              "fraction between 0 and 1 (0.01 = 1% of the lines)")
        self.max_malformed_fraction = float(max_malformed_fraction)
        self._files: list[Path] = []
        self._epoch = 0
        self._start_batch = 0
        self._line_counts: tuple[list[Path], list[int]] | None = None
        self.last_pass: PassStats | None = None

    # -- PaddlePaddle's dataset setters ------------------------------------------------
    def set_filelist(self, files: Sequence[str | Path]) -> None:
        """The job's files, in the same order on every worker.

        Raises:
            ConfigError: empty list, or (split_file_list False) fewer files than workers.
        """
        self._files = [Path(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
        self.share()  # validate now

    def set_pipe_command(self, command: str | None) -> None:
        """Pipe every text file through this shell command (None: read files directly)."""
        self.pipe_command = command or None

    def set_thread_num(self, thread_num: int) -> None:
        """Parse threads (>= 1)."""
        if thread_num < 1:
            raise ConfigError(f"thread_num: {thread_num!r} must be >= 1")
        self.thread_num = thread_num

    def set_batch_size(self, batch_size: int) -> None:
        """Examples per batch (>= 1)."""
        if batch_size < 1:
            raise ConfigError(f"batch_size: {batch_size!r} must be >= 1")
        self.batch_size = batch_size

    # -- Reader protocol ---------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch`."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (its shuffle order, if any)."""
        self._epoch = epoch

    def set_start_batch(self, batches: int) -> None:
        """Skip the first ``batches`` batches of the next iteration only (resume).

        Raises:
            ConfigError: negative count.
        """
        if batches < 0:
            raise ConfigError(f"start batch: {batches!r} must be >= 0")
        self._start_batch = batches

    def _take_start_batch(self) -> int:
        start, self._start_batch = self._start_batch, 0
        return start

    @property
    def files(self) -> list[Path]:
        """The job's file list (:meth:`set_filelist`)."""
        return list(self._files)

    def share(self) -> WorkerShare:
        """This worker's files and lines.

        Raises:
            ConfigError: no file list yet, or it cannot be split (see plan_share).
        """
        if not self._files:
            raise ConfigError("no data files: call set_filelist(files) first")
        return plan_share(self._files, self.worker_index, self.worker_num,
                          self.split_file_list)

    @property
    def counts_known(self) -> bool:
        """Line counts can be had without parsing: text files read directly."""
        return self.pipe_command is None and self.parser.kind == "text"

    def line_counts(self) -> list[int]:
        """Lines of each file (header lines included); reads (and decompresses) the
        files once (cached). For a parser whose records may span lines (CSV's quoted
        line breaks) these are records, which the split rule shares out.

        Raises:
            ConfigError: the lines come through a pipe_command or from Parquet.
        """
        if not self.counts_known:
            raise ConfigError("line counts are unknown before reading when a pipe_command "
                              "is set or the files are Parquet")
        if self._line_counts is None or self._line_counts[0] != self._files:
            quoted = quoted_records(self.parser)
            self._line_counts = (list(self._files), [
                count_records(p, True) if quoted else count_lines(p) for p in self._files])
        return list(self._line_counts[1])

    def worker_lines(self) -> list[int]:
        """Data lines each worker reads (header lines excluded); reads the files once."""
        header = 1 if self.parser.header else 0
        counts = [max(n - header, 0) for n in self.line_counts()]
        return [sum(share_lines(n, f, k, self.worker_num, self.split_file_list)
                    for f, n in enumerate(counts)) for k in range(self.worker_num)]

    @property
    def total_lines(self) -> int:
        """Input lines of one epoch over all workers (for the job's examples/s).

        Exact for text files read directly (counted) and, after a complete pass, when
        every worker reads every file (split_file_list True); otherwise this worker's
        lines read in the last pass x worker_num (an estimate; 0 before any pass).
        Compressed files are counted from a complete pass when that is exact (counting
        would decompress them once more).
        """
        last = self.last_pass
        if (last is not None and last.complete and self.split_file_list
                and any(codec_of(f) is not None for f in self._files)):
            return last.read_lines
        if self.counts_known:
            return sum(self.line_counts())
        if last is None or not last.complete:
            return 0
        if self.split_file_list:
            return last.read_lines
        return last.read_lines * self.worker_num

    # -- a pass ------------------------------------------------------------------------
    def _pass(self) -> Iterator[ParsedChunk]:
        """Parsed chunks of one pass over this worker's share; logs timing if debug.

        Raises:
            DataError: at the end of a complete pass, if more than
                ``max_malformed_fraction`` of its lines were malformed.
        """
        stats = PassStats()
        self.last_pass = stats
        try:
            yield from parse_share(self.share(), self.parser, pipe_command=self.pipe_command,
                                   thread_num=self.thread_num, strict=self.strict,
                                   stats=stats, pipe_cwd=self.pipe_cwd)
            self._check_malformed(stats)
        finally:
            if stats.malformed:
                logger.warning("worker %d: skipped %d malformed lines of %d in this pass",
                               self.worker_index, stats.malformed, stats.lines)
            if self.debug:
                logger.info("dataset_debug worker %d (%s, %d threads): %s", self.worker_index,
                            type(self).__name__, self.thread_num, stats.summary())

    def _check_malformed(self, stats: PassStats) -> None:
        """Raise if the pass's malformed lines exceed ``max_malformed_fraction``."""
        if not stats.malformed or stats.malformed <= self.max_malformed_fraction * stats.lines:
            return
        percent = 100.0 * stats.malformed / max(stats.lines, 1)
        raise DataError(
            f"worker {self.worker_index}: {stats.malformed} of {stats.lines} lines "
            f"({percent:.1f}%) of its share were malformed (first: {stats.first_malformed}); "
            f"at most {self.max_malformed_fraction:g} may be; fix the data or raise "
            "runner.max_malformed_fraction")
