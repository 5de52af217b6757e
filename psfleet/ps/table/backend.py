"""Which kernels a sparse table runs: ``PSFLEET_TABLE_BACKEND`` (``psfleet.env``).

- ``numpy``: the reference, every operation vectorised in numpy (hash_index.py,
  rules.py, ...).
- ``native`` (default): the C++ core (``psfleet.ps.table.native``) for lookups,
  placements, gathers and rule updates, bit for bit the reference's results.

A table picks its backend once, when it is created (:func:`make_backend`); the
variable is read then.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.ps.merge import distinct_summed
from psfleet.ps.table.rules import Rule
from psfleet.ps.table.shard import Shard

if TYPE_CHECKING:
    from psfleet.ps.table.native import NativeKernels

__all__ = ["BACKENDS", "TableBackend", "backend_name", "make_backend", "scatter_add_kernel"]

BACKENDS = ("native", "numpy")


@dataclass(frozen=True)
class TableBackend:
    """A backend: its name, the shard class its tables use, the merge of repeated
    keys' values (``psfleet.ps.merge.distinct_summed``'s contract), pool threads per
    call (native; 0: min(cores, shards))."""

    name: str
    shard_type: type[Shard]
    merge: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] = distinct_summed
    threads: int = 0

    def kernels(self, shards: list[Shard], dim: int, rule: Rule, label: str,
                shard_rule: tuple[int, int]) -> NativeKernels | None:
        """The table-level native calls for ``shards`` (None: numpy, the reference)."""
        if self.name != "native":
            return None
        from psfleet.ps.table.native import NativeKernels
        return NativeKernels(shards, dim, rule, label, shard_rule, self.threads)


def backend_name(environ: dict[str, str] | None = None) -> str:
    """The backend ``PSFLEET_TABLE_BACKEND`` names (default native).

    Raises:
        ConfigError: another value (names the variable and the allowed values).
    """
    raw = (env.read("PSFLEET_TABLE_BACKEND", environ) or "native").strip().lower()
    if raw not in BACKENDS:
        raise ConfigError(f"PSFLEET_TABLE_BACKEND: {raw!r} is not one of "
                          f"{', '.join(BACKENDS)}")
    return raw


def scatter_add_kernel() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """``out[index[i]] += values[i]`` for i in order (out float32[U, D], index int64[N],
    values float32[N, D]): the native core's kernel, or numpy's ``add.at`` (the same
    bits) under the numpy backend or without the built core (tables then refuse the
    native backend, naming the cause)."""
    if backend_name() == "native":
        try:
            from psfleet.ps.table.native import scatter_add
        except ImportError:
            pass
        else:
            return scatter_add
    return np.add.at


def make_backend(name: str | None = None) -> TableBackend:
    """The backend ``name`` (None: :func:`backend_name`).

    Raises:
        ConfigError: an unknown name, a bad ``PSFLEET_TABLE_THREADS``, or ``native``
            without the built core (an install that skipped the extension).
    """
    name = backend_name() if name is None else name
    if name == "numpy":
        return TableBackend("numpy", Shard)
    if name not in BACKENDS:
        raise ConfigError(f"PSFLEET_TABLE_BACKEND: {name!r} is not one of "
                          f"{', '.join(BACKENDS)}")
    try:
        from psfleet.ps.table.native import NativeShard
        from psfleet.ps.table.native import distinct_summed as native_merge
    except ImportError as exc:
        raise ConfigError(
            f"PSFLEET_TABLE_BACKEND: 'native' needs the C++ core psfleet.ps.table._core, "
            f"which does not import ({exc}); reinstall psfleet (pip install -e ., needs "
            "g++) or set PSFLEET_TABLE_BACKEND=numpy") from None
    threads = env.int_var(os.environ, "PSFLEET_TABLE_THREADS", 0) or 0
    return TableBackend("native", NativeShard, native_merge, threads)
