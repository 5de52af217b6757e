"""DistributedOptimizer: a torch optimizer whose step() drives the communicator.

The wrapped optimizer is not stepped: its type and hyper-parameters choose the rule
the tables apply (Adam -> adam, SGD -> sgd, Adagrad -> adagrad), as Paddle's
distributed optimizer turns the optimizer into server-side rules. In async mode with
``local_dense_update`` an optimizer computing the dense table's rule
(``psfleet.fleet.dense_lag.LocalStep``) also steps the dense parameters on the
worker: those steps stand in for the worker's own pushes the servers' values do not
hold yet. ``step()`` asks the worker runtime's step collector
(:class:`psfleet.fleet.step.StepCollector`) to push the step's sparse gradients
(collected there by the embeddings' forwards) and the flat dense gradient, and
installs the freshest dense values it returns.

Tables with the ``ctr`` accessor count each key's shows and clicks from the batch
labels, so their steps take the labels: ``optimizer.step(labels=batch.labels)`` or
``optimizer.minimize(loss, labels=batch.labels)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import cast

import numpy as np
import torch

from psfleet.errors import ConfigError, FatalError
from psfleet.fleet.dense_lag import LocalStep, OwnStepCompensation
from psfleet.fleet.step import StepCollector
from psfleet.ps.types import OPTIMIZER_CLASSES, RuleConfig

__all__ = ["DistributedOptimizer", "rule_from_optimizer", "rule_of_class"]


def _hyper(optimizer: torch.optim.Optimizer, name: str) -> object:
    values = {repr(group.get(name)) for group in optimizer.param_groups}
    if len(values) > 1:
        raise ConfigError(f"optimizer: param groups differ in {name!r} ({sorted(values)}); "
                          "the tables apply one rule: use a single group")
    return optimizer.param_groups[0].get(name)


_KNOWN = ", ".join(f"torch.optim.{name}" for name in OPTIMIZER_CLASSES)


def rule_from_optimizer(optimizer: torch.optim.Optimizer) -> RuleConfig:
    """The table rule equivalent to ``optimizer``.

    Raises:
        ConfigError: the optimizer or one of its options has no table rule (lists
            the supported ones).
    """
    return _rule(type(optimizer), lambda name: _hyper(optimizer, name))


def rule_of_class(class_name: str, learning_rate: float) -> RuleConfig:
    """The table rule of ``torch.optim.<class_name>(params, lr=learning_rate)`` with
    its other settings at the class's defaults, read from its signature: no optimizer
    is constructed (a constructor imports ``torch._dynamo``, about 1.5 s of CPU).

    Raises:
        ConfigError: ``class_name`` is not one of ``OPTIMIZER_CLASSES``.
    """
    if class_name not in OPTIMIZER_CLASSES:
        raise ConfigError(f"optimizer: {class_name!r} has no table rule; use one of "
                          f"{_KNOWN}")
    optimizer_class = getattr(torch.optim, class_name)
    defaults = inspect.signature(optimizer_class).parameters
    return _rule(optimizer_class, lambda name: learning_rate if name == "lr"
                 else defaults[name].default if name in defaults else None)


def _rule(optimizer_class: type, hyper: Callable[[str], object]) -> RuleConfig:
    def unsupported(option: str, default: object) -> None:
        value = hyper(option)
        if value not in (None, default):
            raise ConfigError(f"optimizer {optimizer_class.__name__}: {option}={value!r} is "
                              f"not supported by the tables (only {default!r})")

    def number(option: str) -> float:
        return float(hyper(option))  # type: ignore[arg-type]

    if issubclass(optimizer_class, torch.optim.Adam | torch.optim.Adagrad | torch.optim.SGD):
        unsupported("weight_decay", 0)
        unsupported("maximize", False)
    if issubclass(optimizer_class, torch.optim.Adam):
        unsupported("amsgrad", False)
        betas = cast(tuple[float, float], hyper("betas"))
        return RuleConfig(name="adam", learning_rate=number("lr"), beta1=betas[0],
                          beta2=betas[1], epsilon=number("eps"))
    if issubclass(optimizer_class, torch.optim.Adagrad):
        unsupported("lr_decay", 0)
        return RuleConfig(name="adagrad", learning_rate=number("lr"), epsilon=number("eps"),
                          initial_accumulator=number("initial_accumulator_value"))
    if issubclass(optimizer_class, torch.optim.SGD):
        unsupported("momentum", 0)
        unsupported("nesterov", False)
        return RuleConfig(name="sgd", learning_rate=number("lr"))
    raise ConfigError(f"optimizer: {optimizer_class.__name__} has no table rule; use one of "
                      f"{_KNOWN}")


class DistributedOptimizer:
    """Wraps a torch optimizer for parameter-server training.

    Give either ``optimizer``, or ``params`` and ``rule``: the same without a
    ``torch.optim`` instance (whose constructor imports ``torch._dynamo``, about 1.5 s
    of CPU; the YAML runner's workers use this form, with :func:`rule_of_class`).

    Args:
        optimizer: the user's optimizer over the model's dense parameters.
        params: the model's dense parameters (float32 tensors).
        rule: the tables' rule.

    Raises:
        ConfigError: the optimizer has no table rule, or not exactly one of
            ``optimizer`` and (``params``, ``rule``) was given.
    """

    def __init__(self, optimizer: torch.optim.Optimizer | None = None, *,
                 params: Iterable[torch.Tensor] | None = None,
                 rule: RuleConfig | None = None) -> None:
        if optimizer is not None and params is None and rule is None:
            rule = rule_from_optimizer(optimizer)
            params = (p for g in optimizer.param_groups for p in g["params"])
        elif optimizer is not None or params is None or rule is None:
            raise ConfigError("distributed_optimizer: give a torch optimizer, or params and "
                              "rule (not both)")
        self.inner = optimizer
        self.rule: RuleConfig = rule
        #: the dense table's rule: ``rule``, or in async mode with momentum correction
        #: its Adam beta1 lowered (``psfleet.fleet.async_momentum``), or its learning
        #: rate scaled (``psfleet.fleet.lr_scaling``); set by the runtime
        self.dense_rule = self.rule
        self.params: list[torch.Tensor] = list(params)
        self._step: StepCollector | None = None
        self._own: OwnStepCompensation | None = None  # async local_dense_update
        self.steps = 0

    def bind(self, step: StepCollector) -> None:
        """Drive the worker runtime's steps (called by ``fleet.init_worker``, after
        it installed the tables' dense values)."""
        self._step = step
        if step.communicator.local_dense_update and self.params:
            self._own = OwnStepCompensation(sum(p.numel() for p in self.params),
                                            LocalStep(self.params, self.dense_rule))

    def flat_values(self, out: np.ndarray | None = None) -> np.ndarray:
        """The dense parameters flattened in order: float32[total] (a copy, written
        into ``out`` when given)."""
        if not self.params:
            return np.zeros(0, dtype=np.float32)
        with torch.no_grad():
            if out is not None:
                torch.cat([p.reshape(-1) for p in self.params], out=torch.from_numpy(out))
                return out
            return torch.cat([p.reshape(-1) for p in self.params]).numpy().copy()

    def install(self, values: np.ndarray) -> None:
        """Copy flat float32[total] values into the dense parameters, in place."""
        flat = torch.from_numpy(values)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset:offset + n].view_as(p))
                offset += n

    def refresh(self) -> None:
        """Install the dense values the tables hold now (blocks on a pull)."""
        if self._step is not None and self.params:
            values = self._step.pull_dense()
            if values is not None:
                self.install(values)
                if self._own is not None:
                    self._own.reset()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the dense parameters' gradients."""
        if self.inner is not None:
            self.inner.zero_grad(set_to_none=set_to_none)
            return
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self, labels: torch.Tensor | np.ndarray | None = None) -> None:
        """Have the runtime push this step's gradients (sparse rows collected by the
        forwards, then dense); install fresh dense values if any arrived.

        Args:
            labels (Tensor[B] or [B, 1], float or int 0/1) or None: the labels of the
                batch the step's forwards read. Needed when a table read this step has
                the ``ctr`` accessor: each key's push carries show = its occurrences
                in the batch and click = the sum of their examples' labels (Paddle's
                DownpourWorker::CollectLabelInfo). Ignored by the other tables.

        Raises:
            ConfigError: a ctr table was read and ``labels`` is None (names the table),
                or labels' length is not the batch's (names both); nothing was pushed.
            DataError: a label is NaN or infinite (names the example); nothing pushed.
            FatalError: ``fleet.init_worker()`` was not called, or sending failed.
        """
        if self._step is None:
            raise FatalError("call fleet.init_worker() before optimizer.step()")
        grads = None
        if self.params:
            grads = torch.cat([p.grad.reshape(-1) if p.grad is not None
                               else torch.zeros(p.numel()) for p in self.params]).numpy()
        fresh = self._step.end_step(grads, labels)
        own = self._own
        if own is not None and own.local is not None:  # the own step, at once
            before = self.flat_values(out=own.before)
            own.local.step()
            own.record(before, self.flat_values(out=own.after))
            if fresh is not None:
                fresh = own.compensate(fresh, self._step.communicator.fresh_dense_lag)
        if fresh is not None:
            self.install(fresh)
        self.steps += 1

    def minimize(self, loss: torch.Tensor,
                 labels: torch.Tensor | np.ndarray | None = None) -> None:
        """``loss.backward()`` then :meth:`step` with ``labels`` (the seeds' spelling).

        Raises:
            as :meth:`step`.
        """
        loss.backward()
        self.step(labels)
