"""Serve a :class:`ServiceHandler` over gRPC, with the standard health service.

The handler (``psfleet.ps.service.TableService``) implements one Python method per rpc of
``psfleet.proto``; this module adapts it to grpc, maps psfleet errors to status codes
(:data:`STATUS_OF_ERROR`), applies the access rules of ``psfleet.rpc.access`` (the auth
token on every call, UNAUTHENTICATED; Save and Load folders under the storage roots,
PERMISSION_DENIED; no token: loopback only), serves TLS when configured
(``psfleet.rpc.tls``), and binds the port (0: a free port chosen by the OS).
docs/security.md.

Every call runs in this order: the token is checked on the raw body (grpc is given no
request deserializer, so nothing of a caller without the token is parsed), then the
body is decoded (one that does not decode is INVALID_ARGUMENT naming the method and the
message type), then the storage roots, then the handler. Every status message sent is
at most :data:`MAX_STATUS_MESSAGE_BYTES` on the wire (:func:`status_message`): the
``grpc-message`` header counts toward the client's metadata limits (a soft 8 KiB,
``grpc.max_metadata_size``, above which a response may be refused, and a hard 16 KiB),
and a refused one reaches the client as RESOURCE_EXHAUSTED "Stream removed" instead of
the reason.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable
from concurrent import futures
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import grpc
import numpy as np
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from psfleet.errors import (
    ConfigError,
    PsfleetError,
    ResourceExhaustedError,
    RetryableError,
    clip_text,
)
from psfleet.rpc import psfleet_pb2 as pb
from psfleet.rpc.access import StorageRoots, check_bind
from psfleet.rpc.types import RpcConfig

__all__ = ["ServiceHandler", "RunningServer", "serve", "status_message", "status_code_of",
           "call_route", "CallRoute", "AUTH_METADATA_KEY", "SHARE_METADATA_KEY",
           "FROM_METADATA_KEY", "MAX_STATUS_MESSAGE_BYTES", "STATUS_OF_ERROR"]

logger = logging.getLogger(__name__)

AUTH_METADATA_KEY = "psfleet-auth-token"
#: Metadata naming the share (server index) a call is for, when it is not the host's own
#: (replication, ``psfleet.ps.replica``).
SHARE_METADATA_KEY = "psfleet-share"
#: Metadata of a write one server forwards to another: the sender's server index.
FROM_METADATA_KEY = "psfleet-from-host"


@dataclass(frozen=True)
class CallRoute:
    """What a call's metadata says about where it belongs (``psfleet.ps.replica``):
    the share it is for and the server that forwarded it (None: not said)."""

    share: int | None = None
    from_host: int | None = None


_CALL_ROUTE: ContextVar[CallRoute | None] = ContextVar("psfleet_call_route", default=None)


def call_route() -> CallRoute:
    """The route of the call being handled. Valid inside a handler method."""
    return _CALL_ROUTE.get() or CallRoute()


def _metadata_int(metadata: dict[str, Any], key: str) -> int | None:
    value = metadata.get(key)
    return int(value) if isinstance(value, str) and value.isdigit() else None
SERVICE_NAME = "psfleet.ParameterServer"

#: The longest status message sent, in bytes on the wire (UTF-8, percent-encoded): half
#: the client's soft metadata limit (8 KiB), leaving room for the other headers.
MAX_STATUS_MESSAGE_BYTES = 4096

#: The status each error a handler raises is sent as; the first entry that matches wins
#: (so subclasses come before their bases). Anything else is a bug: INTERNAL.
STATUS_OF_ERROR: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    # out of memory, or above a size limit: RESOURCE_EXHAUSTED (the service names the
    # table where it can)
    (ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (MemoryError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    # the request is wrong (InvalidRequestError included): fix the caller
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    # may succeed when tried again later
    (RetryableError, grpc.StatusCode.ABORTED),
    # the server's state does not allow it: RemoteError (no such table, a sync round
    # failed) and DataError (a save that does not exist or is damaged: make the save
    # first); the caller must change that state, retrying the same call cannot help
    (PsfleetError, grpc.StatusCode.FAILED_PRECONDITION),
)


class ServiceHandler(Protocol):
    """One method per rpc; each takes the request message and returns the response
    message (the rpc's output type in ``psfleet.proto``).

    Methods raise the errors of :data:`STATUS_OF_ERROR` (sent as its status with the
    message); anything else is sent as INTERNAL. They are called from many threads at
    once and must be thread safe. An rpc of ``psfleet.proto`` the handler has no method
    for is answered UNIMPLEMENTED.
    """

    def CreateTable(self, request: pb.CreateTableRequest) -> Message: ...  # noqa: N802
    def PullSparse(self, request: pb.PullSparseRequest) -> Message: ...  # noqa: N802
    def PushSparse(self, request: pb.PushSparseRequest) -> Message: ...  # noqa: N802
    def PullDense(self, request: pb.PullDenseRequest) -> Message: ...  # noqa: N802
    def PushDense(self, request: pb.PushDenseRequest) -> Message: ...  # noqa: N802
    def Barrier(self, request: pb.BarrierRequest) -> Message: ...  # noqa: N802
    def Clock(self, request: pb.ClockRequest) -> Message: ...  # noqa: N802
    def Save(self, request: pb.SaveRequest) -> Message: ...  # noqa: N802
    def Load(self, request: pb.LoadRequest) -> Message: ...  # noqa: N802
    def Stats(self, request: pb.StatsRequest) -> Message: ...  # noqa: N802
    def Stop(self, request: pb.StopRequest) -> Message: ...  # noqa: N802
    def Shrink(self, request: pb.ShrinkRequest) -> Message: ...  # noqa: N802
    def AgeOneDay(self, request: pb.AgeOneDayRequest) -> Message: ...  # noqa: N802


#: The rpcs whose request names a folder the server reads or writes (field ``dirname``).
_STORAGE_METHODS = frozenset(("Save", "Load"))


def status_message(text: str, limit_bytes: int = MAX_STATUS_MESSAGE_BYTES) -> str:
    """``text`` as sent in a status: at most ``limit_bytes`` on the wire.

    gRPC sends the message as the ``grpc-message`` header, UTF-8 with every byte
    outside printable ASCII (and ``%``) percent-encoded as 3 bytes. A longer text is
    clipped where its wire form reaches the limit (less room for the note) and ends
    with ``... (N characters)``, N its full length (:func:`psfleet.errors.clip_text`).
    Characters UTF-8 cannot encode (lone surrogates) are sent as ``\\udcxx``.
    Vectorised: one numpy pass over the bytes, only for a text that may be too long.
    """
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) * 12 <= limit_bytes:  # 4 UTF-8 bytes x 3 per character at most
        return text
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    plain = (raw >= 0x20) & (raw <= 0x7E) & (raw != 0x25)
    wire = np.cumsum(np.where(plain, 1, 3))  # [bytes]
    if wire[-1] <= limit_bytes:
        return text
    room = limit_bytes - 64  # the note "... (N characters)" and a margin
    cut = int(np.searchsorted(wire, room, side="right"))
    kept = raw[:cut].tobytes().decode("utf-8", "ignore")  # no half character
    return clip_text(text, len(kept))


def status_code_of(exc: BaseException) -> grpc.StatusCode:
    """The status :data:`STATUS_OF_ERROR` gives ``exc``; INTERNAL when none does."""
    for error_type, code in STATUS_OF_ERROR:
        if isinstance(exc, error_type):
            return code
    return grpc.StatusCode.INTERNAL


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with ``code``: the one place psfleet's status messages are sent."""
    context.abort(code, status_message(message))
    raise AssertionError("unreachable")  # context.abort raises


class _Gate:
    """The access checks of every call: the token first, then the storage roots."""

    def __init__(self, auth_token: str | None, roots: StorageRoots) -> None:
        self._token = None if auth_token is None else auth_token.encode()
        self._roots = roots
        self._refused = 0
        self._lock = threading.Lock()

    def check_token(self, name: str, context: grpc.ServicerContext) -> None:
        """Abort the call (UNAUTHENTICATED) unless it carries the job's token. Runs
        before the body is decoded."""
        if self._token is None:
            return
        sent = dict(context.invocation_metadata()).get(AUTH_METADATA_KEY)
        # Constant time: the comparison must not tell how much of a guess is right.
        if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), self._token):
            self._log_refusal(name, context.peer(), "missing or wrong auth token")
            _abort(context, grpc.StatusCode.UNAUTHENTICATED,
                   "missing or wrong auth token (set PSFLEET_AUTH_TOKEN to the job's token: "
                   "the same value on every server and worker; a fleetrun job's is in "
                   "LOG_DIR/.auth_token while it runs)")

    def check_storage(self, name: str, request: Any, context: grpc.ServicerContext) -> None:
        """Abort a Save or Load (PERMISSION_DENIED) of a folder outside the roots."""
        if name in _STORAGE_METHODS:
            refusal = self._roots.refusal(name, request.dirname)
            if refusal is not None:
                self._log_refusal(name, context.peer(), refusal)
                _abort(context, grpc.StatusCode.PERMISSION_DENIED, refusal)

    def _log_refusal(self, name: str, peer: str, why: str) -> None:
        with self._lock:
            self._refused += 1
            count = self._refused
        # The first refusals in full; then one in 1000 (a scan must not flood the log).
        if count <= 10 or count % 1000 == 0:
            logger.warning("refused %s from %s (%d refused so far): %s", name, peer, count,
                           clip_text(why, 2000))


def _decode(name: str, request_type: type[Message], body: bytes,
            context: grpc.ServicerContext) -> Message:
    """``body`` parsed as ``request_type``; INVALID_ARGUMENT when it does not parse."""
    try:
        return request_type.FromString(body)
    except Exception as exc:  # DecodeError; any failure to parse is the body's
        _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
               f"{name}: the request body ({len(body)} bytes) is not a "
               f"{request_type.__name__} message ({type(exc).__name__}: {exc}); the client "
               "must send psfleet.proto's messages (the same psfleet version as the server)")


def _unary(name: str, method: Callable[[Any], Any], request_type: type[Message],
           gate: _Gate) -> Callable[[bytes, grpc.ServicerContext], Any]:
    """The grpc behaviour of rpc ``name``: raw body in, ``method``'s response out."""

    def call(body: bytes, context: grpc.ServicerContext) -> Any:
        gate.check_token(name, context)
        request = _decode(name, request_type, body, context)
        gate.check_storage(name, request, context)
        metadata = dict(context.invocation_metadata())
        token = _CALL_ROUTE.set(CallRoute(_metadata_int(metadata, SHARE_METADATA_KEY),
                                          _metadata_int(metadata, FROM_METADATA_KEY)))
        try:
            return method(request)
        except Exception as exc:
            code = status_code_of(exc)
            if code == grpc.StatusCode.INTERNAL:  # a bug: log it whole, send its summary
                logger.exception("%s failed", name)
                _abort(context, code, f"{name}: {type(exc).__name__}: {exc}")
            if isinstance(exc, MemoryError):  # the service names the table where it can
                table_id = getattr(request, "table_id", None)
                what = name if table_id is None else f"{name} on table {table_id}"
                logger.error("%s: out of memory: %s", what, exc)
                _abort(context, code, f"{what}: the server ran out of memory ({exc}); give it "
                       "more memory, add servers, or send smaller requests")
            _abort(context, code, str(exc))
        finally:
            _CALL_ROUTE.reset(token)

    call.__name__ = name
    return call


def _method_handlers(handler: ServiceHandler, gate: _Gate) -> dict[str, grpc.RpcMethodHandler]:
    """One handler per rpc of ``psfleet.proto`` the ``handler`` implements, taking the
    request body as bytes (no request deserializer: :func:`_unary` decodes it)."""
    handlers = {}
    for rpc in pb.DESCRIPTOR.services_by_name["ParameterServer"].methods:
        method = getattr(handler, rpc.name, None)
        if method is None:
            continue
        request_type: type[Message] = getattr(pb, rpc.input_type.name)
        response_type: type[Message] = getattr(pb, rpc.output_type.name)
        handlers[rpc.name] = grpc.unary_unary_rpc_method_handler(
            _unary(rpc.name, method, request_type, gate), request_deserializer=None,
            response_serializer=response_type.SerializeToString)
    return handlers


class RunningServer:
    """A started gRPC server. ``port`` is the bound port (the OS's when 0 was asked);
    ``handler`` the object it serves."""

    def __init__(self, server: grpc.Server, host: str, port: int,
                 health_servicer: health.HealthServicer,
                 executor: futures.ThreadPoolExecutor | None = None,
                 handler: Any = None) -> None:
        self._server = server
        self.handler = handler
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


def serve(handler: ServiceHandler, host: str, port: int, config: RpcConfig,
          max_request_bytes: int | None = None) -> RunningServer:
    """Start serving ``handler`` on ``host:port`` and return at once.

    Args:
        handler: the service implementation.
        host: address to bind, e.g. ``127.0.0.1`` or ``0.0.0.0``.
        port: port to bind; 0 lets the OS choose (read it from the result).
        config: thread count, message limits, auth token, TLS files, storage roots.
        max_request_bytes: the largest request gRPC receives (None:
            ``config.max_message_bytes``); a larger one is refused with
            RESOURCE_EXHAUSTED from its declared length, before it is decoded.

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
    if max_request_bytes is not None:
        options = [(key, max_request_bytes if key == "grpc.max_receive_message_length"
                    else value) for key, value in options]
    executor = futures.ThreadPoolExecutor(max_workers=config.server_threads,
                                          thread_name_prefix="psfleet-rpc")
    server = grpc.server(executor, options=options)
    handlers = _method_handlers(handler, _Gate(config.auth_token, roots))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
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
    return RunningServer(server, host, bound, health_servicer, executor, handler)
