"""Vocabulary of the transport: its configuration and the handler contract.

Only this package imports grpc. Layers above see :class:`RpcConfig`,
:class:`RpcClient` (``client.py``), :func:`serve` (``server.py``) and the message
classes of ``psfleet.proto`` re-exported as :mod:`psfleet.rpc.messages`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.rpc.tls import TlsConfig

__all__ = ["RpcConfig", "parse_endpoint", "DEFAULT_MAX_MESSAGE_BYTES"]

DEFAULT_MAX_MESSAGE_BYTES = 1 << 30  # 1 GiB: a pull of 10^7 rows of dim 9 is 360 MB


@dataclass(frozen=True)
class RpcConfig:
    """How every remote call behaves.

    Attributes:
        deadline_s: deadline of each call, seconds (the seeds' ``rpc_deadline``, 180 s).
        max_retries: retries of a call that failed with UNAVAILABLE (server not up,
            connection reset) before :class:`~psfleet.errors.RpcError` is raised.
        backoff_initial_s: first wait between retries; doubled each retry.
        backoff_max_s: cap of the wait between retries, seconds.
        max_message_bytes: send and receive limit of one message, bytes.
        auth_token: shared secret sent as metadata with every call and checked by the
            server; None disables the check (a server then serves on loopback only,
            ``psfleet.rpc.access``). Never shown in the config's repr.
        server_threads: handler threads of a server (a Barrier holds one per worker).
        tls: TLS files of servers and clients (``psfleet.rpc.tls``); None: plaintext.
        storage_roots: folders (paths or fsspec URL prefixes) a server's Save and Load
            may use; None: the server's working folder
            (``psfleet.rpc.access.StorageRoots``).
    """

    deadline_s: float = 180.0
    max_retries: int = 5
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    auth_token: str | None = field(default=None, repr=False)
    server_threads: int = 32
    tls: TlsConfig | None = None
    storage_roots: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.deadline_s <= 0:
            raise ConfigError(f"rpc.deadline_s: {self.deadline_s!r} must be > 0 seconds")
        if self.max_retries < 0:
            raise ConfigError(f"rpc.max_retries: {self.max_retries!r} must be >= 0")
        if self.server_threads < 2:
            raise ConfigError(f"rpc.server_threads: {self.server_threads!r} must be >= 2")

    @classmethod
    def from_env(cls) -> RpcConfig:
        """Build from ``PSFLEET_RPC_DEADLINE_S``, ``PSFLEET_RPC_MAX_RETRIES``,
        ``PSFLEET_AUTH_TOKEN``, ``PSFLEET_STORAGE_ROOTS`` and ``PSFLEET_TLS_*``.

        Raises:
            ConfigError: the deadline is not a positive number, or the TLS variables
                do not go together (names them).
        """
        raw = env.read("PSFLEET_RPC_DEADLINE_S")
        try:
            deadline = float(raw or 180.0)
        except ValueError:
            raise ConfigError(
                f"PSFLEET_RPC_DEADLINE_S: {raw!r} is not a number of seconds"
            ) from None
        retries_raw = env.read("PSFLEET_RPC_MAX_RETRIES") or "5"
        if not retries_raw.isdigit():
            raise ConfigError(f"PSFLEET_RPC_MAX_RETRIES: {retries_raw!r} is not an integer >= 0")
        return cls(deadline_s=deadline, max_retries=int(retries_raw),
                   auth_token=env.read("PSFLEET_AUTH_TOKEN"), tls=TlsConfig.from_env(),
                   storage_roots=env.list_var(None, "PSFLEET_STORAGE_ROOTS"))

    def with_storage_roots(self, *extra: str) -> RpcConfig:
        """This config with ``extra`` folders added to the storage roots (to the
        default, the working folder, when none are set)."""
        roots = self.storage_roots or (os.getcwd(),)
        return dataclasses.replace(
            self, storage_roots=(*roots, *(r for r in extra if r not in roots)))

    def channel_options(self) -> list[tuple[str, int]]:
        """gRPC channel/server options raising the message-size limits."""
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            # A restarted server is reconnected to within 2 s (gRPC's default backoff
            # grows to 120 s between connection attempts).
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]


def parse_endpoint(endpoint: str, what: str = "endpoint") -> tuple[str, int]:
    """Split ``host:port`` into its parts.

    Raises:
        ConfigError: not of the form host:port with a port in 0..65535 (names ``what``).
    """
    host, sep, port_text = endpoint.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(
            f"{what}: {endpoint!r} is not host:port (for example 127.0.0.1:6170)"
        )
    return host, int(port_text)
