"""Async training's dense rule: Adam's momentum lowered by what asynchrony adds.

Mitliagkas et al. 2016 ("Asynchrony begets momentum, with an application to deep
learning", Allerton) show that W workers applying gradients asynchronously behave, in
expectation, like one worker with an added momentum of 1 - 1/W: each update carries
on the direction of the updates the gradient did not see. On top of the optimizer's
own momentum that overshoots; they lower the explicit momentum to compensate.

psfleet applies it to the dense table's Adam rule in async mode
(``a_sync_configs.momentum_correction``, on by default): beta1 becomes
max(0, beta1 - (1 - 1/W)), e.g. 0.9 -> 0.4 with 2 workers, 0.15 with 4; one worker
keeps its beta1 (with ``local_dense_update`` it computes on fresh values). Measured on
the DNN of ``examples/criteo_dnn`` (150k rows; docs/modes.md): async 1x2 0.7324 ->
0.7395 with beta1 0.5 and 0.7416 with 0, 1x4 0.7119 -> 0.7311 / 0.7354, against
0.7420 in one process. Sparse tables keep their rule: stale sparse rows cost nothing
measurable (a row appears in few consecutive steps).
"""

from __future__ import annotations

from psfleet.ps.types import RuleConfig

__all__ = ["async_dense_rule"]


def async_dense_rule(rule: RuleConfig, worker_num: int) -> RuleConfig:
    """``rule`` with Adam's beta1 lowered by the momentum ``worker_num`` async workers
    add, ``1 - 1/worker_num`` (floored at 0); other rules (no momentum) and one worker
    unchanged."""
    if rule.name != "adam" or worker_num <= 1:
        return rule
    return rule.model_copy(update={"beta1": max(0.0, rule.beta1 - (1.0 - 1.0 / worker_num))})
