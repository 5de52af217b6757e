"""Tests of psfleet.ps.table.rules: each rule against its published formula and torch.optim.

Two oracles per rule: an independent float64 numpy reference written here from the
paper's formula, and torch.optim applied to a tensor (what a user compares against).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from psfleet.ps.dense_table import DenseTable
from psfleet.ps.table.rules import make_rule
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import DenseTableConfig, RuleConfig, SparseTableConfig

pytestmark = pytest.mark.unit


class ReferenceRule:
    """float64 reference of one rule over rows ``w`` [N, D], from the published formulas.

    - SGD: w <- w - lr g.
    - Adagrad (Duchi, Hazan & Singer 2011): G <- G + g^2; w <- w - lr g / (sqrt(G) + eps).
    - Adam (Kingma & Ba 2015, Algorithm 1): m <- b1 m + (1-b1) g; v <- b2 v + (1-b2) g^2;
      m_hat = m / (1 - b1^t); v_hat = v / (1 - b2^t); w <- w - lr m_hat / (sqrt(v_hat) + eps),
      with t counted per row.
    """

    def __init__(self, config: RuleConfig, w: np.ndarray) -> None:
        self.c = config
        self.w = np.array(w, dtype=np.float64)
        n = self.w.shape[0]
        self.acc = np.full_like(self.w, config.initial_accumulator)
        self.m = np.zeros_like(self.w)
        self.v = np.zeros_like(self.w)
        self.t = np.zeros((n, 1), dtype=np.float64)

    def step(self, g: np.ndarray, rows: np.ndarray | None = None) -> None:
        """One update of ``rows`` (all rows when None) with gradient ``g`` [len(rows), D]."""
        c = self.c
        r = np.arange(self.w.shape[0]) if rows is None else rows
        g = np.asarray(g, dtype=np.float64)
        if c.name == "sgd":
            self.w[r] -= c.learning_rate * g
        elif c.name == "adagrad":
            self.acc[r] += g * g
            self.w[r] -= c.learning_rate * g / (np.sqrt(self.acc[r]) + c.epsilon)
        else:
            self.m[r] = c.beta1 * self.m[r] + (1 - c.beta1) * g
            self.v[r] = c.beta2 * self.v[r] + (1 - c.beta2) * g * g
            self.t[r] += 1
            m_hat = self.m[r] / (1 - c.beta1 ** self.t[r])
            v_hat = self.v[r] / (1 - c.beta2 ** self.t[r])
            self.w[r] -= c.learning_rate * m_hat / (np.sqrt(v_hat) + c.epsilon)


RULE_CONFIGS = [
    RuleConfig(name="sgd", learning_rate=0.05),
    RuleConfig(name="adagrad", learning_rate=0.05, epsilon=1e-10),
    RuleConfig(name="adagrad", learning_rate=0.02, epsilon=1e-6, initial_accumulator=0.1),
    RuleConfig(name="adam", learning_rate=0.01),
    RuleConfig(name="adam", learning_rate=0.03, beta1=0.8, beta2=0.99, epsilon=1e-6),
    # A large eps makes its place in the formula visible (outside the square root).
    RuleConfig(name="adagrad", learning_rate=0.05, epsilon=0.5),
    RuleConfig(name="adam", learning_rate=0.05, epsilon=0.5),
]


@pytest.mark.parametrize("config", RULE_CONFIGS,
                         ids=lambda c: f"{c.name}-{c.learning_rate}-{c.epsilon}")
def test_rule_matches_float64_reference_over_several_steps(config: RuleConfig) -> None:
    rng = np.random.default_rng(1)
    n, d = 7, 5
    w0 = rng.uniform(0.5, 1.5, size=(n, d)).astype(np.float32)  # away from 0: rtol is fair
    rule = make_rule(config)
    w = w0.copy()
    state = rule.init_state(n, d)
    assert state.shape == (n, rule.state_width(d))
    ref = ReferenceRule(config, w0)
    for _ in range(12):
        g = rng.normal(0.0, 1.0, size=(n, d)).astype(np.float32)
        rule.update(w, state, g)
        ref.step(g)
        np.testing.assert_allclose(w, ref.w, rtol=2e-6, atol=0)  # float32 vs float64
    # The updates moved the values well beyond the tolerance (the test can fail).
    assert np.abs(ref.w - w0).max() > 1e-2


def _torch_optimizer(name: str, param: torch.Tensor) -> tuple[torch.optim.Optimizer, RuleConfig]:
    """A torch optimizer with default eps and the RuleConfig meaning the same thing."""
    if name == "sgd":
        return torch.optim.SGD([param], lr=0.1), RuleConfig(name="sgd", learning_rate=0.1)
    if name == "adagrad":
        return (torch.optim.Adagrad([param], lr=0.1),
                RuleConfig(name="adagrad", learning_rate=0.1, epsilon=1e-10))
    return (torch.optim.Adam([param], lr=0.01),
            RuleConfig(name="adam", learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8))


@pytest.mark.parametrize(("name", "atol"), [("sgd", 1e-6), ("adagrad", 1e-6), ("adam", 1e-5)])
def test_dense_table_matches_torch_optim_over_20_steps(name: str, atol: float) -> None:
    rng = np.random.default_rng(2)
    size = 300
    init = rng.normal(0.0, 1.0, size=size).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(init.copy()))
    optimizer, rule = _torch_optimizer(name, param)
    table = DenseTable(DenseTableConfig(name="dense", size=size, rule=rule), init)
    for _ in range(20):
        g = rng.normal(0.0, 1.0, size=size).astype(np.float32)
        param.grad = torch.from_numpy(g.copy())
        optimizer.step()
        table.push(g)
        np.testing.assert_allclose(table.pull(), param.detach().numpy(), rtol=0, atol=atol)
    assert np.abs(table.pull() - init).max() > 0.05


def test_dense_table_state_is_the_rule_state() -> None:
    rule = RuleConfig(name="adagrad", learning_rate=0.1, initial_accumulator=0.5)
    table = DenseTable(DenseTableConfig(name="d", size=3, rule=rule),
                       np.array([1.0, 2.0, 3.0], np.float32))
    table.push(np.array([1.0, -2.0, 0.0], np.float32))
    values, state = table.state()
    np.testing.assert_allclose(state, [1.5, 4.5, 0.5], rtol=1e-7)
    expected = np.array([1.0, 2.0, 3.0]) - 0.1 * np.array([1.0, -2.0, 0.0]) / (
        np.sqrt([1.5, 4.5, 0.5]) + 1e-8)
    np.testing.assert_allclose(values, expected, rtol=1e-6)


def test_sparse_adam_keeps_a_step_count_per_row() -> None:
    rule = RuleConfig(name="adam", learning_rate=0.01)
    table = SparseTable(SparseTableConfig(name="emb", dim=4, rule=rule, initial_range=0.5))
    a = np.array([11], np.uint64)
    both = np.array([11, 22], np.uint64)
    w0 = table.pull(both)  # [2, 4]
    rng = np.random.default_rng(3)
    ref = ReferenceRule(rule, w0)
    for _ in range(4):  # row A alone, 4 times
        g = rng.normal(size=(1, 4)).astype(np.float32)
        table.push(a, g)
        ref.step(g, rows=np.array([0]))
    g = rng.normal(size=(2, 4)).astype(np.float32)
    table.push(both, g)  # A's 5th update, B's first, in one push
    ref.step(g, rows=np.array([0, 1]))

    after = table.pull(both)
    # A first step of Adam moves each weight by lr * g / (|g| + eps), i.e. ~lr * sign(g).
    first_step = w0[1] - 0.01 * g[1] / (np.abs(g[1]) + 1e-8)
    np.testing.assert_allclose(after[1], first_step, rtol=1e-6)
    np.testing.assert_allclose(after, ref.w, rtol=1e-6, atol=1e-6)  # float32 m, v state
    _, rows = table.items()
    assert rows[:, -1].tolist() == [5.0, 1.0]  # the step column, keys sorted 11, 22
