"""Who may call a server and where it may read and write: token, storage roots, binds.

Three rules, applied by ``psfleet.rpc.server`` to every remote call (the in-process
transport of a one-process job has no server and no caller to protect from):

- **Token.** With ``PSFLEET_AUTH_TOKEN`` set, every call (data and admin alike) must
  carry it, compared in constant time; the launcher generates one per job when none
  is set (``psfleet.launch.security``). The standard gRPC health service answers
  without it (it says only SERVING or not), so readiness waits and probes work.
- **Binds.** A server without a token serves only on a loopback address (with a
  warning); bound to any other address it refuses to start (:func:`check_bind`).
- **Storage roots.** ``Save`` and ``Load`` name a folder (a path or an fsspec URL); it
  must lie under one of the server's roots (:class:`StorageRoots`), after ``..`` and
  symbolic links are resolved. Roots come from ``PSFLEET_STORAGE_ROOTS``; without
  any, the server's working folder is the one root.

docs/security.md gives the threat model.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from psfleet.errors import ConfigError

__all__ = ["StorageRoots", "check_bind", "is_loopback", "split_location"]

_LOCAL_PROTOCOLS = ("file", "local")


def split_location(location: str) -> tuple[str, str]:
    """``(protocol, normalised path)`` of a local path or fsspec URL.

    A local path (or ``file://``) is made absolute against this process's working
    folder, and ``..`` and symbolic links are resolved (``os.path.realpath``; a tail
    that does not exist yet is normalised as text). Another URL keeps its protocol
    (lower case; a chained URL ``a::b://`` keeps its whole chain) and its path is
    normalised as text under ``/``, so ``..`` cannot climb above the bucket.
    """
    protocol, sep, rest = location.partition("://")
    if not sep:
        return "file", os.path.realpath(location)
    protocol = protocol.lower()
    if protocol in _LOCAL_PROTOCOLS:
        return "file", os.path.realpath(rest)
    return protocol, posixpath.normpath("/" + rest)


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class StorageRoots:
    """The folders under which a server's ``Save`` and ``Load`` may read and write.

    Attributes:
        roots: each root as given (a local path or an fsspec URL prefix).
        normalised: the ``(protocol, path)`` of each root (:func:`split_location`),
            resolved once, when the server starts.
    """

    roots: tuple[str, ...]
    normalised: tuple[tuple[str, str], ...]

    @classmethod
    def resolve(cls, roots: Sequence[str] | None) -> StorageRoots:
        """Resolve ``roots``; None or empty: this process's working folder alone.

        Raises:
            ConfigError: a root is blank.
        """
        given = tuple(roots or ()) or (os.getcwd(),)
        for root in given:
            if not root.strip():
                raise ConfigError(f"PSFLEET_STORAGE_ROOTS: blank root in {list(given)!r}; "
                                  "give folders or fsspec URL prefixes, comma-separated")
        return cls(given, tuple(split_location(r.strip()) for r in given))

    def refusal(self, method: str, dirname: str) -> str | None:
        """Why ``method`` may not use ``dirname`` (a message), or None when it may.

        The message names the folder as given and as resolved, the roots, and how
        to allow it.
        """
        try:
            protocol, path = split_location(dirname)
        except (ValueError, OSError) as exc:  # e.g. an embedded NUL byte
            return f"{method}: {dirname!r} is not a usable folder name ({exc})"
        if any(p == protocol and _is_under(path, r) for p, r in self.normalised):
            return None
        shown = path if protocol == "file" else f"{protocol}:/{path}"
        return (f"{method}: {dirname!r} (resolved: {shown!r}) is outside this server's "
                f"storage roots {list(self.roots)}; save and load under one of them, or "
                "add the folder to PSFLEET_STORAGE_ROOTS (comma-separated folders or fsspec "
                "URL prefixes) in the environment of the servers (of fleetrun, for a "
                "launched job)")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP or a name) is reachable only from this machine.

    A name counts when every address it resolves to is a loopback address;
    ``0.0.0.0`` and ``::`` (every interface) do not.
    """
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(
        ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addresses)


def check_bind(host: str, auth_token: str | None) -> None:
    """Refuse to serve without a token on an address other machines can reach.

    Raises:
        ConfigError: ``auth_token`` is None and ``host`` is not a loopback address
            (names the address and what to set).
    """
    if auth_token is None and not is_loopback(host):
        raise ConfigError(
            f"server on {host!r} without PSFLEET_AUTH_TOKEN: any machine that reaches it "
            "could stop it, overwrite its tables or read them. Set PSFLEET_AUTH_TOKEN to "
            "the same secret on every server and worker, e.g. export PSFLEET_AUTH_TOKEN="
            "$(python -c 'import secrets; print(secrets.token_urlsafe(32))'), or bind "
            "127.0.0.1 (POD_IP) for a job on one machine. docs/security.md")
