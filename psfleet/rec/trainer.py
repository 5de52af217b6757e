"""The YAML runner's training loop: one function for servers and workers.

:func:`train` is what every process of a ``psfleet train`` job runs: it builds the
model, and then either serves tables (server) or trains on its share of the data
(worker), showing a progress bar with examples/s, loss and running AUC on worker 0.
After the last epoch every worker flushes its pushes, and worker 0 evaluates the
test data on the final parameters and writes ``metrics.json`` to the output folder:
past the stop barrier and before it stops the servers (``fleet.stop_worker(finish)``),
so the other workers have left and no barrier deadline counts a long evaluation or
export against a finished job.

Worker 0 opens the run folder (:mod:`psfleet.rec.run_folder`: ``config.yaml``, the
``latest`` link) and records the run there (:mod:`psfleet.rec.reporting`): TensorBoard
scalars in ``tensorboard/``, ``curves.png`` at the end, the export, and the malformed lines
its passes skipped. With ``runner.valid_data_dir`` the job validates every
``runner.valid_interval`` epochs and after the last one: every worker flushes its
pushes and meets the others, worker 0 evaluates on the tables as they are then (no
push changes them meanwhile: the others wait at a second barrier), in every mode; with
``runner.early_stopping`` it also decides whether every worker stops there
(:mod:`psfleet.rec.early_stopping`).
On Ctrl-C worker 0 writes ``metrics.json`` with the finished epochs and an
``interrupted`` entry and raises :class:`~psfleet.rec.reporting.TrainingInterrupted`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from psfleet import fleet, interrupts
from psfleet.checkpoint import Cursor
from psfleet.data import Batch, Reader
from psfleet.errors import DataError
from psfleet.fleet import DistributedOptimizer, rule_of_class
from psfleet.fleet.role_info import restart_num
from psfleet.fleet.role_maker import (
    RoleMaker,
)
from psfleet.job.modes import mode_spec
from psfleet.metrics import StreamingAuc
from psfleet.nn import FeatureEmbeddings, Prefetch, SparseEmbedding, use_prefetched
from psfleet.rec.config import TrainConfig, strategy_of
from psfleet.rec.curves import TENSORBOARD_DIR, RunRecorder
from psfleet.rec.early_stopping import EarlyStopping
from psfleet.rec.features import build_runner_model, model_inputs, prefetchers
from psfleet.rec.json_file import finite
from psfleet.rec.pass_loop import pass_batches
from psfleet.rec.passes import (
    PassBook,
    PassPlan,
    restored_passes,
    sparse_table_names,
    table_totals,
)
from psfleet.rec.readers import build_test_reader, build_train_reader, exchange_dir
from psfleet.rec.reporting import (
    Progress,
    TrainingInterrupted,
    evaluate,
    finish_run,
    record_interrupt,
    write_worker_tally,
)
from psfleet.rec.resume import CheckpointTally, agreed_share, resume_cursor
from psfleet.rec.run_folder import open_run_folder
from psfleet.rec.validation import finish_pass, record_valid, valid_reader, validate_between

__all__ = ["train", "evaluate"]

logger = logging.getLogger(__name__)


def _prefetch(modules: list[FeatureEmbeddings | SparseEmbedding],
              batch: Batch) -> list[Prefetch | None]:
    """Start pulling ``batch``'s rows in every module that pulls (async mode only)."""
    handles: list[Prefetch | None] = []
    for module in modules:
        if isinstance(module, FeatureEmbeddings):
            handles.extend(module.prefetch(batch.sparse, batch.jagged))
        else:
            handles.append(module.prefetch(batch.sparse))
    return handles


def _with_prefetch(reader: Reader, modules: list[FeatureEmbeddings | SparseEmbedding]
                   ) -> Iterator[tuple[Batch, list[Prefetch | None]]]:
    """Yield each batch with its prefetch handles, starting the next batch's row pulls
    before yielding one.

    The pulls of batch t+1 overlap the forward and backward of batch t (async mode;
    ``SparseEmbedding.prefetch`` returns None in the other modes). Run the forward of
    a batch inside ``use_prefetched(handles)``.
    """
    batches = iter(reader)
    current = next(batches, None)
    handles: list[Prefetch | None] = []
    while current is not None:
        upcoming = next(batches, None)
        coming = _prefetch(modules, upcoming) if upcoming is not None else []
        yield current, handles
        current, handles = upcoming, coming


def _train_epoch(model: nn.Module, optimizer: DistributedOptimizer, reader: Reader,
                 epoch: int, config: TrainConfig, show: bool, start_batch: int = 0,
                 after_batch: Callable[[int], None] | None = None,
                 progress: Progress | None = None,
                 recorder: RunRecorder | None = None, desc: str | None = None
                 ) -> dict[str, float]:
    """One epoch; ``start_batch`` batches already trained (resume) are skipped, and
    ``after_batch(k)`` runs after the epoch's k-th batch (checkpoints). ``progress``
    follows the batches done; ``recorder`` gets a point every ``print_interval`` steps;
    ``show`` draws the progress bar (titled ``desc``) and keeps the running AUC
    (worker 0)."""
    loss_fn = nn.BCEWithLogitsLoss()
    running = StreamingAuc()
    reader.set_epoch(epoch)
    if start_batch:
        reader.set_start_batch(start_batch)
    total_loss, examples, start = 0.0, 0, time.perf_counter()
    interval_loss, interval_examples, interval_start = 0.0, 0, start
    bar = tqdm(total=reader.num_batches, initial=start_batch,
               desc=desc or f"epoch {epoch + 1}/{config.runner.epochs}",
               disable=not show, mininterval=0.5, unit="batch", dynamic_ncols=True)
    modules = list(prefetchers(model))
    batches = (((batch, []) for batch in pass_batches(reader, model))
               if mode_spec(config.runner.sync_mode).passes else _with_prefetch(reader, modules))
    for step, (batch, prefetched) in enumerate(batches):
        interrupts.raise_pending()  # a stop signal whose interrupt was swallowed
        with use_prefetched(prefetched):
            logits = model(*model_inputs(batch))
        loss = loss_fn(logits, batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step(labels=batch.labels)  # ctr tables: shows and clicks per key
        if progress is not None:
            progress.batch = start_batch + step + 1
        if after_batch is not None:
            after_batch(start_batch + step + 1)
        n = len(batch)
        batch_loss = loss.item() * n
        total_loss += batch_loss
        examples += n
        interval_loss += batch_loss
        interval_examples += n
        if show:
            running.update(batch.labels, torch.sigmoid(logits.detach()))
            bar.update(1)
        if (step + 1) % config.runner.print_interval == 0 and (show or recorder is not None):
            now = time.perf_counter()
            running_auc = running.compute() if show else float("nan")
            bar.set_postfix(ex_s=f"{examples / (now - start):,.0f}",
                            loss=f"{total_loss / examples:.4f}", auc=f"{running_auc:.4f}")
            if recorder is not None:
                recorder.step(optimizer.steps, interval_loss / interval_examples,
                              running_auc, interval_examples / (now - interval_start))
            interval_loss, interval_examples, interval_start = 0.0, 0, now
    bar.close()
    wall = time.perf_counter() - start
    return {"epoch": epoch + 1, "loss": total_loss / max(examples, 1),
            "auc": running.compute() if show else float("nan"), "examples": examples,
            "examples_per_s": examples / wall, "wall_s": wall}


def _recorder(config: TrainConfig, first: bool) -> RunRecorder:
    """Worker 0's recorder writes ``<run folder>/tensorboard/`` and samples every
    server's Stats (not in collective mode); worker k's writes ``tensorboard/worker_k/``."""
    folder = config.runner.run_dir / TENSORBOARD_DIR
    if not first:
        return RunRecorder(folder / f"worker_{fleet.worker_index()}")
    return RunRecorder(folder, None if fleet.is_collective() else fleet.server_stats)


def train(config: TrainConfig, role_maker: RoleMaker | None = None) -> dict[str, Any] | None:
    """Train: this process's part of the job described by ``config`` as a worker, or
    alone against in-process tables when there is no job. Servers do not come here
    (:func:`psfleet.rec.roles.run` serves them without torch).

    Args:
        config: the checked runner config.
        role_maker: :func:`~psfleet.rec.roles.role_maker_of` ``(config)``; None: the
            environment's (``fleet.init``).

    Returns:
        On worker 0, the metrics written to ``<run folder>/metrics.json``;
        otherwise None.

    Raises:
        ConfigError, DataError: bad configuration or data (names the field or file).
        TrainingInterrupted: worker 0 got Ctrl-C (a KeyboardInterrupt, after writing
            metrics.json with the finished epochs); other workers re-raise theirs.
    """
    runner, hp = config.runner, config.hyper_parameters
    torch.set_num_threads(runner.thread_num)
    torch.manual_seed(runner.seed)
    # The config was checked before the job started (runner.use_gpu is false: CPU).
    fleet.init(role_maker, strategy=strategy_of(config))
    model = build_runner_model(config, fleet.worker_index())  # its own dropout masks
    # hyper_parameters.optimizer.class names a torch.optim class whose rule the tables run.
    optimizer = fleet.distributed_optimizer(
        params=model.parameters(),
        rule=rule_of_class(hp.optimizer.class_, hp.optimizer.learning_rate))
    first = fleet.worker_index() == 0
    if first:
        open_run_folder(config)
    progress = Progress(valid=[] if runner.valid_data_dir is not None else None)
    recorder = _recorder(config, first)
    readers: dict[str, Reader | None] = {}
    try:
        return _work(config, model, optimizer, progress, recorder, readers)
    except KeyboardInterrupt as exc:
        if not first or isinstance(exc, TrainingInterrupted):
            raise
        raise record_interrupt(config, progress, readers.get("train"), optimizer.steps,
                               recorder) from exc
    finally:
        if recorder is not None:
            recorder.close()


def _work(config: TrainConfig, model: nn.Module, optimizer: DistributedOptimizer,
          progress: Progress, recorder: RunRecorder | None,
          readers: dict[str, Reader | None]) -> dict[str, Any] | None:
    """A worker's part of :func:`train`; ``readers`` is filled as they are built.

    Epochs run over the passes of :class:`~psfleet.rec.passes.PassPlan` (one pass
    without ``runner.train_passes``): the reader is rebuilt at each pass, and at a
    pass's end :func:`~psfleet.rec.passes.end_pass` runs, then the pass's validation
    and a checkpoint (taken once the next pass's reader exists, so that it carries
    that pass's agreed examples per worker)."""
    runner, checkpoint = config.runner, config.runner.checkpoint
    # Collective mode: the model all-reduces gradients (DDP); elsewhere this is `model`.
    train_model = fleet.distributed_model(model)
    index, workers = fleet.worker_index(), fleet.worker_num()
    first = index == 0
    equal_steps = runner.needs_equal_steps
    plan = PassPlan.of(config)
    total = plan.total_epochs
    agreed = agreed_share(checkpoint) if equal_steps and restart_num() > 0 else None
    current = plan.start_pass(checkpoint)
    reader = build_train_reader(plan.config_for(config, current), index, workers,
                                equal_steps=equal_steps, example_limit=agreed,
                                tag=f"pass-{current + 1}" if plan.online else "")
    readers["train"] = reader
    share: dict[str, object] = (
        {"examples_per_worker": reader.num_examples} if equal_steps else {})
    if first:
        readers["test"], readers["valid"] = build_test_reader(config), valid_reader(config)
        for name, built in readers.items():
            progress.malformed.observe(name, built)
    fleet.init_worker()
    tally = CheckpointTally(checkpoint)
    early = (EarlyStopping(runner.early_stopping, exchange_dir(runner), workers)
             if runner.early_stopping is not None else None)
    resume = resume_cursor(checkpoint, reader, share, tally, roll_over=not plan.online)
    book = None
    if plan.online:
        done = restored_passes(checkpoint) if resume.epoch or resume.batch else []
        share["passes"] = done
        if first:
            resumed = bool(done) or resume.epoch > 0 or resume.batch > 0
            baseline = (table_totals(fleet.server_stats(), sparse_table_names(config))
                        if resumed and not fleet.is_collective() else None)
            book = PassBook(done, baseline)
            progress.passes = book.entries
    progress.started = time.perf_counter()
    progress.epoch = resume.epoch
    pending: Cursor | None = None  # a pass-end checkpoint, taken with the next reader
    for epoch in range(resume.epoch, total):
        k = plan.pass_of(epoch)
        if k != current:
            reader = build_train_reader(plan.config_for(config, k), index, workers,
                                        equal_steps=equal_steps, tag=f"pass-{k + 1}")
            readers["train"], current = reader, k
            if equal_steps:
                share["examples_per_worker"] = reader.num_examples
        if pending is not None:
            tally.save(pending, share)
            pending = None
        after_batch = None
        if checkpoint is not None:
            def after_batch(done: int, epoch: int = epoch, reader: Reader = reader) -> None:
                if checkpoint.due_after_batch(done, reader.num_batches):
                    tally.save(Cursor(epoch=epoch, batch=done, step=optimizer.steps), share)
        start_batch = resume.batch if epoch == resume.epoch else 0
        progress.epoch, progress.batch = epoch, start_batch
        # Skip only an epoch a resumed run had finished (its cursor at the last batch);
        # an epoch of 0 batches is trained (on nothing), so it is caught below.
        if not start_batch or reader.num_batches is None or start_batch < reader.num_batches:
            desc = (f"pass {k + 1}/{plan.count} epoch {epoch % plan.epochs + 1}/"
                    f"{plan.epochs}" if plan.online else None)
            with fleet.join():  # collective: ranks with fewer batches wait for the others
                stats = _train_epoch(train_model, optimizer, reader, epoch, config,
                                     show=first, start_batch=start_batch,
                                     after_batch=after_batch, progress=progress,
                                     recorder=recorder, desc=desc)
            if plan.online:
                stats["pass"] = k + 1
            progress.epochs.append(stats)
            progress.job_lines += reader.total_lines
            progress.malformed.observe("train", reader)  # every worker's: its tally
            if recorder is not None:
                recorder.epoch(stats)
            auc = "" if math.isnan(stats["auc"]) else f", train auc {stats['auc']:.4f}"
            logger.info("epoch %d/%d: loss %.5f%s, %d examples, %.0f examples/s on this "
                        "worker, %.1f s", stats["epoch"], total, stats["loss"], auc,
                        stats["examples"], stats["examples_per_s"], stats["wall_s"])
        progress.epoch, progress.batch = epoch + 1, 0  # the next one, if any
        if plan.ends_pass(epoch):
            if finish_pass(config, plan, k, epoch, model, optimizer, readers, book,
                         progress, recorder):
                share["passes"] = finite(book.entries) if book is not None else []
            if checkpoint is not None and epoch + 1 < total:
                pending = Cursor(epoch=epoch + 1, batch=0, step=optimizer.steps)
            continue
        if (checkpoint is not None and epoch + 1 < total
                and checkpoint.due_after_epoch(epoch + 1)):
            tally.save(Cursor(epoch=epoch + 1, batch=0, step=optimizer.steps), share)
        if (runner.valid_data_dir is not None and not plan.online and epoch + 1 < total
                and (epoch + 1) % runner.valid_interval == 0):  # the last one: below
            valid, stop = validate_between(model, optimizer, readers.get("valid"), early, epoch + 1)
            record_valid(progress, recorder, valid, epoch + 1, total)
            if stop:
                progress.early_stopped = early.stopped if early is not None else None
                break
    epochs = progress.epochs
    if epochs and not any(stats["examples"] for stats in epochs):
        raise DataError(
            f"worker {index} trained on 0 examples in {len(epochs)} epoch(s): every line of "
            "its share of runner.train_data_dir was skipped as malformed (see the warnings "
            "above) or the share is empty (fewer lines than workers). Check the data's "
            "format against runner.parser, or use fewer workers")
    if checkpoint is not None:  # the end of training (also flushes and meets)
        tally.save(Cursor(epoch=total, batch=0, step=optimizer.steps), share)
    if not first:  # worker 0 adds it to metrics.json after the barrier
        write_worker_tally(config, progress, index)
    fleet.flush()
    fleet.barrier_worker()  # every worker's pushes are applied past this point
    finished: list[dict[str, Any]] = []

    def finish() -> None:  # worker 0, past the stop barrier: no one waits for it
        optimizer.refresh()
        finished.append(finish_run(config, model, progress, reader, readers, recorder))

    fleet.stop_worker(finish if first else None)
    if first:
        tally.summarize()
    return finished[0] if finished else None
