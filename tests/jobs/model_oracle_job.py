"""The model oracle job: a registered CTR model over several tables, one of them read
by multi-valued features, trained with the fleet API; final parameters saved.

Run by fleetrun as servers and workers (``--mode sync|async|geo``), as the ranks of a
collective job (``fleetrun --mode collective ... --mode collective``), or alone (no job
environment: one worker on in-process tables, the single-process reference), like
``oracle_job.py``:

Alone, several runs may share one process: ``model_oracle_job.py A :: B`` runs A,
then B, with a fresh fleet for each (``run_each.py``).

- the data: real Criteo rows (``CriteoReader``, worker k of W reads lines k, k+W, ...,
  no shuffling), made multi-valued by :func:`multi_hot_batch`: C1..C13 stay
  single-valued, C14..C19 and C20..C26 become the multi-valued features ``ctx_a`` and
  ``ctx_b`` holding the values present (missing values dropped, so 0 to 6 or 7 ids
  per example);
- the model: ``build_model(--model, embeddings=FeatureEmbeddings(SCHEMA, TABLES), ...)``
  with table ``ids`` (C1..C13, dim 4) and table ``context`` (ctx_a, ctx_b, dim 4,
  mean-pooled); wide_deep and deepfm add their ``wide`` table;
- each worker runs exactly ``--steps`` steps of batch ``--batch`` (starting its share
  again when it runs out), flushes, waits for every worker, and worker 0 writes
  ``--out`` (.npz): ``dense`` (the servers' flat dense parameters), for each table T
  ``keys_T`` (every key of T in the first ``steps * batch * W`` lines, sorted uint64)
  and ``rows_T`` (their rows), ``loss_before`` / ``loss_after`` / ``auc_before`` /
  ``auc_after`` over all of ``--data``, and ``train_losses`` (worker 0's).

So sync mode with W workers x batch b must write what one process with batch W*b
writes.
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
from psfleet.data import Batch, CriteoReader
from psfleet.data.jagged import KeyedJagged
from psfleet.data.jagged_rows import JaggedRows
from psfleet.data.types import FeatureSchema
from psfleet.metrics import auc
from psfleet.nn import EmbeddingTableSpec, FeatureEmbeddings, SparseEmbedding
from psfleet.rec.models import build_model

SINGLE = 13  # C1..C13 stay single-valued
GROUPS = {"ctx_a": (13, 19), "ctx_b": (19, 26)}  # columns of C14..C19, C20..C26
SCHEMA = FeatureSchema(dense=tuple(f"I{i}" for i in range(1, 14)),
                       sparse=tuple(f"C{i}" for i in range(1, SINGLE + 1)),
                       multi=tuple(GROUPS))
TABLES = (EmbeddingTableSpec("ids", 4, SCHEMA.sparse),
          EmbeddingTableSpec("context", 4, SCHEMA.multi, pooling="mean"))
MISSING_LOW_BITS = 1 << 32  # a Criteo key's low 33 bits for a missing value
LOW_33_BITS = (1 << 33) - 1
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}


def multi_hot_rows(keys: np.ndarray) -> tuple[np.ndarray, JaggedRows]:
    """Criteo keys uint64 [N, 26] as (C1..C13 keys uint64 [N, 13], the multi-valued
    features of :data:`GROUPS`: each example's present values of C14..C19, then of
    C20..C26, missing values dropped)."""
    tail = keys[:, SINGLE:]  # [N, 13]
    present = (tail & np.uint64(LOW_33_BITS)) != np.uint64(MISSING_LOW_BITS)
    lengths = np.stack([present[:, a - SINGLE:b - SINGLE].sum(axis=1)
                        for a, b in GROUPS.values()], axis=1).astype(np.int32)  # [N, 2]
    return np.ascontiguousarray(keys[:, :SINGLE]), JaggedRows(tail[present], lengths)


def multi_hot_batch(batch: Batch) -> Batch:
    """``batch`` (Criteo, 26 single-valued slots) with SCHEMA's features."""
    single, rows = multi_hot_rows(batch.sparse.numpy().view(np.uint64))
    return Batch(batch.labels, batch.dense, torch.from_numpy(single.view(np.int64)),
                 KeyedJagged.from_rows(SCHEMA.multi, rows))


def table_keys(batch: Batch) -> dict[str, np.ndarray]:
    """The distinct keys (sorted uint64) of each table in ``batch`` (SCHEMA's form)."""
    single = np.unique(batch.sparse.numpy().view(np.uint64))
    assert batch.jagged is not None
    context = np.unique(batch.jagged.values.numpy().view(np.uint64))
    return {"ids": single, "context": context, "wide": np.union1d(single, context)}


def evaluate(model: nn.Module, batches: list[Batch]) -> tuple[float, float]:
    """(mean BCE, AUC) of ``model`` over ``batches``; creates and pushes nothing."""
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(b.sparse, b.dense, b.jagged) for b in batches])
    model.train()
    labels = torch.cat([b.labels for b in batches])
    loss = float(nn.functional.binary_cross_entropy_with_logits(logits, labels))
    return loss, auc(labels.numpy(), logits.numpy())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["dnn", "wide_deep", "deepfm", "dcn_v2"],
                        required=True)
    parser.add_argument("--mode", choices=["sync", "async", "geo", "collective"],
                        default="sync")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--geo_step", type=int, default=5)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    if args.mode == "collective":  # ranks of a process group, tables replicated
        fleet.init(is_collective=True)
    else:
        fleet.init(strategy=fleet.DistributedStrategy(mode=args.mode, geo_step=args.geo_step))
    model = build_model(args.model, embeddings=FeatureEmbeddings(SCHEMA, TABLES),
                        num_dense=len(SCHEMA.dense), fc_sizes=[16, 8])
    optimizer = fleet.distributed_optimizer(
        OPTIMIZERS[args.optimizer](model.parameters(), lr=args.lr))
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0

    train_model = fleet.distributed_model(model)  # collective: DDP; else model itself
    index, workers = fleet.worker_index(), fleet.worker_num()
    reader = CriteoReader([args.data], args.batch, index, workers, shuffle_seed=None)
    everything = ([multi_hot_batch(b) for b in CriteoReader([args.data], 1024)]
                  if index == 0 else None)
    fleet.init_worker()
    before = evaluate(model, everything) if everything is not None else (math.nan, math.nan)
    fleet.barrier_worker()  # nobody trains before worker 0 measured the initial model

    loss_fn = nn.BCEWithLogitsLoss()
    train_losses = []
    epoch, batches = 0, iter(reader)
    for _ in range(args.steps):
        raw = next(batches, None)
        if raw is None:  # start the share again
            epoch += 1
            reader.set_epoch(epoch)
            batches = iter(reader)
            raw = next(batches)
        batch = multi_hot_batch(raw)
        loss = loss_fn(train_model(batch.sparse, batch.dense, batch.jagged), batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_losses.append(loss.item())
    fleet.flush()
    fleet.barrier_worker()  # every worker's pushes are applied past this point

    if everything is not None:
        optimizer.refresh()
        after = evaluate(model, everything)
        seen = args.steps * args.batch * workers
        first = multi_hot_batch(next(iter(CriteoReader([args.data], max(seen, 1)))))
        tables = {m.name: m.table_id for m in model.modules() if isinstance(m, SparseEmbedding)}
        saved: dict[str, np.ndarray] = {}
        for name, keys in table_keys(first).items():
            if name in tables:
                saved[f"keys_{name}"] = keys
                saved[f"rows_{name}"] = fleet._fleet.client.pull_sparse(tables[name], keys,
                                                                         create=False)
        tmp = args.out.with_name(f".{args.out.name}.tmp.npz")
        np.savez(tmp, dense=optimizer.flat_values(), loss_before=before[0],
                 auc_before=before[1], loss_after=after[0], auc_after=after[1],
                 train_losses=np.array(train_losses), **saved)  # type: ignore[arg-type]
        os.replace(tmp, args.out)
    fleet.stop_worker()
    return 0


if __name__ == "__main__":
    from run_each import run_each  # this script's folder

    sys.exit(run_each(main, sys.argv[1:]))
