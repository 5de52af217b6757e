"""Where keys and dense blocks live: virtual buckets and the dense block layout.

Sparse keys go to bucket ``mix64(key) % num_buckets`` (fixed at table creation) and a
bucket map sends each bucket to a server (DESIGN.md "Routing"). Servers own whole
buckets, so moving buckets is how a cluster grows or shrinks and a checkpoint written
per bucket loads into any server count.

Dense parameters are flattened into one vector, cut into blocks (one per parameter
tensor) and the blocks are dealt to servers round-robin, as Paddle's RoundRobin
split method does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from psfleet.ps.hashing import mix64

__all__ = ["bucket_of", "BucketRouter", "DenseBlock", "DenseLayout"]


def bucket_of(keys: np.ndarray, num_buckets: int) -> np.ndarray:
    """Virtual bucket of each key: int64[N] in [0, num_buckets)."""
    return (mix64(keys) % np.uint64(num_buckets)).astype(np.int64)


class BucketRouter:
    """Sends keys to servers through a bucket map.

    Args:
        num_buckets: virtual buckets of the table.
        num_servers: servers sharing them; bucket b goes to server ``b % num_servers``.
    """

    def __init__(self, num_buckets: int, num_servers: int) -> None:
        self.num_buckets = num_buckets
        self.num_servers = num_servers
        self.bucket_map = np.arange(num_buckets, dtype=np.int64) % num_servers

    def split(self, keys: np.ndarray) -> list[np.ndarray]:
        """Positions in ``keys`` (uint64[N]) owned by each server: one int64 array each."""
        if self.num_servers == 1:
            return [np.arange(keys.size)]
        servers = self.bucket_map[bucket_of(keys, self.num_buckets)]
        order = np.argsort(servers, kind="stable")
        bounds = np.searchsorted(servers[order], np.arange(self.num_servers + 1))
        return [order[bounds[s]:bounds[s + 1]] for s in range(self.num_servers)]


@dataclass(frozen=True)
class DenseBlock:
    """A contiguous piece ``[offset, offset + size)`` of the flat dense vector."""

    offset: int
    size: int
    server: int


class DenseLayout:
    """Places the blocks of a flat dense vector on servers.

    Args:
        sizes: number of elements of each dense parameter, in model order.
        num_servers: servers to deal the blocks to (round-robin).
    """

    def __init__(self, sizes: Sequence[int], num_servers: int) -> None:
        self.num_servers = num_servers
        self.total = int(sum(sizes))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.blocks = [DenseBlock(int(offsets[i]), int(size), i % num_servers)
                       for i, size in enumerate(sizes)]
        # For each server, the flat indices of its blocks in block order.
        self._index = [
            np.concatenate([np.arange(b.offset, b.offset + b.size) for b in self.blocks
                            if b.server == s] or [np.zeros(0, dtype=np.int64)]).astype(np.int64)
            for s in range(num_servers)
        ]

    def server_size(self, server: int) -> int:
        """Elements held by ``server``."""
        return int(self._index[server].size)

    def scatter(self, flat: np.ndarray) -> list[np.ndarray]:
        """Split a flat float32[total] vector into each server's part."""
        return [flat[idx] for idx in self._index]

    def gather(self, parts: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Assemble each server's part back into a flat float32[total] vector."""
        flat = np.empty(self.total, dtype=np.float32) if out is None else out
        for idx, part in zip(self._index, parts, strict=True):
            flat[idx] = part
        return flat
