"""The PaddleRec-initialised fully connected layers every CTR model is built from.

PaddleRec's rank models (``models/rank/dnn``, ``wide_deep``, ``deepfm``) start each
Linear weight as ``paddle.nn.initializer.Normal(std=1.0 / math.sqrt(fan_in))`` with
Paddle's default zero bias; :func:`paddle_linear` does the same in torch, drawing from
an optional generator (``None``: torch's global generator, so ``torch.manual_seed``
makes a model deterministic).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from psfleet.errors import ConfigError

__all__ = ["check_fc_sizes", "mlp_tower", "paddle_linear"]


def paddle_linear(fan_in: int, fan_out: int,
                  generator: torch.Generator | None = None) -> nn.Linear:
    """``nn.Linear(fan_in, fan_out)`` with weight ~ Normal(0, 1 / sqrt(fan_in)), bias 0.

    Raises:
        ConfigError: if ``fan_in`` or ``fan_out`` is < 1.
    """
    if fan_in < 1 or fan_out < 1:
        raise ConfigError(f"Linear layer: sizes {fan_in!r} -> {fan_out!r} must both be >= 1")
    linear = nn.Linear(fan_in, fan_out)
    with torch.no_grad():
        linear.weight.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=generator)
        linear.bias.zero_()
    return linear


def check_fc_sizes(fc_sizes: Sequence[int]) -> list[int]:
    """``fc_sizes`` as a list.

    Raises:
        ConfigError: if a width is < 1 (names the list).
    """
    sizes = [int(size) for size in fc_sizes]
    if any(size < 1 for size in sizes):
        raise ConfigError(f"fc_sizes: {list(fc_sizes)!r} must all be >= 1")
    return sizes


def mlp_tower(sizes: Sequence[int], generator: torch.Generator | None = None) -> nn.Sequential:
    """``Linear, ReLU, Linear, ReLU, ..., Linear`` through ``sizes`` (no ReLU at the end).

    ``sizes = [in, h1, .., hk, out]`` gives k + 1 Linear layers (PaddleRec's DNN tower
    with ``acts = ["relu"] * k + [None]``). Input Tensor[B, in] float32, output
    Tensor[B, out] float32.

    Raises:
        ConfigError: fewer than 2 sizes, or a size < 1.
    """
    if len(sizes) < 2:
        raise ConfigError(f"mlp_tower: needs an input and an output size, got {list(sizes)!r}")
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [paddle_linear(fan_in, fan_out, generator), nn.ReLU()]
    return nn.Sequential(*layers[:-1])
