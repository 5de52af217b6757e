"""One pass over a worker's share: read chunks in order, parse them in parallel, hand
them over in order.

A reader thread reads the files one after the other (directly or through the
``pipe_command``) and submits each raw chunk to a pool of ``thread_num`` parse
threads; the consumer takes the parsed chunks in submission order. So the output is
the same whatever the thread timing, and at most ``2 x thread_num`` chunks (about
4 MiB of text each) wait at any time: the bounded queue is the back-pressure that
keeps a stream from being read faster than training consumes it.

Parsing releases the GIL where the work is in Arrow or large numpy operations (the
``criteo`` and ``csv`` parsers, and the ``slot`` parser on lines of one token layout),
so parse threads run in parallel there; lines the ``slot`` parser reads one by one in
Python gain little from threads. A pipe command runs in its own process, in parallel
with parsing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from psfleet.data.malformed import MalformedRecord, first_malformed
from psfleet.data.parsers import Parser, quoted_records
from psfleet.data.sources import (
    DEFAULT_CHUNK_BYTES,
    check_pipe_supported,
    iter_parquet_chunks,
    iter_text_chunks,
)
from psfleet.data.split import WorkerShare
from psfleet.data.types import ParsedChunk, RawChunk

__all__ = ["PassStats", "empty_chunk", "parse_share"]

logger = logging.getLogger(__name__)

_END = object()
_PUT_POLL_S = 0.1


@dataclass
class PassStats:
    """Timing of one pass (``dataset_debug`` prints it).

    Attributes:
        parse_s: seconds spent parsing, summed over parse threads.
        wait_s: seconds the consumer waited for a parsed chunk (queue wait).
        lines: kept (this worker's) input lines parsed.
        read_lines: input lines read, other workers' lines included.
        examples: well-formed examples.
        malformed: malformed lines skipped.
        first_malformed: the first malformed line of the pass (``file:line reason``), in
            file order, or None.
        complete: the pass reached the end of the data.
        started: ``time.perf_counter()`` at the start.
    """

    parse_s: float = 0.0
    wait_s: float = 0.0
    lines: int = 0
    read_lines: int = 0
    examples: int = 0
    malformed: int = 0
    first_malformed: str | None = None
    complete: bool = False
    started: float = field(default_factory=time.perf_counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def summary(self) -> str:
        """One line: lines, lines/s, parse time, queue wait, malformed."""
        wall = max(time.perf_counter() - self.started, 1e-9)
        return (f"{self.lines} lines ({self.read_lines} read) in {wall:.2f} s = "
                f"{self.lines / wall:,.0f} lines/s; parse {self.parse_s:.2f} s (thread sum), "
                f"queue wait {self.wait_s:.2f} s, {self.examples} examples, "
                f"{self.malformed} malformed")


def _raw_chunks(share: WorkerShare, parser: Parser, pipe_command: str | None,
                chunk_bytes: int, pipe_cwd: Path | None
                ) -> Generator[RawChunk, None, None]:
    for position, path in share.files:
        if parser.kind == "parquet":
            yield from iter_parquet_chunks(path, position, share)
        else:
            yield from iter_text_chunks(path, position, share, pipe_command, chunk_bytes,
                                        parser.header, pipe_cwd, quoted_records(parser))


def parse_share(share: WorkerShare, parser: Parser, *, pipe_command: str | None = None,
                thread_num: int = 1, strict: bool = False, stats: PassStats | None = None,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                pipe_cwd: Path | None = None) -> Iterator[ParsedChunk]:
    """Parsed chunks of this worker's share, in file and line order (module docstring).

    Args:
        share: what this worker reads (:func:`psfleet.data.split.plan_share`).
        parser: the format.
        pipe_command: shell command every text file is piped through.
        thread_num: parse threads (>= 1).
        strict: raise on a malformed line.
        stats: filled while the pass runs.
        chunk_bytes: raw bytes per chunk.
        pipe_cwd: working directory of the pipe command (None: this process's).

    Yields:
        ParsedChunk per raw chunk. Closing the generator stops the threads and kills a
        running pipe command.

    Raises:
        ConfigError: pipe_command with a Parquet parser.
        DataError: unreadable file, failing pipe command, or a malformed line with
            ``strict`` (raised here, in the consumer's thread).
    """
    check_pipe_supported("parquet" if parser.kind == "parquet" else "text", pipe_command)
    stats = stats if stats is not None else PassStats()
    pending: queue.Queue[object] = queue.Queue(maxsize=2 * max(thread_num, 1))
    stop = threading.Event()
    pool = ThreadPoolExecutor(max(thread_num, 1), thread_name_prefix="psfleet-parse")

    def parse(raw: RawChunk) -> tuple[ParsedChunk, MalformedRecord]:
        start = time.perf_counter()
        with first_malformed() as first:
            chunk = parser.parse(raw, strict) if raw.lines else empty_chunk(parser)
        with stats._lock:
            stats.parse_s += time.perf_counter() - start
            stats.read_lines += raw.read_lines
        return chunk, first

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                pending.put(item, timeout=_PUT_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        chunks = _raw_chunks(share, parser, pipe_command, chunk_bytes, pipe_cwd)
        try:
            for raw in chunks:
                if not put(pool.submit(parse, raw)):
                    return
            put(_END)
        except BaseException as exc:  # forwarded to the consumer, raised there
            put(exc)
        finally:
            chunks.close()  # kills a pipe command still running

    producer = threading.Thread(target=produce, name="psfleet-reader", daemon=True)
    producer.start()
    try:
        while True:
            start = time.perf_counter()
            item = pending.get()
            if isinstance(item, Future):
                chunk, first = item.result()
                if first.source is not None and stats.first_malformed is None:
                    stats.first_malformed = str(first)
            stats.wait_s += time.perf_counter() - start
            if item is _END:
                stats.complete = True
                return
            if isinstance(item, BaseException):
                raise item
            stats.lines += chunk.lines
            stats.examples += len(chunk)
            stats.malformed += chunk.malformed
            yield chunk
    finally:
        stop.set()
        while producer.is_alive():
            try:
                pending.get(timeout=_PUT_POLL_S)
            except queue.Empty:
                continue
        producer.join()
        pool.shutdown(wait=True, cancel_futures=True)


def empty_chunk(parser: Parser) -> ParsedChunk:
    """A chunk of no examples with the parser's shapes."""
    return ParsedChunk.empty(parser.schema)
