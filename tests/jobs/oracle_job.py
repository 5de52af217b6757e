"""The oracle job: a small DNN trained with the fleet API, final parameters saved.

Run by fleetrun as servers and workers, or alone (no job environment: one worker on
in-process tables, the single-process reference). The same script, the fleet
paradigm:

- server: ``fleet.init_server()``, ``fleet.run_server()`` until worker 0 stops it.
- worker k of W: reads its share of ``--data`` (``CriteoReader`` lines k, k+W, ...,
  no shuffling), runs exactly ``--steps`` steps of batch ``--batch`` (starting the
  share again when it runs out), flushes, waits for every worker, and worker 0
  writes ``--out`` (.npz):

  - ``dense``: the flat dense parameters the servers hold (``optimizer.flat_values()``
    after a refresh), float32[total];
  - ``keys``, ``rows``: every key of the first ``steps * batch * W`` lines of
    ``--data`` (sorted, uint64[K]) and its row in the sparse table, float32[K, 4];
  - ``loss_before``, ``loss_after``, ``auc_before``, ``auc_after``: BCE and AUC of
    the model on all of ``--data`` before any step and after the last one;
  - ``train_losses``: worker 0's loss of each step.

So sync mode with W workers x batch b must write what one process with batch W*b
writes: worker k's batch j holds the lines of the single process's batch j whose
index is k modulo W.

Alone, several runs may share one process: ``oracle_job.py A :: B`` runs A, then B,
with a fresh fleet for each (``run_each.py``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from psfleet import fleet
from psfleet.data import CriteoReader
from psfleet.metrics import auc
from psfleet.nn import SparseEmbedding
from psfleet.rec.models import build_model

DIM = 4
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}


def evaluate(model: nn.Module, reader: CriteoReader) -> tuple[float, float]:
    """(mean BCE, AUC) of ``model`` over ``reader``; creates and pushes nothing."""
    model.eval()
    labels, logits = [], []
    with torch.no_grad():
        for batch in reader:
            labels.append(batch.labels)
            logits.append(model(batch.sparse, batch.dense))
    model.train()
    y, z = torch.cat(labels), torch.cat(logits)
    loss = float(nn.functional.binary_cross_entropy_with_logits(z, y))
    return loss, auc(y.numpy(), z.numpy())


def seen_keys(data: Path, lines: int) -> np.ndarray:
    """Distinct keys (sorted uint64) of the first ``lines`` examples of ``data``."""
    reader = CriteoReader([data], max(lines, 1))
    first = next(iter(reader))
    return np.unique(first.sparse[:lines].numpy().view(np.uint64))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["sync", "async", "geo"], default="sync")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--geo_step", type=int, default=5)
    parser.add_argument("--min_block_size", type=int, default=8192)
    parser.add_argument("--split_method", choices=["RoundRobin", "HashName"],
                        default="RoundRobin")
    parser.add_argument("--dc_asgd", action="store_true")
    parser.add_argument("--dc_asgd_lambda", type=float, default=0.04)
    parser.add_argument("--lr_scaling", choices=["auto", "none", "sqrt", "linear"],
                        default="auto")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    strategy = fleet.DistributedStrategy(
        mode=args.mode, geo_step=args.geo_step, min_block_size=args.min_block_size,
        split_method=args.split_method, dc_asgd=args.dc_asgd,
        dc_asgd_lambda=args.dc_asgd_lambda, lr_scaling=args.lr_scaling)
    fleet.init(strategy=strategy)
    embedding = SparseEmbedding(DIM, name="embedding")
    model = build_model("dnn", embedding=embedding, embedding_dim=DIM, fc_sizes=[16, 8])
    optimizer = fleet.distributed_optimizer(
        OPTIMIZERS[args.optimizer](model.parameters(), lr=args.lr))
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0

    index, workers = fleet.worker_index(), fleet.worker_num()
    reader = CriteoReader([args.data], args.batch, index, workers, shuffle_seed=None)
    everything = CriteoReader([args.data], 1024) if index == 0 else None
    fleet.init_worker()
    before = evaluate(model, everything) if everything is not None else (math.nan, math.nan)
    fleet.barrier_worker()  # nobody trains before worker 0 measured the initial model

    loss_fn = nn.BCEWithLogitsLoss()
    train_losses = []
    epoch, batches = 0, iter(reader)
    for _ in range(args.steps):
        batch = next(batches, None)
        if batch is None:  # start the share again
            epoch += 1
            reader.set_epoch(epoch)
            batches = iter(reader)
            batch = next(batches)
        loss = loss_fn(model(batch.sparse, batch.dense), batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_losses.append(loss.item())
    fleet.flush()
    fleet.barrier_worker()  # every worker's pushes are applied past this point

    if everything is not None:
        optimizer.refresh()
        after = evaluate(model, everything)
        keys = seen_keys(args.data, args.steps * args.batch * workers)
        rows = fleet._fleet.client.pull_sparse(0, keys, create=False)
        tmp = args.out.with_name(f".{args.out.name}.tmp.npz")
        np.savez(tmp, dense=optimizer.flat_values(), keys=keys, rows=rows,
                 loss_before=before[0], auc_before=before[1], loss_after=after[0],
                 auc_after=after[1], train_losses=np.array(train_losses))
        os.replace(tmp, args.out)
    fleet.stop_worker()
    return 0


if __name__ == "__main__":
    from run_each import run_each  # this script's folder

    sys.exit(run_each(main, sys.argv[1:]))
