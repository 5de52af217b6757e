"""Compressed text data files: chosen by suffix, decompressed as a stream.

Rules (every reader and parser, the preflight check and the line counts follow them):

- A file whose name ends with ``.gz``, ``.bz2``, ``.xz``, ``.lzma`` or ``.zst`` (any
  case) is decompressed while it is read, through fsspec's compression codecs
  (``fsspec.open(path, "rb", compression=...)``: gzip, bz2, lzma from the standard
  library). ``.zst`` is read with the ``zstandard`` package directly, frame by frame,
  because fsspec's zstd reader ends silently at a truncated frame (the lost lines would
  go unnoticed); here a truncated file is a DataError. Concatenated members / frames
  (``cat a.gz b.gz``, ``pigz``, ``pzstd``) are read whole. Line numbers in messages
  count decompressed lines.
- ``.zip`` is an archive of files, not a stream of lines: without a pipe_command it
  is a DataError naming the file (unzip it and list the extracted files).
- A file without such a suffix whose content starts with a gzip, bzip2, xz, zstd or zip
  signature is a DataError without a pipe_command (rename it with its suffix): the
  codec is chosen by name, never guessed from the content, so that a ``zcat``
  pipe_command on such files keeps working.
- With a ``pipe_command`` the command reads the decompressed text of a suffixed file,
  as PaddlePaddle's ``localfs_open_read`` runs ``zcat`` on a ``.gz`` file before the
  converter. Files without a codec suffix (and ``.zip``) reach the command as they
  are. So a pipe_command must not decompress a suffixed file again:
  :func:`check_pipe_input` rejects a decompressing command (``zcat``, ``gzip -d``, ...)
  on one.
- Parquet files compress their own columns: a Parquet file with a codec suffix is a
  DataError (rewrite it with Parquet's own compression).

A compressed stream cannot be seeked: a worker that keeps a share of a file's lines
(``split_file_list: True``) decompresses the whole file and keeps its lines
(:mod:`psfleet.data.split`); with ``split_file_list: False`` each file is decompressed
by one worker only. Counting lines (sync mode with QueueDataset) decompresses each
file once more.
"""

from __future__ import annotations

import io
import lzma
import shlex
from pathlib import Path
from typing import IO, Any, Protocol

import fsspec
import zstandard

from psfleet.errors import ConfigError, DataError

__all__ = ["CODEC_SUFFIXES", "ByteStream", "check_parquet_file", "check_pipe_input",
           "check_text_file", "codec_of", "open_data_file"]

#: File suffix (lower case) -> codec name (fsspec's names).
CODEC_SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".lzma": "lzma",
                  ".zst": "zstd"}
_ARCHIVES = {".zip": "zip"}
#: Leading bytes of compressed files and archives.
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz",
          b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip"}
_SUFFIX_OF = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz", "zstd": ".zst", "zip": ".zip"}
#: Commands that decompress their input (first word of a pipe_command).
_DECOMPRESSORS = {"zcat", "gzcat", "gunzip", "bzcat", "bunzip2", "xzcat", "unxz", "lzcat",
                  "unlzma", "zstdcat", "unzstd", "funzip"}
_DECOMPRESS_FLAG_COMMANDS = {"gzip", "pigz", "bzip2", "pbzip2", "xz", "lzma", "zstd"}
_READ_BYTES = 1 << 18

_CODEC_ERRORS = (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError, ValueError)


class ByteStream(Protocol):
    """What :func:`open_data_file` returns: a binary stream of the file's text."""

    def read(self, size: int = -1, /) -> bytes: ...

    def readline(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...

    def __enter__(self) -> ByteStream: ...

    def __exit__(self, *exc: Any) -> Any: ...


def codec_of(path: Path) -> str | None:
    """The codec a file is decompressed with, by its suffix (None: read as it is)."""
    return CODEC_SUFFIXES.get(path.suffix.lower())


def _signature(path: Path) -> str | None:
    with path.open("rb") as file:
        head = file.read(8)
    return next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)


def check_text_file(path: Path, pipe_command: str | None = None) -> str | None:
    """Check that ``path`` can be read as lines (module rules); returns its codec.

    Reads the first bytes of a file without a codec suffix (no pipe_command).

    Raises:
        DataError: a ``.zip`` or an unsuffixed compressed file without a pipe_command
            (names the file and what to do); the file cannot be opened.
    """
    codec = codec_of(path)
    if codec is not None or pipe_command is not None:
        return codec
    zip_error = DataError(f"data file {str(path)!r} is a zip archive, not a stream of "
                          "lines; unzip it and list the extracted files (.gz and .zst files "
                          "are read directly), or set a pipe_command that extracts it (e.g. "
                          "'funzip')")
    if path.suffix.lower() in _ARCHIVES:
        raise zip_error
    try:
        found = _signature(path)
    except OSError as exc:
        raise DataError(f"data file {str(path)!r} cannot be read: {exc}") from exc
    if found == "zip":
        raise zip_error
    if found is not None:
        suffix = _SUFFIX_OF[found]
        raise DataError(f"data file {str(path)!r} is {found}-compressed but its name does "
                        f"not end with {suffix}; rename it to {path.name}{suffix} (compressed "
                        "files are read by their suffix), decompress it, or set a "
                        "pipe_command that decompresses it (e.g. 'zcat')")
    return None


def check_parquet_file(path: Path) -> None:
    """Raise DataError when a Parquet file carries a codec suffix (module rules)."""
    suffix = path.suffix.lower()
    if suffix in CODEC_SUFFIXES or suffix in _ARCHIVES:
        raise DataError(f"data file {str(path)!r}: Parquet files are read directly and "
                        f"compress their own columns; a {suffix} Parquet file cannot be read: "
                        "decompress it (write it with e.g. compression='zstd' instead)")


def check_pipe_input(path: Path, pipe_command: str) -> None:
    """Raise ConfigError when ``pipe_command`` would decompress a file that psfleet
    already decompresses (a codec suffix): it would fail on the plain text.

    Raises:
        ConfigError: the command's first word is a decompressor (names it and the file).
    """
    codec = codec_of(path)
    if codec is None:
        return
    try:
        words = shlex.split(pipe_command)
    except ValueError:
        return
    if not words:
        return
    program = Path(words[0]).name
    flags = {w for w in words[1:] if w.startswith("-") and not w.startswith("--")}
    decompressing = program in _DECOMPRESSORS or (
        program in _DECOMPRESS_FLAG_COMMANDS
        and (any("d" in f for f in flags) or "--decompress" in words))
    if decompressing:
        raise ConfigError(f"pipe_command: {pipe_command!r} decompresses its input, but data "
                          f"file {str(path)!r} is decompressed by psfleet already (its "
                          f"{path.suffix} suffix) and reaches the pipe as text, as in "
                          "PaddlePaddle; remove the decompression from the pipe_command")


class _ZstdReader(io.RawIOBase):
    """The decompressed bytes of a ``.zst`` file, frame after frame; a truncated last
    frame raises DataError (zstandard's stream reader would stop silently)."""

    def __init__(self, raw: IO[bytes], path: Path) -> None:
        super().__init__()
        self._raw, self._path = raw, path
        self._context = zstandard.ZstdDecompressor()
        self._frame: Any = self._context.decompressobj()
        self._in_frame = False
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        """Decompress input until output is pending; False at the end of the file."""
        while not len(self._pending):
            data = self._raw.read(_READ_BYTES)
            if not data:
                if self._in_frame:
                    raise DataError(f"data file {str(self._path)!r} ends inside a zstd frame "
                                    "(truncated); copy or compress it again")
                return False
            out = []
            while data:
                if self._frame.eof:
                    self._frame = self._context.decompressobj()
                out.append(self._frame.decompress(data))
                data = self._frame.unused_data if self._frame.eof else b""
            self._in_frame = not self._frame.eof
            self._pending = memoryview(b"".join(out))
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._fill():
            return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Checked:
    """A decompressing stream whose codec errors become DataErrors naming the file
    (a thin proxy: the codec's stream is buffered already)."""

    def __init__(self, stream: Any, path: Path, codec: str) -> None:
        self._stream, self._path, self._codec = stream, path, codec

    def _call(self, method: str, size: int) -> bytes:
        """``self._stream.<method>(size)``, a codec error raised as a DataError naming
        the file (a DataError of the stream itself passes unchanged)."""
        try:
            data: bytes = getattr(self._stream, method)(size)
        except DataError:
            raise
        except _CODEC_ERRORS as exc:
            raise DataError(f"data file {str(self._path)!r} is not valid {self._codec} data "
                            f"({exc}); check that it was written completely, or remove its "
                            f"{self._path.suffix} suffix if it is not compressed") from exc
        return data

    def read(self, size: int = -1) -> bytes:
        return self._call("read", size)

    def readline(self, size: int = -1) -> bytes:
        return self._call("readline", size)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> _Checked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_data_file(path: Path, buffer_bytes: int = 1 << 20) -> ByteStream:
    """Open ``path`` for reading its lines: decompressed by its suffix (module rules).

    Args:
        path: the file.
        buffer_bytes: read buffer of a ``.zst`` stream (the others buffer their own).

    Returns:
        A binary stream (``read``, ``readline``, context manager); close it.
        Reading a corrupt or truncated compressed file raises DataError.

    Raises:
        DataError: a ``.zip``, an unsuffixed compressed file, or the file cannot be
            opened (names it).
    """
    codec = check_text_file(path)
    try:
        if codec is None:
            return path.open("rb")
        if codec == "zstd":
            stream: Any = io.BufferedReader(_ZstdReader(path.open("rb"), path), buffer_bytes)
        else:
            stream = fsspec.open(str(path), "rb", compression=codec).open()
    except OSError as exc:
        raise DataError(f"data file {str(path)!r} cannot be read: {exc}") from exc
    return _Checked(stream, path, codec)
