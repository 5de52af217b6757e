"""The launcher's health-check helper against real servers (issue 15, finding 10).

- :func:`speaks_http2` tells a psfleet gRPC server (it greets with a SETTINGS frame)
  from a socket that never speaks, without sending either a byte, and from a port
  nothing listens on.
- :class:`HealthMonitor` (its ``health_probe`` helper process) arms a plaintext and a
  TLS server (self-signed, the CA from ``PSFLEET_TLS_CA`` as the job's clients have
  it) by their health answers, and skips a server that is not gRPC, logging it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from psfleet.launch.health import HealthMonitor
from psfleet.launch.health_probe import speaks_http2
from psfleet.launch.tls import write_self_signed_pair
from psfleet.ps import start_server
from psfleet.ps.service import TableService
from psfleet.rpc import RpcConfig
from psfleet.rpc.tls import TlsConfig

pytestmark = pytest.mark.job

HOST = "127.0.0.1"


@contextlib.contextmanager
def _server(config: RpcConfig) -> Iterator[str]:
    _, server = start_server(HOST, 0, config, TableService(barrier_timeout_s=1.0))
    try:
        yield server.endpoint
    finally:
        server.stop(grace_s=0.5)


@contextlib.contextmanager
def _silent_socket() -> Iterator[str]:
    """A listening socket that accepts (the kernel's backlog) and never writes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    sock.listen(4)
    try:
        yield f"{HOST}:{sock.getsockname()[1]}"
    finally:
        sock.close()


@contextlib.contextmanager
def _monitor(environ: dict[str, str]) -> Iterator[HealthMonitor]:
    monitor = HealthMonitor(3.0, environ)
    try:
        yield monitor
    finally:
        monitor.close()


def _armed_within(monitor: HealthMonitor, pid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        monitor.overdue()
        if monitor.tracker.armed(pid):
            return True
        time.sleep(0.05)
    return False


def test_speaks_http2_tells_grpc_servers_from_silent_sockets() -> None:
    with _server(RpcConfig(auth_token="t", server_threads=2)) as endpoint:
        assert speaks_http2(endpoint, 2.0) is True
    with _silent_socket() as endpoint:
        started = time.monotonic()
        assert speaks_http2(endpoint, 0.3) is False
        assert time.monotonic() - started < 2.0
    assert speaks_http2(endpoint, 0.3) is None  # closed: nothing listens there now


def test_the_probe_arms_plaintext_and_tls_servers_and_skips_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pair = write_self_signed_pair(tmp_path / "tls")
    tls = RpcConfig(auth_token="t", server_threads=2,
                    tls=TlsConfig(cert=str(pair.cert), key=str(pair.key)))
    caplog.set_level(logging.INFO, logger="psfleet.launch.health")
    with _server(RpcConfig(auth_token="t", server_threads=2)) as plain, \
            _monitor({}) as monitor, _silent_socket() as silent:
        monitor.watch(1_000_001, plain)
        monitor.watch(1_000_002, silent)
        assert _armed_within(monitor, 1_000_001)
        deadline = time.monotonic() + 30.0
        while "not a gRPC server" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"{silent} (pid 1000002) sends no HTTP/2 greeting" in caplog.text
        assert not monitor.tracker.armed(1_000_002)
        assert monitor.overdue() == []
    with _server(tls) as secure, _monitor({"PSFLEET_TLS_CA": str(pair.cert)}) as monitor:
        monitor.watch(1_000_003, secure)
        assert _armed_within(monitor, 1_000_003)
