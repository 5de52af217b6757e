"""The runner's readers, built from the YAML's ``runner`` section.

``reader_type`` chooses the reader (all yield the same examples for the same files
and ``split_file_list``; they differ in order and memory):

- ``DataLoader``: torch ``DataLoader`` over the in-memory reader
  (:class:`~psfleet.data.DataLoaderReader`), shuffled each epoch with ``seed + epoch``.
- ``QueueDataset``: streamed from the files (or ``pipe_command``), file order, never
  all in memory.
- ``InMemoryDataset``: loaded once, shuffled each epoch, and with ``global_shuffle``
  mixed across workers through ``exchange_dir``.

Sync mode needs every worker to run the same number of steps per epoch:

- in-memory readers exchange their example counts (through ``exchange_dir``) and
  keep the smallest count on every worker;
- QueueDataset counts the lines of the files (no parsing) and streams exactly the
  smallest worker's share; a share that comes out shorter (malformed lines) stops the
  job with a DataError; with ``pipe_command`` (or Parquet) the count is unknown before
  reading, so that combination is a ConfigError.

The barrier of these exchanges is the parameter servers' (server 0), reached before
``fleet.init_worker``; without servers (collective jobs) it is
``torch.distributed.barrier``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from psfleet import fleet
from psfleet.data import (
    DataLoaderReader,
    FileExchange,
    InMemoryDataset,
    QueueDataset,
    Reader,
    list_data_files,
)
from psfleet.errors import ConfigError
from psfleet.fleet.server_wait import server_wait_timeout_s
from psfleet.rec.config import (
    RunnerConfig,
    TrainConfig,
    check_equal_steps_reader,
    parser_kind,
    parser_options,
)

__all__ = ["exchange_dir", "build_test_reader", "build_train_reader", "data_files"]

logger = logging.getLogger(__name__)

TEST_BATCH_SIZE = 4096


def data_files(paths: Path | Sequence[Path], runner: RunnerConfig) -> list[Path]:
    """The data files of a ``*_data_dir`` value (files and directories, in order) for
    ``runner``'s parser (:mod:`psfleet.data.files` says which files of a folder are data)."""
    items = [paths] if isinstance(paths, Path) else list(paths)
    kind = parser_kind(runner)
    return [f for p in items for f in list_data_files(p, kind)]


def _dataset_kwargs(runner: RunnerConfig, worker_index: int, worker_num: int) -> dict[str, Any]:
    return {"worker_index": worker_index, "worker_num": worker_num,
            "split_file_list": runner.split_file_list, "pipe_command": runner.pipe_command,
            "thread_num": runner.reader_thread_num, "strict": runner.strict,
            "max_malformed_fraction": runner.max_malformed_fraction,
            "debug": runner.dataset_debug, "pipe_cwd": runner.pipe_cwd}


def exchange_dir(runner: RunnerConfig) -> Path:
    """The folder every worker of the job shares: ``runner.exchange_dir``, default
    ``<run folder>/exchange``."""
    return runner.exchange_dir or runner.run_dir / "exchange"


@contextmanager
def _exchange(runner: RunnerConfig, config: TrainConfig, worker_index: int,
              worker_num: int, tag: str = "") -> Iterator[FileExchange]:
    """A FileExchange whose barrier is server 0's (or torch.distributed's); a ``tag``
    (e.g. ``pass-2``) gives it its own folder and barrier names, so that the readers of
    successive passes never meet an earlier reader's rounds."""
    directory = exchange_dir(runner) / tag if tag else exchange_dir(runner)
    endpoints = fleet.server_endpoints()
    if endpoints:
        from psfleet.fleet.role_info import restart_num
        from psfleet.ps import RemoteClient
        from psfleet.rpc import RpcConfig

        client = RemoteClient(endpoints, RpcConfig.from_env(), worker_index,
                              incarnation=restart_num())  # a restart replaces its arrival
        try:
            client.wait_ready(server_wait_timeout_s(config.cluster.server_wait_timeout_s))

            def barrier(name: str) -> None:
                client.barrier(f"psfleet.data/{tag}{name}", worker_index, worker_num)

            yield FileExchange(directory, worker_index, worker_num, barrier)
        finally:
            client.close()
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("runner.global_shuffle / sync mode with several workers needs a "
                          "barrier: parameter servers (cluster.server_num >= 1) or an "
                          "initialised torch.distributed process group")

    def dist_barrier(name: str) -> None:
        dist.barrier()

    yield FileExchange(directory, worker_index, worker_num, dist_barrier)


def build_train_reader(config: TrainConfig, worker_index: int, worker_num: int, *,
                       equal_steps: bool | None = None,
                       example_limit: int | None = None, tag: str = "") -> Reader:
    """This worker's training reader (module docstring); loads in-memory data (blocks)
    and, with ``equal_steps``, makes every worker's step count per epoch equal. Logs
    the global batch.

    Args:
        config: the job's config.
        worker_index, worker_num: this worker and the job's worker count.
        equal_steps: every worker must run the same number of steps per epoch
            (default: ``runner.needs_equal_steps``: sync mode, or checkpoints inside
            epochs).
        example_limit: with ``equal_steps``, the examples per worker already agreed
            (a restarted worker takes it from the checkpoint: the others are not there
            to count again); None: count now, among all workers.

    Every worker of the job must call it (it may be a collective) unless
    ``example_limit`` is given and there is no global shuffle.

    Raises:
        ConfigError: an invalid reader combination (names the fields) or file split.
        DataError: unreadable data, a failing pipe_command, a malformed line with
            ``strict``.

    ``tag`` names this reader's exchanges (a pass: ``pass-<k>``), distinct from those of
    the job's other readers.
    """
    runner = config.runner
    if equal_steps is None:
        equal_steps = runner.needs_equal_steps
    # Checked on load with cluster.worker_num; again with the job's real worker count.
    check_equal_steps_reader(runner, worker_num, equal_steps)
    options = parser_options(runner)
    kwargs = _dataset_kwargs(runner, worker_index, worker_num)
    files = data_files(runner.train_data_dir, runner)
    sync = equal_steps and worker_num > 1
    reader: Reader
    if runner.reader_type == "QueueDataset":
        stream = QueueDataset(runner.batch_size, runner.parser, options, **kwargs)
        stream.set_filelist(files)
        if sync and example_limit is not None:
            stream.set_example_limit(example_limit)
        elif sync:
            shares = stream.worker_lines()
            stream.set_example_limit(min(shares))
            logger.info("sync mode: every worker streams %d examples per epoch (the smallest "
                        "share; this worker's is %d lines)", min(shares), shares[worker_index])
        reader = stream
    else:
        memory = InMemoryDataset(runner.batch_size, runner.parser, options,
                                 shuffle_seed=runner.seed if runner.shuffle else None,
                                 **kwargs)
        memory.set_filelist(files)
        memory.load_into_memory()
        if sync and example_limit is not None and not runner.global_shuffle:
            memory.truncate(example_limit)
        elif worker_num > 1 and (runner.global_shuffle or sync):
            with _exchange(runner, config, worker_index, worker_num, tag) as exchange:
                if runner.global_shuffle:
                    memory.global_shuffle(exchange, seed=runner.seed)
                if sync:
                    counts = exchange.all_gather("sync_counts", memory.num_examples)
                    dropped = memory.truncate(min(counts))
                    if dropped:
                        logger.info("sync mode: dropped the last %d example(s) of this "
                                    "worker's share so that every worker runs the same "
                                    "number of steps", dropped)
        reader = DataLoaderReader(memory) if runner.reader_type == "DataLoader" else memory
    examples = reader.num_examples
    logger.info("%s (%s parser, split_file_list %s): batch_size %d x %d workers = global "
                "batch %d; %s examples on this worker", runner.reader_type, runner.parser,
                runner.split_file_list, runner.batch_size, worker_num,
                runner.batch_size * worker_num,
                "unknown (stream)" if examples is None else examples)
    return reader


def build_test_reader(config: TrainConfig) -> Reader | None:
    """The test reader of worker 0 (every test example, file order), or None when
    ``runner.test_data_dir`` is not set. Same parser and pipe_command as training."""
    runner = config.runner
    if runner.test_data_dir is None:
        return None
    kwargs = _dataset_kwargs(runner, 0, 1)
    kwargs["split_file_list"] = True
    memory = InMemoryDataset(TEST_BATCH_SIZE, runner.parser, parser_options(runner),
                             **kwargs)
    memory.set_filelist(data_files(runner.test_data_dir, runner))
    memory.load_into_memory()
    return memory


