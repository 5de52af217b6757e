"""A small parameter-server job written against the fleet API, run by fleetrun.

The same script runs as server and as worker (the fleet paradigm):

- server: ``fleet.init_server()``, ``fleet.run_server()`` until worker 0 stops it.
- worker k: reads its share of ``--data`` (``CriteoReader`` split by
  ``fleet.worker_index()`` / ``fleet.worker_num()``), trains a tiny CTR model (one
  SparseEmbedding + a linear layer) for ``--epochs`` with SGD, flushes, waits for the
  other workers, and writes ``<out_dir>/worker.<k>.json`` (examples, per-epoch losses,
  one fingerprint per example so a test can check the split). Worker 0 also writes
  ``<out_dir>/result.json``: the loss on all of ``--data`` before and after training
  and the servers' table statistics. Then ``fleet.stop_worker()``.

Failure injection: ``--fail_worker K --fail_after_steps S`` makes worker K raise
RuntimeError after S training steps (the others block in a barrier or an rpc; the
launcher must stop them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from psfleet import fleet
from psfleet.data import NUM_DENSE, NUM_SLOTS, CriteoReader
from psfleet.nn import SparseEmbedding
from psfleet.ps import RemoteClient
from psfleet.rpc import RpcConfig

DIM = 4


class TinyCtr(nn.Module):
    """logit = Linear([embeddings of the 26 slots, 13 dense features])."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = SparseEmbedding(DIM, name="embedding", initial_range=0.05)
        self.fc = nn.Linear(NUM_SLOTS * DIM + NUM_DENSE, 1)

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        rows = self.embedding(sparse)  # [B, 26, DIM]
        return self.fc(torch.cat([rows.flatten(1), dense], dim=1)).squeeze(1)


def fingerprints(reader: CriteoReader) -> list[str]:
    """One digest per example (label, dense and sparse values), in reader order."""
    out = []
    for batch in reader:
        labels, dense, keys = batch.labels.numpy(), batch.dense.numpy(), batch.sparse.numpy()
        for i in range(len(batch)):
            digest = hashlib.sha1(labels[i].tobytes() + dense[i].tobytes() + keys[i].tobytes())
            out.append(digest.hexdigest())
    return out


def mean_loss(model: nn.Module, reader: CriteoReader) -> float:
    """BCE over every example of ``reader``; no rows created or pushed."""
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for batch in reader:
            logits = model(batch.sparse, batch.dense)
            total += float(nn.functional.binary_cross_entropy_with_logits(
                logits, batch.labels, reduction="sum"))
            n += len(batch)
    model.train()
    return total / n


def write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out_dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.005)
    parser.add_argument("--fail_worker", type=int, default=-1)
    parser.add_argument("--fail_after_steps", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    fleet.init()
    model = TinyCtr()
    optimizer = fleet.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=args.lr))
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0

    index, workers = fleet.worker_index(), fleet.worker_num()
    reader = CriteoReader([args.data], args.batch_size, index, workers, shuffle_seed=index)
    everything = CriteoReader([args.data], 1024) if index == 0 else None
    fleet.init_worker()
    loss_before = mean_loss(model, everything) if everything is not None else None
    fleet.barrier_worker()  # nobody trains before worker 0 measured the initial loss

    loss_fn = nn.BCEWithLogitsLoss()
    epoch_losses, steps = [], 0
    for epoch in range(args.epochs):
        reader.set_epoch(epoch)
        total, n = 0.0, 0
        for batch in reader:
            loss = loss_fn(model(batch.sparse, batch.dense), batch.labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            total += loss.item() * len(batch)
            n += len(batch)
            if index == args.fail_worker and steps >= args.fail_after_steps:
                raise RuntimeError(f"injected failure of worker {index} at step {steps}")
        epoch_losses.append(total / n)
    fleet.flush()
    fleet.barrier_worker()  # every worker's pushes are applied past this point
    reader.set_epoch(0)
    write_json(args.out_dir / f"worker.{index}.json", {
        "worker_index": index, "worker_num": workers, "examples": reader.num_examples,
        "steps": steps, "epoch_losses": epoch_losses,
        "fingerprints": sorted(fingerprints(reader)), "pid": os.getpid(),
    })
    if everything is not None:
        optimizer.refresh()
        stats_client = RemoteClient(fleet.server_endpoints(), RpcConfig.from_env())
        try:
            stats = [[{"table_id": t.table_id, "name": t.name, "rows": t.rows}
                      for t in reply.tables] for reply in stats_client.stats()]
        finally:
            stats_client.close()
        write_json(args.out_dir / "result.json", {
            "loss_before": loss_before, "loss_after": mean_loss(model, everything),
            "server_endpoints": fleet.server_endpoints(), "tables": stats,
            "dense_values_finite": bool(np.isfinite(optimizer.flat_values()).all()),
        })
    fleet.stop_worker()
    return 0


if __name__ == "__main__":
    sys.exit(main())
