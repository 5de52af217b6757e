"""Worker 0's curves of a run: TensorBoard scalars and a PNG of loss and AUC per epoch.

- ``<run folder>/tensorboard/``: event files of :class:`RunRecorder`
  (``torch.utils.tensorboard.SummaryWriter``); every run into the same folder adds a
  new event file, as TensorBoard does. View with
  ``tensorboard --logdir <run folder>/tensorboard``. Scalars (tag: x axis):

  ==========================================  ==============================================
  ``train/loss``                              mean loss of the batches since the last point,
                                              every ``runner.print_interval`` steps (x: the
                                              worker's global step)
  ``train/auc_running``                       the epoch's running (bucketed) train AUC
  ``train/examples_per_s``                    worker 0's examples/s since the last point
  ``epoch/train_loss``, ``epoch/train_auc``,  per epoch (x: epoch, 1-based)
  ``epoch/examples_per_s``
  ``valid/auc``, ``valid/logloss``,           per validation (x: epoch)
  ``valid/copc``
  ``test/auc``, ``test/logloss``,             once, at the end (x: the last epoch)
  ``test/copc``
  ==========================================  ==============================================

- ``<run folder>/curves.png``: :func:`plot_curves`, loss and AUC per epoch (train,
  valid, test), drawn on matplotlib's Agg canvas without pyplot (the process's
  matplotlib backend is untouched), written under a temporary name and renamed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CURVES_NAME", "TENSORBOARD_DIR", "RunRecorder", "plot_curves"]

CURVES_NAME = "curves.png"
TENSORBOARD_DIR = "tensorboard"


class RunRecorder:
    """Worker 0's TensorBoard scalars (module docstring lists the tags).

    Args:
        log_dir: the event files' folder (created); a new event file per recorder.

    Not thread safe; :meth:`close` when done (also on errors: it flushes and stops
    the writer's thread). Non-finite values (an undefined AUC) are not written.
    """

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: ~1 s

        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self._writer: Any = SummaryWriter(log_dir=str(log_dir))

    def _scalar(self, tag: str, value: Any, step: int) -> None:
        if isinstance(value, int | float) and math.isfinite(value):
            self._writer.add_scalar(tag, float(value), step)

    def step(self, step: int, loss: float, running_auc: float,
             examples_per_s: float) -> None:
        """One ``print_interval`` point at the worker's global ``step``."""
        self._scalar("train/loss", loss, step)
        self._scalar("train/auc_running", running_auc, step)
        self._scalar("train/examples_per_s", examples_per_s, step)

    def epoch(self, stats: Mapping[str, Any]) -> None:
        """An epoch's ``{"epoch", "loss", "auc", "examples_per_s"}`` (the trainer's)."""
        for key in ("loss", "auc", "examples_per_s"):
            self._scalar(f"epoch/{'train_' if key != 'examples_per_s' else ''}{key}",
                         stats.get(key), int(stats["epoch"]))
        self._writer.flush()

    def evaluation(self, name: str, result: Mapping[str, Any], epoch: int) -> None:
        """``valid`` or ``test`` metrics ``{"auc", "logloss", "copc"}`` after ``epoch``."""
        for key in ("auc", "logloss", "copc"):
            self._scalar(f"{name}/{key}", result.get(key), epoch)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (idempotent)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _values(entries: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [math.nan if e.get(key) is None else float(e[key]) for e in entries]


def plot_curves(path: Path, epochs: Sequence[Mapping[str, Any]],
                valid: Sequence[Mapping[str, Any]] | None, test: Mapping[str, Any] | None,
                final_epoch: int, title: str = "") -> Path:
    """Draw loss and AUC per epoch into a PNG at ``path`` (written atomically).

    Args:
        path: the PNG to write (its folder must exist).
        epochs: the trainer's epoch entries ``{"epoch", "loss", "auc"}`` (train loss is
            the mean BCE of the epoch, so it shares an axis with log loss).
        valid: validation entries ``{"epoch", "auc", "logloss"}``, or None.
        test: the test metrics ``{"auc", "logloss"}``, drawn at ``final_epoch``, or None.
        final_epoch: the x of the test point (1-based).
        title: the figure's title (e.g. model and mode).

    Raises:
        OSError: the file cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(figure)
    loss_ax, auc_ax = figure.subplots(1, 2)
    x = [int(e["epoch"]) for e in epochs]
    loss_ax.plot(x, _values(epochs, "loss"), "o-", label="train loss")
    auc_ax.plot(x, _values(epochs, "auc"), "o-", label="train AUC (running)")
    if valid:
        vx = [int(v["epoch"]) for v in valid]
        loss_ax.plot(vx, _values(valid, "logloss"), "s-", label="valid log loss")
        auc_ax.plot(vx, _values(valid, "auc"), "s-", label="valid AUC")
    if test:
        loss_ax.plot([final_epoch], _values([test], "logloss"), "*", markersize=12,
                     label="test log loss")
        auc_ax.plot([final_epoch], _values([test], "auc"), "*", markersize=12,
                    label="test AUC")
    for ax, name in ((loss_ax, "log loss"), (auc_ax, "AUC")):
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        figure.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
