"""The :class:`Batch` every reader yields: one mini-batch of CTR examples as CPU
tensors (the fields are described in :mod:`psfleet.data.types`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from psfleet.data.jagged import KeyedJagged
from psfleet.errors import ConfigError

if TYPE_CHECKING:
    from psfleet.data.types import ParsedChunk

__all__ = ["Batch"]


@dataclass(frozen=True)
class Batch:
    """One mini-batch of examples (immutable; the tensors are not copied).

    Attributes:
        labels (Tensor[B], float32): click labels, 0.0 or 1.0.
        dense (Tensor[B, num_dense], float32): dense features.
        sparse (Tensor[B, num_slots], int64): keys of the single-valued slots (uint64
            bits in int64).
        jagged: the multi-valued slots (stride B), or None.

    Raises:
        ConfigError: on construction, if the shapes or dtypes do not match the above.
    """

    labels: Tensor
    dense: Tensor
    sparse: Tensor
    jagged: KeyedJagged | None = None

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
        if self.jagged is not None and self.jagged.stride != size:
            raise ConfigError(f"Batch: jagged has stride {self.jagged.stride}, the batch "
                              f"{size} examples")

    @classmethod
    def of_chunk(cls, chunk: ParsedChunk, multi: Sequence[str] = ()) -> Batch:
        """The examples of ``chunk`` as a Batch (tensors share memory where contiguous);
        ``multi`` names the multi-valued features (the schema's)."""
        return cls(torch.from_numpy(np.ascontiguousarray(chunk.labels)),
                   torch.from_numpy(np.ascontiguousarray(chunk.dense)),
                   torch.from_numpy(np.ascontiguousarray(chunk.sparse).view(np.int64)),
                   None if chunk.jagged is None else KeyedJagged.from_rows(multi, chunk.jagged))

    def __len__(self) -> int:
        """The batch size B."""
        return int(self.labels.shape[0])
