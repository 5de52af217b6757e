"""Damaged saves for the server fuzz test's Load requests (``tests/_fuzz_requests.py``).

Each must be refused by Load without changing a table; the layout is psfleet/ps/persist.py's.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

__all__ = ["write_damaged_saves"]


def write_damaged_saves(loads: Path) -> None:
    """Saves a Load must refuse without changing a table: an empty folder, and folders
    ``damaged-*`` whose table files are garbage, truncated, of another dim, bucket count
    or row width, or valid with no rows (table 0) beside a garbage dense file."""
    (loads / "empty").mkdir(parents=True)
    header = struct.Struct("<8sIIIIQ")

    def sparse(dim: int, width: int, buckets: int, n: int, cut: int = 0) -> bytes:
        offsets = np.zeros(buckets + 1, dtype="<i8")
        offsets[-1] = n
        body = header.pack(b"PSFLSPRS", 2, dim, width, buckets, n) + offsets.tobytes()
        body += np.zeros(n, "<u8").tobytes() + np.zeros(n * width, "<f4").tobytes()
        return body[:len(body) - cut]

    files = {
        "garbage": {"table-0.sparse": b"\x00garbage", "table-1.dense": b"PK\x03\x04junk",
                    "tables.json": b"{not json"},
        "truncated": {"table-0.sparse": sparse(4, 12, 4096, 10, cut=7)},
        "other-dim": {"table-0.sparse": sparse(5, 15, 4096, 0)},
        "other-buckets": {"table-0.sparse": sparse(4, 12, 7, 0)},
        "other-width": {"table-0.sparse": sparse(4, 5, 4096, 0)},
        "huge-header": {"table-0.sparse": header.pack(b"PSFLSPRS", 2, 4, 12, 2**32 - 1,
                                                      2**64 - 1)},
        "no-rows": {"table-0.sparse": sparse(4, 12, 4096, 0), "table-1.dense": b"garbage"},
    }
    for name, content in files.items():
        folder = loads / f"damaged-{name}" / "server-0"
        folder.mkdir(parents=True)
        for file, data in content.items():
            (folder / file).write_bytes(data)
