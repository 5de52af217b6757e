"""Hosts and endpoints of a multi-node job: parse ``--servers`` / ``--workers``, find
this node's addresses, and decide whether a host is this node.

This node's addresses come from the kernel, with the standard library only: on Linux
``/proc/net/fib_trie`` (every local IPv4 address, the ``/32 host LOCAL`` entries) and
``/proc/net/if_inet6`` (IPv6), both per network namespace; elsewhere the addresses the
host name resolves to plus the loopback addresses. ``--node_ip`` replaces the detection.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Collection, Iterable
from pathlib import Path

from psfleet.errors import ConfigError

__all__ = [
    "split_list",
    "parse_server_list",
    "parse_worker_list",
    "local_addresses",
    "normalize_host",
    "host_matches",
    "bind_error",
]

_PROC_NET = Path("/proc/net")
_EXAMPLE_SERVER = "10.0.0.1:6170"


def split_list(value: str | Iterable[str]) -> tuple[str, ...]:
    """``"a, b"`` or ``["a", "b"]`` -> ``("a", "b")`` (items stripped, empty ones kept)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(item).strip() for item in items)


def _split_host_port(item: str) -> tuple[str, str | None]:
    """``host:port`` / ``[v6]:port`` / ``host`` / bare IPv6 -> (host, port text or None)."""
    if item.startswith("["):
        host, sep, rest = item[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return "", None
        return host, rest[1:] if rest else None
    if item.count(":") > 1:  # a bare IPv6 address, no port
        return item, None
    host, sep, port = item.partition(":")
    return host, port if sep else None


def _port(text: str | None) -> int | None:
    if text is None or not text.isdigit() or not 1 <= int(text) <= 65535:
        return None
    return int(text)


def parse_server_list(value: str | Iterable[str], flag: str = "--servers") -> tuple[str, ...]:
    """Validate every server's ``IP:PORT``; return them in server-index order.

    Raises:
        ConfigError: the list is empty, an entry is not ``host:port`` with a port in
            1..65535, or an endpoint is listed twice (names ``flag``).
    """
    items = split_list(value)
    if not any(items):
        raise ConfigError(f"{flag}: empty; list every server's IP:PORT, e.g. {_EXAMPLE_SERVER}")
    endpoints: list[str] = []
    for item in items:
        host, port_text = _split_host_port(item)
        port = _port(port_text)
        if not host or port is None:
            raise ConfigError(
                f"{flag}: {item!r} is not IP:PORT with a port in 1..65535 "
                f"(for example {_EXAMPLE_SERVER}; separate servers with commas)"
            )
        endpoint = f"{host}:{port}"
        if endpoint in endpoints:
            raise ConfigError(
                f"{flag}: {endpoint} is listed twice; every server needs its own IP:PORT"
            )
        endpoints.append(endpoint)
    return tuple(endpoints)


def parse_worker_list(value: str | Iterable[str], flag: str = "--workers") -> tuple[str, ...]:
    """Validate every worker's ``IP`` or ``IP:PORT``; return the hosts in index order.

    The ports are informational (as in Paddle): a worker binds nothing. The same host
    may appear many times (several workers on one node), but the same ``IP:PORT`` not.

    Raises:
        ConfigError: the list is empty, an entry has no host or a bad port, or an
            ``IP:PORT`` is listed twice (names ``flag``).
    """
    items = split_list(value)
    if not any(items):
        raise ConfigError(f"{flag}: empty; list every worker's IP (or IP:PORT), e.g. 10.0.0.1")
    hosts: list[str] = []
    seen: set[str] = set()
    for item in items:
        host, port_text = _split_host_port(item)
        if not host or (port_text is not None and _port(port_text) is None):
            raise ConfigError(
                f"{flag}: {item!r} is not IP or IP:PORT with a port in 1..65535 "
                "(for example 10.0.0.1 or 10.0.0.1:6180; separate workers with commas)"
            )
        if port_text is not None:
            endpoint = f"{host}:{port_text}"
            if endpoint in seen:
                raise ConfigError(
                    f"{flag}: {endpoint} is listed twice; give each worker its own entry "
                    "(or list bare IPs)"
                )
            seen.add(endpoint)
        hosts.append(host)
    return tuple(hosts)


def normalize_host(host: str) -> str:
    """The canonical text of an IP literal (``::0001`` -> ``::1``); other hosts unchanged."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return host


def _fib_trie_ipv4(text: str) -> set[str]:
    """Local IPv4 addresses: the ``|-- ADDR`` lines followed by ``/32 host LOCAL``."""
    found: set[str] = set()
    last: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|--"):
            last = stripped[3:].strip()
        elif stripped.startswith("/32") and "host LOCAL" in stripped and last is not None:
            found.add(last)
    return found


def _if_inet6(text: str) -> set[str]:
    found: set[str] = set()
    for line in text.splitlines():
        fields = line.split()
        if fields and len(fields[0]) == 32:
            with contextlib.suppress(ValueError):
                found.add(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def local_addresses(proc_net: Path = _PROC_NET) -> frozenset[str]:
    """Every IP address of this node (this network namespace), as canonical text.

    Blocks briefly (reads ``/proc``; off Linux, resolves the host name once).
    """
    found: set[str] = set()
    with contextlib.suppress(OSError):
        found |= _fib_trie_ipv4((proc_net / "fib_trie").read_text())
    with contextlib.suppress(OSError):
        found |= _if_inet6((proc_net / "if_inet6").read_text())
    if not found:
        found = {"127.0.0.1", "::1"}
        with contextlib.suppress(OSError):
            for info in socket.getaddrinfo(socket.gethostname(), None):
                found.add(normalize_host(str(info[4][0])))
    return frozenset(found)


def host_matches(host: str, addresses: Collection[str]) -> bool:
    """Whether ``host`` (an IP literal or a name) is one of ``addresses``.

    An IP literal is compared canonically; a name matches when it is itself listed or
    resolves (``getaddrinfo``) to a listed address. An unresolvable name matches nothing.
    """
    canonical = {normalize_host(a) for a in addresses}
    if normalize_host(host) in canonical:
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
        return False  # an IP literal that is not listed
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return any(normalize_host(str(info[4][0])) in canonical for info in infos)


def bind_error(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound here right now (``None``: it can).

    Binds a TCP socket with ``SO_REUSEADDR`` (as gRPC does, so a port in TIME_WAIT
    passes) and closes it at once. Only a quick early check before starting a server:
    the server's own bind stays the authority.
    """
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        return f"cannot resolve {host!r}: {e}"
    family, kind, proto, _, address = infos[0]
    try:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as e:
        return e.strerror or str(e)
    return None
