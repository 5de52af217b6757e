"""The hot rpcs with the server decoding requests itself (issue 15, finding F1).

``psfleet.rpc.server`` registers its methods without a request deserializer: grpc hands
it the raw body, it checks the auth token, then decodes the message (so an undecodable
body is INVALID_ARGUMENT, and a call without the token is refused before any decoding).
This measures that the hot path did not get slower: one server
(``psfleet.ps.run_server`` on 127.0.0.1, port 0) in a subprocess, this process the
worker (``psfleet.ps.RemoteClient``), one call in flight at a time:

- ``--calls`` PullSparse calls of ``--keys`` existing keys (dim ``--dim``, Adam);
- ``--calls`` PushSparse calls of the same keys (float32 gradients of 1e-3 scale).

Per op: calls/s and examples/s (keys/s), and the server process's CPU time per call
(user + system, microseconds: what decoding in psfleet's handler could change, and far
less sensitive than wall clock to other processes on the machine), each a summary over
``--repeats`` samples, one JSON line per op. Run it on the commit before and after a
change to compare:

    python benchmarks/rpc_decode.py --repeats 5
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import psutil
from common import ServerProcess, base_parser, emit, log, summarise

from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig
from psfleet.rpc import RpcConfig

__all__ = ["time_calls", "main"]


def time_calls(call: Callable[[], object], calls: int,
               server: psutil.Process) -> tuple[float, float]:
    """(wall seconds, ``server``'s CPU seconds) of ``calls`` back-to-back calls."""
    cpu = server.cpu_times()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    wall = time.perf_counter() - start
    after = server.cpu_times()
    return wall, (after.user - cpu.user) + (after.system - cpu.system)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0], repeats=5)
    parser.add_argument("--calls", type=int, default=2000, help="calls per sample")
    parser.add_argument("--keys", type=int, default=4096, help="keys per call")
    parser.add_argument("--dim", type=int, default=9, help="the table's row width")
    args = parser.parse_args()
    rng = np.random.default_rng(15)
    keys = rng.permutation(np.arange(1, 10 * args.keys, 10, dtype=np.uint64))  # [K]
    grads = rng.standard_normal((args.keys, args.dim), dtype=np.float32) * np.float32(1e-3)
    with ServerProcess() as server:
        proc = psutil.Process(server.proc.pid)
        client = RemoteClient([server.endpoint], RpcConfig())
        try:
            client.wait_ready(60.0)
            client.create_sparse_table(0, SparseTableConfig(
                name="decode", dim=args.dim, rule=RuleConfig(name="adam")))
            client.pull_sparse(0, keys)  # the rows exist: pulls below create none
            ops: dict[str, Callable[[], object]] = {
                "PullSparse": lambda: client.pull_sparse(0, keys, create=False),
                "PushSparse": lambda: client.push_sparse(0, keys, grads),
            }
            for op, call in ops.items():
                time_calls(call, max(args.calls // 20, 1), proc)  # warm up
                samples = [time_calls(call, args.calls, proc) for _ in range(args.repeats)]
                seconds = [wall for wall, _ in samples]
                log(f"rpc_decode {op}: {[round(s, 2) for s in seconds]} s per "
                    f"{args.calls} calls")
                emit({"bench": "rpc_decode", "op": op, "keys": args.keys, "dim": args.dim,
                      "calls": args.calls,
                      "calls_per_s": summarise([args.calls / s for s in seconds]),
                      "examples_per_s": summarise([args.calls * args.keys / s
                                                   for s in seconds]),
                      "server_cpu_us_per_call": summarise([cpu / args.calls * 1e6
                                                           for _, cpu in samples])})
        finally:
            try:
                client.stop_servers(0)
            finally:
                client.close()


if __name__ == "__main__":
    main()
