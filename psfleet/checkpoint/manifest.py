"""The manifest of a checkpoint: what it holds, where training stood, each file's checksum.

``manifest.json`` is the last file written into a checkpoint; a checkpoint folder
without one is incomplete and never loaded.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from psfleet.errors import DataError

__all__ = ["Manifest", "Cursor", "CheckpointError", "MANIFEST_NAME", "MANIFEST_FORMAT"]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 2


class CheckpointError(DataError):
    """A checkpoint is damaged, incomplete or does not fit the model (names the file or
    the table and both values)."""


class Cursor(BaseModel):
    """Where a worker stood in its data: ``epoch`` (0-based) and ``batch``, the number
    of batches of that epoch already trained; ``step`` counts every batch trained."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epoch: int = Field(ge=0)
    batch: int = Field(ge=0)
    step: int = Field(0, ge=0)


class Manifest(BaseModel):
    """``manifest.json``.

    Attributes:
        format_version: :data:`MANIFEST_FORMAT`.
        step: optimizer steps of worker 0 when taken; epoch, batch: its cursor.
        server_num, worker_num: the job's shape when taken; ``server_num`` counts its
            shares (one per server unless ``cluster.shares``), the ``server-<i>``
            folders of the save.
        mode: the strategy's mode; strategy: the whole strategy.
        sparse_tables: table name -> {table_id, dim, num_buckets, rule, initializer, ...}
            (the SparseTableConfig); the bucket map is ``bucket % server_num``.
        dense: the dense table: table_id, rule and the parameter shapes.
        cursors: every worker's cursor, by worker index.
        files: path relative to the checkpoint -> {"size", "sha256"}.
        extra: what the caller added (free form).
    """

    model_config = ConfigDict(extra="forbid")

    format_version: int = MANIFEST_FORMAT
    step: int = 0
    epoch: int = 0
    batch: int = 0
    server_num: int = 1
    worker_num: int = 1
    mode: str = "local"
    strategy: dict[str, Any] = {}
    sparse_tables: dict[str, dict[str, Any]] = {}
    dense: dict[str, Any] = {}
    cursors: list[Cursor] = []
    files: dict[str, dict[str, Any]] = {}
    extra: dict[str, Any] = {}
