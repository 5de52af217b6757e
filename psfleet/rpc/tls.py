"""TLS of every gRPC channel: the files a server and a client are given, and their use.

A server serves TLS when it has a certificate and key (``PSFLEET_TLS_CERT``,
``PSFLEET_TLS_KEY``); it also requires a client certificate signed by
``PSFLEET_TLS_CLIENT_CA`` when that is set (mutual TLS). A client speaks TLS when it has
the CA that signed the servers' certificates (``PSFLEET_TLS_CA``) and presents
``PSFLEET_TLS_CLIENT_CERT`` / ``PSFLEET_TLS_CLIENT_KEY`` when given. Every process of a
job gets the same variables (a worker is a client, a server is a server), so one set
of files serves the whole job. ``fleetrun --tls self-signed`` makes a pair for a
one-host job (``psfleet.launch.tls``). docs/security.md says what TLS protects.

:func:`diagnose_tls_mismatch` turns "the server closed the connection" into the real
cause when one side speaks TLS and the other does not.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from psfleet import env
from psfleet.errors import ConfigError

__all__ = ["TlsConfig", "diagnose_tls_mismatch", "TLS_VARIABLES"]

#: Every variable a TlsConfig is read from (the launcher passes them to its children).
TLS_VARIABLES = ("PSFLEET_TLS_CERT", "PSFLEET_TLS_KEY", "PSFLEET_TLS_CA",
                 "PSFLEET_TLS_CLIENT_CERT", "PSFLEET_TLS_CLIENT_KEY", "PSFLEET_TLS_CLIENT_CA",
                 "PSFLEET_TLS_SERVER_NAME")


def _read(path: str | None, variable: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{variable}: cannot read {path!r} ({exc.strerror or exc}); give "
                          "a readable PEM file") from None


@dataclass(frozen=True)
class TlsConfig:
    """PEM files of one process's TLS (paths; read when credentials are built).

    Attributes:
        cert: the server's certificate chain (``PSFLEET_TLS_CERT``).
        key: the server's private key (``PSFLEET_TLS_KEY``).
        ca: the CA clients verify servers with (``PSFLEET_TLS_CA``).
        client_cert: the certificate a client presents (``PSFLEET_TLS_CLIENT_CERT``).
        client_key: its private key (``PSFLEET_TLS_CLIENT_KEY``).
        client_ca: the CA a server verifies clients with; set, a server refuses a
            client without a certificate it signed (``PSFLEET_TLS_CLIENT_CA``).
        server_name: the name clients expect in the servers' certificates when it
            is not the endpoint's host (``PSFLEET_TLS_SERVER_NAME``).

    Raises:
        ConfigError: a key without its certificate (or the reverse), or a client
            CA without a server certificate (names the variables).
    """

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    client_ca: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        for a, b in (("cert", "key"), ("client_cert", "client_key")):
            if (getattr(self, a) is None) != (getattr(self, b) is None):
                given, missing = (a, b) if getattr(self, a) is not None else (b, a)
                raise ConfigError(f"PSFLEET_TLS_{given.upper()} is set but "
                                  f"PSFLEET_TLS_{missing.upper()} is not; set both")
        if self.client_ca is not None and self.cert is None:
            raise ConfigError("PSFLEET_TLS_CLIENT_CA needs PSFLEET_TLS_CERT and "
                              "PSFLEET_TLS_KEY: a server verifies clients only over TLS")

    @classmethod
    def from_env(cls) -> TlsConfig | None:
        """The TLS files of the ``PSFLEET_TLS_*`` variables; None when none is set."""
        values = {name: env.read(name) for name in TLS_VARIABLES}
        if all(v is None for v in values.values()):
            return None
        return cls(*(values[name] for name in TLS_VARIABLES))

    @property
    def serves_tls(self) -> bool:
        """Whether a server with this config serves TLS (it has a certificate)."""
        return self.cert is not None

    @property
    def dials_tls(self) -> bool:
        """Whether a client with this config speaks TLS (it has a CA or a client cert)."""
        return self.ca is not None or self.client_cert is not None

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials of a TLS server port (client certificates required with a
        client CA).

        Raises:
            ConfigError: a file cannot be read (names the variable and path).
        """
        cert = _read(self.cert, "PSFLEET_TLS_CERT")
        key = _read(self.key, "PSFLEET_TLS_KEY")
        client_ca = _read(self.client_ca, "PSFLEET_TLS_CLIENT_CA")
        if cert is None or key is None:
            raise ConfigError("a TLS server needs PSFLEET_TLS_CERT and PSFLEET_TLS_KEY")
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca,
            require_client_auth=client_ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials of a client channel: verify the server with ``ca`` (the system's
        roots when None), present the client certificate when given.

        Raises:
            ConfigError: a file cannot be read (names the variable and path).
        """
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "PSFLEET_TLS_CA"),
            private_key=_read(self.client_key, "PSFLEET_TLS_CLIENT_KEY"),
            certificate_chain=_read(self.client_cert, "PSFLEET_TLS_CLIENT_CERT"))


def _probe(host: str, port: int, timeout_s: float) -> str | None:
    """What ``host:port`` speaks: ``"plain"``, ``"tls"``, ``"tls-client-cert"`` (TLS
    that refuses a client without a certificate), or None when it cannot be reached.
    One handshake without certificates, checking none; nothing of the job is sent."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return None
    with raw:
        try:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                # TLS 1.3 refuses a client without the certificate it asked for only
                # after the handshake: gRPC closes the connection (or sends an alert),
                # where a server that asked for none sends its HTTP/2 settings.
                tls.settimeout(min(timeout_s, 0.5))
                try:
                    first = tls.recv(1)
                except ssl.SSLError as exc:
                    return ("tls-client-cert" if "CERTIFICATE" in (exc.reason or "").upper()
                            else "tls")
                except OSError:
                    return "tls"
                return "tls" if first else "tls-client-cert"
        except ssl.SSLError as exc:
            # A TLS server ends the handshake with an alert; plain HTTP/2 bytes are
            # not a TLS record at all.
            reason = (exc.reason or "").upper()
            if "CERTIFICATE" in reason:
                return "tls-client-cert"
            return "tls" if "ALERT" in reason else "plain"
        except OSError:
            return "plain"


def diagnose_tls_mismatch(endpoint: str, tls: TlsConfig | None,
                          timeout_s: float = 2.0) -> str | None:
    """Why a client could not talk to ``endpoint`` when TLS is the cause, else None.

    Probes the port with one TLS handshake (no certificate check; nothing of the
    job is sent) and compares with what the client speaks.

    Args:
        endpoint: ``host:port`` of the server.
        tls: the client's TLS config (None: plaintext).
        timeout_s: bound of the probe, seconds.

    Returns:
        A message naming the variable to set, or None when TLS is not the problem
        (or the port does not answer). Blocks up to about 2 * ``timeout_s``.
    """
    host, _, port = endpoint.rpartition(":")
    speaks = _probe(host.strip("[]"), int(port), timeout_s)
    dials = tls is not None and tls.dials_tls
    if speaks in ("tls", "tls-client-cert") and not dials:
        return (f"server {endpoint} wants TLS and this client speaks plaintext: set "
                "PSFLEET_TLS_CA to the CA file that signed the server's certificate "
                "(fleetrun --tls self-signed: <log_dir>/tls/cert.pem)")
    if speaks == "tls-client-cert" and (tls is None or tls.client_cert is None):
        return (f"server {endpoint} requires a client certificate (mutual TLS): set "
                "PSFLEET_TLS_CLIENT_CERT and PSFLEET_TLS_CLIENT_KEY to a pair signed by "
                "the servers' PSFLEET_TLS_CLIENT_CA")
    if speaks == "plain" and dials:
        return (f"server {endpoint} speaks plaintext and this client TLS: unset "
                "PSFLEET_TLS_CA / PSFLEET_TLS_CLIENT_CERT, or start the servers with "
                "PSFLEET_TLS_CERT and PSFLEET_TLS_KEY")
    return None
