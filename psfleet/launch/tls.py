"""A self-signed TLS pair for a one-host job (``fleetrun --tls self-signed``).

:func:`write_self_signed_pair` makes an ECDSA P-256 key and a certificate for
``127.0.0.1``, ``::1`` and ``localhost`` (its own CA: the servers present it and the
clients verify with it), valid from 5 minutes ago for 30 days, with the
``cryptography`` package. The key file is created with mode 0600 (nothing else can
read it); both go to ``<log_dir>/tls/``, replaced on every run.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["TlsPair", "write_self_signed_pair", "CERT_NAME", "KEY_NAME"]

CERT_NAME = "cert.pem"
KEY_NAME = "key.pem"
_VALID_DAYS = 30


class TlsPair:
    """Paths of a certificate and its key."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert = cert
        self.key = key


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by this user only (0600 from creation)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_self_signed_pair(folder: Path, common_name: str = "psfleet local job",
                           hosts: tuple[str, ...] = ("127.0.0.1", "::1", "localhost")
                           ) -> TlsPair:
    """Make a key and a self-signed certificate naming ``hosts``; write them to ``folder``.

    Args:
        folder: created (mode 0700) if missing; ``cert.pem`` and ``key.pem`` (mode
            0600) are replaced.
        common_name: the certificate's subject CN.
        hosts: IP addresses and DNS names of the certificate (subjectAltName).

    Returns:
        The paths written.

    Raises:
        OSError: the folder cannot be created or written.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    alt_names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    pair = TlsPair(folder / CERT_NAME, folder / KEY_NAME)
    _write_private(pair.key, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    tmp = pair.cert.with_name(f".{CERT_NAME}.tmp.{os.getpid()}")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, pair.cert)
    return pair
