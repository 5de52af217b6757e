"""The YAML runner's training loop: one function for servers and workers.

:func:`train` is what every process of a ``psfleet train`` job runs: it builds the
model, and then either serves tables (server) or trains on its share of the data
(worker), showing a progress bar with examples/s, loss and running AUC on worker 0.
After the last epoch every worker flushes its pushes, and worker 0 evaluates the
test data on the final parameters and writes ``metrics.json`` to the output folder.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from psfleet import fleet
from psfleet.data import Batch, CriteoReader, list_data_files
from psfleet.fleet import DistributedOptimizer, DistributedStrategy
from psfleet.metrics import StreamingAuc, auc, log_loss
from psfleet.nn import SparseEmbedding
from psfleet.rec.config import TrainConfig
from psfleet.rec.models import build_model

__all__ = ["train", "evaluate", "OPTIMIZERS"]

logger = logging.getLogger(__name__)

OPTIMIZERS: dict[str, Any] = {
    "Adam": torch.optim.Adam, "SGD": torch.optim.SGD, "Adagrad": torch.optim.Adagrad}


def _files(paths: Path | Sequence[Path]) -> list[Path]:
    items = [paths] if isinstance(paths, Path) else list(paths)
    return [f for p in items for f in list_data_files(p)]


def evaluate(model: nn.Module, reader: CriteoReader) -> dict[str, float]:
    """AUC and log loss of ``model`` on every example of ``reader``; no table writes.

    Returns:
        ``{"auc", "logloss", "examples"}``.
    """
    model.eval()
    labels, probs = [], []
    with torch.no_grad():
        for batch in reader:
            labels.append(batch.labels.numpy())
            probs.append(torch.sigmoid(model(batch.sparse, batch.dense)).numpy())
    model.train()
    y, p = np.concatenate(labels), np.concatenate(probs)
    return {"auc": auc(y, p), "logloss": log_loss(y, p), "examples": int(y.size)}


def _with_prefetch(reader: CriteoReader, embeddings: list[SparseEmbedding]
                   ) -> Iterator[Batch]:
    """Yield the batches, starting each next batch's row pulls before yielding one.

    The pulls of batch t+1 overlap the forward and backward of batch t (async mode;
    ``SparseEmbedding.prefetch`` does nothing in the other modes).
    """
    batches = iter(reader)
    current = next(batches, None)
    while current is not None:
        upcoming = next(batches, None)
        if upcoming is not None:
            for embedding in embeddings:
                embedding.prefetch(upcoming.sparse)
        yield current
        current = upcoming


def _train_epoch(model: nn.Module, optimizer: DistributedOptimizer, reader: CriteoReader,
                 epoch: int, config: TrainConfig, show: bool) -> dict[str, float]:
    loss_fn = nn.BCEWithLogitsLoss()
    running = StreamingAuc()
    reader.set_epoch(epoch)
    total_loss, examples, start = 0.0, 0, time.perf_counter()
    bar = tqdm(total=len(reader), desc=f"epoch {epoch + 1}/{config.runner.epochs}",
               disable=not show, mininterval=0.5, unit="batch", dynamic_ncols=True)
    embeddings = [m for m in model.modules() if isinstance(m, SparseEmbedding)]
    for step, batch in enumerate(_with_prefetch(reader, embeddings)):
        logits = model(batch.sparse, batch.dense)
        loss = loss_fn(logits, batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        n = len(batch)
        total_loss += loss.item() * n
        examples += n
        if show:
            running.update(batch.labels, torch.sigmoid(logits.detach()))
            bar.update(1)
            if (step + 1) % config.runner.print_interval == 0:
                rate = examples / (time.perf_counter() - start)
                bar.set_postfix(ex_s=f"{rate:,.0f}", loss=f"{total_loss / examples:.4f}",
                                auc=f"{running.compute():.4f}")
    bar.close()
    wall = time.perf_counter() - start
    return {"epoch": epoch + 1, "loss": total_loss / max(examples, 1),
            "auc": running.compute() if show else float("nan"), "examples": examples,
            "examples_per_s": examples / wall, "wall_s": wall}


def train(config: TrainConfig) -> dict[str, Any] | None:
    """Run this process's part of the job described by ``config``.

    The role comes from the environment (``fleet.init``): a server serves until the
    workers stop it; a worker trains; with no job environment the process trains
    alone against in-process tables.

    Returns:
        On worker 0, the metrics written to ``<model_save_path>/metrics.json``;
        otherwise None.

    Raises:
        ConfigError, DataError: bad configuration or data (names the field or file).
    """
    runner, hp = config.runner, config.hyper_parameters
    torch.set_num_threads(runner.thread_num)
    torch.manual_seed(runner.seed)
    # Only an explicit cluster.server_wait_timeout_s overrides PSFLEET_SERVER_WAIT_TIMEOUT_S.
    explicit = "server_wait_timeout_s" in config.cluster.model_fields_set
    fleet.init(strategy=DistributedStrategy(
        mode=runner.sync_mode, geo_step=runner.geo_step,
        server_wait_timeout_s=config.cluster.server_wait_timeout_s if explicit else None))
    embedding = SparseEmbedding(hp.sparse_feature_dim, name="embedding",
                                initializer=hp.embedding_initializer,
                                initial_range=hp.embedding_init_range)
    model = build_model(runner.model, embedding=embedding,
                        embedding_dim=hp.sparse_feature_dim, fc_sizes=hp.fc_sizes)
    optimizer = fleet.distributed_optimizer(
        OPTIMIZERS[hp.optimizer.class_](model.parameters(), lr=hp.optimizer.learning_rate))
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return None

    index, workers = fleet.worker_index(), fleet.worker_num()
    first = index == 0
    reader = CriteoReader(_files(runner.train_data_dir), runner.batch_size, index, workers,
                          shuffle_seed=runner.seed if runner.shuffle else None)
    test_reader = (CriteoReader(_files(runner.test_data_dir), 4096)
                   if first and runner.test_data_dir is not None else None)
    if runner.sync_mode == "sync":  # every worker must run the same number of steps
        dropped = reader.truncate(reader.total_lines // workers)
        if dropped:
            logger.info("sync mode: dropped the last %d example(s) of this worker's share "
                        "so that every worker runs the same number of steps", dropped)
    logger.info("batch_size %d x %d workers = global batch %d; %d examples on this worker",
                runner.batch_size, workers, runner.batch_size * workers, reader.num_examples)
    fleet.init_worker()
    job_start = time.perf_counter()
    epochs = []
    for epoch in range(runner.epochs):
        stats = _train_epoch(model, optimizer, reader, epoch, config, show=first)
        epochs.append(stats)
        logger.info("epoch %d/%d: loss %.5f, train auc %.4f, %d examples, %.0f examples/s "
                    "on this worker, %.1f s", stats["epoch"], runner.epochs, stats["loss"],
                    stats["auc"], stats["examples"], stats["examples_per_s"], stats["wall_s"])
    fleet.flush()
    fleet.barrier_worker()  # every worker's pushes are applied past this point
    train_wall = time.perf_counter() - job_start
    metrics: dict[str, Any] | None = None
    if first:
        optimizer.refresh()
        all_examples = runner.epochs * reader.total_lines  # every worker's share
        metrics = {
            "model": runner.model, "sync_mode": runner.sync_mode,
            "server_num": fleet.server_num(), "worker_num": workers,
            "batch_size": runner.batch_size, "global_batch": runner.batch_size * workers,
            "epochs": epochs, "train_wall_s": train_wall,
            "examples_per_s": all_examples / train_wall,
            "test": evaluate(model, test_reader) if test_reader is not None else None,
        }
        out = runner.model_save_path
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        logger.info("metrics written to %s", out / "metrics.json")
    fleet.stop_worker()
    return metrics
