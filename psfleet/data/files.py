"""Which files of a data folder are data: :func:`list_data_files`.

A folder given as ``train_data_dir``, ``test_data_dir``, ``valid_data_dir`` or
``psfleet predict --data`` often holds more than data: a README, ``psfleet datagen``'s
``*.json`` summary, a config, Hadoop/Spark markers. The rule, declared here once:

- names starting with ``.`` or ``_`` are never data (hidden files; ``_SUCCESS``,
  ``_metadata`` and ``_committed_*`` markers — pyarrow's datasets skip the same
  prefixes, ``pyarrow.dataset`` ``ignore_prefixes``);
- a **text** parser (``criteo``, ``slot``, ``csv``, ``libsvm``) reads every other file
  except those whose suffix, after a compression suffix (``.gz``, ``.zst``, ...), names a
  known non-text or non-data format: :data:`NOT_TEXT_DATA` (``.json``, ``.md``,
  ``.yaml``, ``.png``, ``.parquet``, ...). Unsuffixed names (``part-00000``) and any
  other suffix (``.txt``, ``.csv``, ``.tsv``, ``.data``) are read;
- the **parquet** parser reads the files whose suffix is one of :data:`PARQUET_SUFFIXES`.

A file named directly is always read: the rule only filters folders. What a folder's
filter skipped is logged (INFO) with the names.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from psfleet.data.compression import CODEC_SUFFIXES
from psfleet.errors import DataError

__all__ = ["NOT_TEXT_DATA", "PARQUET_SUFFIXES", "is_data_file", "list_data_files"]

logger = logging.getLogger(__name__)

DataKind = Literal["text", "parquet"]

PARQUET_SUFFIXES = frozenset({".parquet", ".parq", ".pq"})

NOT_TEXT_DATA = frozenset({
    # documents and configs
    ".md", ".rst", ".html", ".htm", ".pdf", ".json", ".yaml", ".yml", ".toml", ".ini",
    ".cfg", ".xml",
    # code and notebooks
    ".py", ".ipynb", ".sh",
    # images
    ".png", ".jpg", ".jpeg", ".gif", ".svg",
    # binary arrays, models and columnar files
    ".npy", ".npz", ".pt", ".pth", ".pkl", ".pickle", ".onnx", *PARQUET_SUFFIXES,
    # logs, checksums and partial downloads
    ".log", ".crc", ".md5", ".sha256", ".lock", ".tmp", ".part",
})

_SKIPPED_PREFIXES = (".", "_")


def _format_suffix(name: str) -> str:
    """The suffix that names a file's format: ``a.csv.gz`` -> ``.csv``, ``a.txt`` ->
    ``.txt``, ``part-0`` -> ``''`` (lower case)."""
    suffixes = [s.lower() for s in Path(name).suffixes]
    if suffixes and suffixes[-1] in CODEC_SUFFIXES:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def is_data_file(name: str, kind: DataKind = "text") -> bool:
    """Whether a folder's file ``name`` is data for a parser of ``kind`` (module
    docstring has the rule)."""
    if name.startswith(_SKIPPED_PREFIXES):
        return False
    suffix = _format_suffix(name)
    if kind == "parquet":
        return suffix in PARQUET_SUFFIXES
    return suffix not in NOT_TEXT_DATA


def list_data_files(path: str | Path, kind: DataKind = "text") -> list[Path]:
    """List the data files at ``path``.

    Args:
        path: a file, or a directory whose data files (by :func:`is_data_file`) are read.
        kind: the parser's kind (``Parser.kind``): ``text`` or ``parquet``.

    Returns:
        ``[path]`` for a file (always, whatever its name); the directory's regular data
        files, sorted by name, for a directory (subdirectories are not searched).
        Compressed files are listed like the others: the readers decompress ``.gz``,
        ``.bz2``, ``.xz``, ``.lzma`` and ``.zst`` files and reject ``.zip`` when they
        open them (:mod:`psfleet.data.compression`).

    Raises:
        DataError: if ``path`` does not exist, or the directory holds no data file (the
            message names the files skipped and why).
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        hint = "" if path.is_absolute() else f" (resolved from {str(Path.cwd())!r})"
        raise DataError(f"data path {str(path)!r} does not exist{hint}; check the path")
    if not path.is_dir():
        raise DataError(f"data path {str(path)!r} is neither a regular file nor a directory")
    entries = sorted(p for p in path.iterdir() if p.is_file())
    files = [p for p in entries if is_data_file(p.name, kind)]
    skipped = [p.name for p in entries
               if not p.name.startswith(".") and not is_data_file(p.name, kind)]
    what = ("Parquet files (" + ", ".join(sorted(PARQUET_SUFFIXES)) + ")" if kind == "parquet"
            else "data files")
    if not files:
        seen = f"; it holds only {_names(skipped)}, which are not read" if skipped else ""
        raise DataError(
            f"data directory {str(path)!r} holds no {what}{seen} (hidden files, names "
            "starting with '_' and subdirectories are ignored too); put the data files "
            "directly in it, or name a file itself to read it whatever its name")
    if skipped:
        logger.info("data directory %s: read %d file(s); skipped %s (not %s; name a file "
                    "itself to read it)", path, len(files), _names(skipped), what)
    return files


def _names(names: list[str], limit: int = 8) -> str:
    """``a, b, c`` or the first ``limit`` names and how many more."""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
