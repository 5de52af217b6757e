"""Reading the role variables of ``psfleet.env`` (private to role_maker).

Each reader returns the value and, where messages need it, the name of the variable
it came from; two variables that say the same thing differently raise ConfigError.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from psfleet import env
from psfleet.env import int_var, list_var
from psfleet.errors import ConfigError
from psfleet.rpc import parse_endpoint

__all__ = ["Workers", "server_endpoints", "workers_of"]


def _hosts(environ: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    hosts = list_var(environ, name)
    for host in hosts or ():
        if ":" in host or " " in host:
            raise ConfigError(f"{name}: {host!r} is not an IP address or host name "
                              "(host:port lists go in PADDLE_PSERVERS_IP_PORT_LIST)")
    return hosts


def _endpoint_list(endpoints: tuple[str, ...], source: str) -> tuple[str, ...]:
    seen: set[str] = set()
    for endpoint in endpoints:
        _, port = parse_endpoint(endpoint, source)
        if port == 0:
            raise ConfigError(f"{source}: {endpoint!r} has port 0, which no worker can "
                              "reach: give each server its fixed port")
        if endpoint in seen:
            raise ConfigError(f"{source}: {endpoint!r} appears twice: give each server its "
                              "own host:port (servers on one host need different ports)")
        seen.add(endpoint)
    return endpoints


def server_endpoints(environ: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """The server list and the name of the variable(s) it came from.

    PADDLE_PSERVERS_IP_PORT_LIST, or PADDLE_PSERVER_IPS + PADDLE_PSERVER_PORT (one port
    for every IP, or a comma list aligned with the IPs, as old Paddle did). Both given
    must agree.
    """
    listed = list_var(environ, "PADDLE_PSERVERS_IP_PORT_LIST")
    ips = _hosts(environ, "PADDLE_PSERVER_IPS")
    ports_raw = _server_ports(environ)
    composed: tuple[str, ...] | None = None
    if ips is not None and ports_raw is None:
        raise ConfigError(f"PADDLE_PSERVER_IPS is {','.join(ips)!r} but PADDLE_PSERVER_PORT "
                          "is not set: set one port for all servers or one per IP")
    if ports_raw is not None:
        if ips is None:
            raise ConfigError(f"PADDLE_PSERVER_PORT is {ports_raw!r} but PADDLE_PSERVER_IPS "
                              "is not set: list the servers' IPs (comma separated)")
        ports = [p.strip() for p in ports_raw.split(",") if p.strip()]
        for port in ports:
            if not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ConfigError(f"PADDLE_PSERVER_PORT: {port!r} is not a port (1..65535)")
        if len(ports) == 1:
            ports = ports * len(ips)
        if len(ports) != len(ips):
            raise ConfigError(
                f"PADDLE_PSERVER_PORT {ports_raw!r} lists {len(ports)} ports but "
                f"PADDLE_PSERVER_IPS {','.join(ips)!r} lists {len(ips)} IPs: give one port "
                "for all servers or one per IP")
        pairs = zip(ips, ports, strict=True)
        composed = _endpoint_list(tuple(f"{ip}:{port}" for ip, port in pairs),
                                  "PADDLE_PSERVER_IPS + PADDLE_PSERVER_PORT")
    if listed is not None:
        _endpoint_list(listed, "PADDLE_PSERVERS_IP_PORT_LIST")
        if composed is not None and composed != listed:
            raise ConfigError(
                f"PADDLE_PSERVERS_IP_PORT_LIST {','.join(listed)!r} and PADDLE_PSERVER_IPS + "
                f"PADDLE_PSERVER_PORT ({','.join(composed)!r}) disagree: set only one of them")
        return listed, "PADDLE_PSERVERS_IP_PORT_LIST"
    if composed is not None:
        return composed, "PADDLE_PSERVER_IPS + PADDLE_PSERVER_PORT"
    return (), "PADDLE_PSERVERS_IP_PORT_LIST"


def _server_ports(environ: Mapping[str, str]) -> str | None:
    """PADDLE_PSERVER_PORT, or the seeds' GPUBox spelling PADDLE_PSERVER_PORT_ARRAY
    ("(29011 29012)", spaces or commas) as a comma list; both set must agree."""
    port = env.read("PADDLE_PSERVER_PORT", environ)
    array = env.read("PADDLE_PSERVER_PORT_ARRAY", environ)
    if array is None:
        return port
    ports = ",".join(array.strip().strip("()").replace(",", " ").split())
    if port is not None and port.replace(" ", "") != ports:
        raise ConfigError(f"PADDLE_PSERVER_PORT {port!r} and PADDLE_PSERVER_PORT_ARRAY "
                          f"{array!r} disagree: set only one of them")
    if not ports:
        raise ConfigError(f"PADDLE_PSERVER_PORT_ARRAY: {array!r} lists no port")
    return ports


def _trainers(environ: Mapping[str, str]) -> tuple[int | None, tuple[str, ...] | None]:
    """PADDLE_TRAINERS: a worker count, or (older seeds) a comma list of worker IPs."""
    raw = env.read("PADDLE_TRAINERS", environ)
    if raw is None:
        return None, None
    if raw.strip().isdigit():
        return int_var(environ, "PADDLE_TRAINERS", 1), None
    ips = list_var(environ, "PADDLE_TRAINERS") or ()
    for ip in ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(f"PADDLE_TRAINERS: {raw!r} is neither a worker count nor a "
                              f"comma list of IP addresses ({ip!r}): set PADDLE_TRAINERS_NUM "
                              "to the number of workers") from None
    if not ips:
        raise ConfigError(f"PADDLE_TRAINERS: {raw!r} is not a worker count")
    return len(ips), ips


@dataclass(frozen=True)
class Workers:
    """worker_num, the variable it came from (for messages), the workers' IPs, and
    whether a variable gave it (False: the default of 1, nothing set)."""

    num: int
    source: str  # the variable num came from, for messages
    ips: tuple[str, ...]
    given: bool = True


def workers_of(environ: Mapping[str, str]) -> Workers:
    """worker_num from PADDLE_TRAINERS_NUM / PADDLE_TRAINERS / PADDLE_TRAINER_IPS."""
    num = int_var(environ, "PADDLE_TRAINERS_NUM", 1)
    old_num, old_ips = _trainers(environ)
    ips = _hosts(environ, "PADDLE_TRAINER_IPS")
    if num is not None and old_num is not None and num != old_num:
        raise ConfigError(
            f"PADDLE_TRAINERS_NUM is {num} but PADDLE_TRAINERS is "
            f"{env.read('PADDLE_TRAINERS', environ)!r} ({old_num} workers): set only one, "
            "or make them agree")
    if old_ips is not None and ips is not None and old_ips != ips:
        raise ConfigError(
            f"PADDLE_TRAINERS {','.join(old_ips)!r} and PADDLE_TRAINER_IPS "
            f"{','.join(ips)!r} list different workers: set only one of them")
    if num is not None:
        workers = Workers(num, "PADDLE_TRAINERS_NUM", ips or old_ips or ())
    elif old_num is not None:
        workers = Workers(old_num, "PADDLE_TRAINERS", ips or old_ips or ())
    elif ips:
        return Workers(len(ips), "PADDLE_TRAINER_IPS", ips)
    else:
        return Workers(1, "PADDLE_TRAINERS_NUM", (), given=False)
    if ips is not None and len(ips) != workers.num:
        raise ConfigError(
            f"PADDLE_TRAINER_IPS {','.join(ips)!r} lists {len(ips)} IPs but "
            f"{workers.source} is {workers.num}: list one IP per worker")
    return workers
