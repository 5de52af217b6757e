"""An inference model built from a base save and its delta saves, without servers.

Online training saves a ``base`` now and then and a ``delta`` after each pass
(``fleet.save_persistables(dirname, mode=...)``, ``psfleet.ps.persist_delta``).
:func:`export_from_saves` replays them in order into in-process tables
(``psfleet.ps.restore.replay``) and writes the same export as
``save_inference_model`` (``psfleet predict`` / ``load_inference_model`` read it):
the sparse rows are the replayed tables', the dense tower is ``model``'s own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor, nn

from psfleet.errors import ConfigError
from psfleet.export.plan import TowerPlan
from psfleet.export.save import _default_examples, write_inference_model
from psfleet.export.storage import ModelDir
from psfleet.export.tower import export_dense_tower
from psfleet.export.types import InferenceManifest
from psfleet.ps.persist import saved_table_configs
from psfleet.ps.restore import replay
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import SparseTableConfig

__all__ = ["export_from_saves"]


def export_from_saves(dirname: str | Path, model: nn.Module, base: str | Path,
                      deltas: Sequence[str | Path] = (),
                      example_inputs: tuple[Tensor, Tensor] | None = None,
                      metadata: Mapping[str, Any] | None = None) -> InferenceManifest:
    """Write an inference model whose sparse rows are ``base`` + ``deltas`` replayed.

    Each SparseEmbedding of ``model`` takes the saved sparse table of its name (the
    base's ``server-0/tables.json``); the rows are the base's, then each delta's in
    order (tombstones removed, rows upserted), from any saving server count. The
    dense tower is exported from ``model`` as it is (load or train its dense
    parameters first).

    Args:
        dirname: the model directory (local path or fsspec URL).
        model: as for ``save_inference_model``.
        base: a ``base`` (or ``full``) save.
        deltas: the ``delta`` saves taken after it, oldest first.
        example_inputs, metadata: as for ``save_inference_model``.

    Returns:
        The manifest written.

    Raises:
        ConfigError: an embedding has no table of its name in the save, or the model
            is not exportable.
        DataError: a save is damaged, ``base`` is a delta or a ``deltas`` entry is
            not one (names it).
        RemoteError: a saved table does not fit its config.
        FatalError: torch.export fails.
    """
    examples = example_inputs if example_inputs is not None else _default_examples(model)
    plan = TowerPlan.of(model)
    configs = {c.name: (tid, c) for tid, c in saved_table_configs(base, 0).items()
               if isinstance(c, SparseTableConfig)}
    missing = [e.name for e in plan.embeddings if e.name not in configs]
    if missing:
        raise ConfigError(f"export_from_saves: SparseEmbeddings {missing} have no table of "
                          f"that name in {base} (tables: {sorted(configs)}); pass the saves "
                          "of this model")
    program = export_dense_tower(model, examples)
    wanted = {configs[e.name][0]: configs[e.name][1] for e in plan.embeddings}
    tables = replay(base, [str(d) for d in deltas], configs=wanted)
    rows = []
    for embedding in plan.embeddings:
        table_id, config = configs[embedding.name]
        table = tables[table_id]
        assert isinstance(table, SparseTable)
        keys, data = table.items()
        rows.append((config, keys, np.ascontiguousarray(data[:, : config.dim])))
    target = ModelDir(dirname)
    target.makedirs()
    return write_inference_model(target, plan, program, examples, rows, metadata)
