"""The PaddleRec-initialised fully connected layers every CTR model is built from.

PaddleRec's rank models (``models/rank/dnn``, ``wide_deep``, ``deepfm``) start each
Linear weight as ``paddle.nn.initializer.Normal(std=1.0 / math.sqrt(fan_in))`` with
Paddle's default zero bias; :func:`paddle_linear` does the same in torch, drawing from
an optional generator (``None``: torch's global generator, so ``torch.manual_seed``
makes a model deterministic).

:func:`mlp_tower` may drop hidden units out while training (``hyper_parameters.dropout``,
Srivastava et al. 2014, inverted scaling as ``torch.nn.Dropout``): after each hidden
layer's ReLU, as DeepCTR's ``DNN`` and PaddleRec's rank models place it. The tower
stays an ``nn.Sequential`` of the same Linear / ReLU modules (no Dropout module is
inserted), so its parameter names, a checkpoint and an export are the same with and
without dropout; ``model.eval()`` turns it off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from psfleet.errors import ConfigError
from psfleet.rec.dropout import check_dropout

__all__ = ["MLPTower", "check_fc_sizes", "mlp_tower", "paddle_linear"]


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


class MLPTower(nn.Sequential):
    """``Linear, ReLU, ..., Linear`` with dropout after each hidden ReLU while training.

    Its modules (and so its ``state_dict``) are exactly those of the plain tower; the
    masks are drawn from ``dropout_generator`` (None: torch's global generator), so a
    worker seeded apart from the others draws masks of its own, the same on every run.
    Not thread safe (the generator advances with each training forward).

    Args:
        layers: the Linear and ReLU modules.
        dropout: one rate per hidden layer (per ReLU); 0 keeps every unit.
        dropout_generator: where the masks come from.
    """

    def __init__(self, layers: Sequence[nn.Module], dropout: Sequence[float],
                 dropout_generator: torch.Generator | None = None) -> None:
        super().__init__(*layers)
        self.dropout = tuple(dropout)
        self.dropout_generator = dropout_generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tensor[B, in] float32 -> Tensor[B, out] float32 (masks only in ``train()``)."""
        hidden = 0
        for module in self:
            x = module(x)
            if isinstance(module, nn.ReLU):
                rate = self.dropout[hidden]
                hidden += 1
                if self.training and rate > 0.0:
                    keep = torch.rand(x.shape, generator=self.dropout_generator) >= rate
                    x = x * keep / (1.0 - rate)  # [B, width], inverted dropout
        return x


def mlp_tower(sizes: Sequence[int], generator: torch.Generator | None = None,
              dropout: float | Sequence[float] = 0.0, dropout_seed: int | None = None
              ) -> nn.Sequential:
    """``Linear, ReLU, Linear, ReLU, ..., Linear`` through ``sizes`` (no ReLU at the end).

    ``sizes = [in, h1, .., hk, out]`` gives k + 1 Linear layers (PaddleRec's DNN tower
    with ``acts = ["relu"] * k + [None]``). Input Tensor[B, in] float32, output
    Tensor[B, out] float32.

    Args:
        sizes: the widths, input first.
        generator: where the weights' initial values come from (None: torch's global
            generator).
        dropout: the rate of every hidden layer, or one per hidden layer (k); 0: none.
        dropout_seed: seed of the masks' own generator (None: torch's global one).

    Raises:
        ConfigError: fewer than 2 sizes, a size < 1, or a dropout rate outside [0, 1)
            or a list of another length than k
            (:func:`psfleet.rec.dropout.check_dropout`).
    """
    if len(sizes) < 2:
        raise ConfigError(f"mlp_tower: needs an input and an output size, got {list(sizes)!r}")
    rates = check_dropout(dropout, len(sizes) - 2)
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [paddle_linear(fan_in, fan_out, generator), nn.ReLU()]
    if not any(rates):
        return nn.Sequential(*layers[:-1])
    masks = None
    if dropout_seed is not None:
        masks = torch.Generator()
        masks.manual_seed(dropout_seed)
    return MLPTower(layers[:-1], rates, masks)
