"""Worker cursors on their way into a checkpoint, and the name of the checkpoint resumed.

Before a checkpoint every worker writes its cursor to
``checkpoint_dir/.cursors/worker-<k>.json``; worker 0 collects them into the manifest.
At resume worker 0 writes the chosen checkpoint's folder name to
``checkpoint_dir/.cursors/resume.json`` before the workers meet, so every worker reads
its cursor from the same checkpoint without verifying it again.

Both records are removed before they are written again (cursors after each
checkpoint, the resume name before each resume), so a write that fails (full or
read-only storage) leaves no stale record behind: a reader finds the record missing
and the checkpoint fails, or the resume falls back, instead of using old values.
"""

from __future__ import annotations

import contextlib
import json

from psfleet.checkpoint.manifest import CheckpointError, Cursor
from psfleet.checkpoint.storage import Storage

__all__ = ["write_cursor", "read_cursors", "clear_cursors", "write_resume_name",
           "read_resume_name", "clear_resume_name"]

_FOLDER = ".cursors"


def write_cursor(storage: Storage, worker_index: int, cursor: Cursor) -> None:
    """Publish this worker's cursor (atomic write).

    Raises:
        OSError: the storage refused the write (e.g. full); nothing was published.
    """
    storage.write_bytes(f"{_FOLDER}/worker-{worker_index}.json",
                        cursor.model_dump_json().encode())


def read_cursors(storage: Storage, worker_num: int) -> list[Cursor]:
    """Every worker's published cursor, by worker index.

    Raises:
        CheckpointError: a worker's cursor is missing or unreadable (names the file).
    """
    cursors = []
    for k in range(worker_num):
        rel = f"{_FOLDER}/worker-{k}.json"
        try:
            cursors.append(Cursor.model_validate_json(storage.read_bytes(rel)))
        except (FileNotFoundError, ValueError) as exc:
            raise CheckpointError(f"{storage.url}/{rel}: worker {k}'s cursor is missing or "
                                  f"unreadable ({exc})") from None
    return cursors


def clear_cursors(storage: Storage, worker_num: int) -> None:
    """Remove every worker's published cursor (best effort; errors are ignored)."""
    for k in range(worker_num):
        with contextlib.suppress(OSError):
            storage.remove(f"{_FOLDER}/worker-{k}.json")


def clear_resume_name(storage: Storage) -> None:
    """Remove the resume record (best effort; errors are ignored)."""
    with contextlib.suppress(OSError):
        storage.remove(f"{_FOLDER}/resume.json")


def write_resume_name(storage: Storage, name: str | None) -> None:
    """Record which checkpoint folder the job resumes from (None: none).

    Raises:
        OSError: the storage refused the write (e.g. full).
    """
    storage.write_bytes(f"{_FOLDER}/resume.json", json.dumps({"name": name}).encode())


def read_resume_name(storage: Storage) -> str | None:
    """The folder name :func:`write_resume_name` recorded.

    Raises:
        CheckpointError: the record is missing (worker 0 did not write it).
    """
    try:
        return json.loads(storage.read_bytes(f"{_FOLDER}/resume.json"))["name"]  # type: ignore[no-any-return]
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{storage.url}/{_FOLDER}/resume.json: unreadable ({exc})"
                              ) from None
