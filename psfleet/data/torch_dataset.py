"""The ``DataLoader`` reader: psfleet's readers behind torch's IterableDataset.

:class:`CtrIterableDataset` yields the :class:`~psfleet.data.batch.Batch` objects of
any psfleet reader (InMemoryDataset, QueueDataset, CriteoReader), so the parsers,
worker split and shuffling are the same and the torch ecosystem (``DataLoader``,
``pin_memory``, samplers that wrap iterables) can be used::

    dataset = InMemoryDataset(512, "criteo", shuffle_seed=0); dataset.set_filelist(files)
    dataset.load_into_memory()
    loader = torch.utils.data.DataLoader(CtrIterableDataset(dataset), batch_size=None)

:class:`DataLoaderReader` is that DataLoader with the Reader protocol
(``set_epoch``, ``set_start_batch``, ``num_batches``, ``total_lines``), as the runner
uses it (``reader_type: DataLoader``). Batches are already cut, so use
``batch_size=None`` and ``num_workers=0`` (loader processes would each hold a copy of
the data).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.utils.data

from psfleet.data.batch import Batch
from psfleet.data.types import Reader

__all__ = ["CtrIterableDataset", "DataLoaderReader"]


class CtrIterableDataset(torch.utils.data.IterableDataset[Batch]):
    """A torch IterableDataset over a psfleet reader; each iteration is one epoch.

    Args:
        reader: any object of the :class:`~psfleet.data.types.Reader` protocol.
    """

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise RuntimeError("CtrIterableDataset: use DataLoader(num_workers=0); batches "
                               "are cut and split across fleet workers by the reader")
        return iter(self.reader)


def _identity(batch: Any) -> Any:
    return batch


class DataLoaderReader:
    """``torch.utils.data.DataLoader(CtrIterableDataset(reader), batch_size=None)`` with
    the Reader protocol (delegated to ``reader``).

    Args:
        reader: the reader whose batches the loader yields.
        loader_kwargs: more DataLoader arguments (e.g. ``pin_memory=True``).
    """

    def __init__(self, reader: Reader, **loader_kwargs: Any) -> None:
        self.reader = reader
        self.loader = torch.utils.data.DataLoader(CtrIterableDataset(reader), batch_size=None,
                                                  collate_fn=_identity, **loader_kwargs)

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.reader.set_epoch(epoch)

    def set_start_batch(self, batches: int) -> None:
        self.reader.set_start_batch(batches)

    @property
    def num_batches(self) -> int | None:
        return self.reader.num_batches

    @property
    def total_lines(self) -> int:
        return self.reader.total_lines

    @property
    def num_examples(self) -> int | None:
        """Examples of one epoch on this worker (None while unknown)."""
        value = getattr(self.reader, "num_examples", None)
        return None if value is None else int(value)

    def __len__(self) -> int:
        batches = self.num_batches
        if batches is None:
            raise TypeError("the number of batches is unknown; use num_batches")
        return batches
