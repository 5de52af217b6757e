"""Hosts for job tests: network namespaces on one bridge, all created by the test.

:func:`bridged_hosts` creates a "switch" namespace holding a bridge and, per host, a
namespace whose ``eth0`` is one end of a veth pair; the other end is created directly
inside the switch namespace and joined to the bridge. Nothing is added to the
machine's own namespace; the namespaces have no default route, so no traffic leaves
them. Every namespace is deleted (after killing what runs in it) in every case. Skips,
saying why, where namespaces cannot be created (not root, no ``ip`` binary, or the
kernel refuses).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest
from conftest import kill_processes

__all__ = ["Host", "bridged_hosts", "ip", "kill_namespace_processes", "new_subnet"]


@dataclass(frozen=True)
class Host:
    """One namespace ("host") and its address on the bridge."""

    ns: str
    address: str


def ip(*args: str) -> None:
    """Run ``ip ARGS``; raise CalledProcessError with its stderr when it fails."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def kill_namespace_processes(ns: str) -> None:
    """SIGKILL every process in network namespace ``ns`` (``ip netns pids``)."""
    try:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return
    procs = []
    for pid in out.split():
        with contextlib.suppress(psutil.Error, ValueError):
            procs.append(psutil.Process(int(pid)))
    kill_processes(procs)


def new_subnet() -> tuple[str, int]:
    """A random tag for namespace names and a random third octet for addresses;
    skips, saying why, where namespaces cannot be made (no ``ip``, not root)."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` binary (apt package iproute2): cannot create network namespaces")
    if os.geteuid() != 0:
        pytest.skip(f"creating network namespaces needs root; running as uid {os.geteuid()}")
    return secrets.token_hex(3), secrets.randbelow(250) + 1


@contextlib.contextmanager
def bridged_hosts(count: int) -> Iterator[list[Host]]:
    """``count`` hosts on one bridge, addresses ``10.232.<random>.<1..count>/24``."""
    tag, subnet = new_subnet()
    switch = f"psf-sw-{tag}"
    hosts = [Host(f"psf-h{i}-{tag}", f"10.232.{subnet}.{i + 1}") for i in range(count)]
    created: list[str] = []
    try:
        try:
            for ns in (switch, *(h.ns for h in hosts)):
                ip("netns", "add", ns)
                created.append(ns)
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            pytest.skip(f"cannot create network namespaces: {detail.strip()}")
        ip("-n", switch, "link", "add", "br0", "type", "bridge")
        ip("-n", switch, "link", "set", "br0", "up")
        for i, host in enumerate(hosts):
            port = f"p{i}"
            ip("-n", host.ns, "link", "add", "eth0", "type", "veth",
               "peer", "name", port, "netns", switch)
            ip("-n", switch, "link", "set", port, "master", "br0")
            ip("-n", switch, "link", "set", port, "up")
            ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.ns, "link", "set", "lo", "up")
            ip("-n", host.ns, "link", "set", "eth0", "up")
        yield hosts
    finally:
        for ns in reversed(created):
            kill_namespace_processes(ns)
            with contextlib.suppress(OSError, subprocess.CalledProcessError):
                ip("netns", "del", ns)  # also removes its veth ends
