"""Checkpoints: CheckpointConfig, atomic save through fsspec, finding the newest good one.

Modules: :mod:`~psfleet.checkpoint.config` (CheckpointConfig), :mod:`.storage`
(fsspec folders, atomic file writes with SHA-256), :mod:`.manifest` (what a checkpoint
holds), :mod:`.store` (publish, keep the last N, verify, fall back). The tables' files
are written by the servers (``psfleet.ps.persist``); the fleet API drives a checkpoint
(``Fleet.save_checkpoint`` / ``Fleet.load_checkpoint``).
"""

from psfleet.checkpoint.config import CheckpointConfig
from psfleet.checkpoint.manifest import CheckpointError, Cursor, Manifest
from psfleet.checkpoint.storage import FileDigest, Storage
from psfleet.checkpoint.store import CheckpointStore, LoadedCheckpoint, PendingCheckpoint

__all__ = [
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointStore",
    "Cursor",
    "FileDigest",
    "LoadedCheckpoint",
    "Manifest",
    "PendingCheckpoint",
    "Storage",
]
