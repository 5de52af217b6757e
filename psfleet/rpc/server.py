"""Serve a :class:`ServiceHandler` over gRPC, with the standard health service.

The handler (``psfleet.ps.service.TableService``) implements one Python method per rpc of
``psfleet.proto``; this module adapts it to grpc, maps psfleet errors to status codes,
applies the access rules of ``psfleet.rpc.access`` (the auth token on every call,
UNAUTHENTICATED; Save and Load folders under the storage roots, PERMISSION_DENIED;
no token: loopback only), serves TLS when configured (``psfleet.rpc.tls``), and binds
the port (0: a free port chosen by the OS). docs/security.md.
"""

from __future__ import annotations

import hmac
import logging
import threading
from concurrent import futures
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from psfleet.errors import ConfigError, PsfleetError, RemoteError, ResourceExhaustedError
from psfleet.rpc import psfleet_pb2 as pb
from psfleet.rpc import psfleet_pb2_grpc as pb_grpc
from psfleet.rpc.access import StorageRoots, check_bind
from psfleet.rpc.types import RpcConfig

__all__ = ["ServiceHandler", "RunningServer", "serve", "AUTH_METADATA_KEY"]

logger = logging.getLogger(__name__)

AUTH_METADATA_KEY = "psfleet-auth-token"
SERVICE_NAME = "psfleet.ParameterServer"


class ServiceHandler(Protocol):
    """One method per rpc; each takes the request message and returns the response.

    Methods may raise :class:`~psfleet.errors.ConfigError` (its subclass
    ``InvalidRequestError`` included) or :class:`~psfleet.errors.RemoteError` (sent as
    INVALID_ARGUMENT / FAILED_PRECONDITION with the message), or
    :class:`~psfleet.errors.ResourceExhaustedError` (RESOURCE_EXHAUSTED); a
    MemoryError is sent as RESOURCE_EXHAUSTED too, anything else as INTERNAL.
    They are called from many threads at once and must be thread safe.
    """

    def CreateTable(self, request: pb.CreateTableRequest) -> pb.CreateTableResponse: ...  # noqa: N802
    def PullSparse(self, request: pb.PullSparseRequest) -> pb.PullSparseResponse: ...  # noqa: N802
    def PushSparse(self, request: pb.PushSparseRequest) -> pb.Empty: ...  # noqa: N802
    def PullDense(self, request: pb.PullDenseRequest) -> pb.PullDenseResponse: ...  # noqa: N802
    def PushDense(self, request: pb.PushDenseRequest) -> pb.Empty: ...  # noqa: N802
    def Barrier(self, request: pb.BarrierRequest) -> pb.Empty: ...  # noqa: N802
    def Save(self, request: pb.SaveRequest) -> pb.SaveResponse: ...  # noqa: N802
    def Load(self, request: pb.LoadRequest) -> pb.Empty: ...  # noqa: N802
    def Stats(self, request: pb.StatsRequest) -> pb.StatsResponse: ...  # noqa: N802
    def Stop(self, request: pb.StopRequest) -> pb.Empty: ...  # noqa: N802


_METHODS = ("CreateTable", "PullSparse", "PushSparse", "PullDense", "PushDense", "Barrier",
            "Save", "Load", "Stats", "Stop")


#: The rpcs whose request names a folder the server reads or writes (field ``dirname``).
_STORAGE_METHODS = frozenset(("Save", "Load"))


class _Gate:
    """The access checks of every call: token first, then the storage roots."""

    def __init__(self, auth_token: str | None, roots: StorageRoots) -> None:
        self._token = None if auth_token is None else auth_token.encode()
        self._roots = roots
        self._refused = 0
        self._lock = threading.Lock()

    def check(self, name: str, request: Any, context: grpc.ServicerContext) -> None:
        """Abort the call (UNAUTHENTICATED / PERMISSION_DENIED) unless it may run."""
        if self._token is not None:
            sent = dict(context.invocation_metadata()).get(AUTH_METADATA_KEY)
            # Constant time: the comparison must not tell how much of a guess is right.
            if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(),
                                                                    self._token):
                self._log_refusal(name, context.peer(), "missing or wrong auth token")
                context.abort(grpc.StatusCode.UNAUTHENTICATED,
                              "missing or wrong auth token (set PSFLEET_AUTH_TOKEN to the "
                              "job's token: the same value on every server and worker; "
                              "a fleetrun job's is in LOG_DIR/.auth_token while it runs)")
        if name in _STORAGE_METHODS:
            refusal = self._roots.refusal(name, request.dirname)
            if refusal is not None:
                self._log_refusal(name, context.peer(), refusal)
                context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)

    def _log_refusal(self, name: str, peer: str, why: str) -> None:
        with self._lock:
            self._refused += 1
            count = self._refused
        # The first refusals in full; then one in 1000 (a scan must not flood the log).
        if count <= 10 or count % 1000 == 0:
            logger.warning("refused %s from %s (%d refused so far): %s", name, peer, count, why)


def _make_servicer(handler: ServiceHandler, gate: _Gate) -> Any:
    """Build a ParameterServerServicer whose methods call ``handler``."""

    def wrap(name: str) -> Any:
        method = getattr(handler, name)

        def call(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            gate.check(name, request, context)
            try:
                return method(request)
            except ResourceExhaustedError as exc:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            except MemoryError as exc:  # the service names the table where it can
                logger.error("%s: out of memory: %s", name, exc)
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{name}: the server ran out of memory ({exc})")
            except ConfigError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except RemoteError as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except PsfleetError as exc:
                context.abort(grpc.StatusCode.ABORTED, str(exc))
            except Exception as exc:  # a bug: log it whole, send its summary
                logger.exception("%s failed", name)
                context.abort(grpc.StatusCode.INTERNAL, f"{name}: {type(exc).__name__}: {exc}")

        call.__name__ = name
        return call

    cls = type("Servicer", (pb_grpc.ParameterServerServicer,),
               {name: wrap(name) for name in _METHODS})
    return cls()


class RunningServer:
    """A started gRPC server. ``port`` is the bound port (the OS's when 0 was asked)."""

    def __init__(self, server: grpc.Server, host: str, port: int,
                 health_servicer: health.HealthServicer,
                 executor: futures.ThreadPoolExecutor | None = None) -> None:
        self._server = server
        self._executor = executor
        self._health = health_servicer
        self.host = host
        self.port = port
        self._stopped = threading.Event()

    @property
    def endpoint(self) -> str:
        """``host:port`` workers connect to."""
        return f"{self.host}:{self.port}"

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop accepting calls; calls in flight get ``grace_s`` seconds. Idempotent."""
        if self._stopped.is_set():
            return
        self._health.enter_graceful_shutdown()
        self._server.stop(grace_s).wait()
        if self._executor is not None:
            # grpc does not end the handler threads itself. A handler still blocked (a
            # Barrier waiting for a dead worker) must not hold stop() up for its timeout.
            threads = list(self._executor._threads)
            self._executor.shutdown(wait=False, cancel_futures=True)
            for thread in threads:
                thread.join(timeout=grace_s + 1.0)
        self._stopped.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until :meth:`stop` has completed; False on timeout."""
        return self._stopped.wait(timeout_s)


def serve(handler: ServiceHandler, host: str, port: int, config: RpcConfig) -> RunningServer:
    """Start serving ``handler`` on ``host:port`` and return at once.

    Args:
        handler: the service implementation.
        host: address to bind, e.g. ``127.0.0.1`` or ``0.0.0.0``.
        port: port to bind; 0 lets the OS choose (read it from the result).
        config: thread count, message limits, auth token, TLS files, storage roots.

    Raises:
        ConfigError: the port cannot be bound (in use, or not allowed; names it), no
            auth token and ``host`` is not a loopback address, or a TLS file cannot
            be read (names the variable).
    """
    check_bind(host, config.auth_token)
    roots = StorageRoots.resolve(config.storage_roots)
    tls = config.tls if config.tls is not None and config.tls.serves_tls else None
    credentials = tls.server_credentials() if tls is not None else None
    options = [*config.channel_options(), ("grpc.so_reuseport", 0)]
    executor = futures.ThreadPoolExecutor(max_workers=config.server_threads,
                                          thread_name_prefix="psfleet-rpc")
    server = grpc.server(executor, options=options)
    pb_grpc.add_ParameterServerServicer_to_server(
        _make_servicer(handler, _Gate(config.auth_token, roots)), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"{host}:{port}"
    try:
        bound = (server.add_insecure_port(address) if credentials is None
                 else server.add_secure_port(address, credentials))
    except RuntimeError as exc:
        raise ConfigError(
            f"cannot bind {address}: {exc}. The port is in use or not allowed; "
            "choose another port (PADDLE_PORT) or 0 for a free one"
        ) from None
    if bound == 0:
        raise ConfigError(f"cannot bind {address}: port in use; choose another port or 0")
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    logger.info("Server listening on %s:%d (%s; auth token %s; Save/Load under %s)", host,
                bound, "plaintext" if tls is None else
                "TLS, client certificates required" if tls.client_ca else "TLS",
                "required" if config.auth_token else "NOT SET", list(roots.roots))
    if config.auth_token is None:
        logger.warning("no PSFLEET_AUTH_TOKEN: any process on this machine can call this "
                       "server (Stop, Save, Load, pushes); set PSFLEET_AUTH_TOKEN on every "
                       "server and worker, or start the job with fleetrun, which makes one")
    return RunningServer(server, host, bound, health_servicer, executor)
