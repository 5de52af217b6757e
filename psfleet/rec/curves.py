"""The curves of a run: TensorBoard scalars and a PNG of loss and AUC per epoch.

- ``<run folder>/tensorboard/``: event files of :class:`RunRecorder`
  (``torch.utils.tensorboard.SummaryWriter``); every run into the same folder adds a
  new event file, as TensorBoard does. View with
  ``tensorboard --logdir <run folder>/tensorboard``. TensorBoard shows each folder as a
  run: worker 0 writes the folder itself, worker ``k`` > 0 writes ``worker_k/`` (its
  ``train/loss`` and ``train/examples_per_s``), and worker 0 writes server ``i``'s
  scalars to ``server_i/``, so the runs overlay per tag. Scalars (tag: x axis):

  ==========================================  ==============================================
  ``train/loss``                              mean loss of the batches since the last point,
                                              every ``runner.print_interval`` steps (x: the
                                              worker's global step)
  ``train/auc_running``                       the epoch's running (bucketed) train AUC
  ``train/examples_per_s``                    the worker's examples/s since the last point
  ``epoch/train_loss``, ``epoch/train_auc``,  per epoch (x: epoch, 1-based)
  ``epoch/examples_per_s``
  ``valid/auc``, ``valid/logloss``,           per validation (x: epoch)
  ``valid/copc``
  ``test/auc``, ``test/logloss``,             once, at the end (x: the last epoch)
  ``test/copc``
  ``server/<table>/rows``, ``…/memory_bytes``  per server (``server_i/``), sampled with the
  ``server/<table>/pulls_per_s``,             ``Stats`` call every ``print_interval`` steps
  ``server/<table>/pushes_per_s``             of worker 0 (x: its step); rows of a dense
                                              table are floats; a rate is requests per
                                              second since the previous sample (since the
                                              server started, at the first)
  ==========================================  ==============================================

- ``<run folder>/curves.png``: :func:`plot_curves`, loss and AUC per epoch (train,
  valid, test), drawn on matplotlib's Agg canvas without pyplot (the process's
  matplotlib backend is untouched), written under a temporary name and renamed.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from psfleet.errors import PsfleetError
from psfleet.rpc import messages as msg

__all__ = ["CURVES_NAME", "TENSORBOARD_DIR", "RunRecorder", "plot_curves", "save_png",
           "server_scalars"]

logger = logging.getLogger(__name__)

CURVES_NAME = "curves.png"
TENSORBOARD_DIR = "tensorboard"


StatsSource = Callable[[], Sequence[msg.StatsResponse]]


def server_scalars(now: Sequence[msg.StatsResponse],
                   before: Sequence[msg.StatsResponse] | None) -> list[dict[str, float]]:
    """Per server, the ``server/<table>/...`` scalars of the module docstring.

    Args:
        now: every server's ``Stats`` answer, in server-index order.
        before: the previous sample (same servers), or None: rates since each server
            started (its ``uptime_s``). A server that restarted since (uptime went down)
            also gets rates since its start.

    Returns:
        One ``{tag: value}`` per server; rates in requests per second.
    """
    result = []
    for index, stats in enumerate(now):
        prev = before[index] if before is not None and index < len(before) else None
        if prev is not None and prev.uptime_s >= stats.uptime_s:
            prev = None
        seconds = stats.uptime_s - (prev.uptime_s if prev is not None else 0.0)
        earlier = {t.table_id: t for t in prev.tables} if prev is not None else {}
        scalars: dict[str, float] = {}
        for table in stats.tables:
            old = earlier.get(table.table_id)
            tag = f"server/{table.name}"
            scalars[f"{tag}/rows"] = table.rows
            scalars[f"{tag}/memory_bytes"] = table.memory_bytes
            for name in ("pulls", "pushes"):
                count = getattr(table, name) - (getattr(old, name) if old else 0)
                scalars[f"{tag}/{name}_per_s"] = count / seconds if seconds > 0 else math.nan
        result.append(scalars)
    return result


class RunRecorder:
    """A worker's TensorBoard scalars (module docstring lists the tags and folders).

    Args:
        log_dir: the event files' folder (created); a new event file per recorder.
        servers: worker 0's source of every server's ``Stats`` (e.g.
            ``fleet.client().stats``), sampled at each :meth:`step`; None: no server
            scalars (other workers, collective mode).

    Not thread safe; :meth:`close` when done (also on errors: it flushes and stops
    the writers' threads). Non-finite values (an undefined AUC) are not written. A
    failing ``Stats`` call (a server restarting) skips that sample with one warning.
    """

    def __init__(self, log_dir: Path, servers: StatsSource | None = None) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self._writer: Any = self._open(log_dir)
        self._servers = servers
        self._server_writers: list[Any] = []
        self._last_stats: Sequence[msg.StatsResponse] | None = None
        self._stats_warned = False

    @staticmethod
    def _open(log_dir: Path) -> Any:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: ~1 s

        return SummaryWriter(log_dir=str(log_dir))

    def _scalar(self, tag: str, value: Any, step: int, writer: Any = None) -> None:
        if isinstance(value, int | float) and math.isfinite(value):
            (writer or self._writer).add_scalar(tag, float(value), step)

    def step(self, step: int, loss: float, running_auc: float,
             examples_per_s: float) -> None:
        """One ``print_interval`` point at the worker's global ``step`` (and, with a
        server source, a sample of every server)."""
        self._scalar("train/loss", loss, step)
        self._scalar("train/auc_running", running_auc, step)
        self._scalar("train/examples_per_s", examples_per_s, step)
        if self._servers is not None:
            self._sample_servers(step)

    def _sample_servers(self, step: int) -> None:
        assert self._servers is not None
        try:
            stats = self._servers()
        except PsfleetError as exc:
            if not self._stats_warned:
                logger.warning("TensorBoard: server stats not sampled at step %d (%s); "
                               "later samples are tried again", step, exc)
                self._stats_warned = True
            return
        while len(self._server_writers) < len(stats):
            index = len(self._server_writers)
            self._server_writers.append(self._open(self.log_dir / f"server_{index}"))
        for writer, scalars in zip(self._server_writers,
                                   server_scalars(stats, self._last_stats), strict=False):
            for tag, value in scalars.items():
                self._scalar(tag, value, step, writer)
        self._last_stats = stats

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
        """Flush and close the event files (idempotent)."""
        for writer in (self._writer, *self._server_writers):
            if writer is not None:
                writer.close()
        self._writer, self._server_writers = None, []


def save_png(figure: Any, path: Path, title: str = "") -> Path:
    """Write a matplotlib ``figure`` to ``path`` as PNG, atomically (a temporary file
    beside it, then a rename: a reader never sees half a file); returns ``path``.
    A ``title`` is also the PNG's ``Title`` text."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        figure.savefig(tmp, format="png", metadata={"Title": title} if title else None)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


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
    return save_png(figure, path, title)
