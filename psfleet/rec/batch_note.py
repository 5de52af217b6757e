"""The note a run's result line (``psfleet train``) and ``psfleet parity``'s report
carry when the run's updates saw another batch than one process's: W workers in a
mode whose updates average the workers' batches (``ModeSpec.averages``, or async with
global batch aggregation) step with a global batch W times ``batch_size``, at the
learning rate ``runner.lr_scaling`` gives (:mod:`psfleet.fleet.lr_scaling`). No torch
here: the parity report reads metrics.json files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["global_batch_note"]


def global_batch_note(metrics: Mapping[str, Any]) -> str | None:
    """A phrase for the result line when the run's updates saw another batch than one
    process's (``worker_num`` > 1 in a mode whose updates average the workers'
    batches), naming ``runner.lr_scaling``; None otherwise (or for metrics.json of an
    earlier psfleet, without ``batch_averaged``).

    Args:
        metrics: a run's metrics.json (module docstring).
    """
    workers, batch = int(metrics.get("worker_num") or 1), metrics.get("batch_size")
    if workers <= 1 or not metrics.get("batch_averaged") or batch is None:
        return None
    factor = float(metrics.get("lr_factor") or 1.0)
    scaling = metrics.get("lr_scaling")
    head = (f"global batch {workers * int(batch)} ({workers} workers x {batch}, averaged "
            f"per update; one process steps with {batch})")
    if factor != 1.0:
        return (f"{head}: learning rate x{factor:.3g} by runner.lr_scaling: {scaling}")
    return (f"{head} at the same learning rate (runner.lr_scaling: {scaling}): set "
            "runner.lr_scaling: sqrt or linear to raise it with the workers, or "
            f"runner.batch_size: {max(int(batch) // workers, 1)} to keep one process's "
            "global batch")
