"""What more shares than servers cost a worker: gRPC calls, not the work in them.

Two servers (``psfleet.ps.run_server`` in subprocesses, port 0) with replication 2; this
process is one worker (``psfleet.ps.RemoteClient``) with ``--shares`` shares (default 2
and 6: one per server, and the 6 a job that may grow to 3 servers asks for). Per share
count, fresh servers each repeat, the mean latency in ms of:

- ``step``: one worker step of the criteo DNN's sizes: a pull and a push of about 19,900
  distinct sparse keys of dim 9 (512 examples x 39 slots), a push and a pull of its
  295,361 dense floats (Adam on both tables);
- each of those four calls alone;
- ``pull_60_keys``: a pull of 60 keys, where the per-call cost is nearly all of it;
- ``stats_call``: one ``Stats`` call to one server, sequential (a round trip's floor).

Each share is one call per table and server it is served by, plus the forwards of
writes to its second copy, so 6 shares on 2 servers make three times the calls of 2
for the same rows. One JSON line per (shares, op): the median, min and max over
``--repeats``.

    python benchmarks/share_calls.py --repeats 3
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from common import ServerProcess, base_parser, emit, log, summarise

from psfleet.ps import RemoteClient
from psfleet.ps.types import RuleConfig, SparseTableConfig
from psfleet.rpc import RpcConfig
from psfleet.rpc import messages as msg
from psfleet.rpc.client import RpcClient

SPARSE, DENSE = 1, 2
DIM = 9
DENSE_FLOATS = 295_361  # the criteo DNN's 512-256-128-32 tower
BATCH_KEYS = 512 * 39
STEPS = 60


def _mean_ms(call: Callable[[int], object], calls: int) -> float:
    for i in range(5):  # warm up: connections, first rows
        call(i)
    start = time.perf_counter()
    for i in range(calls):
        call(i)
    return 1000 * (time.perf_counter() - start) / calls


def measure(shares: int) -> dict[str, float]:
    """One repeat against fresh servers: op -> mean ms."""
    with ServerProcess() as first, ServerProcess() as second:
        config = RpcConfig()
        client = RemoteClient([first.endpoint, second.endpoint], config, 0, replication=2,
                              shares=shares)
        try:
            client.wait_ready(30.0)
            rule = RuleConfig(name="adam", learning_rate=0.001)
            client.create_sparse_table(SPARSE, SparseTableConfig(name="emb", dim=DIM,
                                                                 rule=rule))
            client.create_dense_table(DENSE, "dense", [(DENSE_FLOATS,)], rule,
                                      np.zeros(DENSE_FLOATS, np.float32))
            rng = np.random.default_rng(shares)
            batches = [np.unique(rng.integers(0, 2_000_000, BATCH_KEYS)).astype(np.uint64)
                       for _ in range(8)]
            grads = [rng.standard_normal((b.size, DIM), dtype=np.float32) for b in batches]
            dense = rng.standard_normal(DENSE_FLOATS, dtype=np.float32)
            small = np.unique(rng.integers(0, 2_000_000, 60)).astype(np.uint64)

            def step(i: int) -> None:
                keys = batches[i % 8]
                client.pull_sparse(SPARSE, keys)
                client.push_sparse(SPARSE, keys, grads[i % 8])
                client.push_dense(DENSE, dense)
                client.pull_dense(DENSE)

            stats = RpcClient(first.endpoint, config)
            try:
                return {
                    "step": _mean_ms(step, STEPS),
                    "pull_sparse": _mean_ms(lambda i: client.pull_sparse(SPARSE, batches[i % 8]),
                                            STEPS),
                    "push_sparse": _mean_ms(lambda i: client.push_sparse(
                        SPARSE, batches[i % 8], grads[i % 8]), STEPS),
                    "push_dense": _mean_ms(lambda i: client.push_dense(DENSE, dense), STEPS),
                    "pull_dense": _mean_ms(lambda i: client.pull_dense(DENSE), STEPS),
                    "pull_60_keys": _mean_ms(lambda i: client.pull_sparse(SPARSE, small),
                                             4 * STEPS),
                    "stats_call": _mean_ms(lambda i: stats.call("Stats", msg.StatsRequest()),
                                           4 * STEPS),
                }
            finally:
                stats.close()
        finally:
            client.close()


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--shares", type=lambda s: [int(x) for x in s.split(",")],
                        default=[2, 6], help="share counts, comma separated (default 2,6)")
    args = parser.parse_args()
    for shares in args.shares:
        samples: dict[str, list[float]] = {}
        for repeat in range(args.repeats):
            log(f"shares {shares}, repeat {repeat + 1} of {args.repeats}")
            for op, ms in measure(shares).items():
                samples.setdefault(op, []).append(ms)
        for op, values in samples.items():
            emit({"bench": "share_calls", "shares": shares, "servers": 2, "replication": 2,
                  "op": op, "ms": summarise(values)})


if __name__ == "__main__":
    main()
