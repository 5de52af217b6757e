"""Early stopping on the validation metric (``runner.early_stopping``).

Worker 0 alone evaluates the validation data (:func:`psfleet.rec.trainer` validates
between two barriers), so it alone decides; the others learn the decision from a
small file it writes, before the second barrier, in the job's exchange folder
(``runner.exchange_dir``, default ``<run folder>/exchange``: the folder sync mode's
example counts already use, shared by every worker; on several machines a shared
file system). A job of one worker writes no file.

The rule is Keras' ``EarlyStopping`` (``monitor``, ``patience``, ``min_delta``,
``mode`` inferred from the metric): stop after ``patience`` validations in a row whose
metric did not beat the best so far by at least ``min_delta``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from psfleet.errors import FatalError
from psfleet.rec.config import EarlyStoppingConfig

__all__ = ["EarlyStopping"]

logger = logging.getLogger(__name__)

#: How long a worker waits for worker 0's decision file after the barrier, seconds
#: (it is written before the barrier; this covers a shared file system's delay).
DECISION_WAIT_S = 30.0


class EarlyStopping:
    """Worker 0's early-stopping state, and the decision every worker reads.

    Args:
        config: the rule.
        directory: the exchange folder the decision files go to.
        worker_num: the job's workers (1: no file).
    """

    def __init__(self, config: EarlyStoppingConfig, directory: Path, worker_num: int) -> None:
        self.config = config
        self.directory = directory
        self.worker_num = worker_num
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.bad = 0  # validations in a row without improvement
        self.stopped: dict[str, Any] | None = None  # metrics.json's early_stopped

    def _improves(self, value: float) -> bool:
        if self.best is None:
            return True
        delta = self.config.min_delta
        if self.config.metric == "auc":
            return value > self.best + delta
        return value < self.best - delta

    def observe(self, epoch: int, metrics: dict[str, float]) -> bool:
        """Worker 0: take the validation of ``epoch`` (1-based epochs done); returns
        whether training stops after it. A NaN metric (e.g. one class only) never
        improves."""
        value = float(metrics[self.config.metric])
        if not math.isnan(value) and self._improves(value):
            self.best, self.best_epoch, self.bad = value, epoch, 0
            return False
        self.bad += 1
        if self.bad < self.config.patience:
            return False
        self.stopped = {"epoch": epoch, "metric": self.config.metric, "best": self.best,
                        "best_epoch": self.best_epoch}
        logger.warning("early stopping after epoch %d: valid %s has not improved on %.4f "
                       "(epoch %s) by %g for %d validation(s)", epoch, self.config.metric,
                       self.best if self.best is not None else math.nan, self.best_epoch,
                       self.config.min_delta, self.bad)
        return True

    def _path(self, epoch: int) -> Path:
        return self.directory / f"early_stopping.{epoch}.json"

    def publish(self, epoch: int, stop: bool) -> None:
        """Worker 0: write the decision for ``epoch`` (atomically), before the barrier
        the others wait at."""
        if self.worker_num == 1:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.directory / f".early_stopping.{epoch}.{os.getpid()}"
        temporary.write_text(json.dumps({"stop": stop}))
        os.replace(temporary, self._path(epoch))

    def read(self, epoch: int) -> bool:
        """Another worker, after the barrier: worker 0's decision for ``epoch``.

        Raises:
            FatalError: no decision file within :data:`DECISION_WAIT_S` (the exchange
                folder is not shared: names it).
        """
        path = self._path(epoch)
        deadline = time.monotonic() + DECISION_WAIT_S
        while True:
            try:
                return bool(json.loads(path.read_text())["stop"])
            except (OSError, ValueError, KeyError):
                if time.monotonic() > deadline:
                    raise FatalError(
                        f"runner.early_stopping: worker 0's decision {path} did not appear "
                        f"within {DECISION_WAIT_S:.0f} s; runner.exchange_dir must be a "
                        "folder every worker shares") from None
                time.sleep(0.05)
