"""The collective oracle job: a small DNN trained on a fixed schedule of batches.

Rank r of W trains on its share of ``--data`` (``CriteoReader`` lines r, r+W, ...,
no shuffling) in batches of ``--batches[r]`` examples, ``--steps[r]`` steps (starting
the share again when it runs out), inside ``fleet.join()`` so ranks may run
different step counts. Started by ``fleetrun --mode collective`` or ``torchrun``.

With ``--single`` the same schedule runs in one process (no job environment, local
tables, the reference): step j trains on the union of the ranks' step-j batches, for
the ranks that still have a step j. So the collective run must end with the same
parameters: each step's gradient is the mean over the union's examples.

Several --single runs may share one process: ``collective_oracle_job.py A :: B`` runs
A, then B, with a fresh fleet for each (``run_each.py``).

Each process writes ``--out_dir/rank<r>.npz`` (``single.npz`` with --single):

- ``dense``: the dense table's values (float32[total]) after training;
- ``params``: the model's own parameters flattened (must equal ``dense``);
- ``keys``: every key of the schedule (sorted uint64[K]); ``rows``: their rows
  float32[K, 4];
- ``steps``: optimizer steps this process ran.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from psfleet import fleet
from psfleet.data import Batch, CriteoReader
from psfleet.nn import SparseEmbedding
from psfleet.rec.models import build_model

DIM = 4
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}


def schedule(data: Path, batches: list[int], steps: list[int]) -> list[list[Batch]]:
    """For each rank, its batches in training order."""
    world = len(batches)
    plan = []
    for rank in range(world):
        reader = CriteoReader([data], batches[rank], rank, world, shuffle_seed=None)
        mine: list[Batch] = []
        while len(mine) < steps[rank]:
            mine.extend(reader)
        plan.append(mine[: steps[rank]])
    return plan


def union(parts: list[Batch]) -> Batch:
    return Batch(torch.cat([b.labels for b in parts]), torch.cat([b.dense for b in parts]),
                 torch.cat([b.sparse for b in parts]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out_dir", type=Path, required=True)
    parser.add_argument("--batches", default="32,32", help="per-rank batch sizes")
    parser.add_argument("--steps", default="20,20", help="per-rank step counts")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--single", action="store_true")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    steps = [int(s) for s in args.steps.split(",")]
    torch.manual_seed(0)
    torch.set_num_threads(1)

    if args.single:
        fleet.init()
    else:
        fleet.init(is_collective=True)
        if fleet.worker_num() != len(batches):
            raise SystemExit(f"world size {fleet.worker_num()} but --batches has "
                             f"{len(batches)} entries")
    rank = fleet.worker_index()
    model = build_model("dnn", embedding=SparseEmbedding(DIM, name="embedding"),
                        embedding_dim=DIM, fc_sizes=[16, 8])
    train_model = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(
        OPTIMIZERS[args.optimizer](model.parameters(), lr=args.lr))
    fleet.init_worker()
    plan = schedule(args.data, batches, steps)
    if args.single:
        mine = [union([plan[r][j] for r in range(len(plan)) if j < steps[r]])
                for j in range(max(steps))]
    else:
        mine = plan[rank]

    loss_fn = nn.BCEWithLogitsLoss()
    with fleet.join():
        for batch in mine:
            loss = loss_fn(train_model(batch.sparse, batch.dense), batch.labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    fleet.flush()
    fleet.barrier_worker()

    keys = np.unique(np.concatenate([b.sparse.numpy().reshape(-1) for part in plan
                                     for b in part]).view(np.uint64))
    rows = fleet._fleet.client.pull_sparse(0, keys, create=False)
    with torch.no_grad():
        params = torch.cat([p.reshape(-1) for p in model.parameters()]).numpy().copy()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / ("single.npz" if args.single else f"rank{rank}.npz")
    tmp = out.with_name(f".{out.name}.tmp.npz")
    np.savez(tmp, dense=optimizer.flat_values(), params=params, keys=keys, rows=rows,
             steps=np.array(optimizer.steps))
    os.replace(tmp, out)
    fleet.stop_worker()
    return 0


if __name__ == "__main__":
    from run_each import run_each  # this script's folder

    sys.exit(run_each(main, sys.argv[1:]))
