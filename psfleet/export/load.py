"""Loading an inference model for offline scoring: no server, no fleet.

:func:`load_inference_model` returns an :class:`InferenceModel`, an ``nn.Module``
with the training model's signature ``(sparse_ids, dense[, jagged]) -> logits``: it
computes the keys each table reads (for pooled and ``shared_ids`` tables, with
``FeatureEmbeddings.table_inputs`` of a FeatureEmbeddings rebuilt from the manifest,
the same code as training), looks their unique keys up (:class:`SparseLookup`) and
runs the exported dense tower (inputs: :mod:`psfleet.export.types`).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError
from torch import Tensor, nn

from psfleet.data.jagged import KeyedJagged
from psfleet.data.types import FeatureSchema
from psfleet.errors import ConfigError, DataError
from psfleet.export.lookup import SparseLookup
from psfleet.export.plan import TowerInputs
from psfleet.export.storage import ModelDir
from psfleet.export.types import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    InferenceManifest,
    TableInputSpec,
)
from psfleet.nn import EmbeddingTableSpec, FeatureEmbeddings, SparseEmbeddingBag

__all__ = ["InferenceModel", "load_inference_model", "read_manifest"]


def read_manifest(dirname: str | Path) -> InferenceManifest:
    """The manifest of the model directory ``dirname`` (local path or fsspec URL).

    Raises:
        DataError: the directory or its manifest is missing, unreadable, of another
            format or format version (names the file and the values).
    """
    model_dir = ModelDir(dirname)
    if not model_dir.is_dir():
        raise DataError(f"inference model directory {str(dirname)!r} does not exist; pass "
                        "the folder fleet.save_inference_model() (or runner."
                        "inference_model_path) wrote")
    path = model_dir.describe(MANIFEST_FILE)
    if not model_dir.exists(MANIFEST_FILE):
        raise DataError(f"{path} does not exist: {str(dirname)!r} is not an inference model "
                        "or its export did not complete; export it again")
    try:
        raw: Any = json.loads(model_dir.read_bytes(MANIFEST_FILE))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise DataError(f"{path}: format {found!r} is not {FORMAT!r}")
    if raw.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path}: format_version {raw.get('format_version')!r}, this psfleet "
                        f"reads version {FORMAT_VERSION}; export the model with this release")
    try:
        return InferenceManifest.model_validate(raw)
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                           for e in exc.errors())
        raise DataError(f"{path}: {fields}") from None


def _groups(manifest: InferenceManifest, where: str) -> list[FeatureEmbeddings]:
    """The own-keyed FeatureEmbeddings of the manifest's tables, rebuilt (unbound: only
    their ``table_inputs`` is used).

    Raises:
        DataError: the tables' ``inputs`` or ``features`` are inconsistent.
    """
    specs = [(t, t.inputs) for t in manifest.sparse_tables if t.inputs is not None]
    if not specs:
        return []
    features = manifest.features
    if features is None:
        raise DataError(f"{where}: sparse_tables have inputs but there is no features "
                        "entry; export the model again")
    schema = FeatureSchema(dense=tuple(features.dense), sparse=tuple(features.sparse),
                           multi=tuple(features.multi), weighted=features.weighted)
    groups: list[FeatureEmbeddings] = []
    for g in range(max(i.group for _, i in specs) + 1):
        tables = sorted((s for s in specs if s[1].group == g), key=lambda s: s[1].table)
        if [i.table for _, i in tables] != list(range(len(tables))):
            raise DataError(f"{where}: the tables of group {g} are not numbered 0, 1, ...; "
                            "export the model again")
        try:
            group = FeatureEmbeddings(schema, [EmbeddingTableSpec(
                name=t.name, dim=t.dim, features=tuple(i.features), pooling=i.pooling or "sum",
                shared_ids=i.shared_ids) for t, i in tables])
        except ConfigError as exc:
            raise DataError(f"{where}: group {g}: {exc}") from None
        for (t, i), module in zip(tables, group.embeddings, strict=True):
            if isinstance(module, SparseEmbeddingBag) != (i.pooling is not None):
                raise DataError(f"{where}: table {t.name!r}: pooling {i.pooling!r} does not "
                                "fit its features' kinds; export the model again")
        groups.append(group)
    return groups


class InferenceModel(nn.Module):
    """An exported model: sparse lookups plus the dense tower. Always in eval mode.

    Args:
        manifest: the directory's manifest.
        tower: the dense tower (``torch.export.load(...).module()``).
        tables: one lookup per ``manifest.sparse_tables``, in order.

    Shapes:
        input: sparse_ids (Tensor[B, S], int64): feature keys (uint64 bits);
            dense (Tensor[B, F], float32); jagged: the multi-valued features
            (KeyedJagged, stride B) when ``manifest.features.multi`` names any.
        output: Tensor[B], float32 logits (``sigmoid`` gives the click probability).

    Raises:
        DataError: on construction, the manifest's table inputs are inconsistent.
    """

    def __init__(self, manifest: InferenceManifest, tower: nn.Module,
                 tables: list[SparseLookup]) -> None:
        super().__init__()
        self.manifest = manifest
        self.tables = tables
        self._tower = [tower]  # not a submodule: exported graphs reject train()/eval()
        inputs: list[TableInputSpec | None] = [t.inputs for t in manifest.sparse_tables]
        features = manifest.features
        self._inputs = TowerInputs(inputs, _groups(manifest, MANIFEST_FILE),
                                   features is not None and features.weighted)

    def train(self, mode: bool = True) -> InferenceModel:
        """No effect on the computation: the exported graph is fixed in eval mode."""
        self.training = mode
        return self

    def forward(self, sparse_ids: Tensor, dense: Tensor, jagged: KeyedJagged | None = None
                ) -> Tensor:
        """Logits of a batch.

        Raises:
            ConfigError: an input has the wrong dtype or shape, or the multi-valued
                features do not fit the model's (names the input or feature and the
                manifest's).
        """
        for name, tensor, spec in (("sparse_ids", sparse_ids, self.manifest.sparse_input),
                                   ("dense", dense, self.manifest.dense_input)):
            shape = list(tensor.shape)
            if (str(tensor.dtype).removeprefix("torch.") != spec.dtype
                    or len(shape) != len(spec.shape)
                    or any(s != e for s, e in zip(shape[1:], spec.shape[1:], strict=True))):
                raise ConfigError(f"{name}: got {tensor.dtype} {shape}, the model takes "
                                  f"{spec.dtype} {spec.shape} (-1: any batch size)")
        if sparse_ids.shape[0] != dense.shape[0]:
            raise ConfigError(f"sparse_ids and dense: batch sizes {sparse_ids.shape[0]} and "
                              f"{dense.shape[0]} differ")
        self._check_jagged(jagged, int(sparse_ids.shape[0]))
        if sparse_ids.shape[0] == 0:  # the tower is exported for batches of 1 and more
            return torch.zeros(0, dtype=torch.float32)

        def lookup(i: int, keys: np.ndarray) -> np.ndarray:
            return self.tables[i].lookup(keys)

        inputs = self._inputs(sparse_ids, dense, jagged, lookup)
        with torch.no_grad():
            logits: Tensor = self._tower[0](*inputs)
        return logits

    def _check_jagged(self, jagged: KeyedJagged | None, batch: int) -> None:
        features = self.manifest.features
        multi = [] if features is None else features.multi
        if not multi:
            if jagged is not None and jagged.keys:
                raise ConfigError(f"jagged: the model reads no multi-valued features, got "
                                  f"{list(jagged.keys)}")
            return
        assert features is not None
        if jagged is None:
            raise ConfigError(f"jagged: the model reads the multi-valued features {multi}; "
                              "pass the batch's jagged")
        missing = [k for k in multi if k not in jagged.keys]
        if missing:
            raise ConfigError(f"jagged: multi-valued features {missing} are missing (got "
                              f"{list(jagged.keys)}); the model reads {multi}")
        if jagged.stride != batch:
            raise ConfigError(f"jagged: stride {jagged.stride} differs from the batch size "
                              f"{batch}")
        if (jagged.weights is not None) != features.weighted:
            have = "have" if jagged.weights is not None else "have no"
            want = "with" if features.weighted else "without"
            raise ConfigError(f"jagged: the multi-valued features {multi} {have} weights per "
                              f"id, but the model was exported for data {want} them "
                              f"(FeatureSchema.weighted {features.weighted})")


def load_inference_model(dirname: str | Path) -> InferenceModel:
    """Load the model directory ``dirname`` (local path or fsspec URL).

    Raises:
        DataError: the directory, its manifest or a file it names is missing,
            unreadable or inconsistent (names the file).
    """
    manifest = read_manifest(dirname)
    model_dir = ModelDir(dirname)

    def need(relative: str) -> str:
        if not model_dir.exists(relative):
            raise DataError(f"{model_dir.describe(relative)} does not exist (named by "
                            f"{model_dir.describe(MANIFEST_FILE)}); export the model again")
        return relative

    dense_file = need(manifest.dense_model.file)
    try:
        program = torch.export.load(io.BytesIO(model_dir.read_bytes(dense_file)))
        tower = program.module()
    except Exception as exc:  # torch raises many types for a damaged or foreign file
        raise DataError(f"{model_dir.describe(dense_file)}: not a loadable torch.export "
                        f"program ({type(exc).__name__}: {str(exc)[:500]})") from None
    tables = []
    for spec in manifest.sparse_tables:
        keys = model_dir.read_npy(need(spec.keys_file))
        values = model_dir.read_npy(need(spec.values_file))
        if keys.shape != (spec.rows,) or values.shape != (spec.rows, spec.dim):
            raise DataError(f"{model_dir.describe(spec.values_file)}: table {spec.name!r} has "
                            f"keys {keys.shape} and values {values.shape}, the manifest says "
                            f"{spec.rows} rows of dim {spec.dim}")
        tables.append(SparseLookup(keys, values, spec.initializer, spec.initial_range,
                                   spec.seed, spec.name))
    return InferenceModel(manifest, tower, tables)
