"""Checks of a loaded config against this machine, run before any process starts.

:func:`psfleet.rec.config.load_config` validates the YAML itself (types, ranges,
allowed values and the cross-field rules). What needs the file system or the model
registry is checked here, by ``psfleet train`` before it starts a job (and again,
cheaply, by each process of the job):

- every ``runner.train_data_dir`` / ``train_passes`` / ``test_data_dir`` /
  ``valid_data_dir`` path exists, a folder
  holds at least one data file, and no data file is empty (0 bytes or only blank
  lines, after decompression: a worker would train on nothing). ``.gz``, ``.bz2``,
  ``.xz``, ``.lzma`` and ``.zst`` files are read decompressed (only their first block
  is decompressed here); without a ``runner.pipe_command`` a ``.zip`` or a compressed
  file without its suffix is a DataError, and a pipe_command that decompresses a
  suffixed file (which reaches it as text) is a ConfigError
  (:mod:`psfleet.data.compression`);
- with ``runner.split_file_list: False`` there are at least ``cluster.worker_num``
  training files (each worker reads whole files);
- the first lines of every data file parse with the configured parser (a column
  the config names that the file's header lacks is a ConfigError naming it), and
  unless ``runner.max_malformed_fraction`` is 1, not all of them are malformed (text
  labels without ``columns.label_positive``: a DataError naming the first line);
- ``runner.model`` is a registered model and builds over the declared tables (checked
  after the data: building it imports torch, seconds, so the other mistakes are
  named sooner);
- ``PSFLEET_SIMULATE_STALENESS``, when set, is a valid value;
- a table with a disk tier (``memory_rows`` / ``memory_budget_bytes``) holds one
  request's keys in memory.

Each failure is a :class:`~psfleet.errors.DataError` or
:class:`~psfleet.errors.ConfigError` naming the field, the file and what to do.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from psfleet.data import Parser, RawChunk, list_data_files, make_parser
from psfleet.data.compression import (
    ByteStream,
    check_parquet_file,
    check_pipe_input,
    codec_of,
    open_data_file,
)
from psfleet.data.malformed import first_malformed
from psfleet.data.split import plan_share
from psfleet.errors import ConfigError, DataError, ParserConfigError
from psfleet.job.modes import mode_spec
from psfleet.nn.table_checks import check_accessor
from psfleet.ps import SparseTable, SparseTableConfig
from psfleet.ps.communicator.local_mode import simulated_staleness
from psfleet.rec.config import TrainConfig, parser_kind, parser_options, parser_schema

__all__ = ["check_before_start", "check_data_files", "check_model"]

_BLOCK_BYTES = 1 << 16
#: Data lines (Parquet rows) of each file parsed before a job starts.
_FIRST_LINES = 100

def _open_text(path: Path, pipe_command: str | None) -> ByteStream:
    """The lines of ``path`` as the parser (or the pipe_command) reads them."""
    if pipe_command is not None and codec_of(path) is None:
        return path.open("rb")  # the pipe_command reads the file as it is
    return open_data_file(path)


def _holds_data(path: Path, pipe_command: str | None) -> bool:
    """Whether ``path`` has a byte that is not ASCII whitespace (reads until the first
    such byte: one block for any real data file)."""
    with _open_text(path, pipe_command) as file:
        while block := file.read(_BLOCK_BYTES):
            if block.strip():
                return True
    return False


def check_data_files(field: str, value: Path | list[Path] | None,
                     pipe_command: str | None = None, parquet: bool = False) -> list[Path]:
    """The data files of a ``*_data_dir`` value, each checked to hold data.

    Args:
        field: the config field path, for messages (``runner.train_data_dir``).
        value: a file or folder, a list of them, or None (no files).
        pipe_command: the command the files are piped through, if any (it may
            decompress unsuffixed compressed files; suffixed ones reach it as text).
        parquet: the files are Parquet (a codec suffix is then an error).

    Returns:
        The files, in order (a folder's sorted by name).

    Raises:
        DataError: a path does not exist, a folder holds no data file, or a file is
            empty or only blank lines (after decompression), a ``.zip`` or an
            unsuffixed compressed file with no pipe_command, corrupt compressed data,
            or Parquet with a codec suffix (names the field and the file).
        ConfigError: the pipe_command decompresses a suffixed file again.
    """
    paths = [] if value is None else [value] if isinstance(value, Path) else value
    files: list[Path] = []
    for path in paths:
        try:
            files += list_data_files(path, "parquet" if parquet else "text")
        except DataError as exc:
            raise DataError(f"{field}: {exc}") from None
    for file in files:
        try:
            size = file.stat().st_size
            if parquet:
                check_parquet_file(file)
                blank = False
            else:
                if pipe_command is not None:
                    check_pipe_input(file, pipe_command)
                blank = size > 0 and not _holds_data(file, pipe_command)
        except DataError as exc:
            raise DataError(f"{field}: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"runner.{exc} ({field})") from None
        except OSError as exc:
            raise DataError(f"{field}: data file {str(file)!r} cannot be read: {exc}") from None
        if size == 0 or blank:
            what = "0 bytes" if size == 0 else "only blank lines"
            raise DataError(f"{field}: data file {str(file)!r} is empty ({what}); remove it "
                            f"from {field} (or from its folder), or write the data into it")
    return files


def check_before_start(config: TrainConfig) -> None:
    """Everything about ``config`` that needs the file system or the model registry
    (module docstring). Blocks while it reads the first block of each data file.

    Raises:
        DataError: a missing, empty, unreadable or (zip, unsuffixed) compressed data
            path, or a file whose first lines are all malformed (names the field, the
            file and the first bad line).
        ConfigError: too few files for ``split_file_list: False``, an unknown model,
            a pipe_command that decompresses a file psfleet decompresses, or a bad
            ``PSFLEET_SIMULATE_STALENESS``.
    """
    simulated_staleness()  # read by single-process training, after the run folder exists
    runner = config.runner
    parquet = parser_kind(runner) == "parquet"
    if runner.train_passes is not None:  # each pass named: train_passes[k]
        for k, path in enumerate(runner.train_passes):
            check_data_files(f"runner.train_passes[{k}]", path, runner.pipe_command, parquet)
    train_files = check_data_files("runner.train_data_dir", runner.train_data_dir,
                                   runner.pipe_command, parquet)
    test_files = check_data_files("runner.test_data_dir", runner.test_data_dir,
                                  runner.pipe_command, parquet)
    valid_files = check_data_files("runner.valid_data_dir", runner.valid_data_dir,
                                   runner.pipe_command, parquet)
    if not runner.split_file_list:
        try:
            plan_share(train_files, 0, config.cluster.worker_num, split_file_list=False)
        except ConfigError as exc:
            raise ConfigError(f"runner.{exc} (runner.train_data_dir, cluster.worker_num)"
                              ) from None
    if runner.pipe_command is None:
        parser = make_parser(runner.parser, parser_options(runner))
        for field, files in (("runner.train_data_dir", train_files),
                             ("runner.test_data_dir", test_files),
                             ("runner.valid_data_dir", valid_files)):
            for file in files:
                _check_first_lines(parser, field, file,
                                   some_well_formed=runner.max_malformed_fraction < 1)
    # Last: the model imports torch (seconds), so every other mistake is named sooner.
    check_model(config)
    _check_memory_tiers(config)


def check_model(config: TrainConfig) -> None:
    """``runner.model`` is a registered model and accepts the declared tables: the model
    is built once (no file is read), so a cluster route can check it too.

    Raises:
        ConfigError: an unknown model (lists the known ones), or a model that rejects
            the tables (names the key).
    """
    from psfleet.rec.features import build_runner_model
    from psfleet.rec.models import list_models

    if config.runner.model not in list_models():
        raise ConfigError(f"runner.model: {config.runner.model!r} is not one of "
                          f"{', '.join(list_models()) or '(none)'}")
    build_runner_model(config)


def _check_memory_tiers(config: TrainConfig) -> None:
    """A table with a disk tier must hold one request's keys in memory: up to
    ``batch_size`` x its features ids per worker (x ``worker_num`` in sync mode, whose
    server applies the workers' merged push), spread over its shards. Asks for twice
    that, so that an uneven spread over the shards fits too. A multi-valued feature
    counts as one id here (its lists' lengths are the data's): a table of them can
    still be refused at run time, by the server, with the size its request needed."""
    from psfleet.fleet import rule_of_class
    from psfleet.rec.features import table_specs

    hp, runner = config.hyper_parameters, config.runner
    schema = parser_schema(runner)
    for k, spec in enumerate(table_specs(hp, schema)):
        accessor = check_accessor(spec.accessor, f"table {spec.name!r}")
        if not accessor.tiered:
            continue
        rule = spec.rule or rule_of_class(hp.optimizer.class_, hp.optimizer.learning_rate)
        rows = SparseTable.memory_rows(SparseTableConfig(name=spec.name, dim=spec.dim,
                                                         rule=rule, accessor=accessor))
        workers = config.cluster.worker_num if mode_spec(runner.sync_mode).rounds else 1
        request = runner.batch_size * len(spec.features) * workers
        if rows is not None and rows < 2 * request:
            key = (f"hyper_parameters.tables[{k}].accessor" if hp.tables is not None
                   and hp.tables[k].accessor is not None else "hyper_parameters.sparse_accessor")
            raise ConfigError(
                f"{key}: a memory tier of {rows:,} rows per server cannot hold one "
                f"request's keys (up to {runner.batch_size} examples x {len(spec.features)} "
                f"features{f' x {workers} workers' if workers > 1 else ''} = {request:,} "
                f"ids of table {spec.name!r}, spread over its shards): set memory_rows "
                f"(or memory_budget_bytes) to at least {2 * request:,} rows")


def _check_first_lines(parser: Parser, field: str, file: Path,
                       some_well_formed: bool = True) -> None:
    """Parse the header and first :data:`_FIRST_LINES` data lines of ``file`` (rows of
    Parquet), so that a column the config names but the file lacks, or data the config
    cannot read at all (text labels without ``columns.label_positive``), fails now,
    not in every worker after the job started. A compressed file is decompressed only
    as far as its first lines. ``some_well_formed``: at least one of them must be
    (``runner.max_malformed_fraction`` below 1: a file that starts with nothing but
    malformed lines would fail the job anyway).

    Raises:
        ConfigError: the parser rejects the file's columns (names the column, the
            field and the file).
        DataError: the file's first block is corrupt compressed data, or every one of
            its first lines is malformed (names the first line and why).
    """
    if parser.kind == "parquet":
        import pyarrow.parquet as pq

        payload: bytes | pa.Table = pq.ParquetFile(file).read_row_group(0).slice(
            0, _FIRST_LINES)
        header = None
    else:
        try:
            with open_data_file(file) as f:
                header = f.readline().rstrip(b"\r\n") if parser.header else None
                payload = b"".join(f.readline() for _ in range(_FIRST_LINES))
        except DataError as exc:
            raise DataError(f"{field}: {exc}") from None
    first = 2 if header is not None else 1
    lines = payload.num_rows if isinstance(payload, pa.Table) else \
        len(payload.splitlines())
    try:
        with first_malformed() as record:
            parsed = parser.parse(RawChunk(str(file), first, 1, lines, lines, payload, header),
                                  strict=False)
    except ParserConfigError as exc:  # a key of the parser's section: runner.<key>
        raise ConfigError(f"runner.{exc} ({field})") from None
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc}") from None
    if some_well_formed and parsed.malformed and not len(parsed):
        raise DataError(f"{field}: {file}: every one of its first {parsed.malformed} "
                        f"data lines is malformed (first: {record}); fix the data or the "
                        "config's columns")
