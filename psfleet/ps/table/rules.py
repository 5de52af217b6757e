"""Optimizer rules applied by the server to pushed gradients, registered by name.

A rule updates rows in place: ``w`` float32[N, D] (the values), ``state``
float32[N, S] (its per-row state, S = ``state_width(D)``) and the gradient ``g``
float32[N, D]. A sparse table applies it to the rows pushed; a dense table is one
row of D = its size, so a dense rule is exactly the per-element rule of torch.optim.

Per-row step counts (sparse Adam) follow Paddle's SparseAdamSGDRule, which keeps the
bias-correction powers per row: a rare feature's first update is bias-corrected as a
first step, not as step 10^6 of the job. DESIGN.md explains why that is the right
default for sparse tables. The step count is a float32 column, exact to 2^24 updates.

Each formula is written once and runs on numpy arrays (the servers' tables) and on
torch tensors on any device (pass mode's worker cache, ``psfleet.ps.pass_cache``):
the arithmetic is in float32 either way, so a row updated in the cache equals the
row the server would have computed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, TypeAlias

import numpy as np

from psfleet.errors import ConfigError
from psfleet.ps.types import RuleConfig

__all__ = ["Rule", "SgdRule", "AdagradRule", "AdamRule", "make_rule", "RULES", "Rows"]

if TYPE_CHECKING:
    import torch

#: What a rule updates: numpy arrays (servers, which never import torch) or torch
#: tensors (any device).
Rows: TypeAlias = "np.ndarray | torch.Tensor"


def _sqrt(x: Rows) -> Rows:
    return np.sqrt(x) if isinstance(x, np.ndarray) else x.sqrt()


def _as(x: Rows, dtype: type[np.floating]) -> Rows:
    """``x`` as float32 or float64, numpy or torch alike."""
    if isinstance(x, np.ndarray):
        return x.astype(dtype)
    return x.double() if dtype is np.float64 else x.float()


class Rule(ABC):
    """An optimizer rule; stateless itself, its state lives in the table's rows."""

    name: ClassVar[str]
    #: State layout of a row of D values: ``element_states`` blocks of D floats (one
    #: per value, e.g. Adam's m and v), then ``scalar_states`` floats (Adam's t).
    element_states: ClassVar[int] = 0
    scalar_states: ClassVar[int] = 0

    def __init__(self, config: RuleConfig) -> None:
        self.config = config

    def state_width(self, dim: int) -> int:
        """float32 state values kept per row of ``dim`` values."""
        return self.element_states * dim + self.scalar_states

    def init_state(self, n: int, dim: int) -> np.ndarray:
        """Initial state of ``n`` new rows: float32[n, state_width(dim)]."""
        return np.zeros((n, self.state_width(dim)), dtype=np.float32)

    @abstractmethod
    def update(self, w: Rows, state: Rows, g: Rows) -> None:
        """Apply one step in place to ``w`` [N, D] and ``state`` [N, S] given ``g`` [N, D],
        float32, all numpy arrays or all torch tensors on one device."""


class SgdRule(Rule):
    """w -= lr * g (torch.optim.SGD without momentum)."""

    name = "sgd"

    def update(self, w: Rows, state: Rows, g: Rows) -> None:
        w -= float(np.float32(self.config.learning_rate)) * g


class AdagradRule(Rule):
    """Adagrad (Duchi, Hazan & Singer 2011) as torch.optim.Adagrad computes it.

    G += g^2; w -= lr * g / (sqrt(G) + eps). State: G [D].
    """

    name = "adagrad"
    element_states = 1

    def init_state(self, n: int, dim: int) -> np.ndarray:
        return np.full((n, dim), self.config.initial_accumulator, dtype=np.float32)

    def update(self, w: Rows, state: Rows, g: Rows) -> None:
        state += g * g
        lr, eps = (float(np.float32(x)) for x in (self.config.learning_rate,
                                                  self.config.epsilon))
        w -= lr * g / (_sqrt(state) + eps)


class AdamRule(Rule):
    """Adam (Kingma & Ba 2015, Algorithm 1) as torch.optim.Adam computes it.

    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; t += 1;
    w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
    State: m [D], v [D], t [1]; t counts this row's updates (per-row bias correction).
    """

    name = "adam"
    element_states = 2
    scalar_states = 1

    def update(self, w: Rows, state: Rows, g: Rows) -> None:
        c = self.config
        d = w.shape[1]
        m, v, t = state[:, :d], state[:, d:2 * d], state[:, 2 * d:]
        # float32 constants as Python floats: numpy (NEP 50) and torch both compute
        # float32 x float32 with them, so both back ends round alike.
        b1, b2, eps = (float(np.float32(x)) for x in (c.beta1, c.beta2, c.epsilon))
        m *= b1
        m += float(1 - np.float32(c.beta1)) * g
        v *= b2
        v += float(1 - np.float32(c.beta2)) * g * g
        t += 1
        steps = _as(t, np.float64)  # [N, 1]
        step_size = _as(c.learning_rate / (1.0 - c.beta1 ** steps), np.float32)
        inv_sqrt_bc2 = _as(1.0 / _sqrt(1.0 - c.beta2 ** steps), np.float32)
        w -= step_size * m / (_sqrt(v) * inv_sqrt_bc2 + eps)


RULES: dict[str, type[Rule]] = {cls.name: cls for cls in (SgdRule, AdagradRule, AdamRule)}


def make_rule(config: RuleConfig) -> Rule:
    """Build the rule named by ``config.name``.

    Raises:
        ConfigError: unknown rule name (lists the known ones).
    """
    try:
        return RULES[config.name](config)
    except KeyError:
        raise ConfigError(
            f"rule.name: {config.name!r} is not one of {', '.join(sorted(RULES))}"
        ) from None
