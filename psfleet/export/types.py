"""Vocabulary of an inference model directory: its manifest and format constants.

An inference model is a directory (local path or fsspec URL)::

    manifest.json                 InferenceManifest below (written last: its presence
                                  marks a complete export)
    dense_model.pt2               torch.export program of the dense tower
    sparse/table-<i>.keys.npy     uint64[n]: the keys of table i, strictly ascending
    sparse/table-<i>.values.npy   float32[n, dim]: their rows (values only, no
                                  optimizer state), row j belongs to key j

The dense tower is the model with every ``SparseEmbedding`` replaced by a gather::

    forward(positions int64[B, S], dense float32[B, F], rows_0 float32[U, dim_0], ...)
        -> logits float32[B]

where, for a batch of feature keys ``ids`` (uint64[B, S]), ``uniq, positions =
unique(ids, return_inverse=True)`` and ``rows_t`` are table t's rows of ``uniq``
(keys absent from the table take the table's key-seeded initial values, see
:func:`psfleet.ps.hashing.init_rows`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from psfleet.ps.types import Initializer

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST_FILE", "DENSE_MODEL_FILE", "TensorSpec",
           "SparseTableSpec", "DenseModelSpec", "InferenceManifest"]

#: ``manifest.json``'s ``format`` value.
FORMAT = "psfleet-inference-model"
#: Bumped on any change a reader of the previous version would misread.
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
DENSE_MODEL_FILE = "dense_model.pt2"


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TensorSpec(_Spec):
    """A model input: dtype name and shape (-1: any size, the batch dimension)."""

    dtype: str
    shape: list[int]


class SparseTableSpec(_Spec):
    """One sparse table of the export.

    Attributes:
        name: the SparseEmbedding's (table's) name.
        dim: floats per row.
        rows: rows stored (keys seen in training).
        keys_file, values_file: paths relative to the model directory.
        key_dtype, value_dtype: ``uint64`` and ``float32`` (little-endian .npy).
        initializer, initial_range, seed: the table's key-seeded initializer, used
            for keys not stored (``psfleet.ps.hashing.init_rows``).
    """

    name: str
    dim: int = Field(gt=0)
    rows: int = Field(ge=0)
    keys_file: str
    values_file: str
    key_dtype: Literal["uint64"] = "uint64"
    value_dtype: Literal["float32"] = "float32"
    initializer: Initializer
    initial_range: float = Field(ge=0)
    seed: int = Field(ge=0)


class DenseModelSpec(_Spec):
    """The dense tower: a ``torch.export`` program saved with ``torch.export.save``."""

    file: str = DENSE_MODEL_FILE
    kind: Literal["torch.export"] = "torch.export"
    torch_version: str
    inputs: list[str]
    output: str = "logits float32[B]"


class InferenceManifest(_Spec):
    """``manifest.json`` of an inference model directory.

    Attributes:
        format, format_version: :data:`FORMAT` and :data:`FORMAT_VERSION`.
        created_by: the psfleet version that wrote it.
        sparse_input, dense_input: the model's inputs (feature keys as int64 holding
            uint64 bits, dense features).
        dense_model: the dense tower.
        sparse_tables: in the order of the dense tower's ``rows_<i>`` inputs.
        metadata: free-form (the runner stores the model name, hyper-parameters and
            the in-training test metrics).
    """

    format: str
    format_version: int
    created_by: str
    sparse_input: TensorSpec
    dense_input: TensorSpec
    dense_model: DenseModelSpec
    sparse_tables: list[SparseTableSpec]
    metadata: dict[str, Any] = {}
