"""One server process under 1, 2, 4 and 8 client processes: how much it serves.

One server (``psfleet.ps.run_server`` on 127.0.0.1, port 0) holds a dim-9 Adam table of
``--pool_rows`` rows. Each client is a process of its own that loops a worker's step,
"pull ``--keys`` existing keys, push their gradients", through ``RemoteClient`` for
``--seconds``; all clients of a case start together. Per case (client count), one JSON
line: steps/s and rows/s of all clients together, the pull's p50 / p99 latency, the
server's CPU (% of one core, from /proc: user + system time over the case's wall time)
and its CPU-ms per step. Issue 42 asks that 8 clients keep >= 0.9x the steps/s of 4
(queueing, not thrashing) and that a step cost the server <= 7 CPU-ms.

The table backend is the server's ``PSFLEET_TABLE_BACKEND`` (this process's
environment), so the same run compares them:

    python benchmarks/server_capacity.py --repeats 3
    PSFLEET_TABLE_BACKEND=numpy python benchmarks/server_capacity.py --repeats 3
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
from common import ServerProcess, base_parser, clean_env, emit, log, machine_info, summarise

from psfleet.ps import RemoteClient, SparseTableConfig
from psfleet.rpc import RpcConfig

CLIENTS = (1, 2, 4, 8)
DIM = 9
TABLE_ID = 0

#: One client: argv = endpoint, table id, dim, keys per step, seconds, start time
#: (epoch s), seed, pool rows. Prints {"steps", "pull_ms": [...]} when done.
_CLIENT_CODE = """
import json, sys, time
import numpy as np
from psfleet.ps import RemoteClient, SparseTableConfig
from psfleet.rpc import RpcConfig
endpoint, table, dim, keys, seconds, start, seed, pool_rows = sys.argv[1:9]
table, dim, keys, pool_rows = int(table), int(dim), int(keys), int(pool_rows)
seconds, start = float(seconds), float(start)
rng = np.random.default_rng(int(seed))
pool = np.arange(1, pool_rows + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
batches = [rng.choice(pool, keys, replace=False) for _ in range(8)]
grads = rng.standard_normal((keys, dim), dtype=np.float32) * np.float32(1e-3)
client = RemoteClient([endpoint], RpcConfig())
client.wait_ready(60.0)
client.create_sparse_table(table, SparseTableConfig(name="capacity", dim=dim))  # as filled
time.sleep(max(0.0, start - time.time()))
pulls, steps, end = [], 0, time.time() + seconds
while time.time() < end:
    batch = batches[steps % len(batches)]
    t0 = time.perf_counter()
    client.pull_sparse(table, batch)
    pulls.append((time.perf_counter() - t0) * 1e3)
    client.push_sparse(table, batch, grads)
    steps += 1
client.close()
print(json.dumps({"steps": steps, "pull_ms": pulls}))
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fill(endpoint: str, pool_rows: int) -> None:
    """Create the table and insert the pool's rows (the clients' keys)."""
    client = RemoteClient([endpoint], RpcConfig())
    try:
        client.wait_ready(60.0)
        client.create_sparse_table(TABLE_ID, SparseTableConfig(name="capacity", dim=DIM))
        pool = np.arange(1, pool_rows + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        for i in range(0, pool_rows, 100_000):
            client.pull_sparse(TABLE_ID, pool[i:i + 100_000])
    finally:
        client.close()


def run_case(server: ServerProcess, clients: int, keys: int, seconds: float,
             pool_rows: int, seed: int) -> dict[str, float]:
    """One sample of ``clients`` clients: totals and the server's CPU."""
    start = time.time() + 3.0 + 0.5 * clients  # every client imported and connected
    procs = [subprocess.Popen(
        [sys.executable, "-c", _CLIENT_CODE, server.endpoint, str(TABLE_ID), str(DIM),
         str(keys), str(seconds), str(start), str(seed + i), str(pool_rows)],
        env=clean_env(), stdout=subprocess.PIPE, text=True) for i in range(clients)]
    try:
        time.sleep(max(0.0, start - time.time()))
        cpu0, t0 = cpu_seconds(server.proc.pid), time.perf_counter()
        outputs = [p.communicate(timeout=seconds + 120)[0] for p in procs]
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(server.proc.pid) - cpu0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a client failed: exit codes {[p.returncode for p in procs]}")
    results = [json.loads(out) for out in outputs]
    steps = sum(r["steps"] for r in results)
    pulls = np.concatenate([r["pull_ms"] for r in results])
    return {"steps_per_s": steps / seconds, "rows_per_s": 2 * keys * steps / seconds,
            "pull_p50_ms": float(np.percentile(pulls, 50)),
            "pull_p99_ms": float(np.percentile(pulls, 99)),
            "server_cpu_pct": 100 * cpu / wall,
            "server_cpu_ms_per_step": 1e3 * cpu / max(steps, 1)}


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--pool_rows", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000, help="keys per pull and push")
    parser.add_argument("--seconds", type=float, default=8.0, help="each sample's length")
    parser.add_argument("--clients", default=",".join(map(str, CLIENTS)),
                        help="comma-separated client counts (default 1,2,4,8)")
    args = parser.parse_args()
    backend = os.environ.get("PSFLEET_TABLE_BACKEND", "native (default)")
    emit({"bench": "server_capacity", "machine": machine_info(), "backend": backend})
    with ServerProcess() as server:
        fill(server.endpoint, args.pool_rows)
        log(f"server_capacity: {args.pool_rows} rows on {server.endpoint} ({backend})")
        for clients in (int(c) for c in args.clients.split(",")):
            samples = [run_case(server, clients, args.keys, args.seconds, args.pool_rows,
                                100 * r) for r in range(args.repeats)]
            emit({"bench": "server_capacity", "backend": backend, "clients": clients,
                  "keys": args.keys, "dim": DIM,
                  **{name: summarise([s[name] for s in samples]) for name in samples[0]}})
        stopper = RemoteClient([server.endpoint], RpcConfig())
        try:
            stopper.stop_servers(0)
        finally:
            stopper.close()


if __name__ == "__main__":
    main()
