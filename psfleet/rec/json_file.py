"""JSON files written atomically, with NaN and infinities as null (``metrics.json``,
``parity.json``)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["finite", "write_json_atomic"]


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None, recursively (strict
    JSON has no NaN: a train AUC of one class is undefined, not a number)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _temporary(path: Path) -> Path:
    """A hidden name beside ``path``, distinct per process (for write-then-rename)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_json_atomic(path: Path, value: Any) -> Path:
    """Write ``value`` as indented JSON to ``path`` atomically: to a temporary name in
    the same folder, flushed to disk, then renamed over ``path`` (``os.replace``). A
    reader sees the old file or the new one, never a partial one. Creates the folder.

    Raises:
        OSError: the folder cannot be created or written (the temporary file is
            removed; an existing ``path`` is untouched).
        TypeError: ``value`` holds something JSON cannot encode.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(finite(value), indent=2) + "\n"
    tmp = _temporary(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
