"""A worker's own dense updates on top of lagging server values (async mode).

An async worker installs the dense values the servers held after some earlier push of
its own: the steps it queued since are missing from them, so its next gradient is
computed on values ``lag`` of its own steps old (plus whatever other workers pushed
meanwhile). Measured on the DNN of ``examples/criteo_dnn`` (150k rows, Adam; single
process with every push applied ``lag`` steps late, docs/modes.md), each step of dense
lag costs about 0.005 test AUC, and dense lag, not sparse lag, is nearly all of it.

With the local update (``a_sync_configs.local_dense_update``, on by default), the
worker also applies the dense table's rule to its dense gradient at once, as one
process would (:class:`LocalStep`), and keeps the running sum of its own steps'
movement. When values that include its steps up to ``k`` arrive at step ``t``, it installs

    values_k + (own movement of steps k+1 .. t),

the servers' values (with the other workers' pushes) plus its own movement since step
``k``; the jumps of earlier installs (the other workers' pushes) are not movement of
its own and are not added again. With one worker and SGD that is exactly one
process's values, whatever the lag; with Adam it is up to rounding (``torch.optim``'s
functional form computes the rule the servers apply). With
W workers only the other workers' in-flight pushes are missing. Gradients still go to
the servers exactly as before: the servers' values stay the job's model; the local
copy only decides where the next gradient is computed.

This is delay compensation on the worker, in the spirit of DC-ASGD's compensation on
the server (Zheng et al. 2017, "Asynchronous Stochastic Gradient Descent with Delay
Compensation", ICML), which corrects a stale gradient instead: here the values the
gradient is computed on are made fresh for the worker's own part of the delay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.optim.adagrad import adagrad
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from psfleet.errors import ConfigError
from psfleet.ps.types import RuleConfig

__all__ = ["LocalStep", "OwnStepCompensation"]


class LocalStep:
    """Applies table ``rule`` (``psfleet.ps.table.rules``: sgd, adagrad, adam) to ``params``
    from their ``.grad``, for the worker's own dense steps.

    It calls ``torch.optim``'s functional form of the rule (``torch.optim.adam.adam``,
    ``adagrad.adagrad``, ``sgd.sgd``) on state it keeps itself: the same arithmetic as
    the ``torch.optim`` classes, without constructing one (a class's constructor
    imports ``torch._dynamo``: about 1.5 s of CPU per process). Fused where this
    torch build has the kernel (Adam on 295k CPU floats: 0.14 vs 1.8 ms per step),
    else the default implementation.

    Args:
        params: the dense parameters (float32 tensors), stepped in place.
        rule: the dense table's rule.

    Raises:
        ConfigError: ``rule.name`` is not a rule this class steps (names the known
            ones); only a config built without validation can carry one.
    """

    def __init__(self, params: Sequence[torch.Tensor], rule: RuleConfig) -> None:
        if rule.name not in _STEPS:
            raise ConfigError(f"rule.name: {rule.name!r} is not one of "
                              f"{', '.join(sorted(_STEPS))}")
        self.params = list(params)
        self.rule = rule
        self._fused: bool | None = True  # None: this build has no fused kernel
        self._steps = [torch.zeros((), dtype=torch.float32) for _ in self.params]
        if rule.name == "adam":
            self._first = [torch.zeros_like(p) for p in self.params]
            self._second = [torch.zeros_like(p) for p in self.params]
        elif rule.name == "adagrad":
            self._sums = [torch.full_like(p, rule.initial_accumulator) for p in self.params]

    def step(self) -> None:
        """One step of the rule from the parameters' gradients (a missing gradient
        counts as zero)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        with torch.no_grad():
            try:
                self._apply(grads)
            except RuntimeError:
                if self._fused is None:
                    raise
                self._fused = None  # no fused kernel here: the default from now on
                self._apply(grads)

    def _apply(self, grads: list[torch.Tensor]) -> None:
        _STEPS[self.rule.name](self, grads, self._fused)


def _adam(local: LocalStep, grads: list[torch.Tensor], fused: bool | None) -> None:
    rule = local.rule
    adam(local.params, grads, local._first, local._second, [], local._steps, fused=fused,
         amsgrad=False, beta1=rule.beta1, beta2=rule.beta2, lr=rule.learning_rate,
         weight_decay=0.0, eps=rule.epsilon, maximize=False)


def _adagrad(local: LocalStep, grads: list[torch.Tensor], fused: bool | None) -> None:
    rule = local.rule
    adagrad(local.params, grads, local._sums, local._steps, fused=fused,
            lr=rule.learning_rate, weight_decay=0.0, lr_decay=0.0, eps=rule.epsilon,
            maximize=False)


def _sgd(local: LocalStep, grads: list[torch.Tensor], fused: bool | None) -> None:
    sgd(local.params, grads, [None] * len(grads), fused=fused, weight_decay=0.0,
        momentum=0.0, lr=local.rule.learning_rate, dampening=0.0, nesterov=False,
        maximize=False)


#: Each rule's step through torch.optim's functional form, by ``RuleConfig.name``.
_STEPS: dict[str, Callable[[LocalStep, list[torch.Tensor], bool | None], None]] = {
    "adam": _adam, "adagrad": _adagrad, "sgd": _sgd}


class OwnStepCompensation:
    """A worker's own dense movement per step, to add to lagging server values.

    Only the worker's own steps count: :meth:`record` takes the values before and
    after each local step, and their difference accumulates into a running sum whose
    value after each step is kept (float32: with the sum at 10, adding a 1e-3 step
    rounds by at most 6e-7). Installs between steps (which bring the other workers'
    pushes) are not movement of this worker: counting them would add the other
    workers' pushes again at every install.

    Args:
        size: the number of dense values.
        local: the own steps' rule (:class:`LocalStep`), kept here for the caller;
            None when the caller steps the values itself.
    """

    def __init__(self, size: int, local: LocalStep | None = None) -> None:
        self.local = local
        self.before = np.empty(size, np.float32)  # scratch buffers for the caller
        self.after = np.empty(size, np.float32)
        self._sum = np.zeros(size, np.float32)  # own movement so far
        self._free: list[np.ndarray] = []  # reused snapshot buffers (1 MB+ each: a
        # fresh allocation of that size costs page faults every step)
        self._sums: deque[np.ndarray] = deque([self._sum.copy()])  # after steps _first..
        self._first = 0
        self._out = np.empty(size, np.float32)
        self.steps = 0  # own steps recorded

    def record(self, before: np.ndarray, after: np.ndarray) -> None:
        """One own step moved the values from ``before`` to ``after`` (float32[size])."""
        self.steps += 1
        self._sum += after
        self._sum -= before
        kept = self._free.pop() if self._free else np.empty_like(self._sum)
        np.copyto(kept, self._sum)
        self._sums.append(kept)

    def compensate(self, fresh: np.ndarray, lag: int) -> np.ndarray:
        """The servers' ``fresh`` values float32[size], which miss this worker's last
        ``lag`` steps, plus the worker's own movement over those steps.

        Returns ``fresh`` itself when ``lag`` is 0, else a buffer valid until the next
        call. Sums older than the one used are dropped: later values never miss more.

        Raises:
            ValueError: ``lag`` is negative or more than the steps recorded.
        """
        if not 0 <= lag <= self.steps:
            raise ValueError(f"lag {lag} outside 0..{self.steps} recorded steps")
        included = max(self.steps - lag, self._first)  # a reset dropped older sums
        while self._first < included:
            self._free.append(self._sums.popleft())
            self._first += 1
        if lag == 0:
            return fresh
        np.subtract(self._sums[-1], self._sums[0], out=self._out)
        self._out += fresh
        return self._out

    def reset(self) -> None:
        """Values with every own step in them were installed: nothing to add."""
        self._free.extend(self._sums)
        self._sums = deque([self._free.pop()])
        np.copyto(self._sums[0], self._sum)
        self._first = self.steps
