"""Vocabulary of the data layer: the :class:`Batch` every reader yields.

A batch holds one mini-batch of CTR examples as CPU tensors:

- ``labels``  (Tensor[B], float32): click labels, 0.0 or 1.0.
- ``dense``   (Tensor[B, num_dense], float32): transformed dense features.
- ``sparse``  (Tensor[B, num_slots], int64): feature keys, one per slot. Keys are
  uint64 values stored bit for bit in int64 (torch has no uint64 arithmetic);
  ``batch.sparse.numpy().view(np.uint64)`` gives the keys back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from psfleet.errors import ConfigError

__all__ = ["Batch"]


@dataclass(frozen=True)
class Batch:
    """One mini-batch of examples (immutable; the tensors are not copied).

    Attributes:
        labels (Tensor[B], float32): click labels, 0.0 or 1.0.
        dense (Tensor[B, num_dense], float32): dense features.
        sparse (Tensor[B, num_slots], int64): feature keys (uint64 bits in int64).

    Raises:
        ConfigError: on construction, if the shapes or dtypes do not match the above.
    """

    labels: Tensor
    dense: Tensor
    sparse: Tensor

    def __post_init__(self) -> None:
        checks = (
            ("labels", self.labels, 1, torch.float32),
            ("dense", self.dense, 2, torch.float32),
            ("sparse", self.sparse, 2, torch.int64),
        )
        for name, tensor, ndim, dtype in checks:
            if tensor.dim() != ndim or tensor.dtype != dtype:
                raise ConfigError(
                    f"Batch.{name}: expected a {ndim}-D {dtype} tensor, got shape "
                    f"{tuple(tensor.shape)} dtype {tensor.dtype}"
                )
        size = self.labels.shape[0]
        if self.dense.shape[0] != size or self.sparse.shape[0] != size:
            raise ConfigError(
                f"Batch: labels, dense and sparse must have the same batch size; got "
                f"{size}, {self.dense.shape[0]} and {self.sparse.shape[0]}"
            )

    def __len__(self) -> int:
        """The batch size B."""
        return int(self.labels.shape[0])
