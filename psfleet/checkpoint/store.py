"""A folder of checkpoints: atomic publish, keeping the last N, finding the newest good one.

Layout of ``checkpoint_dir``::

    ckpt-000007-step001200/       a complete checkpoint (sequence 7, taken at step 1200)
        manifest.json             written last: see psfleet.checkpoint.manifest
        server-<i>/...            each server's tables (psfleet.ps.persist)
    .tmp-ckpt-000008-<id>/        a checkpoint being written (or left by a crash)

A checkpoint is written into a temporary folder; its manifest, with the SHA-256 of
every file, is written last, and then the folder is renamed to its final name (one
rename on a local filesystem). Readers consider only final names holding a manifest,
and verify every file's size and checksum before using one; a damaged checkpoint is
skipped with a warning naming the file and the previous one is used.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from psfleet.checkpoint.manifest import MANIFEST_NAME, CheckpointError, Manifest
from psfleet.checkpoint.storage import FileDigest, Storage, digests_of, sha256_of

__all__ = ["CheckpointStore", "PendingCheckpoint", "LoadedCheckpoint"]

logger = logging.getLogger(__name__)

_FINAL = re.compile(r"^ckpt-(\d{6,})-step(\d+)$")
_TMP = re.compile(r"^\.tmp-ckpt-(\d{6,})-")


@dataclass
class PendingCheckpoint:
    """A checkpoint being written: its temporary folder and the files written so far."""

    name: str
    final_name: str
    storage: Storage
    digests: list[FileDigest] = field(default_factory=list)

    def add(self, digests: Iterable[FileDigest]) -> None:
        """Record written files (paths relative to the checkpoint folder)."""
        self.digests.extend(digests)


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A verified checkpoint: its folder name, Storage and manifest."""

    name: str
    storage: Storage
    manifest: Manifest


class CheckpointStore:
    """The checkpoints of one job.

    Args:
        url: ``checkpoint_dir``: a local path or fsspec URL; created on first save.
        max_num_checkpoints: complete checkpoints kept after each publish (>= 1).
    """

    def __init__(self, url: str | Path, max_num_checkpoints: int = 3) -> None:
        self.storage = Storage(url)
        self.max_num_checkpoints = max(1, max_num_checkpoints)

    def names(self) -> list[str]:
        """Final-named checkpoint folders, newest first (complete or not, not verified)."""
        return [name for _, name in self._entries()]

    def _entries(self) -> list[tuple[int, str]]:
        """(sequence, name) of every final-named folder, newest first."""
        found = []
        for name in self.storage.listdir():
            match = _FINAL.match(name)
            if match:
                found.append((int(match.group(1)), name))
        return sorted(found, reverse=True)

    def _next_sequence(self) -> int:
        seqs = [seq for seq, _ in self._entries()]
        seqs += [int(m.group(1)) for n in self.storage.listdir() if (m := _TMP.match(n))]
        return max(seqs, default=0) + 1

    def begin(self, step: int) -> PendingCheckpoint:
        """Create the temporary folder of a new checkpoint taken at ``step``.

        Raises:
            OSError: the folder cannot be created (e.g. read-only or full storage).
        """
        seq = self._next_sequence()
        name = f".tmp-ckpt-{seq:06d}-{uuid.uuid4().hex[:8]}"
        storage = self.storage.child(name)
        storage.makedirs()
        return PendingCheckpoint(name, f"ckpt-{seq:06d}-step{step}", storage)

    def commit(self, pending: PendingCheckpoint, manifest: Manifest) -> str:
        """Write the manifest (last), publish the folder under its final name and remove
        checkpoints beyond ``max_num_checkpoints``. Returns the final folder's URL.

        Raises:
            OSError: a write or the rename failed; earlier checkpoints are untouched.
        """
        manifest = manifest.model_copy(update={"files": digests_of(pending.digests)})
        pending.storage.write_bytes(MANIFEST_NAME,
                                    (manifest.model_dump_json(indent=1) + "\n").encode())
        self.storage.rename(pending.name, pending.final_name)
        try:
            self.prune()
        except OSError as exc:  # published; old ones stay until the next prune
            logger.warning("checkpoint %s published, but removing older checkpoints "
                           "failed: %s", pending.final_name, exc)
        return self.storage.child(pending.final_name).url

    def abort(self, pending: PendingCheckpoint) -> None:
        """Remove a checkpoint's temporary folder (best effort; never raises)."""
        try:
            self.storage.remove(pending.name)
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the first error
            logger.warning("could not remove the unfinished checkpoint %s: %s",
                           pending.storage.url, exc)

    def prune(self) -> None:
        """Keep the newest ``max_num_checkpoints`` complete checkpoints; remove older
        ones and every older unfinished folder."""
        complete = [(seq, name) for seq, name in self._entries()
                    if self.storage.exists(name, MANIFEST_NAME)]
        if len(complete) < self.max_num_checkpoints:
            return
        oldest_kept = complete[self.max_num_checkpoints - 1][0]
        for name in self.storage.listdir():
            match = _FINAL.match(name) or _TMP.match(name)
            if match and int(match.group(1)) < oldest_kept:
                logger.info("removing old checkpoint %s", name)
                self.storage.remove(name)

    def verify(self, name: str) -> Manifest:
        """Read a checkpoint's manifest and check every file's size and SHA-256.

        Raises:
            CheckpointError: no manifest, an unreadable one, or a missing, truncated or
                corrupted file (the message names it).
        """
        storage = self.storage.child(name)
        try:
            manifest = Manifest.model_validate_json(storage.read_bytes(MANIFEST_NAME))
        except FileNotFoundError:
            raise CheckpointError(f"{storage.url}: no {MANIFEST_NAME}; the checkpoint is "
                                  "incomplete") from None
        except ValidationError as exc:
            raise CheckpointError(f"{storage.url}/{MANIFEST_NAME}: not a psfleet manifest "
                                  f"({exc.error_count()} errors)") from None
        for rel, expected in sorted(manifest.files.items()):
            where = f"{storage.url}/{rel}"
            try:
                size, digest = sha256_of(storage, rel)
            except FileNotFoundError:
                raise CheckpointError(f"{where}: missing from the checkpoint") from None
            if size != expected.get("size"):
                raise CheckpointError(f"{where}: {size} bytes, the manifest says "
                                      f"{expected.get('size')}: the file is truncated or "
                                      "damaged")
            if digest != expected.get("sha256"):
                raise CheckpointError(f"{where}: checksum mismatch (sha256 {digest}, the "
                                      f"manifest says {expected.get('sha256')}): the file "
                                      "is corrupted")
        return manifest

    def latest(self) -> LoadedCheckpoint | None:
        """The newest complete checkpoint whose files all verify, or None.

        Incomplete folders are skipped; a damaged one is skipped with a warning naming
        the file, and the previous one is tried.
        """
        for _, name in self._entries():
            try:
                manifest = self.verify(name)
            except CheckpointError as exc:
                logger.warning("skipping checkpoint %s: %s; trying the previous one", name, exc)
                continue
            return LoadedCheckpoint(name, self.storage.child(name), manifest)
        return None
