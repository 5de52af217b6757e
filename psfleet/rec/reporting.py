"""What worker 0 reports of a run: the evaluations, ``metrics.json`` (written
atomically), the malformed lines its passes skipped, and the record of a Ctrl-C.

``metrics.json`` (in the run folder, :mod:`psfleet.rec.run_folder`) holds: ``run_name``,
``model``, ``sync_mode``,
``server_num``, ``worker_num``, ``batch_size``, ``global_batch``; ``batch_averaged``
(an update averages the workers' batches: the global batch is the batch one update
sees), ``lr_scaling`` (``runner.lr_scaling``) and ``lr_factor`` (what it multiplied
the learning rate by, :mod:`psfleet.fleet.lr_scaling`); ``epochs`` (per epoch:
loss, train AUC, examples, examples/s, wall time); ``train_wall_s`` and the job's
``examples_per_s``; ``test`` and each ``valid`` entry (AUC, log loss, COPC, examples;
``valid`` is None without ``runner.valid_data_dir``); ``malformed_lines`` (per data
set: malformed lines skipped, lines read, passes, the first bad ``file:line``; for
``train`` summed over every worker whose tally reached worker 0, and ``workers``: how
many did, :func:`write_worker_tally`); each epoch's ``job_examples`` (every counted
worker's examples of that epoch; ``examples`` is worker 0's);
``tensorboard`` and ``curves`` (paths, :mod:`psfleet.rec.curves`); ``export`` (the
exported model's folder, None when not exported); ``early_stopped`` (None, or
``{"epoch", "metric", "best", "best_epoch"}``); ``interrupted``
(None, or ``{"epoch", "step", "batch", "checkpoint"}`` after Ctrl-C); ``passes`` (None,
or with ``runner.train_passes`` one entry per pass done: its tables' rows, bytes and
lifecycle counts, its save and validation, :mod:`psfleet.rec.passes`; epochs are then
numbered across the passes); ``tables`` (None in collective mode or when interrupted;
else per sparse table at the end of training, summed over the servers: ``rows``,
``bytes`` and the lifecycle counts ``admitted``, ``rejected``, ``evicted``,
``deleted``). It is written
under a temporary name and renamed, so a reader never sees a partial file; NaN and
infinities become null (:mod:`psfleet.rec.json_file`).

On Ctrl-C the trainer raises :class:`TrainingInterrupted` (a ``KeyboardInterrupt``)
carrying the epoch and step reached, the metrics file and the newest complete
checkpoint (:func:`newest_checkpoint`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from psfleet import fleet
from psfleet.checkpoint import CheckpointConfig, CheckpointStore
from psfleet.checkpoint.manifest import MANIFEST_NAME
from psfleet.data import Reader
from psfleet.data.pipeline import PassStats
from psfleet.fleet.lr_scaling import averages_batches, lr_factor
from psfleet.job.modes import mode_spec
from psfleet.metrics import auc, copc, log_loss
from psfleet.rec.config import TrainConfig
from psfleet.rec.curves import CURVES_NAME, RunRecorder, plot_curves
from psfleet.rec.features import model_inputs
from psfleet.rec.json_file import write_json_atomic
from psfleet.rec.passes import sparse_table_names, table_totals
from psfleet.rec.predict import export_trained_model
from psfleet.rec.readers import exchange_dir
from psfleet.types import Mode

__all__ = ["METRICS_NAME", "MalformedTally", "Progress", "TrainingInterrupted", "evaluate",
           "add_worker_tallies", "finish_run", "newest_checkpoint", "record_interrupt",
           "run_metrics", "run_title", "write_worker_tally"]

logger = logging.getLogger(__name__)

METRICS_NAME = "metrics.json"


class MalformedTally:
    """Malformed (skipped) lines of worker 0's passes, per data set.

    :meth:`observe` a reader after each pass (an in-memory reader has one pass, its
    load; a QueueDataset one per epoch); the same pass observed twice counts once.
    """

    def __init__(self) -> None:
        self._passes: dict[str, list[PassStats]] = {}

    def observe(self, name: str, reader: object | None) -> None:
        """Count ``reader``'s last pass (``last_pass``, or that of the reader it wraps
        as ``.reader``, e.g. a DataLoaderReader's) under ``name``; nothing for a reader
        without one."""
        stats = None
        for _ in range(4):  # wrappers of wrappers, not forever
            stats = getattr(reader, "last_pass", None)
            if stats is not None or not hasattr(reader, "reader"):
                break
            reader = getattr(reader, "reader")  # noqa: B009 - typed as object
        if not isinstance(stats, PassStats):
            return
        passes = self._passes.setdefault(name, [])
        if not any(seen is stats for seen in passes):
            passes.append(stats)

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per data set: ``{"malformed", "lines", "passes", "first"}``: malformed lines
        skipped and lines read (summed over the passes), the pass count, and the first
        malformed line (``file:line reason``) or None."""
        return {name: {"malformed": sum(p.malformed for p in passes),
                       "lines": sum(p.lines for p in passes), "passes": len(passes),
                       "first": next((p.first_malformed for p in passes
                                      if p.first_malformed), None)}
                for name, passes in self._passes.items()}

    def describe(self) -> str:
        """One phrase for a log line: ``train 12 of 7200 lines, test 0 of 800 lines``."""
        return ", ".join(f"{name} {s['malformed']} of {s['lines']} lines"
                         for name, s in self.summary().items()) or "no pass read"


def _tally_path(config: TrainConfig, index: int) -> Path:
    return exchange_dir(config.runner) / f"tally-worker-{index}.json"


def write_worker_tally(config: TrainConfig, progress: Progress, index: int) -> None:
    """A worker other than 0, before the job's last worker barrier: its training
    passes' malformed lines and each epoch's examples, as a file in the folder the
    job's workers share (``runner.exchange_dir``), which worker 0 adds to metrics.json
    after the barrier (no RPC of its own). A write that fails is a warning: worker 0
    then counts without it and says so (``workers``).
    """
    tally = {"train": progress.malformed.summary().get("train"),
             "examples": [int(e["examples"]) for e in progress.epochs]}
    try:
        write_json_atomic(_tally_path(config, index), tally)
    except OSError as exc:
        logger.warning("worker %d: its malformed-line tally could not be written for worker "
                       "0 (metrics.json counts without it): %s", index, exc)


def add_worker_tallies(config: TrainConfig, metrics: dict[str, Any], worker_num: int) -> None:
    """Worker 0 after the last barrier: add the other workers' tallies
    (:func:`write_worker_tally`) found in the exchange folder to ``metrics``, in place:
    ``malformed_lines.train`` summed (``first``: the first worker's with one) with
    ``workers`` (how many were counted), and each epoch's ``job_examples``; the tally
    files read are removed. A tally missing (a folder the workers do not share, or a
    failed write) is left out; the count says so."""
    own = metrics["malformed_lines"].get("train")
    epochs = metrics["epochs"]
    counted = 1
    total = dict(own) if own is not None else None
    examples = [int(e["examples"]) for e in epochs]
    for index in range(1, worker_num):
        path = _tally_path(config, index)
        try:
            tally = json.loads(path.read_text())
            path.unlink()  # the exchange folder holds no leftovers of a finished run
        except (OSError, ValueError):
            continue
        counted += 1
        theirs = tally.get("train")
        if theirs is not None and total is not None:
            total["malformed"] += int(theirs["malformed"])
            total["lines"] += int(theirs["lines"])
            total["first"] = total["first"] or theirs.get("first")
        for epoch, count in enumerate(tally.get("examples", [])[:len(examples)]):
            examples[epoch] += int(count)
    if total is not None:
        total["workers"] = counted
        metrics["malformed_lines"]["train"] = total
    for entry, count in zip(epochs, examples, strict=True):
        entry["job_examples"] = count
    if counted < worker_num:
        logger.warning("metrics.json counts the malformed lines and examples of %d of %d "
                       "workers: the others' tallies are not in %s (a folder every worker "
                       "must share, runner.exchange_dir)", counted, worker_num,
                       exchange_dir(config.runner))


def run_title(model: str, sync_mode: Mode, server_num: int, worker_num: int) -> str:
    """How a run ran, for the curves' title: ``dnn, one process`` (in-process tables,
    where the mode changes nothing), ``dnn, collective, 2 workers`` or ``dnn, async,
    1 server x 2 workers``."""
    if server_num == 0 and worker_num == 1:
        return f"{model}, one process"
    workers = f"{worker_num} worker{'s' if worker_num != 1 else ''}"
    if not mode_spec(sync_mode).servers:
        return f"{model}, {sync_mode}, {workers}"
    return f"{model}, {sync_mode}, {server_num} server{'s' if server_num != 1 else ''} x {workers}"


def newest_checkpoint(checkpoint: CheckpointConfig | None) -> str | None:
    """The URL of the newest complete checkpoint (its manifest, written last, exists;
    files not verified, so it is quick on Ctrl-C), or None without checkpoints or when
    the folder cannot be listed."""
    if checkpoint is None:
        return None
    try:
        store = CheckpointStore(checkpoint.checkpoint_dir)
        for name in store.names():
            if store.storage.exists(name, MANIFEST_NAME):
                return store.storage.child(name).url
    except OSError:
        return None
    return None


class TrainingInterrupted(KeyboardInterrupt):
    """Training was stopped by Ctrl-C (SIGINT); what was reached and saved.

    A ``KeyboardInterrupt``: code catching that still catches it. ``str()`` is one line
    for the console.

    Args:
        epoch: the 1-based epoch in progress.
        step: optimizer steps done by this worker (the checkpoints' step count).
        checkpoint: URL of the newest complete checkpoint, or None.
        metrics_path: the metrics.json holding the finished epochs, or None when it
            could not be written.
    """

    def __init__(self, epoch: int, step: int, checkpoint: str | None,
                 metrics_path: str | None) -> None:
        self.epoch, self.step = epoch, step
        self.checkpoint, self.metrics_path = checkpoint, metrics_path
        super().__init__(self._line())

    def _line(self) -> str:
        saved = (f"metrics of the finished epochs in {self.metrics_path}"
                 if self.metrics_path else "no metrics written")
        resume = (f"newest checkpoint {self.checkpoint} (run the same command again to "
                  "resume from it)" if self.checkpoint else
                  "no checkpoint to resume from (set runner.checkpoint to have one)")
        return f"interrupted in epoch {self.epoch} at step {self.step}; {saved}; {resume}"

    def __str__(self) -> str:
        return self._line()

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.epoch, self.step, self.checkpoint, self.metrics_path))


def evaluate(model: nn.Module, reader: Reader) -> dict[str, float]:
    """AUC, log loss and COPC of ``model`` on every example of ``reader``; no table
    writes.

    Returns:
        ``{"auc", "logloss", "copc", "examples"}`` (:mod:`psfleet.metrics`).
    """
    model.eval()
    labels, probs = [], []
    with torch.no_grad():
        for batch in reader:
            labels.append(batch.labels.numpy())
            probs.append(torch.sigmoid(model(*model_inputs(batch))).numpy())
    model.train()
    y, p = np.concatenate(labels), np.concatenate(probs)
    return {"auc": auc(y, p), "logloss": log_loss(y, p), "copc": copc(y, p),
            "examples": int(y.size)}


@dataclass
class Progress:
    """Where the run is and what worker 0 measured so far (for metrics.json, also on
    Ctrl-C). The trainer updates it as it goes."""

    epoch: int = 0  # 0-based epoch in progress: epochs finished (runner.epochs: all)
    batch: int = 0  # batches done in it
    epochs: list[dict[str, Any]] = field(default_factory=list)
    valid: list[dict[str, Any]] | None = None
    malformed: MalformedTally = field(default_factory=MalformedTally)
    started: float = field(default_factory=time.perf_counter)
    early_stopped: dict[str, Any] | None = None  # rec.early_stopping.EarlyStopping.stopped
    passes: list[dict[str, Any]] | None = None  # rec.passes.PassBook.entries (online)
    #: every worker's lines of the epochs trained in this process (each epoch's reader's
    #: ``total_lines``: passes may differ in size); the job's examples/s counts these.
    job_lines: int = 0


def run_metrics(config: TrainConfig, progress: Progress,
                recorder: RunRecorder | None) -> dict[str, Any]:
    """metrics.json's content so far (module docstring); ``test``, ``curves`` and
    ``interrupted`` are None. The job's examples/s counts every worker's lines of the
    epochs this process trained (``progress.job_lines``) over the wall time since
    ``progress.started``."""
    runner = config.runner
    workers = fleet.worker_num()
    train_wall = time.perf_counter() - progress.started
    all_examples = progress.job_lines
    aggregated = runner.a_sync_configs.global_batch_aggregation
    return {
        "run_name": runner.run_name, "model": runner.model, "sync_mode": runner.sync_mode,
        "server_num": fleet.server_num(), "worker_num": workers,
        "batch_size": runner.batch_size, "global_batch": runner.batch_size * workers,
        "batch_averaged": averages_batches(runner.sync_mode, aggregated),
        "lr_scaling": runner.lr_scaling,
        "lr_factor": lr_factor(runner.lr_scaling, runner.sync_mode, workers, aggregated),
        "epochs": progress.epochs, "train_wall_s": train_wall,
        "examples_per_s": all_examples / train_wall, "test": None, "valid": progress.valid,
        "malformed_lines": progress.malformed.summary(),
        "tensorboard": str(recorder.log_dir) if recorder is not None else None,
        "curves": None, "export": None, "early_stopped": progress.early_stopped,
        "interrupted": None, "passes": progress.passes, "tables": None,
    }


def record_interrupt(config: TrainConfig, progress: Progress, reader: Reader | None,
                     step: int, recorder: RunRecorder | None) -> TrainingInterrupted:
    """Worker 0 on Ctrl-C: write metrics.json (the finished epochs, ``interrupted``)
    atomically, log one line, and return the exception to raise. No RPC: the servers
    may be stopping. A failed write is logged (the exception's metrics_path is None).

    Args:
        reader: the training reader (None if not built yet).
        step: the optimizer steps done.
    """
    runner = config.runner
    passes = len(runner.train_passes) if runner.train_passes is not None else 1
    epoch = min(progress.epoch + 1, runner.epochs * passes)
    checkpoint = newest_checkpoint(runner.checkpoint)
    progress.malformed.observe("train", reader)
    metrics = run_metrics(config, progress, recorder)
    metrics["interrupted"] = {"epoch": epoch, "step": step, "batch": progress.batch,
                              "checkpoint": checkpoint}
    path: str | None = None
    try:
        path = str(write_json_atomic(runner.run_dir / METRICS_NAME, metrics))
    except OSError as exc:
        logger.error("interrupted; metrics.json could not be written: %s", exc)
    interrupted = TrainingInterrupted(epoch, step, checkpoint, path)
    logger.warning("%s", interrupted)
    return interrupted


def finish_run(config: TrainConfig, model: nn.Module, progress: Progress, reader: Reader,
               readers: dict[str, Reader | None], recorder: RunRecorder | None
               ) -> dict[str, Any]:
    """Worker 0 after the last barrier (every push applied, dense values refreshed):
    the last validation (at the last epoch trained, ``progress.epoch``), the test
    evaluation, the curves, metrics.json (atomically) and the export
    (``runner.export_model``, to ``runner.model_dir``; metrics.json is written again
    with its path once it is complete).

    Args:
        readers: ``{"valid", "test"}`` readers (None when not configured).

    Returns:
        The metrics written.

    Raises:
        OSError: metrics.json cannot be written (a failing plot is only a warning).
    """
    runner = config.runner
    done = progress.epoch
    metrics = run_metrics(config, progress, recorder)
    add_worker_tallies(config, metrics, fleet.worker_num())
    valid_reader, test_reader = readers["valid"], readers["test"]
    if (valid_reader is not None and progress.valid is not None
            and not (progress.valid and progress.valid[-1]["epoch"] == done)):
        progress.valid.append({"epoch": done, **evaluate(model, valid_reader)})
        if recorder is not None:
            recorder.evaluation("valid", progress.valid[-1], done)
    metrics["test"] = evaluate(model, test_reader) if test_reader is not None else None
    if not fleet.is_collective():  # every push applied: the tables as trained
        metrics["tables"] = table_totals(fleet.server_stats(), sparse_table_names(config))
    if recorder is not None and metrics["test"] is not None:
        recorder.evaluation("test", metrics["test"], done)
    out = runner.run_dir
    out.mkdir(parents=True, exist_ok=True)
    try:
        metrics["curves"] = str(plot_curves(
            out / CURVES_NAME, progress.epochs, progress.valid, metrics["test"],
            done, run_title(runner.model, runner.sync_mode, metrics["server_num"],
                            metrics["worker_num"])))
    except Exception as exc:  # noqa: BLE001 - a plot must not lose the run's metrics
        logger.warning("curves.png could not be drawn: %s", exc)
    write_json_atomic(out / METRICS_NAME, metrics)
    logger.info("metrics written to %s; curves %s; TensorBoard %s; malformed lines "
                "skipped: %s", out / METRICS_NAME, metrics["curves"], metrics["tensorboard"],
                progress.malformed.describe())
    if runner.export_model:  # after the evaluation: same values
        sample = next(iter(test_reader if test_reader is not None else reader), None)
        export_trained_model(config, model, metrics, sample)
        metrics["export"] = str(runner.model_dir)
        write_json_atomic(out / METRICS_NAME, metrics)
    return metrics
