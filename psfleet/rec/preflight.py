"""Checks of a loaded config against this machine, run before any process starts.

:func:`psfleet.rec.config.load_config` validates the YAML itself (types, ranges,
allowed values and the cross-field rules). What needs the file system or the model
registry is checked here, by ``psfleet train`` before it starts a job (and again,
cheaply, by each process of the job):

- every ``runner.train_data_dir`` / ``test_data_dir`` / ``valid_data_dir`` path exists, a folder
  holds at least one data file, and no data file is empty (0 bytes or only blank
  lines: a worker would train on nothing) or compressed (gzip, bzip2, xz, zstd, zip:
  every line would be skipped as malformed) unless a ``runner.pipe_command``
  decompresses it;
- with ``runner.split_file_list: False`` there are at least ``cluster.worker_num``
  training files (each worker reads whole files);
- the first lines of every data file parse with the configured parser (a column
  the config names that the file's header lacks is a ConfigError naming it);
- ``runner.model`` is a registered model and builds over the declared tables.

Each failure is a :class:`~psfleet.errors.DataError` or
:class:`~psfleet.errors.ConfigError` naming the field, the file and what to do.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from psfleet.data import Parser, RawChunk, list_data_files, make_parser
from psfleet.data.split import plan_share
from psfleet.errors import ConfigError, DataError
from psfleet.rec.config import TrainConfig, parser_options
from psfleet.rec.features import build_runner_model

__all__ = ["check_before_start", "check_data_files"]

_BLOCK_BYTES = 1 << 16

#: Leading bytes of compressed files (no parser reads them; a pipe_command may).
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz",
               b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip"}


def _compression(path: Path) -> str | None:
    """The compression format ``path`` starts with, or None."""
    with path.open("rb") as file:
        head = file.read(8)
    return next((name for magic, name in _COMPRESSED.items() if head.startswith(magic)), None)


def _holds_data(path: Path) -> bool:
    """Whether ``path`` has a byte that is not ASCII whitespace (reads until the first
    such byte: one block for any real data file)."""
    with path.open("rb") as file:
        while block := file.read(_BLOCK_BYTES):
            if block.strip():
                return True
    return False


def check_data_files(field: str, value: Path | list[Path] | None,
                     pipe_command: str | None = None) -> list[Path]:
    """The data files of a ``*_data_dir`` value, each checked to hold data.

    Args:
        field: the config field path, for messages (``runner.train_data_dir``).
        value: a file or folder, a list of them, or None (no files).
        pipe_command: the command the files are piped through, if any (it may
            decompress them, so compressed files are allowed then).

    Returns:
        The files, in order (a folder's sorted by name).

    Raises:
        DataError: a path does not exist, a folder holds no data file, or a file is
            empty, only blank lines, or compressed with no pipe_command (names the
            field and the file).
    """
    paths = [] if value is None else [value] if isinstance(value, Path) else value
    files: list[Path] = []
    for path in paths:
        try:
            files += list_data_files(path)
        except DataError as exc:
            raise DataError(f"{field}: {exc}") from None
    for file in files:
        try:
            size = file.stat().st_size
            blank = size > 0 and not _holds_data(file)
            compression = None if pipe_command else _compression(file)
        except OSError as exc:
            raise DataError(f"{field}: data file {str(file)!r} cannot be read: {exc}") from None
        if size == 0 or blank:
            what = "0 bytes" if size == 0 else "only blank lines"
            raise DataError(f"{field}: data file {str(file)!r} is empty ({what}); remove it "
                            f"from {field} (or from its folder), or write the data into it")
        if compression is not None:
            raise DataError(f"{field}: data file {str(file)!r} is {compression}-compressed; "
                            "the parsers read plain text (or Parquet): decompress it, or "
                            "use runner.reader_type: QueueDataset with a runner.pipe_command "
                            "that decompresses (e.g. 'zcat')")
    return files


def check_before_start(config: TrainConfig) -> None:
    """Everything about ``config`` that needs the file system or the model registry
    (module docstring). Blocks while it reads the first block of each data file.

    Raises:
        DataError: a missing or empty data path (names the field and the file).
        ConfigError: too few files for ``split_file_list: False``, or an unknown model.
    """
    from psfleet.rec.models import list_models

    runner = config.runner
    train_files = check_data_files("runner.train_data_dir", runner.train_data_dir,
                                   runner.pipe_command)
    test_files = check_data_files("runner.test_data_dir", runner.test_data_dir,
                                  runner.pipe_command)
    valid_files = check_data_files("runner.valid_data_dir", runner.valid_data_dir,
                                   runner.pipe_command)
    if not runner.split_file_list:
        try:
            plan_share(train_files, 0, config.cluster.worker_num, split_file_list=False)
        except ConfigError as exc:
            raise ConfigError(f"runner.{exc} (runner.train_data_dir, cluster.worker_num)"
                              ) from None
    if runner.model not in list_models():
        raise ConfigError(f"runner.model: {runner.model!r} is not one of "
                          f"{', '.join(list_models()) or '(none)'}")
    if runner.pipe_command is None:
        parser = make_parser(runner.parser, parser_options(runner))
        for field, files in (("runner.train_data_dir", train_files),
                             ("runner.test_data_dir", test_files),
                             ("runner.valid_data_dir", valid_files)):
            for file in files:
                _check_first_lines(parser, field, file)
    build_runner_model(config)  # a model that rejects the tables names the key


def _check_first_lines(parser: Parser, field: str, file: Path) -> None:
    """Parse the header and first data line of ``file`` (the first row of Parquet),
    so that a column the config names but the file lacks fails now.

    Raises:
        ConfigError: the parser rejects the file's columns (names the column, the
            field and the file).
    """
    if parser.kind == "parquet":
        import pyarrow.parquet as pq

        payload: bytes | pa.Table = pq.ParquetFile(file).read_row_group(0).slice(0, 1)
        header = None
    else:
        with file.open("rb") as f:
            header = f.readline().rstrip(b"\r\n") if parser.header else None
            payload = f.readline()
    try:
        parser.parse(RawChunk(str(file), 2 if header is not None else 1, 1, 1, 1, payload,
                              header), strict=False)
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc}") from None
