"""Loading an inference model for offline scoring: no server, no fleet.

:func:`load_inference_model` returns an :class:`InferenceModel`, an ``nn.Module``
with the training model's signature ``(sparse_ids, dense) -> logits``: it looks
the batch's unique keys up in each table (:class:`SparseLookup`) and runs the
exported dense tower.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from torch import Tensor, nn

from psfleet.errors import ConfigError, DataError
from psfleet.export.lookup import SparseLookup
from psfleet.export.storage import ModelDir
from psfleet.export.types import FORMAT, FORMAT_VERSION, MANIFEST_FILE, InferenceManifest

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


class InferenceModel(nn.Module):
    """An exported model: sparse lookups plus the dense tower. Always in eval mode.

    Args:
        manifest: the directory's manifest.
        tower: the dense tower (``torch.export.load(...).module()``).
        tables: one lookup per ``manifest.sparse_tables``, in order.

    Shapes:
        input: sparse_ids (Tensor[B, S], int64): feature keys (uint64 bits);
            dense (Tensor[B, F], float32).
        output: Tensor[B], float32 logits (``sigmoid`` gives the click probability).
    """

    def __init__(self, manifest: InferenceManifest, tower: nn.Module,
                 tables: list[SparseLookup]) -> None:
        super().__init__()
        self.manifest = manifest
        self.tables = tables
        self._tower = [tower]  # not a submodule: exported graphs reject train()/eval()

    def train(self, mode: bool = True) -> InferenceModel:
        """No effect on the computation: the exported graph is fixed in eval mode."""
        self.training = mode
        return self

    def forward(self, sparse_ids: Tensor, dense: Tensor) -> Tensor:
        """Logits of a batch.

        Raises:
            ConfigError: an input has the wrong dtype or shape (names it and the
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
        uniq, positions = torch.unique(sparse_ids.reshape(-1), return_inverse=True)
        keys = uniq.numpy().view("uint64")
        rows = [torch.from_numpy(table.lookup(keys)) for table in self.tables]  # [U, dim]
        with torch.no_grad():
            logits: Tensor = self._tower[0](positions.reshape(sparse_ids.shape), dense, *rows)
        return logits


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
