"""Variable-length (multi-valued) sparse features: stored per example, batched per key.

Two layouts of the same data, for two jobs:

- :class:`~psfleet.data.jagged_rows.JaggedRows` (numpy, **example-major**, its own
  module, which needs no torch): how parsers and in-memory datasets
  hold the multi-valued features of N examples. Example ``i``'s ids are one contiguous
  run, ``values[offsets[i]:offsets[i + 1]]``, its features in declaration order, so
  slicing, shuffling (``take``) and concatenating examples are cheap vectorised
  gathers.
- :class:`KeyedJagged` (torch, **key-major**): what a :class:`~psfleet.data.batch.Batch`
  carries and an embedding pools. It is TorchRec's ``KeyedJaggedTensor`` layout, field
  for field (see below), so a TorchRec user's batch maps onto it without copying.

Mapping to TorchRec's ``KeyedJaggedTensor`` (``torchrec.sparse.jagged_tensor``)::

    KeyedJagged.keys     == kjt.keys()       feature names, F
    KeyedJagged.values   == kjt.values()     int64 [N]: key 0's ids of examples 0..B-1,
                                             then key 1's, ...
    KeyedJagged.lengths  == kjt.lengths()    int32 [F * B]: lengths[f * B + b] ids of
                                             feature f in example b (0: empty)
    KeyedJagged.weights  == kjt.weights_or_none()  float32 [N] or None
    KeyedJagged.offsets() == kjt.offsets()   int64 [F * B + 1], the cumulative lengths
    KeyedJagged.stride   == kjt.stride()     B

So ``KeyedJagged(keys=tuple(kjt.keys()), values=kjt.values(), lengths=kjt.lengths(),
weights=kjt.weights_or_none(), stride=kjt.stride())`` converts one (ids are uint64
bits in int64, as everywhere in psfleet). TorchRec itself is not a dependency.

A fixed-width slot is the case where every length is 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from psfleet.data.jagged_rows import JaggedRows, repeat_ranges
from psfleet.errors import ConfigError

__all__ = ["KeyedJagged"]


@dataclass(frozen=True)
class KeyedJagged:
    """A batch of multi-valued features, key-major: TorchRec's KeyedJaggedTensor
    layout (module docstring gives the field-by-field mapping).

    Attributes:
        keys: feature names, F.
        values (Tensor[N], int64): feature keys (uint64 bits), key-major.
        lengths (Tensor[F * B], int32): ``lengths[f * B + b]``.
        weights (Tensor[N], float32) or None: a weight per id.
        stride: B, the examples of the batch.

    Raises:
        ConfigError: on construction, if shapes, dtypes or sizes disagree.
    """

    keys: tuple[str, ...]
    values: Tensor
    lengths: Tensor
    weights: Tensor | None
    stride: int

    def __post_init__(self) -> None:
        if self.values.dtype != torch.int64 or self.values.dim() != 1:
            raise ConfigError(f"KeyedJagged.values: expected 1-D int64, got "
                              f"{tuple(self.values.shape)} {self.values.dtype}")
        if self.lengths.dtype != torch.int32 or self.lengths.shape != (
                len(self.keys) * self.stride,):
            raise ConfigError(f"KeyedJagged.lengths: expected int32 [{len(self.keys)} keys x "
                              f"{self.stride} examples], got {tuple(self.lengths.shape)} "
                              f"{self.lengths.dtype}")
        if self.weights is not None and (self.weights.dtype != torch.float32
                                         or self.weights.shape != self.values.shape):
            raise ConfigError(f"KeyedJagged.weights: expected float32 {tuple(self.values.shape)}"
                              f", got {tuple(self.weights.shape)} {self.weights.dtype}")

    @classmethod
    def from_rows(cls, keys: Sequence[str], rows: JaggedRows) -> KeyedJagged:
        """The key-major batch of example-major ``rows`` (one stable radix sort by key).

        Raises:
            ConfigError: ``keys`` does not name each of the rows' features once.
        """
        batch, features = rows.lengths.shape
        if len(keys) != features:
            raise ConfigError(f"KeyedJagged: {len(keys)} keys for {features} features")
        key_of_value = np.repeat(np.tile(np.arange(features, dtype=np.int16), batch),
                                 rows.lengths.reshape(-1))
        order = np.argsort(key_of_value, kind="stable")
        values = rows.values[order].view(np.int64)
        weights = None if rows.weights is None else torch.from_numpy(rows.weights[order])
        lengths = np.ascontiguousarray(rows.lengths.T).reshape(-1)
        return cls(tuple(keys), torch.from_numpy(values), torch.from_numpy(lengths), weights,
                   int(batch))

    def offsets(self) -> Tensor:
        """Tensor[F * B + 1], int64: where each (feature, example) run starts."""
        out = torch.zeros(self.lengths.numel() + 1, dtype=torch.int64)
        torch.cumsum(self.lengths, 0, out=out[1:])
        return out

    def length_per_key(self) -> list[int]:
        """Ids of each feature over the batch, F ints."""
        return self.lengths.view(len(self.keys), self.stride).sum(1).tolist()

    def select(self, keys: Sequence[str]) -> KeyedJagged:
        """The features ``keys`` (in that order) as a KeyedJagged of their own.

        Raises:
            ConfigError: a key is not one of :attr:`keys`.
        """
        unknown = [k for k in keys if k not in self.keys]
        if unknown:
            raise ConfigError(f"KeyedJagged: {unknown} are not among the keys {list(self.keys)}")
        if tuple(keys) == self.keys:
            return self
        per_key = self.length_per_key()
        starts = np.concatenate([[0], np.cumsum(per_key)]).astype(np.int64)
        picks = [self.keys.index(k) for k in keys]
        positions = torch.from_numpy(repeat_ranges(
            starts[picks], np.asarray([per_key[i] for i in picks], dtype=np.int64)))
        lengths = self.lengths.view(len(self.keys), self.stride)[picks].reshape(-1)
        return KeyedJagged(tuple(keys), self.values[positions], lengths,
                           None if self.weights is None else self.weights[positions],
                           self.stride)
