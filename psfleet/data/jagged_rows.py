"""Variable-length (multi-valued) sparse features of N examples, example-major
(numpy): how parsers and in-memory datasets hold them.

Example ``i``'s ids are one contiguous run, ``values[offsets[i]:offsets[i + 1]]``, its
features in declaration order, so slicing, shuffling (``take``) and concatenating
examples are cheap vectorised gathers. A batch carries them key-major instead
(:class:`psfleet.data.jagged.KeyedJagged`, TorchRec's layout). This module needs no
torch, so reading a config or parsing data does not import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from psfleet.errors import ConfigError

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["JaggedRows", "repeat_ranges"]


def repeat_ranges(starts: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
                  ) -> npt.NDArray[np.int64]:
    """The positions ``starts[0] .. starts[0] + counts[0] - 1, starts[1] ..`` as one
    int64 array (vectorised; no Python loop per range)."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    shift = np.repeat(starts - (ends - counts), counts)
    return np.arange(total, dtype=np.int64) + shift


@dataclass(frozen=True)
class JaggedRows:
    """Multi-valued features of N examples, example-major (module docstring).

    Attributes:
        values (ndarray[nnz], uint64): feature keys; example i's run is
            ``values[offsets[i]:offsets[i + 1]]``, feature 0's ids first.
        lengths (ndarray[N, M], int32): ids of feature m in example i.
        weights (ndarray[nnz], float32) or None: a weight per id (libSVM values).
        offsets (ndarray[N + 1], int64): where each example's run starts (derived).

    Raises:
        ConfigError: on construction, if the sizes do not agree.
    """

    values: npt.NDArray[np.uint64]
    lengths: npt.NDArray[np.int32]
    weights: npt.NDArray[np.float32] | None = None
    offsets: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.lengths.ndim != 2:
            raise ConfigError(f"JaggedRows.lengths: expected [N, M], got {self.lengths.shape}")
        per_row = self.lengths.sum(axis=1, dtype=np.int64)
        offsets = np.zeros(len(per_row) + 1, dtype=np.int64)
        np.cumsum(per_row, out=offsets[1:])
        if int(offsets[-1]) != len(self.values):
            raise ConfigError(f"JaggedRows: lengths sum to {int(offsets[-1])}, but there are "
                              f"{len(self.values)} values")
        if self.weights is not None and len(self.weights) != len(self.values):
            raise ConfigError(f"JaggedRows: {len(self.weights)} weights for "
                              f"{len(self.values)} values")
        object.__setattr__(self, "offsets", offsets)

    @classmethod
    def empty(cls, num_features: int, weighted: bool = False) -> JaggedRows:
        """No examples, ``num_features`` features."""
        return cls(np.zeros(0, np.uint64), np.zeros((0, num_features), np.int32),
                   np.zeros(0, np.float32) if weighted else None)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_features(self) -> int:
        """M, the multi-valued features per example."""
        return int(self.lengths.shape[1])

    def slice(self, start: int, stop: int) -> JaggedRows:
        """Examples ``start .. stop - 1`` (views of values and weights)."""
        begin, end = int(self.offsets[start]), int(self.offsets[stop])
        return JaggedRows(self.values[begin:end], self.lengths[start:stop],
                          None if self.weights is None else self.weights[begin:end])

    def take(self, index: npt.NDArray[np.int64] | Tensor) -> JaggedRows:
        """Examples ``index[0], index[1], ...`` (int64 [K], any order, repeats allowed)."""
        index = np.asarray(index, dtype=np.int64)
        starts = self.offsets[index]
        positions = repeat_ranges(starts, self.offsets[index + 1] - starts)
        return JaggedRows(self.values[positions], self.lengths[index],
                          None if self.weights is None else self.weights[positions])

    @staticmethod
    def concat(parts: Sequence[JaggedRows]) -> JaggedRows:
        """The examples of ``parts`` one after the other (at least one part, all with
        the same features; weights kept only when every part has them)."""
        if len(parts) == 1:
            return parts[0]
        weighted = all(p.weights is not None for p in parts)
        return JaggedRows(
            np.concatenate([p.values for p in parts]),
            np.concatenate([p.lengths for p in parts]),
            np.concatenate([p.weights for p in parts if p.weights is not None])
            if weighted else None)
