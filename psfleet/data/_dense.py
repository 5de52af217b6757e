"""Numeric (dense) feature transforms shared by the parsers: ``none``, ``log1p`` and
``standardize``.

- ``none``: the values as read.
- ``log1p``: ``log(1 + max(x, 0))`` (raw counts; the Criteo DNN preprocessing, as in
  DLRM's ``log(x + 1)``).
- ``standardize``: ``(x - mean) / std`` with a mean and a standard deviation declared
  per dense column (``dense_mean``, ``dense_std``), the way PaddleRec's Criteo readers
  declare fixed per-column ``min`` / ``diff`` lists: the statistics are part of the
  config, never computed from the data a worker happens to read, so every worker and
  every run transforms alike.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["DenseTransform", "check_dense_transform", "transform_dense"]

DenseTransform = Literal["none", "log1p", "standardize"]


def check_dense_transform(transform: str, mean: list[float] | None, std: list[float] | None,
                          num_dense: int) -> None:
    """Check the statistics a transform needs (call from a config validator).

    Args:
        transform: ``none``, ``log1p`` or ``standardize``.
        mean, std: ``dense_mean`` / ``dense_std`` as declared (None: not set).
        num_dense: dense columns of the config.

    Raises:
        ValueError: ``standardize`` without ``dense_mean`` / ``dense_std``, lists of the
            wrong length, or a std <= 0; or statistics given for another transform. The
            message names the key.
    """
    if transform != "standardize":
        if mean is not None or std is not None:
            raise ValueError("dense_mean / dense_std are only used with dense_transform: "
                             f"standardize (dense_transform is {transform!r})")
        return
    for key, values in (("dense_mean", mean), ("dense_std", std)):
        if values is None:
            raise ValueError(f"{key}: required with dense_transform: standardize (one value "
                             f"per dense column, {num_dense} values)")
        if len(values) != num_dense:
            raise ValueError(f"{key}: {len(values)} values for {num_dense} dense columns; "
                             "give one per dense column, in order")
    if std is not None and any(not s > 0 for s in std):
        raise ValueError(f"dense_std: {std!r} must all be > 0")


def transform_dense(dense: npt.NDArray[np.floating], transform: str,
                    mean: list[float] | None = None, std: list[float] | None = None
                    ) -> npt.NDArray[np.float32]:
    """Apply a dense transform (module docstring).

    Args:
        dense (ndarray[N, D], float): values as read.
        transform: ``none``, ``log1p`` or ``standardize``.
        mean, std: D values each, for ``standardize`` (checked by
            :func:`check_dense_transform`).

    Returns:
        ndarray[N, D], float32 (a new array, or ``dense`` itself for ``none`` when it
        already is float32).
    """
    if transform == "log1p":
        dense = np.log1p(np.maximum(dense, 0.0))
    elif transform == "standardize" and mean is not None and std is not None:
        dense = (np.asarray(dense, dtype=np.float64) - np.asarray(mean, dtype=np.float64)
                 ) / np.asarray(std, dtype=np.float64)
    return np.asarray(dense, dtype=np.float32)
