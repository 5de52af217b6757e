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

import numpy as np
from fsspec.implementations.local import LocalFileSystem

from psfleet.checkpoint.storage import Storage

__all__ = ["ModelDir"]


class ModelDir(Storage):
    """One model directory on some filesystem: the checkpoint layer's fsspec
    :class:`~psfleet.checkpoint.storage.Storage` (atomic writes) plus the array and
    JSON files of an inference model.

    Args:
        dirname: a local path or an fsspec URL.
    """

    def __init__(self, dirname: str | Path) -> None:
        super().__init__(dirname)
        self.dirname = str(dirname)

    def local_path(self) -> Path | None:
        """The directory as a local path, or None on another filesystem."""
        return Path(self.root) if isinstance(self.fs, LocalFileSystem) else None

    def describe(self, relative: str) -> str:
        """``relative`` inside the directory, for messages."""
        return posixpath.join(self.dirname, relative)

    def is_dir(self) -> bool:
        return bool(self.fs.isdir(self.root))

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
