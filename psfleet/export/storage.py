"""Reading and writing the files of an inference model through fsspec.

Local paths and any fsspec URL (``file://``, ``memory://``, ``s3://`` where its package
is installed) work; paths inside the model directory use ``/``.
"""

from __future__ import annotations

import io
import json
import posixpath
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

__all__ = ["ModelDir"]


class ModelDir:
    """One model directory on some filesystem.

    Args:
        dirname: a local path or an fsspec URL.
    """

    def __init__(self, dirname: str | Path) -> None:
        self.dirname = str(dirname)
        self.fs, self.root = fsspec.core.url_to_fs(self.dirname)

    def local_path(self) -> Path | None:
        """The directory as a local path, or None on another filesystem."""
        return Path(self.root) if isinstance(self.fs, LocalFileSystem) else None

    def path(self, relative: str) -> str:
        """``relative`` inside the directory, as the filesystem names it."""
        return posixpath.join(self.root, relative)

    def describe(self, relative: str) -> str:
        """``relative`` inside the directory, for messages."""
        return posixpath.join(self.dirname, relative)

    def is_dir(self) -> bool:
        return bool(self.fs.isdir(self.root))

    def exists(self, relative: str) -> bool:
        return bool(self.fs.exists(self.path(relative)))

    def makedirs(self, relative: str = "") -> None:
        self.fs.makedirs(self.path(relative) if relative else self.root, exist_ok=True)

    def remove(self, relative: str) -> None:
        """Delete a file or a folder (recursively) if it exists."""
        if self.exists(relative):
            self.fs.rm(self.path(relative), recursive=True)

    def write_bytes(self, relative: str, data: bytes) -> None:
        with self.fs.open(self.path(relative), "wb") as f:
            f.write(data)

    def read_bytes(self, relative: str) -> bytes:
        with self.fs.open(self.path(relative), "rb") as f:
            data: bytes = f.read()
        return data

    def write_npy(self, relative: str, array: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        self.write_bytes(relative, buf.getvalue())

    def read_npy(self, relative: str) -> np.ndarray:
        local = self.local_path()
        if local is not None:  # no copy through memory
            return np.load(local / relative, allow_pickle=False)
        return np.load(io.BytesIO(self.read_bytes(relative)), allow_pickle=False)

    def write_json(self, relative: str, value: Any) -> None:
        self.write_bytes(relative, (json.dumps(value, indent=2) + "\n").encode())
