"""Pass mode in the runner (``runner.sync_mode: gpubox``): an epoch as sub-passes.

A worker's epoch over its ``InMemoryDataset`` is one pass. Its batches are read
once to collect each table's ids (``psfleet.nn.pass_ids``: no rows are read), cut
into sub-passes whose rows fit ``runner.pass_configs.cache_budget_bytes``
(``fleet.sub_passes``), and each sub-pass runs between ``fleet.begin_pass`` (its rows
pulled into the worker's cache) and ``fleet.end_pass`` (their changes pushed back).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
from torch import nn

from psfleet import fleet
from psfleet.data.batch import Batch
from psfleet.data.types import Reader
from psfleet.nn import pass_ids

__all__ = ["pass_batches"]

logger = logging.getLogger(__name__)


def pass_batches(reader: Reader, model: nn.Module) -> Iterator[Batch]:
    """The reader's batches of this epoch, each sub-pass's inside begin/end_pass.

    Holds the epoch's batches in memory (the InMemoryDataset holds its examples
    anyway). Blocks at each sub-pass boundary while rows are pulled or pushed.

    Raises:
        ConfigError: one batch's rows alone exceed the cache budget, or the model has
            no FeatureEmbeddings (``psfleet.nn.pass_ids``).
    """
    batches = list(reader)
    per_batch = [pass_ids(model, [batch]) for batch in batches]
    parts = fleet.sub_passes(per_batch)
    if len(parts) > 1:
        logger.info("pass of %d batches in %d sub-passes (runner.pass_configs."
                    "cache_budget_bytes)", len(batches), len(parts))
    for part in parts:
        names = {name for k in part for name in per_batch[k]}
        fleet.begin_pass({name: np.concatenate([per_batch[k][name] for k in part
                                                if name in per_batch[k]])
                          for name in names})
        yield from (batches[k] for k in part)
        fleet.end_pass()
