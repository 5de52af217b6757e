"""The dense tower's dropout rates (``hyper_parameters.dropout``), checked without torch
so that loading a config (the launcher's preflight, a server) does not import it; the
tower that applies them is :class:`psfleet.rec.models.mlp.MLPTower`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from psfleet.errors import ConfigError

__all__ = ["check_dropout", "dropout_seed"]


def check_dropout(dropout: float | Sequence[float], hidden: int,
                  key: str = "hyper_parameters.dropout") -> tuple[float, ...]:
    """The dropout rate of each of ``hidden`` hidden layers.

    Args:
        dropout: one rate for every hidden layer, or one per hidden layer.
        hidden: the number of hidden layers (``len(fc_sizes)``).
        key: the name the errors give the value.

    Raises:
        ConfigError: a rate outside [0, 1), or a list whose length is not ``hidden``
            (names ``key``).
    """
    rates = ([float(dropout)] * hidden if isinstance(dropout, int | float)
             else [float(rate) for rate in dropout])
    if len(rates) != hidden:
        raise ConfigError(f"{key}: {list(rates)!r} has {len(rates)} rates but the tower has "
                          f"{hidden} hidden layers (fc_sizes); give one rate, or one per layer")
    bad = [rate for rate in rates if not 0.0 <= rate < 1.0]
    if bad:
        raise ConfigError(f"{key}: {bad[0]!r} is not in [0, 1) (the fraction of a layer's "
                          "units dropped while training)")
    return tuple(rates)


def dropout_seed(seed: int, worker_index: int) -> int:
    """The seed of worker ``worker_index``'s dropout masks in a job seeded ``seed``
    (``runner.seed``): distinct per worker, the same on every run (numpy's SeedSequence
    of the pair, 63 bits)."""
    state = np.random.SeedSequence([seed, worker_index]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])
