"""Learning-rate scaling with the worker count (``strategy.lr_scaling``).

In ``sync`` and ``collective`` mode one update averages the gradients of W workers'
batches: the global batch is W times ``batch_size``, and with the learning rate of
one process the job takes W times fewer steps of the same size over an epoch. GEO
averages the W workers' local progress every ``geo_step`` steps, which divides each
worker's movement by W in the same way. The standard remedies raise the learning
rate with the batch:

- ``linear``: times W (Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training
  ImageNet in 1 Hour"; the rule for SGD);
- ``sqrt``: times sqrt(W) (Krizhevsky 2014, "One weird trick for parallelizing
  convolutional neural networks"; Malladi et al. 2022, "On the SDEs and Scaling Rules
  for Adaptive Gradient Algorithms", NeurIPS: the rule for Adam);
- ``none``: the configured rate (DDP's and Paddle's behaviour);
- ``auto`` (the default): ``sqrt`` in ``geo`` and in ``async`` with global batch
  aggregation, ``none`` in every other mode.

The factor multiplies every table's rule (the dense table's and each sparse
table's: the servers apply it in ``sync``, the workers' local steps in ``geo`` and
``collective``). ``async`` applies each worker's batch as its own update and pass
mode (``gpubox``) is not measured with it, so their rate is never scaled; ``async``
with global batch aggregation (GBA, ``a_sync_configs.global_batch_aggregation``)
averages W batches per update as sync does, so it is scaled as sync is (measured:
GBA 2x4 at 150k rows 0.7242 -> 0.7359 with ``sqrt``).
Measured on the DNN of ``examples/criteo_dnn`` (docs/modes.md, "Learning-rate
scaling"; one process 0.7420 at 150k rows, 0.7566 at 1M): ``sqrt`` raised test AUC
in every layout tried, e.g. sync 1x4 at 150k rows 0.7320 -> 0.7406, GEO 1x2 0.7312 ->
0.7349, GEO 2x4 0.6829 -> 0.7157, and cost nothing at 1M rows (sync 1x4 0.7554 ->
0.7557, GEO 2x4 0.7481 -> 0.7490). ``auto`` takes it for GEO; sync and collective stay
equal to one process with the global batch and the configured rate unless asked.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

from psfleet.job.modes import MODE_SPECS, mode_spec
from psfleet.ps.types import RuleConfig
from psfleet.types import Mode

__all__ = ["LrScaling", "LR_SCALINGS", "SCALED_MODES", "averages_batches", "check_lr_scaling",
           "lr_factor", "scaled_rule"]

#: How the learning rate follows the worker count (module docstring).
LrScaling = Literal["auto", "none", "sqrt", "linear"]
LR_SCALINGS: tuple[str, ...] = get_args(LrScaling)
#: The modes whose updates average the workers' batches: the only ones scaled.
SCALED_MODES: tuple[str, ...] = tuple(m.name for m in MODE_SPECS.values() if m.averages)


def averages_batches(mode: Mode, global_batch: bool = False) -> bool:
    """Whether an update of ``mode`` averages the workers' batches (``global_batch``:
    async with global batch aggregation, which does), so that W workers step with a
    global batch W times one process's."""
    spec = mode_spec(mode)
    return spec.averages or (spec.step_pushes and global_batch)


def check_lr_scaling(scaling: LrScaling, mode: Mode, global_batch: bool = False) -> None:
    """Refuse a scaling the mode would ignore (``global_batch``: async with global
    batch aggregation, which is scaled).

    Raises:
        ValueError: ``scaling`` is not ``none`` and ``mode`` is not one of
            :data:`SCALED_MODES` (the message says why and what to set).
    """
    if scaling in ("sqrt", "linear") and not averages_batches(mode, global_batch):
        raise ValueError(
            f"lr_scaling {scaling!r} scales the modes whose updates average the workers' "
            f"batches ({', '.join(SCALED_MODES)}); mode {mode!r} applies each worker's "
            "batch as its own update: set lr_scaling to 'none' or lower the learning rate "
            "itself (or, in async, turn on a_sync_configs.global_batch_aggregation)")


def lr_factor(scaling: LrScaling, mode: Mode, worker_num: int,
              global_batch: bool = False) -> float:
    """The learning-rate factor of ``worker_num`` workers in ``mode``: 1.0 for
    ``none``, one worker, or a mode outside :data:`SCALED_MODES` (async counts as
    scaled with ``global_batch``: its global batch aggregation); else W or sqrt(W)
    (``auto``: sqrt(W) in ``geo`` and with ``global_batch``, else 1.0)."""
    if scaling == "auto":
        spec = mode_spec(mode)
        scaling = "sqrt" if spec.step_pushes and global_batch else spec.auto_lr_scaling
    if scaling == "none" or worker_num <= 1 or not averages_batches(mode, global_batch):
        return 1.0
    return float(worker_num) if scaling == "linear" else math.sqrt(worker_num)


def scaled_rule(rule: RuleConfig, factor: float) -> RuleConfig:
    """``rule`` with its learning rate times ``factor`` (``rule`` itself at 1.0)."""
    if factor == 1.0:
        return rule
    return rule.model_copy(update={"learning_rate": rule.learning_rate * factor})
