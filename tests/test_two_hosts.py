"""A real two-node job: two network namespaces joined by a veth pair stand for two hosts.

The test creates namespaces ``psf-a-<rand>`` and ``psf-b-<rand>`` and one veth pair
whose ends are created directly inside them (nothing is added to the host's own
namespace), addresses ``10.231.<rand>.1/24`` and ``.2/24``, and brings ``lo`` and the
veth ends up. The namespaces have no other interface and no default route, so no
traffic can go anywhere but these two addresses (and each namespace's loopback);
proxy variables are removed from the children's environment as well. Then it runs::

    ip netns exec NS_A fleetrun --servers=A:P,B:P --workers=A,B --node_ip A fleet_job.py ...
    ip netns exec NS_B fleetrun --servers=A:P,B:P --workers=A,B --node_ip B fleet_job.py ...

concurrently, and checks that both exit 0 and both workers trained. The namespaces are
deleted (after killing anything left in them) in every case. Skips, printing why, only
where namespaces cannot be created (not root, no ``ip`` binary from iproute2, or the
kernel refuses).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import clean_env
from netns_hosts import ip, kill_namespace_processes, new_subnet

pytestmark = [pytest.mark.job, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
FLEET_JOB = REPO / "tests" / "jobs" / "fleet_job.py"
JOB_TIMEOUT_S = 180.0
DATA_LINES = 800
SERVER_PORT = 36170  # the namespaces are new and empty: every port is free
PROXY_VARIABLES = ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy", "no_proxy")


@dataclass(frozen=True)
class Hosts:
    """The two namespaces ("hosts") and their addresses."""

    ns_a: str
    ns_b: str
    ip_a: str
    ip_b: str


@pytest.fixture
def two_hosts() -> Iterator[Hosts]:
    tag, subnet = new_subnet()
    hosts = Hosts(f"psf-a-{tag}", f"psf-b-{tag}", f"10.231.{subnet}.1", f"10.231.{subnet}.2")
    veth_a, veth_b = f"psfa{tag}", f"psfb{tag}"  # <= 15 characters
    created: list[str] = []
    try:
        try:
            for ns in (hosts.ns_a, hosts.ns_b):
                ip("netns", "add", ns)
                created.append(ns)
        except (OSError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", None) or str(e)
            pytest.skip(f"cannot create network namespaces: {detail.strip()}")
        # Both ends are created inside the namespaces; the host's namespace is untouched.
        ip("-n", hosts.ns_a, "link", "add", veth_a, "type", "veth",
            "peer", "name", veth_b, "netns", hosts.ns_b)
        for ns, dev, address in ((hosts.ns_a, veth_a, hosts.ip_a),
                                 (hosts.ns_b, veth_b, hosts.ip_b)):
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", dev, "up")
        yield hosts
    finally:
        for ns in created:
            kill_namespace_processes(ns)
            with contextlib.suppress(OSError, subprocess.CalledProcessError):
                ip("netns", "del", ns)  # also removes the veth pair


JOB_TOKEN = secrets.token_urlsafe(32)


def _fleetrun() -> list[str]:
    script = Path(sys.executable).parent / "fleetrun"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "psfleet.launch.main"]


def _child_env() -> dict[str, str]:
    # A job across nodes needs one token exported on every node (docs/security.md).
    env = clean_env({"PSFLEET_AUTH_TOKEN": JOB_TOKEN})
    for name in PROXY_VARIABLES:
        env.pop(name, None)
        env.pop(name.upper(), None)
    return env


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM the launchers still running (they stop their children), then SIGKILL."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=20)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_job_across_two_hosts(two_hosts: Hosts, tmp_path: Path,
                              data_slice: Callable[..., Path]) -> None:
    hosts = two_hosts
    for ns in (hosts.ns_a, hosts.ns_b):  # nothing routes out of the namespaces
        routes = subprocess.run(["ip", "-n", ns, "route", "show"], capture_output=True,
                                text=True, check=True).stdout
        assert "default" not in routes, routes
    data = data_slice(DATA_LINES)
    out = tmp_path / "out"
    out.mkdir()
    servers = f"{hosts.ip_a}:{SERVER_PORT},{hosts.ip_b}:{SERVER_PORT}"

    def argv(ns: str, node_ip: str, log_dir: Path) -> list[str]:
        return ["ip", "netns", "exec", ns, *_fleetrun(), f"--servers={servers}",
                f"--workers={hosts.ip_a},{hosts.ip_b}", "--node_ip", node_ip,
                f"--log_dir={log_dir}", "--stop_grace_s=5", str(FLEET_JOB),
                "--data", str(data), "--out_dir", str(out), "--epochs", "2"]

    started = time.monotonic()
    procs: list[subprocess.Popen[str]] = []
    try:
        for ns, node_ip, name in ((hosts.ns_a, hosts.ip_a, "a"), (hosts.ns_b, hosts.ip_b, "b")):
            procs.append(subprocess.Popen(
                argv(ns, node_ip, tmp_path / f"log_{name}"), env=_child_env(), cwd=tmp_path,
                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True))
        deadline = started + JOB_TIMEOUT_S
        outputs = []
        for proc in procs:
            try:
                outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                _stop(procs)
                pytest.fail(f"the two-host job did not finish within {JOB_TIMEOUT_S} s",
                            pytrace=False)
    finally:
        _stop(procs)
    elapsed_s = time.monotonic() - started
    (_, err_a), (_, err_b) = outputs
    both = f"--- node A\n{err_a[-3000:]}\n--- node B\n{err_b[-3000:]}"

    assert [p.returncode for p in procs] == [0, 0], both
    assert f"this node ({hosts.ip_a}) runs server(s) 0 and worker(s) 0" in err_a, both
    assert f"this node ({hosts.ip_b}) runs server(s) 1 and worker(s) 1" in err_b, both
    workers = [json.loads((out / f"worker.{k}.json").read_text()) for k in (0, 1)]
    assert [w["worker_index"] for w in workers] == [0, 1]
    assert all(w["worker_num"] == 2 and w["steps"] > 0 for w in workers)
    assert sum(w["examples"] for w in workers) == DATA_LINES
    result = json.loads((out / "result.json").read_text())
    assert result["server_endpoints"] == servers.split(",")
    assert result["loss_after"] < result["loss_before"], result
    assert all(rows for rows in result["tables"])  # both servers hold rows
    # Worker 0 (on A) stopped the server on B over the veth: it exited by itself.
    assert "server 1 exited 0" in err_b and "SIGKILL" not in err_a + err_b, both
    assert (tmp_path / "log_a" / "serverlog.0").is_file()
    assert (tmp_path / "log_b" / "workerlog.1").is_file()
    print(f"two-host job took {elapsed_s:.1f} s")
