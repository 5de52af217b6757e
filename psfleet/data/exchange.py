"""Moving data among the workers of one job through a shared directory.

:class:`FileExchange` is how InMemoryDataset's ``global_shuffle`` sends examples to
other workers: every worker writes one file per destination into a directory all
workers can read (a local folder for a one-machine job, a shared file system such as
NFS for several machines) and then reads the files addressed to it. The steps are
separated by a barrier that the caller provides (``fleet.barrier_worker``, the
parameter servers' barrier, ``torch.distributed.barrier``, or :class:`FileBarrier`),
so the exchange needs no service of its own. Worker 0 removes stale files of an
earlier, crashed run before the first step and removes the round's folder at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from psfleet.errors import ConfigError, DataError, FatalError

__all__ = ["Barrier", "FileBarrier", "FileExchange"]

Barrier = Callable[[str], None]
_POLL_S = 0.05


class FileBarrier:
    """A barrier of ``worker_num`` processes through files in ``directory``.

    For jobs without parameter servers or torch.distributed (tests, scripts). Each
    call with a new name creates ``<name>.<worker_index>`` and waits until every
    worker's file of that name exists. The directory must be fresh for each job:
    marker files stay until the job's owner removes the directory.

    Args:
        directory: a folder every worker can reach (created if missing).
        worker_index: this worker.
        worker_num: workers taking part.
        timeout_s: how long a call waits for the others.

    Raises:
        FatalError: (on call) the others did not arrive within ``timeout_s`` (lists them).
        ConfigError: (on call) this worker's marker already exists: the directory holds
            files of an earlier job; use a new directory.
    """

    def __init__(self, directory: str | Path, worker_index: int, worker_num: int,
                 timeout_s: float = 300.0) -> None:
        self.directory = Path(directory)
        self.worker_index, self.worker_num, self.timeout_s = worker_index, worker_num, timeout_s
        self.directory.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: str) -> None:
        safe = name.replace("/", "_").replace(":", "_")
        mine = self.directory / f"{safe}.{self.worker_index}"
        if mine.exists():
            raise ConfigError(f"barrier directory {str(self.directory)!r} already holds "
                              f"{mine.name}: it belongs to an earlier job; use a new directory")
        mine.touch()
        deadline = time.monotonic() + self.timeout_s
        while True:
            missing = [k for k in range(self.worker_num)
                       if not (self.directory / f"{safe}.{k}").exists()]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise FatalError(f"barrier {name!r}: workers {missing} did not arrive within "
                                 f"{self.timeout_s:.0f} s (directory {self.directory})")
            time.sleep(_POLL_S)


Arrays = dict[str, npt.NDArray[np.generic]]


class FileExchange:
    """All-to-all exchange of numpy arrays and all-gather of small values, through a
    shared directory (module docstring).

    Every worker of the job must call the same methods in the same order (each call is
    a collective). Blocks.

    Args:
        directory: shared folder (created if missing).
        worker_index: this worker.
        worker_num: workers of the job.
        barrier: ``barrier(name)`` returns once every worker called it with ``name``.
    """

    def __init__(self, directory: str | Path, worker_index: int, worker_num: int,
                 barrier: Barrier) -> None:
        if not 0 <= worker_index < worker_num:
            raise ConfigError(f"worker_index: {worker_index!r} must be in 0..{worker_num - 1}")
        self.directory = Path(directory)
        self.worker_index, self.worker_num = worker_index, worker_num
        self._barrier = barrier
        self._round = 0

    def _begin(self, name: str) -> Path:
        self._round += 1
        folder = self.directory / f"{name}-{self._round}"
        if self.worker_index == 0:
            shutil.rmtree(folder, ignore_errors=True)  # a crashed run's leftovers
            folder.mkdir(parents=True, exist_ok=True)
        self._barrier(f"exchange:{folder.name}:begin")
        return folder

    def _end(self, folder: Path) -> None:
        self._barrier(f"exchange:{folder.name}:end")
        if self.worker_index == 0:
            shutil.rmtree(folder, ignore_errors=True)

    def all_to_all(self, name: str, parts: list[Arrays]) -> list[Arrays]:
        """Send ``parts[d]`` to worker ``d``; return what each worker sent to this one.

        Args:
            name: names the round (a folder ``<name>-<n>`` in the directory).
            parts: ``worker_num`` dicts of arrays, one per destination (this worker's
                own part included; it goes through the directory too).

        Returns:
            ``received[s]``: the arrays worker ``s`` addressed to this worker.

        Raises:
            ConfigError: ``len(parts) != worker_num``.
            DataError: a file cannot be written or read (names it).
        """
        if len(parts) != self.worker_num:
            raise ConfigError(f"all_to_all: {len(parts)} parts for {self.worker_num} workers")
        folder = self._begin(name)
        for dest, arrays in enumerate(parts):
            path = folder / f"from{self.worker_index}-to{dest}.npz"
            tmp = folder / f".from{self.worker_index}-to{dest}.tmp.npz"
            try:
                np.savez(tmp, **arrays)  # type: ignore[arg-type]
                os.replace(tmp, path)
            except OSError as exc:
                raise DataError(f"exchange: cannot write {path}: {exc}; the exchange "
                                "directory must be writable by every worker") from exc
        self._barrier(f"exchange:{folder.name}:written")
        received = []
        for source in range(self.worker_num):
            path = folder / f"from{source}-to{self.worker_index}.npz"
            try:
                with np.load(path) as data:
                    received.append({key: data[key] for key in data.files})
            except OSError as exc:
                raise DataError(f"exchange: cannot read {path}: {exc}; the exchange "
                                "directory must be shared by every worker (same path on "
                                "every machine)") from exc
        self._end(folder)
        return received

    def all_gather(self, name: str, value: int) -> list[int]:
        """Every worker's ``value``, in worker order."""
        folder = self._begin(name)
        (folder / f".{self.worker_index}.tmp").write_text(json.dumps(value))
        os.replace(folder / f".{self.worker_index}.tmp", folder / f"{self.worker_index}.json")
        self._barrier(f"exchange:{folder.name}:written")
        values = [int(json.loads((folder / f"{k}.json").read_text()))
                  for k in range(self.worker_num)]
        self._end(folder)
        return values
