"""The seeds' fleet paradigm on the shared Criteo data: one script, every role.

    fleetrun --server_num=2 --worker_num=2 examples/fleet_minimal.py
    mpirun -np 4 python examples/fleet_minimal.py     # 2 servers, 2 workers
    python examples/fleet_minimal.py                  # alone, in-process tables

or by hand on several machines with the seeds' environment variables (README.md,
"Running on several machines"). Under mpirun (pip install 'psfleet[mpi]') ranks
0 .. N-1 serve, N = PSFLEET_SERVER_NUM (mpirun -x PSFLEET_SERVER_NUM=1 ...), else half
the ranks; the ranks exchange the servers' endpoints over MPI (as root, add
--allow-run-as-root; more ranks than cores, --oversubscribe).

Worker 0 prints the test AUC and, with --save_dir, saves every table with
fleet.save_persistables(); --load_dir starts from such a save.
"""

import argparse
from pathlib import Path

import torch
from torch import nn

from psfleet import fleet
from psfleet.data import CriteoReader
from psfleet.metrics import auc
from psfleet.nn import SparseEmbedding

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo_kaggle_sample"
parser = argparse.ArgumentParser()
parser.add_argument("--data", type=Path, default=DATA)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--save_dir", type=str, default=None)
parser.add_argument("--load_dir", type=str, default=None)
args = parser.parse_args()
torch.manual_seed(0)

fleet.init()  # role from the environment (under mpirun: from the rank)
embedding = SparseEmbedding(dim=8, name="embedding")
model = nn.Sequential(nn.Flatten(), nn.Linear(26 * 8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3),
                                        fleet.StrategyFactory.create_async_strategy())

if fleet.is_server():
    fleet.init_server()
    fleet.run_server()
else:
    reader = CriteoReader([args.data / "train.csv"], 64, fleet.worker_index(),
                          fleet.worker_num(), shuffle_seed=0)
    fleet.init_worker()
    if args.load_dir:
        fleet.load_model(args.load_dir)  # every table, into this job's server count
    for epoch in range(args.epochs):
        reader.set_epoch(epoch)
        for batch in reader:
            logits = model(embedding(batch.sparse)).squeeze(1)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    fleet.flush()
    fleet.barrier_worker()
    if fleet.is_first_worker():
        optimizer.refresh()  # every worker's updates
        test = CriteoReader([args.data / "dev.csv", args.data / "test.csv"], 1024)
        with torch.no_grad():
            scores = [torch.sigmoid(model(embedding(b.sparse)).squeeze(1)) for b in test]
            labels = [b.labels for b in test]
        print(f"test auc {auc(torch.cat(labels), torch.cat(scores)):.4f}", flush=True)
        if args.save_dir:
            fleet.save_persistables(args.save_dir)
    fleet.stop_worker()
