"""The transport: one gRPC service, raw-buffer messages, deadlines, retries, auth."""

from psfleet.rpc.client import PendingCall, RpcClient, wait_servers_ready
from psfleet.rpc.server import CallRoute, RunningServer, ServiceHandler, call_route, serve
from psfleet.rpc.types import RpcConfig, parse_endpoint

__all__ = [
    "CallRoute",
    "PendingCall",
    "RpcClient",
    "RpcConfig",
    "RunningServer",
    "ServiceHandler",
    "call_route",
    "parse_endpoint",
    "serve",
    "wait_servers_ready",
]
