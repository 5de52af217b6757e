"""Call one server: deadlines, bounded retries with backoff, auth, TLS, parallel calls.

:class:`RpcClient` is thread safe (one gRPC channel, shared; TLS when the config's
``tls`` has a CA or client certificate, ``psfleet.rpc.tls``). :meth:`RpcClient.start`
issues a call without blocking so a caller can fan out to every server at once and
then collect the results (``PendingCall.result``). A server that is up but speaks the
other protocol (TLS against plaintext) is named at the first failure, as a
:class:`~psfleet.errors.ConfigError`, not retried as if it were down.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psfleet.errors import (
    ConfigError,
    InvalidRequestError,
    MovedError,
    RemoteError,
    ResourceExhaustedError,
    RpcError,
    ServerNotReadyError,
    ServerUnavailableError,
)
from psfleet.rpc import psfleet_pb2_grpc as pb_grpc
from psfleet.rpc.server import AUTH_METADATA_KEY, FROM_METADATA_KEY, SHARE_METADATA_KEY
from psfleet.rpc.tls import diagnose_tls_mismatch
from psfleet.rpc.types import RpcConfig

__all__ = ["RpcClient", "PendingCall", "wait_servers_ready"]

logger = logging.getLogger(__name__)

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


class RpcClient:
    """A connection to one server endpoint.

    Args:
        endpoint: ``host:port`` of the server.
        config: deadline, retries, message limits, auth token, TLS files.
        share: the share (server index) every call is for, sent as metadata, when the
            server holds it as a replica (``psfleet.ps.replica``); None: its own.
        from_host: the calling server's index when a server forwards writes to
            another (sent as metadata); None: a worker's calls.

    Raises:
        ConfigError: a TLS file cannot be read (names the variable).
    """

    def __init__(self, endpoint: str, config: RpcConfig, share: int | None = None,
                 from_host: int | None = None) -> None:
        self.endpoint = endpoint
        self.config = config
        tls = config.tls
        # A channel of its own (not gRPC's shared pool): a client made for a restarted
        # server must not inherit the reconnect backoff of one that called its dead
        # predecessor at the same endpoint (psfleet.ps.replica).
        options: list[tuple[str, Any]] = [*config.channel_options(),
                                          ("grpc.use_local_subchannel_pool", 1)]
        if tls is not None and tls.dials_tls:
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            self._channel = grpc.secure_channel(endpoint, tls.channel_credentials(),
                                                options=options)
        else:
            self._channel = grpc.insecure_channel(endpoint, options=options)
        self._stub = pb_grpc.ParameterServerStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = (
            ((AUTH_METADATA_KEY, config.auth_token),) if config.auth_token else ()
        ) + (((SHARE_METADATA_KEY, str(share)),) if share is not None else ()) + (
            ((FROM_METADATA_KEY, str(from_host)),) if from_host is not None else ())

    def call(self, method: str, request: Any, deadline_s: float | None = None) -> Any:
        """Call ``method`` and block for its response.

        Args:
            method: an rpc name of ``psfleet.proto`` (``PullSparse``, ...).
            request: the request message.
            deadline_s: this call's deadline; ``config.deadline_s`` when None.

        Raises:
            RpcError: the server stayed UNAVAILABLE through every retry
                (``ServerUnavailableError``), or the deadline passed (names endpoint
                and method).
            InvalidRequestError: the server rejected the request's content
                (INVALID_ARGUMENT; also a ConfigError and a RemoteError).
            ConfigError: the server rejected the auth token (UNAUTHENTICATED), a Save
                or Load folder outside its storage roots (PERMISSION_DENIED), or speaks
                the other protocol (TLS or plaintext; its certificate not accepted).
            ResourceExhaustedError: the server ran out of memory on the request, or
                a message exceeded the size limit (RESOURCE_EXHAUSTED).
            MovedError: the server no longer serves the share the call is for
                (ABORTED; ``psfleet.ps.replica``).
            RemoteError: the server failed the request for another reason.
        """
        return self.start(method, request, deadline_s).result()

    def start(self, method: str, request: Any, deadline_s: float | None = None) -> PendingCall:
        """Issue ``method`` without blocking; ``result()`` waits (with retries)."""
        return PendingCall(self, method, request, deadline_s or self.config.deadline_s)

    def _invoke(self, method: str, request: Any, timeout_s: float) -> Any:
        rpc = getattr(self._stub, method)
        return rpc.future(request, timeout=timeout_s, metadata=self._metadata)

    def is_serving(self, timeout_s: float = 2.0) -> bool:
        """True when the server's health service answers SERVING within ``timeout_s``
        (the health service needs no token; over TLS when the client speaks it)."""
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(service=""),
                                       timeout=timeout_s)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def check_protocol(self) -> None:
        """Raise when the server is up but speaks the other protocol (TLS or not).

        Raises:
            ConfigError: the server wants TLS and this client speaks plaintext, or the
                reverse (names the endpoint and the variable to set).
        """
        problem = diagnose_tls_mismatch(self.endpoint, self.config.tls)
        if problem is not None:
            raise ConfigError(problem)

    def close(self) -> None:
        """Close the channel; calls in flight fail."""
        self._channel.close()


class PendingCall:
    """A call in flight. ``result()`` blocks and retries UNAVAILABLE with backoff."""

    def __init__(self, client: RpcClient, method: str, request: Any, deadline_s: float) -> None:
        self._client = client
        self._method = method
        self._request = request
        self._deadline = time.monotonic() + deadline_s
        self._future = client._invoke(method, request, deadline_s)

    def result(self) -> Any:
        """The response message (see :meth:`RpcClient.call` for the errors raised)."""
        config = self._client.config
        backoff = config.backoff_initial_s
        for attempt in range(config.max_retries + 1):
            try:
                return self._future.result()
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNAVAILABLE and attempt == 0:
                    self._client.check_protocol()  # up but the other protocol: no retry
                remaining = self._deadline - time.monotonic()
                if (code not in _RETRYABLE or attempt == config.max_retries or remaining <= 0
                        or _certificate_refused(exc.details() or "")):
                    raise _translate(exc, self._client.endpoint, self._method) from None
                logger.warning("%s on %s: %s; retry %d/%d in %.1f s", self._method,
                               self._client.endpoint, code.name, attempt + 1,
                               config.max_retries, backoff)
                time.sleep(min(backoff, remaining))
                backoff = min(backoff * 2, config.backoff_max_s)
                remaining = max(self._deadline - time.monotonic(), 0.001)
                self._future = self._client._invoke(self._method, self._request, remaining)
        raise AssertionError("unreachable")  # the loop returns or raises


def _certificate_refused(details: str) -> bool:
    """Whether a failure's details say the TLS handshake refused the server's
    certificate (retrying cannot help)."""
    return "CERTIFICATE_VERIFY_FAILED" in details.upper().replace(" ", "_")


def _translate(exc: grpc.RpcError, endpoint: str, method: str) -> Exception:
    code = exc.code()
    details = exc.details() or ""
    where = f"{method} on server {endpoint}"
    if code == grpc.StatusCode.UNAVAILABLE:
        if _certificate_refused(details):
            return ConfigError(
                f"{where}: the server's TLS certificate was not accepted ({details}): "
                "PSFLEET_TLS_CA must be the CA that signed it, and the certificate must "
                "name the endpoint's host (or set PSFLEET_TLS_SERVER_NAME to a name it has)")
        return ServerUnavailableError(f"{where}: server unavailable after retries ({details})")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return ConfigError(f"{where} refused: {details}")
    if code == grpc.StatusCode.ABORTED:  # a RetryableError on the server: MovedError
        return MovedError(f"{where}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RpcError(f"{where}: deadline exceeded ({details}); raise PSFLEET_RPC_DEADLINE_S "
                        "if the server is slow rather than dead")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequestError(f"{where} rejected: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return ConfigError(f"{where} rejected: {details}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        advice = ("The server ran out of memory or a message exceeded the size limit: give "
                  "the server more memory, or pull and push fewer keys per call (smaller "
                  "batches)")
        # A server relaying another server's error already carries the advice: once.
        return ResourceExhaustedError(f"{where}: resource exhausted: {details}"
                                      + ("" if advice in details else f". {advice}"))
    return RemoteError(f"{where} failed ({code.name}): {details}")


def wait_servers_ready(clients: list[RpcClient], timeout_s: float,
                       retry_interval_s: float = 3.0) -> None:
    """Block until every server answers its health check, logging each retry.

    Args:
        clients: one client per server endpoint.
        timeout_s: give up after this many seconds.
        retry_interval_s: wait between rounds of checks, seconds.

    Raises:
        ServerNotReadyError: some servers were not ready in time (lists them).
        ConfigError: a server is up but speaks the other protocol (TLS or plaintext).
    """
    deadline = time.monotonic() + timeout_s
    pending = list(clients)
    while True:
        pending = [c for c in pending if not c.is_serving()]
        if not pending:
            return
        for client in pending:
            client.check_protocol()
        missing = [c.endpoint for c in pending]
        if time.monotonic() + retry_interval_s > deadline:
            raise ServerNotReadyError(
                f"servers not ready after {timeout_s:.0f} s: {missing}. Check that they "
                "were started, their logs (serverlog.N), and PADDLE_PSERVERS_IP_PORT_LIST; "
                "raise PSFLEET_SERVER_WAIT_TIMEOUT_S if they start slowly"
            )
        logger.warning("server not ready, wait %.0f sec to retry...", retry_interval_s)
        logger.warning("not ready endpoints: %s", missing)
        time.sleep(retry_interval_s)
