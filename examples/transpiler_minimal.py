"""The seeds' Fluid walkthrough (DistributeTranspiler) on the shared Criteo data.

Two servers and two workers started by hand, each told its role by the seeds'
variables (or the flags below, which take precedence). On one host:

    export PADDLE_PSERVER_IPS=127.0.0.1,127.0.0.1 PADDLE_PSERVER_PORT=6174,6175 \
           PADDLE_TRAINERS=2 PADDLE_CURRENT_IP=127.0.0.1
    PADDLE_TRAINING_ROLE=PSERVER PADDLE_PORT=6174 python examples/transpiler_minimal.py &
    PADDLE_TRAINING_ROLE=PSERVER PADDLE_PORT=6175 python examples/transpiler_minimal.py &
    PADDLE_TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=1 python examples/transpiler_minimal.py &
    PADDLE_TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=0 python examples/transpiler_minimal.py

On several machines one PADDLE_PSERVER_PORT serves every IP of PADDLE_PSERVER_IPS and
each server's PADDLE_CURRENT_IP is its own. Worker 0 prints the test AUC, and its
trainer_prog.stop() stops the servers. --async trains in async mode instead of sync.

``--mode nccl2`` is the seeds' NCCL2 (collective) form: no servers; each trainer gets
PADDLE_TRAINER_IPS (every trainer's IP), PADDLE_TRAINER_ID, PADDLE_CURRENT_IP and
PADDLE_PSERVER_PORT (the rendezvous port of the first trainer).
"""

import argparse
from pathlib import Path

import torch
from torch import nn

from psfleet import env, fleet
from psfleet.data import CriteoReader
from psfleet.metrics import auc
from psfleet.nn import SparseEmbedding
from psfleet.rec.models import DNN

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo_kaggle_sample"
ips = (env.read("PADDLE_PSERVER_IPS") or "127.0.0.1").split(",")
ports = (env.read("PADDLE_PSERVER_PORT") or "6174").split(",")
ports = ports * len(ips) if len(ports) == 1 else ports  # one port for all, or one per IP
parser = argparse.ArgumentParser()
parser.add_argument("--role", default=env.read("PADDLE_TRAINING_ROLE") or "TRAINER")
parser.add_argument("--pservers",
                    default=",".join(f"{i}:{p}" for i, p in zip(ips, ports, strict=True)))
parser.add_argument("--current_endpoint", default=f"{env.read('PADDLE_CURRENT_IP')}:"
                    f"{env.read('PADDLE_PORT') or ports[0]}")
parser.add_argument("--trainers", default=env.read("PADDLE_TRAINERS") or "1")
parser.add_argument("--trainer_id", type=int, default=int(env.read("PADDLE_TRAINER_ID") or 0))
parser.add_argument("--async", dest="sync_mode", action="store_false")
parser.add_argument("--mode", choices=["pserver", "nccl2"], default="pserver")
parser.add_argument("--data", type=Path, default=DATA)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()
trainers = int(args.trainers) if args.trainers.isdigit() else args.trainers  # or IP list
if args.mode == "nccl2":  # the seeds' NCCL2 variables: every trainer's IP, rendezvous port
    trainer_ips = (env.read("PADDLE_TRAINER_IPS") or "127.0.0.1").split(",")
    trainers = ",".join(f"{ip}:{ports[0]}" for ip in trainer_ips)
torch.manual_seed(0)

embedding = SparseEmbedding(dim=9, name="embedding")  # Fluid: build the net
model = DNN(embedding, fc_sizes=(64, 32))

config = fleet.DistributeTranspilerConfig()
config.slice_var_up = True
config.print_log = True  # log the plan: mode, trainers, servers, strategy
config.mode = args.mode
t = fleet.DistributeTranspiler(config=config)
t.transpile(args.trainer_id, pservers=args.pservers, trainers=trainers,
            sync_mode=args.sync_mode, current_endpoint=args.current_endpoint)
if args.role.upper() == "PSERVER":
    pserver_prog = t.get_pserver_program(args.current_endpoint)
    startup_prog = t.get_startup_program(args.current_endpoint, pserver_prog)
    exe = fleet.Executor()
    exe.run(startup_prog)
    exe.run(pserver_prog)  # serves until worker 0's stop()
else:
    trainer_prog = t.get_trainer_program()
    # Fluid: sgd_optimizer.minimize(avg_loss); exe.run(fluid.default_startup_program())
    # train_model is model itself, or model wrapped for data parallelism (nccl2)
    train_model, optimizer = trainer_prog.start(
        model, torch.optim.Adam(model.parameters(), lr=1e-3))
    # Sync mode trains in lockstep: drop_last keeps every worker's step count equal.
    reader = CriteoReader([args.data / "train.csv"], 64, args.trainer_id, t.worker_num,
                          shuffle_seed=0, drop_last=True)
    for epoch in range(args.epochs):
        reader.set_epoch(epoch)
        with fleet.join():  # nccl2: ranks with fewer batches wait; pserver: does nothing
            for batch in reader:  # Fluid: exe.run(trainer_prog, feed=..., fetch_list=[loss])
                logits = train_model(batch.sparse, batch.dense)
                loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    fleet.flush()
    fleet.barrier_worker()
    if args.trainer_id == 0:
        optimizer.refresh()  # every worker's updates
        test = CriteoReader([args.data / "dev.csv", args.data / "test.csv"], 1024)
        with torch.no_grad():  # the plain model: a DDP forward would wait for every rank
            scores = [torch.sigmoid(model(b.sparse, b.dense)) for b in test]
            labels = [b.labels for b in test]
        print(f"test auc {auc(torch.cat(labels), torch.cat(scores)):.4f}", flush=True)
    trainer_prog.stop()
