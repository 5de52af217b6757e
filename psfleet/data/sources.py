"""Reading one file of a worker's share into :class:`~psfleet.data.types.RawChunk`s.

A text file is read in blocks of whole lines, either directly or through a
``pipe_command``: the file is fed to the shell command's standard input and its
standard output is read instead (PaddleRec's ``cat FILE | pipe_command``). A command
that exits non-zero stops the read with its exit code, the file name and the end of
its standard error. Parquet files are read in row groups of ``chunk_rows`` rows.

A ``.gz``, ``.bz2``, ``.xz``, ``.lzma`` or ``.zst`` text file is decompressed as it is
read, also before a pipe_command (the command reads its text, as in PaddlePaddle);
``.zip`` and unsuffixed compressed files are DataErrors (:mod:`psfleet.data.compression`).

With ``split_file_list: True`` only this worker's lines (rows) are kept
(:mod:`psfleet.data.split`); the line numbers of the kept lines travel with the chunk
for messages. A format with quoted fields (CSV) is cut at record ends instead of line
ends, so a quoted field holding line breaks stays in its record, and the split rule
counts records (:mod:`psfleet.data.records`).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from psfleet.data.compression import (
    ByteStream,
    check_parquet_file,
    check_pipe_input,
    codec_of,
    open_data_file,
)
from psfleet.data.records import record_ends, record_start_lines
from psfleet.data.split import WorkerShare
from psfleet.data.types import RawChunk
from psfleet.errors import ConfigError, DataError

__all__ = ["DEFAULT_CHUNK_BYTES", "DEFAULT_CHUNK_ROWS", "check_pipe_supported",
           "iter_parquet_chunks", "iter_text_chunks"]

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 4 << 20
DEFAULT_CHUNK_ROWS = 16_384
_STDERR_TAIL_BYTES = 4000
_FEED_BYTES = 1 << 20
_FEED_JOIN_S = 10.0


def _check_file(path: Path) -> None:
    if path.is_dir():
        raise DataError(f"data file {str(path)!r} is a directory; list its files instead")
    if not path.is_file():
        raise DataError(f"data file {str(path)!r} does not exist; check the path")
    if path.stat().st_size == 0:
        raise DataError(f"data file {str(path)!r} is empty (no lines); remove it from the list")


def _blocks(stream: ByteStream, chunk_bytes: int, quoted: bool) -> Iterator[bytes]:
    """Blocks of whole records (each ends with ``\\n``, except a last unterminated one,
    given one); with ``quoted`` a ``\\n`` inside a quoted field ends none
    (:mod:`psfleet.data.records`)."""
    rest = b""
    while True:
        block = stream.read(chunk_bytes)
        if not block:
            break
        block = rest + block
        if quoted:
            ends = record_ends(block, True)
            cut = int(ends[-1]) + 1 if len(ends) else 0
        else:
            cut = block.rfind(b"\n") + 1
        if cut == 0:
            rest = block
            continue
        rest = block[cut:]
        yield block[:cut]
    if rest:
        yield rest + b"\n"


def _record_bounds(block: bytes, quoted: bool) -> npt.NDArray[np.int64]:
    """The record ends of a block from :func:`_blocks`; bytes after the last one (a
    quoted field never closed, at the end of the file) are one more record."""
    ends = record_ends(block, quoted)
    if not len(ends) or int(ends[-1]) != len(block) - 1:
        ends = np.append(ends, len(block) - 1)
    return ends


def _kept_records(block: bytes, ends: npt.NDArray[np.int64], first: int, step: int
                  ) -> bytes:
    """Records ``first, first + step, ...`` of ``block`` (each with its ``\\n``),
    selected by a byte mask over the whole block."""
    lengths = np.diff(ends, prepend=-1)  # bytes per record, its \n included
    record = np.repeat(np.arange(len(ends), dtype=np.int32), lengths)  # [len(block)]
    keep = (record >= first) & ((record - first) % step == 0)
    return np.frombuffer(block, dtype=np.uint8)[keep].tobytes()


def _chunks(blocks: Iterator[bytes], source: str, position: int, share: WorkerShare,
            header: bool, quoted: bool) -> Iterator[RawChunk]:
    """Chunks of this worker's records; with ``header`` the first record is not data.
    The split rule counts records; line numbers count the file's lines."""
    record_index = 0  # data records before the block: the split rule's index
    line_index = 0  # data lines before the block
    offset = 0  # lines of the header
    header_line: bytes | None = None
    split = share.split_lines and share.worker_num > 1
    for block in blocks:
        read = 0
        if header and header_line is None:
            cut = int(_record_bounds(block, quoted)[0])
            header_line, block, read = block[:cut].rstrip(b"\r"), block[cut + 1:], 1
            offset = header_line.count(b"\n") + 1
        lines = block.count(b"\n")
        ends = _record_bounds(block, quoted) if quoted and block else None
        count = lines if ends is None else len(ends)
        first = share.first_kept(position, record_index) if split else 0
        step = share.worker_num if split else 1
        if ends is not None and count != lines:  # records span lines
            kept_index = np.arange(first, count, step)
            starts = record_start_lines(block, ends)[kept_index]
            payload = _kept_records(block, ends, first, step) if split else block
            yield RawChunk(source, line_index + offset + 1 + (int(starts[0]) if len(starts)
                                                              else first), step,
                           len(kept_index), count + read, payload, header_line,
                           line_index + offset + 1 + starts)
        elif split:
            kept = block.split(b"\n")[first:count:step]
            payload = b"\n".join(kept) + b"\n" if kept else b""
            yield RawChunk(source, line_index + first + 1 + offset, step, len(kept),
                           count + read, payload, header_line)
        else:
            yield RawChunk(source, line_index + 1 + offset, 1, count, count + read, block,
                           header_line)
        record_index += count
        line_index += lines


def iter_text_chunks(path: Path, position: int, share: WorkerShare,
                     pipe_command: str | None = None,
                     chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                     header: bool = False, pipe_cwd: Path | None = None,
                     quoted: bool = False) -> Iterator[RawChunk]:
    """This worker's lines of one text file, in blocks of about ``chunk_bytes``.

    Args:
        path: the file.
        position: its 0-based position in the job's file list (the split rule uses it).
        share: this worker's share (:func:`psfleet.data.split.plan_share`).
        pipe_command: a shell command; if given, the file (its decompressed text for
            a codec suffix) is its standard input and its standard output is read
            instead.
        chunk_bytes: target bytes per chunk (whole lines).
        header: the first line of the file (of the pipe's output) is a header: it is
            passed along with every chunk, not parsed as data, nor split.
        pipe_cwd: working directory of the pipe command (None: this process's).
        quoted: quoted fields may hold line breaks (CSV): blocks and the split rule
            go by records, whose ends quote parity finds (:mod:`psfleet.data.records`).

    Yields:
        Chunks in file order. Closing the generator early kills the pipe command.

    Raises:
        DataError: the file is missing or unreadable, a ``.zip`` or an unsuffixed
            compressed file (without pipe_command), corrupt or truncated compressed
            data; the pipe command cannot start or exits non-zero (names the command,
            the file, the exit code and the end of its standard error).
        ConfigError: the pipe_command decompresses a file psfleet decompresses.
    """
    _check_file(path)
    source = str(path)
    if pipe_command is None:
        try:
            with open_data_file(path) as f:
                yield from _chunks(_blocks(f, chunk_bytes, quoted), source, position,
                                   share, header, quoted)
        except OSError as exc:
            raise DataError(f"data file {source!r} cannot be read: {exc}") from exc
        return
    yield from _piped_chunks(path, position, share, pipe_command, chunk_bytes, header,
                             pipe_cwd, quoted)


class _Feeder(threading.Thread):
    """Writes the decompressed text of a file into a pipe command's standard input."""

    def __init__(self, path: Path, sink: IO[bytes]) -> None:
        super().__init__(name="psfleet-pipe-feed", daemon=True)
        self.path, self.sink = path, sink
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with open_data_file(self.path) as text:
                while block := text.read(_FEED_BYTES):
                    try:
                        self.sink.write(block)
                    except (BrokenPipeError, ValueError):
                        return  # the command stopped reading (it exited, or was killed)
        except BaseException as exc:  # raised in the reading thread after the pass
            self.error = exc
        finally:
            with contextlib.suppress(OSError):
                self.sink.close()


def _piped_chunks(path: Path, position: int, share: WorkerShare, pipe_command: str,
                  chunk_bytes: int, header: bool, cwd: Path | None, quoted: bool
                  ) -> Iterator[RawChunk]:
    source = f"{path} | {pipe_command}"
    decompress = codec_of(path) is not None
    if decompress:
        check_pipe_input(path, pipe_command)
    with contextlib.ExitStack() as stack:
        stderr = stack.enter_context(tempfile.TemporaryFile())
        stdin: IO[bytes] | int = (subprocess.PIPE if decompress
                                  else stack.enter_context(path.open("rb")))
        try:
            proc = subprocess.Popen(pipe_command, shell=True, stdin=stdin,
                                    stdout=subprocess.PIPE, stderr=stderr, cwd=cwd)
        except OSError as exc:
            raise DataError(f"pipe_command {pipe_command!r} cannot start for data file "
                            f"{str(path)!r}: {exc}") from exc
        feeder = None
        if decompress and proc.stdin is not None:
            feeder = _Feeder(path, proc.stdin)
            feeder.start()
        finished = False
        try:
            if proc.stdout is None:  # cannot happen with stdout=PIPE; keeps mypy exact
                raise DataError(f"pipe_command {pipe_command!r}: no standard output")
            yield from _chunks(_blocks(proc.stdout, chunk_bytes, quoted), source, position,
                               share, header, quoted)
            code = proc.wait()
            finished = True
        finally:
            if not finished:  # the consumer stopped early, or reading failed
                with contextlib.suppress(OSError):
                    proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            if feeder is not None:  # ends with the command (broken pipe); a child of
                feeder.join(_FEED_JOIN_S)  # it still holding stdin must not hang us
                if feeder.is_alive():
                    logger.warning("pipe_command %r: a process of it still holds its "
                                   "standard input; not waiting for it", pipe_command)
        if feeder is not None and not feeder.is_alive() and feeder.error is not None:
            raise feeder.error
        if code != 0:
            stderr.seek(0)
            text = stderr.read()[-_STDERR_TAIL_BYTES:].decode("utf-8", errors="replace")
            note = (f" (psfleet decompressed the file by its {path.suffix} suffix: the "
                    "command reads its text)" if decompress else "")
            raise DataError(f"pipe_command {pipe_command!r} failed on data file "
                            f"{str(path)!r}{note} with exit code {code}; its stderr:\n"
                            f"{text.rstrip() or '(empty)'}")


def iter_parquet_chunks(path: Path, position: int, share: WorkerShare,
                        chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[RawChunk]:
    """This worker's rows of one Parquet file, ``chunk_rows`` rows at a time.

    Raises:
        DataError: the file is missing, not Parquet, or has a codec suffix (``.gz``...:
            Parquet compresses its own columns).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    _check_file(path)
    check_parquet_file(path)
    try:
        parquet = pq.ParquetFile(path)
        row = 0
        for batch in parquet.iter_batches(batch_size=chunk_rows):
            table = pa.Table.from_batches([batch])
            count = table.num_rows
            if share.split_lines and share.worker_num > 1:
                first = share.first_kept(position, row)
                rows = np.arange(first, count, share.worker_num)
                yield RawChunk(str(path), row + first + 1, share.worker_num, len(rows),
                               count, table.take(pa.array(rows)))
            else:
                yield RawChunk(str(path), row + 1, 1, count, count, table)
            row += count
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"data file {str(path)!r} cannot be read as Parquet: {exc}") from exc


def check_pipe_supported(parser_name: str, pipe_command: str | None) -> None:
    """Raise ConfigError when ``pipe_command`` is set for a non-text format."""
    if pipe_command is not None and parser_name == "parquet":
        raise ConfigError("pipe_command: Parquet files are read directly, not through a "
                          "pipe; remove pipe_command or use a text parser")
