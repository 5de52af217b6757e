"""A finished server's stand-in: the standard gRPC health service and nothing else.

A Kubernetes StatefulSet restarts every container that exits, also one that ended
because the job's workers finished (``stop_worker``). The server pods of a job
rendered by ``psfleet k8s render`` therefore run this once their server ended
cleanly: it answers health checks SERVING (so the pod's gRPC probes pass and the
container is not restarted into a server that would reload its tables), holds no
table, and exits on SIGTERM, when the job is deleted.

Usage: ``python -m psfleet.rpc.health_only --port P [--host H]``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from psfleet.errors import ConfigError

__all__ = ["serve_health_only", "main"]


def serve_health_only(host: str, port: int) -> tuple[grpc.Server, int]:
    """Serve only the health service (``""`` is SERVING) on ``host:port``.

    Returns:
        The running server and the port bound (the one asked, or the OS's for 0).

    Raises:
        ConfigError: the port cannot be bound (names the address).
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:
        raise ConfigError(f"cannot bind {host}:{port}: {exc}") from None
    if bound == 0:
        raise ConfigError(f"cannot bind {host}:{port}: port in use")
    server.start()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, bound


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT; returns the exit code (0, or 2 on a bind error)."""
    parser = argparse.ArgumentParser(prog="python -m psfleet.rpc.health_only",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the port to answer on")
    parser.add_argument("--host", default="0.0.0.0", help="the address to bind")
    args = parser.parse_args(argv)
    try:
        server, _ = serve_health_only(args.host, args.port)
    except ConfigError as exc:
        print(f"health_only: error: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    done.wait()
    server.stop(grace=1.0).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
