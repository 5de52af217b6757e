"""Validation during training, shared by every worker of the YAML runner.

:func:`validate_between` is the job-wide validation (flush, barrier, worker 0
evaluates, barrier) after an epoch or a pass; :func:`record_valid` files its figures;
:func:`finish_pass` is the end of an online pass (:func:`psfleet.rec.passes.end_pass`
and the pass's validation).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn

from psfleet import fleet
from psfleet.data import Reader
from psfleet.fleet import DistributedOptimizer
from psfleet.rec.config import TrainConfig
from psfleet.rec.curves import RunRecorder
from psfleet.rec.early_stopping import EarlyStopping
from psfleet.rec.online_config import AfterPassConfig
from psfleet.rec.passes import PassBook, PassPlan, end_pass
from psfleet.rec.readers import build_test_reader
from psfleet.rec.reporting import Progress, evaluate

__all__ = ["finish_pass", "record_valid", "valid_reader", "validate_between"]

logger = logging.getLogger(__name__)


def validate_between(model: nn.Module, optimizer: DistributedOptimizer, reader: Reader | None,
              early: EarlyStopping | None, epoch: int) -> tuple[dict[str, float] | None, bool]:
    """Validation during training; every worker calls it at the same point.

    Each worker flushes its pushes and meets the others (every push of the job is
    applied past the barrier); the worker holding ``reader`` (worker 0) installs the
    tables' dense values, evaluates, and puts its own dense values back (its training
    state goes on unchanged); a second barrier holds the others until it is done, so
    no push changes the tables during the evaluation. Blocks. In GEO mode the flush is
    one extra delta exchange; the others wait for the evaluation at most the barrier
    timeout (the RPC deadline).

    With ``early``, worker 0 decides whether training stops after ``epoch`` and
    publishes the decision before the second barrier; the others read it after.

    Returns:
        :func:`evaluate`'s metrics on worker 0 (None elsewhere), and whether every
        worker stops training now.
    """
    fleet.flush()
    fleet.barrier_worker()
    result, stop = None, False
    if reader is not None:
        own = optimizer.flat_values()
        optimizer.refresh()
        try:
            result = evaluate(model, reader)
        finally:
            optimizer.install(own)
        if early is not None:
            stop = early.observe(epoch, result)
            early.publish(epoch, stop)
    fleet.barrier_worker()
    if early is not None and reader is None:
        stop = early.read(epoch)
    return result, stop


def valid_reader(config: TrainConfig) -> Reader | None:
    """Worker 0's reader of ``runner.valid_data_dir`` (read as the test data), or None."""
    runner = config.runner
    if runner.valid_data_dir is None:
        return None
    return build_test_reader(config.model_copy(update={"runner": runner.model_copy(
        update={"test_data_dir": runner.valid_data_dir})}))


def record_valid(progress: Progress, recorder: RunRecorder | None,
                  valid: dict[str, float] | None, epoch: int, total: int
                  ) -> dict[str, Any] | None:
    """Worker 0: add a validation's figures (taken after run epoch ``epoch``) to
    ``progress.valid``, the log and TensorBoard; returns the entry (None elsewhere)."""
    if valid is None or progress.valid is None:
        return None
    progress.valid.append({"epoch": epoch, **valid})
    logger.info("epoch %d/%d: valid auc %.4f, logloss %.5f, copc %.4f on %d examples",
                epoch, total, valid["auc"], valid["logloss"], valid["copc"],
                valid["examples"])
    if recorder is not None:
        recorder.evaluation("valid", progress.valid[-1], epoch)
    return progress.valid[-1]


def finish_pass(config: TrainConfig, plan: PassPlan, k: int, epoch: int, model: nn.Module,
              optimizer: DistributedOptimizer, readers: dict[str, Reader | None],
              book: PassBook | None, progress: Progress,
              recorder: RunRecorder | None) -> bool:
    """Every worker at the end of pass ``k`` (run epoch ``epoch`` its last):
    :func:`end_pass`, then the pass's validation (``runner.after_pass.validate`` with
    ``runner.valid_data_dir``), whose figures worker 0 puts into the pass's entry.
    Returns whether worker 0 recorded an entry."""
    runner = config.runner
    path = plan.paths[k] if plan.paths is not None else runner.train_data_dir
    entry = end_pass(config, k, epoch + 1, Path(str(path)), book)
    after = runner.after_pass or AfterPassConfig()
    if runner.valid_data_dir is not None and after.validates:
        valid, _ = validate_between(model, optimizer, readers.get("valid"), None, epoch + 1)
        recorded = record_valid(progress, recorder, valid, epoch + 1, plan.total_epochs)
        if entry is not None and recorded is not None:
            entry["valid"] = {**recorded, "pass": k + 1}
            recorded["pass"] = k + 1
    return entry is not None
