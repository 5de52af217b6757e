"""Checkpoint storage through fsspec: local paths, ``file://``, ``memory://``, ``s3://`` ...

A :class:`Storage` is a root folder on one fsspec filesystem. Files are written under
a temporary name and moved to their final name once complete (:meth:`Storage.write`),
and every write returns the file's SHA-256 so a manifest can list the checksum of each
file without reading it back. On a local filesystem the final move is a rename, so a
reader never sees a half-written file under its final name.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import fsspec

__all__ = ["Storage", "FileDigest", "sha256_of", "digests_of"]

_CHUNK = 1 << 22


@dataclass(frozen=True)
class FileDigest:
    """A written file: its path relative to the storage root, bytes and SHA-256 (hex)."""

    path: str
    size: int
    sha256: str


class _HashingWriter:
    """A binary file wrapper that hashes and counts what is written."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.nbytes == 0:
            return 0
        view = view.cast("B")
        self.hash.update(view)
        self.size += view.nbytes
        self._handle.write(view)
        return view.nbytes

    # numpy.save / np.savez probe for these
    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._handle.flush()


class Storage:
    """A folder on an fsspec filesystem.

    Args:
        url: a local path, or ``protocol://path`` of any installed fsspec filesystem
            (``file://``, ``memory://``, ``s3://`` with s3fs installed, ...).
        storage_options: passed to the filesystem.

    Raises:
        ValueError: the protocol is unknown (fsspec names it and the package to install).
    """

    def __init__(self, url: str | os.PathLike[str], **storage_options: Any) -> None:
        self.url = str(url)
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options)
        self.root = self.root.rstrip("/") or "/"

    def path(self, *parts: str) -> str:
        """The filesystem path of ``parts`` joined under the root."""
        return "/".join([self.root, *[p.strip("/") for p in parts if p]])

    def child(self, *parts: str) -> Storage:
        """A Storage rooted at a sub-folder (same filesystem)."""
        sub = Storage.__new__(Storage)
        sub.fs, sub.root = self.fs, self.path(*parts)
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        sub.url = sub.root if protocol in ("file", "local") else f"{protocol}://{sub.root}"
        return sub

    def exists(self, *parts: str) -> bool:
        return bool(self.fs.exists(self.path(*parts)))

    def makedirs(self, *parts: str) -> None:
        self.fs.makedirs(self.path(*parts), exist_ok=True)

    def listdir(self, *parts: str) -> list[str]:
        """Names (not paths) of the entries of a folder; empty when it does not exist."""
        where = self.path(*parts)
        if not self.fs.exists(where):
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(where, detail=False))

    @contextmanager
    def write(self, *parts: str) -> Iterator[_HashingWriter]:
        """Write a file atomically: yields a writer; on success the file is moved to its
        final name and the writer's ``digest`` set. On error the temporary file is
        removed and nothing appears under the final name.

        Raises:
            OSError: the filesystem failed (the message names the file).
        """
        final = self.path(*parts)
        parent = final.rsplit("/", 1)[0]
        tmp = f"{parent}/.{final.rsplit('/', 1)[-1]}.tmp-{uuid.uuid4().hex[:12]}"
        try:
            self.fs.makedirs(parent, exist_ok=True)
            with self.fs.open(tmp, "wb") as handle:
                writer = _HashingWriter(handle)
                yield writer
            self.fs.mv(tmp, final)
        except BaseException:
            try:
                if self.fs.exists(tmp):
                    self.fs.rm(tmp)
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise

    def write_bytes(self, rel: str, data: bytes) -> FileDigest:
        """Write ``data`` to ``rel`` (atomically, see :meth:`write`); return its digest."""
        with self.write(rel) as writer:
            writer.write(data)
        return FileDigest(rel, writer.size, writer.hash.hexdigest())

    def read_bytes(self, *parts: str) -> bytes:
        return bytes(self.fs.cat_file(self.path(*parts)))

    def open(self, *parts: str, mode: str = "rb") -> IO[bytes]:
        return self.fs.open(self.path(*parts), mode)  # type: ignore[no-any-return]

    def size(self, *parts: str) -> int:
        return int(self.fs.size(self.path(*parts)))

    def rename(self, src: str, dst: str) -> None:
        """Move folder or file ``src`` to ``dst`` (relative to the root)."""
        self.fs.mv(self.path(src), self.path(dst), recursive=True)

    def remove(self, *parts: str) -> None:
        """Remove a file or folder tree; no error when it is gone already."""
        where = self.path(*parts)
        if self.fs.exists(where):
            self.fs.rm(where, recursive=True)


def sha256_of(storage: Storage, rel: str) -> tuple[int, str]:
    """(bytes, SHA-256 hex) of a stored file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    with storage.open(rel) as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def digests_of(items: Iterable[FileDigest]) -> dict[str, dict[str, Any]]:
    """Manifest form of digests: ``{path: {"size": n, "sha256": hex}}``."""
    return {d.path: {"size": d.size, "sha256": d.sha256} for d in items}
