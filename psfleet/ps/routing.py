"""Where keys and dense blocks live: virtual buckets and the dense block layout.

Sparse keys go to bucket ``mix64(key) % num_buckets`` (fixed at table creation) and a
bucket map sends each bucket to a server (DESIGN.md "Routing"). Servers own whole
buckets, so moving buckets is how a cluster grows or shrinks and a checkpoint written
per bucket loads into any server count.

Dense parameters are flattened into one vector and cut into blocks (``SlicingConfig``:
one per parameter, or sliced as Paddle's ``slice_var_up``), placed on servers
round-robin or by name hash, as Paddle's RoundRobin / HashName split methods.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from psfleet.ps.hashing import mix64
from psfleet.ps.types import SlicingConfig

__all__ = ["bucket_of", "keys_of", "BucketRouter", "RoutedKeys", "DenseBlock", "DenseLayout"]


def bucket_of(keys: np.ndarray, num_buckets: int) -> np.ndarray:
    """Virtual bucket of each key: int64[N] in [0, num_buckets)."""
    return (mix64(keys) % np.uint64(num_buckets)).astype(np.int64)


@dataclass(frozen=True)
class RoutedKeys:
    """Keys with the server each one goes to, computed once (``BucketRouter.route``).

    A step pulls and then pushes the same keys; routing them once and passing this
    object to both saves hashing every key twice.

    Attributes:
        keys (uint64[N]): the keys.
        positions: per server, the int64 positions in ``keys`` it owns.
        router: the router that computed ``positions`` (a table's; another table's
            router must route again).
    """

    keys: np.ndarray
    positions: list[np.ndarray]
    router: BucketRouter


def keys_of(keys: np.ndarray | RoutedKeys) -> np.ndarray:
    """The uint64[N] keys of plain or routed keys."""
    return keys.keys if isinstance(keys, RoutedKeys) else keys


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

    def route(self, keys: np.ndarray) -> RoutedKeys:
        """``keys`` (uint64[N]) with the positions each server owns (see :meth:`split`)."""
        return RoutedKeys(keys, self.split(keys), self)

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

    name: str
    offset: int
    size: int
    server: int


def _block_sizes(shape: tuple[int, ...], num_servers: int, min_block_size: int) -> list[int]:
    """Cut a parameter into blocks, as Paddle's ``slice_variable``.

    At most ``num_servers`` blocks, each of at least ``min_block_size`` elements
    (one block when the parameter is smaller), rounded up to whole rows of
    ``prod(shape[1:])`` elements; the last block takes the remainder.
    """
    numel = int(np.prod(shape)) if shape else 1
    count = max(1, min(num_servers, numel // min_block_size))
    block = -(-numel // count)  # ceil
    row = int(np.prod(shape[1:])) if len(shape) >= 2 else 1
    block += (row - block % row) % row
    sizes = [block] * (numel // block)
    if numel % block:
        sizes.append(numel % block)
    return sizes or [0]


class DenseLayout:
    """Places the blocks of a flat dense vector on servers.

    Args:
        shapes: each dense parameter's shape (or element count), in model order.
        num_servers: servers to place the blocks on.
        slicing: block cutting and placement (``SlicingConfig``).
        name: table name; block ``j`` of parameter ``i`` is named ``{name}.{i}.block{j}``
            (the key of HashName placement: crc32 of the name modulo server count).
    """

    def __init__(self, shapes: Sequence[tuple[int, ...] | int], num_servers: int,
                 slicing: SlicingConfig | None = None, name: str = "dense") -> None:
        slicing = slicing or SlicingConfig()
        self.num_servers = num_servers
        self.blocks: list[DenseBlock] = []
        offset = 0
        for i, raw_shape in enumerate(shapes):
            shape = (raw_shape,) if isinstance(raw_shape, int) else tuple(raw_shape)
            sizes = (_block_sizes(shape, num_servers, slicing.min_block_size)
                     if slicing.slice_var_up else [int(np.prod(shape)) if shape else 1])
            for j, size in enumerate(sizes):
                block_name = f"{name}.{i}.block{j}"
                server = (zlib.crc32(block_name.encode()) % num_servers
                          if slicing.split_method == "HashName"
                          else len(self.blocks) % num_servers)
                self.blocks.append(DenseBlock(block_name, offset, size, server))
                offset += size
        self.total = offset
        # For each server, the flat indices of its blocks in block order.
        self._index = [
            np.concatenate([np.arange(b.offset, b.offset + b.size) for b in self.blocks
                            if b.server == s] or [np.zeros(0, dtype=np.int64)]).astype(np.int64)
            for s in range(num_servers)
        ]
        # One server holding every element in order: scatter and gather are the vector.
        self._identity = num_servers == 1 and bool(
            np.array_equal(self._index[0], np.arange(self.total)))

    def server_index(self, server: int) -> np.ndarray:
        """Flat indices (int64[n]) of the elements ``server`` holds, in its order."""
        return self._index[server]

    def server_size(self, server: int) -> int:
        """Elements held by ``server``."""
        return int(self._index[server].size)

    def scatter(self, flat: np.ndarray) -> list[np.ndarray]:
        """Split a flat float32[total] vector into each server's part (the vector
        itself, not a copy, when one server holds it all in order)."""
        if self._identity:
            return [flat]
        return [flat[idx] for idx in self._index]

    def gather(self, parts: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Assemble each server's part back into a flat float32[total] vector."""
        if self._identity and out is None and parts[0].flags.writeable:
            return parts[0]
        flat = np.empty(self.total, dtype=np.float32) if out is None else out
        for idx, part in zip(self._index, parts, strict=True):
            flat[idx] = part
        return flat
