"""Vocabulary of an inference model directory: its manifest and format constants.

An inference model is a directory (local path or fsspec URL)::

    manifest.json                 InferenceManifest below (written last: its presence
                                  marks a complete export)
    dense_model.pt2               torch.export program of the dense tower
    sparse/table-<i>.keys.npy     uint64[n]: the keys of table i, strictly ascending
    sparse/table-<i>.values.npy   float32[n, dim]: their rows (values only, no
                                  optimizer state), row j belongs to key j

The dense tower is the model with its sparse lookups factored out::

    forward(positions int64[B, S], dense float32[B, F], <table 0's inputs>, ...)
        -> logits float32[B]

where, for a batch of feature keys ``ids`` (uint64[B, S]), ``uniq, positions =
unique(ids, return_inverse=True)``. A table reads either the batch's keys or keys
of its own (:attr:`SparseTableSpec.inputs`):

- ``inputs`` absent (a bare ``SparseEmbedding``, or a ``FeatureEmbeddings`` whose
  tables are all single-valued without ``shared_ids``): one input ``rows_t``
  float32[U, dim], table t's rows of ``uniq``;
- a single-valued table of its own: ``positions_t`` int64[B, F_t] and ``rows_t``
  float32[U_t, dim], where ``uniq_t, positions_t = unique(ids_t)`` over the keys
  ``ids_t`` the table reads (``FeatureEmbeddings.table_inputs``: its columns, shared
  ids applied);
- a pooled (multi-valued) table: ``positions_t`` int64[N_t] (positions of its bags'
  keys, feature-major: bag ``f * B + b``), ``offsets_t`` int64[F_t * B + 1], per-id
  ``weights_t`` float32[N_t] when :func:`bag_mode` says so (the pooling's per-id
  weights, ``psfleet.nn.embedding_bag.bag_weights``), and ``rows_t``.

Keys absent from a table take the table's key-seeded initial values (see
:func:`psfleet.ps.hashing.init_rows`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from psfleet.nn.table_checks import Pooling
from psfleet.ps.types import Initializer

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST_FILE", "DENSE_MODEL_FILE", "TensorSpec",
           "TableInputSpec", "FeaturesSpec", "SparseTableSpec", "DenseModelSpec",
           "InferenceManifest", "bag_mode"]

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


def bag_mode(pooling: Pooling, weighted: bool) -> tuple[Literal["sum", "mean"], bool]:
    """How a pooled table's tower pools: ``(embedding_bag mode, takes per-id weights)``.

    As ``psfleet.nn.SparseEmbeddingBag.forward``: unweighted ``mean`` is torch's own
    ``mean`` mode, unweighted ``sum`` a plain sum, anything else a weighted sum with
    ``bag_weights(pooling, offsets, weights)``.
    """
    if not weighted and pooling in ("sum", "mean"):
        return ("mean" if pooling == "mean" else "sum"), False
    return "sum", True


class TableInputSpec(_Spec):
    """What a table of a ``FeatureEmbeddings`` reads, when it reads keys of its own.

    Attributes:
        group: which FeatureEmbeddings of the model (0-based, in the order of
            ``model.modules()``; tables of one group are listed in its spec order).
        table: the table's index among its group's tables.
        features: the features it reads (the EmbeddingTableSpec's).
        pooling: its bags' pooling; None for a single-valued table (a gather).
        shared_ids: the EmbeddingTableSpec's (one key prefix for all its features).
    """

    group: int = Field(ge=0)
    table: int = Field(ge=0)
    features: list[str]
    pooling: Pooling | None
    shared_ids: bool = False


class FeaturesSpec(_Spec):
    """The features of the data the model reads (its ``FeatureSchema``): names of the
    dense columns, the single-valued slots (columns of ``sparse_ids``), the
    multi-valued ones (keys of ``jagged``) and whether their ids carry weights."""

    dense: list[str]
    sparse: list[str]
    multi: list[str] = []
    weighted: bool = False


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
        inputs: what the table reads when not the batch's keys (module docstring);
            absent from the file otherwise.
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
    inputs: TableInputSpec | None = None


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
        sparse_tables: in the order of the dense tower's inputs (tables reading the
            batch's keys first, by name, then each group's tables).
        features: the data's features; present when a table has ``inputs``.
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
    features: FeaturesSpec | None = None
    metadata: dict[str, Any] = {}
