"""Writing an inference model: the dense tower and every sparse table's rows.

The rows come from the tables themselves (servers or in-process): the worker asks
them to save (the ``Save`` rpc, as ``fleet.save_persistables`` does) into a staging
folder inside the model directory, loads that save back as one in-process table
(``psfleet.ps.persist.load_server``), keeps the values of every row (dropping the
optimizer state), sorted by key, and writes them as ``.npy``; the staging folder is
removed. The servers must therefore be able to write the model directory's
filesystem (true for a local job; across hosts use a shared filesystem). For a
directory that is not local (an fsspec URL) the staging folder is a local temporary
folder, so the servers must run on this host.
"""

from __future__ import annotations

import io
import logging
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import psfleet
from psfleet.errors import ConfigError, FatalError
from psfleet.export.plan import TowerPlan
from psfleet.export.storage import ModelDir
from psfleet.export.tower import export_dense_tower, tower_input_names
from psfleet.export.types import (
    DENSE_MODEL_FILE,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    DenseModelSpec,
    InferenceManifest,
    SparseTableSpec,
    TensorSpec,
)
from psfleet.ps.client import TableClient
from psfleet.ps.persist import load_server
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import SparseTableConfig

__all__ = ["save_inference_model", "read_saved_rows", "write_inference_model"]

logger = logging.getLogger(__name__)


def read_saved_rows(save_dir: Path, table_id: int, config: SparseTableConfig
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Every row of sparse table ``table_id`` in a save (``TableClient.save``).

    Loads the save into one in-process table as a single server owning every bucket
    (``psfleet.ps.persist.load_server``), so any saved server count works.

    Args:
        save_dir: the save's folder.
        table_id: the table.
        config: the table's config (the one it was created with).

    Returns:
        keys uint64[n], ascending, and their values float32[n, dim] (no rule state).

    Raises:
        DataError: no server saved the table, or a file is damaged.
        RemoteError: the saved table does not fit ``config``.
    """
    table = SparseTable(config)
    load_server({table_id: table}, save_dir, 0, 1, {})
    keys, rows = table.items()
    return keys, np.ascontiguousarray(rows[:, : config.dim])


def _default_examples(model: nn.Module) -> tuple[Tensor, Tensor]:
    slots, num_dense = getattr(model, "num_slots", None), getattr(model, "num_dense", None)
    if not isinstance(slots, int) or not isinstance(num_dense, int):
        raise ConfigError(f"save_inference_model: {type(model).__name__} has no num_slots / "
                          "num_dense attributes; pass example_inputs=(sparse_ids int64[B, S], "
                          "dense float32[B, F]), e.g. one batch of your reader")
    return torch.zeros(2, slots, dtype=torch.int64), torch.zeros(2, num_dense)


def _manifest_json(manifest: InferenceManifest) -> dict[str, Any]:
    """The manifest as JSON, without the keys of tables reading the batch's keys only
    (``features``, ``inputs``: absent, so such a model's file is format 1 as before)."""
    raw = manifest.model_dump(mode="json")
    if raw["features"] is None:
        del raw["features"]
    for table in raw["sparse_tables"]:
        if table["inputs"] is None:
            del table["inputs"]
    return raw


def _stage(target: ModelDir) -> Path:
    local = target.local_path()
    if local is None:
        return Path(tempfile.mkdtemp(prefix="psfleet-export-"))
    return (local / f".staging-{uuid.uuid4().hex[:12]}").resolve()


def save_inference_model(dirname: str | Path, model: nn.Module, client: TableClient,
                         tables: Mapping[str, tuple[int, SparseTableConfig]],
                         example_inputs: tuple[Tensor, Tensor] | None = None,
                         metadata: Mapping[str, Any] | None = None) -> InferenceManifest:
    """Write ``model`` for serving: the dense tower and its sparse tables' rows.

    Blocks. Call on one worker after every worker's pushes are applied (after
    ``fleet.flush()`` and ``fleet.barrier_worker()``) and with the model's dense
    parameters fresh. An earlier export in ``dirname`` is replaced once every table
    was read (it stays intact when the tables cannot be saved); ``manifest.json`` is
    written last, so a directory without it is an incomplete export.

    Args:
        dirname: the model directory (local path or fsspec URL).
        model: maps ``(sparse_ids int64[B, S], dense float32[B, F])`` (and ``jagged``
            when its FeatureEmbeddings read multi-valued features) to logits float32[B]
            through its SparseEmbeddings and FeatureEmbeddings (every table exported).
        client: the tables.
        tables: each SparseEmbedding's table id and config, by name.
        example_inputs: one batch of inputs (only shapes past the batch dimension
            matter); None: ``[*, model.num_slots]`` and ``[*, model.num_dense]``.
        metadata: stored in the manifest (JSON-serialisable).

    Returns:
        The manifest written.

    Raises:
        ConfigError: no example inputs can be made, or the model is not exportable.
        FatalError: an embedding has no table (``fleet.init_worker`` not called), or
            torch.export fails.
        DataError: the servers' save cannot be read.
        OSError: ``dirname`` cannot be written.
    """
    examples = example_inputs if example_inputs is not None else _default_examples(model)
    plan = TowerPlan.of(model)
    embeddings = plan.embeddings
    missing = [e.name for e in embeddings if e.name not in tables]
    if missing:
        raise FatalError(f"save_inference_model: SparseEmbeddings {missing} have no table; "
                         "call fleet.init_worker() first")
    program = export_dense_tower(model, examples)
    target = ModelDir(dirname)
    target.makedirs()
    staging = _stage(target)
    rows = []
    try:  # read every table before touching an earlier export in ``dirname``
        client.save(str(staging))
        for embedding in embeddings:
            table_id, config = tables[embedding.name]
            rows.append((config, *read_saved_rows(staging, table_id, config)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return write_inference_model(target, plan, program, examples, rows, metadata)


def write_inference_model(target: ModelDir, plan: TowerPlan,
                          program: torch.export.ExportedProgram,
                          examples: tuple[Tensor, Tensor],
                          rows: list[tuple[SparseTableConfig, np.ndarray, np.ndarray]],
                          metadata: Mapping[str, Any] | None) -> InferenceManifest:
    """Write an export whose rows were read: replaces an earlier export in ``target``,
    ``manifest.json`` last.

    Args:
        target: the model directory.
        plan: the model's embeddings and their inputs (``TowerPlan.of``).
        program: the exported dense tower.
        examples: the example inputs it was exported with.
        rows: per embedding of ``plan``, (config, keys uint64[n] ascending, values
            float32[n, dim]).
        metadata: stored in the manifest.

    Raises:
        OSError: ``target`` cannot be written.
    """
    embeddings = plan.embeddings
    target.remove(MANIFEST_FILE)
    target.remove("sparse")
    target.makedirs("sparse")
    buf = io.BytesIO()
    torch.export.save(program, buf)
    target.write_bytes(DENSE_MODEL_FILE, buf.getvalue())
    specs = []
    for i, (embedding, inputs, (config, keys, values)) in enumerate(
            zip(embeddings, plan.inputs, rows, strict=True)):
        spec = SparseTableSpec(
            name=embedding.name, dim=config.dim, rows=int(keys.size),
            keys_file=f"sparse/table-{i}.keys.npy", values_file=f"sparse/table-{i}.values.npy",
            initializer=config.initializer, initial_range=config.initial_range, seed=config.seed,
            inputs=inputs)
        target.write_npy(spec.keys_file, keys)
        target.write_npy(spec.values_file, values)
        specs.append(spec)
    sparse, dense = examples
    manifest = InferenceManifest(
        format=FORMAT, format_version=FORMAT_VERSION, created_by=f"psfleet {psfleet.__version__}",
        sparse_input=TensorSpec(dtype="int64", shape=[-1, *sparse.shape[1:]]),
        dense_input=TensorSpec(dtype="float32", shape=[-1, int(dense.shape[1])]),
        dense_model=DenseModelSpec(torch_version=torch.__version__,
                                   inputs=tower_input_names(plan)),
        sparse_tables=specs, features=plan.features, metadata=dict(metadata or {}))
    target.write_json(MANIFEST_FILE, _manifest_json(manifest))
    logger.info("inference model written to %s: %d sparse tables (%s rows), dense tower %s",
                target.dirname, len(specs), ", ".join(str(s.rows) for s in specs), DENSE_MODEL_FILE)
    return manifest
