"""Tests of fleetrun's multi-node form (--servers / --workers / --node_ip) and --start_port.

- Unit tests: which servers and workers a node starts given its addresses and the
  lists, the environment each gets, address detection, and the flag errors (exit 2).
- Real jobs on this host, through ``fleetrun`` running ``tests/jobs/fleet_job.py``
  (the fleet API training on Criteo lines): fixed server ports on 127.0.0.1, the same
  job split over two fleetrun invocations as "nodes" 127.0.0.1 and 127.0.0.2 (both
  loopback on Linux, so --node_ip tells them apart), --start_port, and a taken port.

Fixed ports: :func:`free_ports` asks the OS for free ports by binding port-0 sockets
and closing them just before the job starts. Another process could take one in
between (a tiny race, acceptable in a test, never done by psfleet itself); a job whose
server cannot bind is retried once with fresh ports.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
import pytest
from conftest import assert_no_processes_mentioning, clean_env, kill_processes, run_command

from psfleet.errors import ConfigError
from psfleet.launch import LaunchConfig
from psfleet.launch.cluster import plan_job
from psfleet.launch.hosts import host_matches, local_addresses
from psfleet.launch.main import build_parser, config_from_args
from psfleet.launch.specs import server_spec, worker_spec

pytestmark = pytest.mark.job

REPO = Path(__file__).resolve().parents[1]
FLEET_JOB = REPO / "tests" / "jobs" / "fleet_job.py"
JOB_TIMEOUT_S = 120.0
DATA_LINES = 600

SERVERS = "10.9.0.1:6170,10.9.0.2:6170,10.9.0.1:6171"
WORKERS = "10.9.0.2:6180,10.9.0.1,10.9.0.2"


def fleetrun() -> list[str]:
    """The installed ``fleetrun`` script, else ``python -m psfleet.launch.main``."""
    script = Path(sys.executable).parent / "fleetrun"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "psfleet.launch.main"]


def free_ports(n: int, consecutive: bool = False, host: str = "127.0.0.1") -> list[int]:
    """``n`` ports that were free a moment ago (see the module docstring for the race).

    With ``consecutive``, ports ``p .. p+n-1`` (for --start_port).
    """
    for _ in range(50):
        with contextlib.ExitStack() as stack:
            socks = [stack.enter_context(socket.socket()) for _ in range(n)]
            socks[0].bind((host, 0))
            first = socks[0].getsockname()[1]
            try:
                for i, sock in enumerate(socks[1:], start=1):
                    sock.bind((host, first + i if consecutive else 0))
            except OSError:
                continue
            return [s.getsockname()[1] for s in socks]
    raise RuntimeError(f"found no {n} free port(s) on {host}")


def _config(**kwargs: object) -> LaunchConfig:
    args: dict[str, object] = {"command": ("train.py",), "servers": SERVERS, "workers": WORKERS}
    args.update(kwargs)
    return LaunchConfig(**args)  # type: ignore[arg-type]


# -- which processes a node starts, and their environment ------------------------------


def test_each_node_starts_its_entries_with_global_indices(tmp_path: Path) -> None:
    config = _config(log_dir=tmp_path)
    assert config.servers == ("10.9.0.1:6170", "10.9.0.2:6170", "10.9.0.1:6171")
    assert config.workers == ("10.9.0.2", "10.9.0.1", "10.9.0.2")  # ports dropped
    assert (config.server_num, config.worker_num) == (3, 3)

    node_a = plan_job(config, ["10.9.0.1", "127.0.0.1"])
    node_b = plan_job(config, ["10.9.0.2"])
    only_servers = plan_job(_config(workers="10.9.0.2,10.9.0.2"), ["10.9.0.1"])
    only_workers = plan_job(_config(servers="10.9.0.2:1"), ["10.9.0.1"])

    assert (node_a.local_servers, node_a.local_workers) == ((0, 2), (1,))
    assert (node_b.local_servers, node_b.local_workers) == ((1,), (0, 2))
    assert (only_servers.local_servers, only_servers.local_workers) == ((0, 2), ())
    assert (only_workers.local_servers, only_workers.local_workers) == ((), (1,))
    assert node_a.endpoints_known
    assert node_a.describe_node() == "server(s) 0, 2 and worker(s) 1"


def test_node_ip_flag_picks_the_entries(tmp_path: Path) -> None:
    layout = plan_job(_config(log_dir=tmp_path, node_ips=("10.9.0.2",)))

    assert (layout.local_servers, layout.local_workers) == ((1,), (0, 2))
    assert layout.node_addresses == ("10.9.0.2",)


def test_environment_of_servers_and_workers(tmp_path: Path) -> None:
    config = _config(log_dir=tmp_path, server_wait_timeout_s=42)
    layout = plan_job(config, ["10.9.0.1"])
    inherited = {"PATH": "/bin", "PADDLE_TRAINER_ID": "7", "PSFLEET_ENDPOINT_FILE": "/x",
                 "RANK": "3"}

    server = server_spec(config, 2, inherited, layout=layout)
    worker = worker_spec(config, 1, layout.server_endpoints, inherited, layout=layout, tee=True)

    expected_list = "10.9.0.1:6170,10.9.0.2:6170,10.9.0.1:6171"
    assert server.env["TRAINING_ROLE"] == server.env["PADDLE_TRAINING_ROLE"] == "PSERVER"
    assert server.env["POD_IP"] == server.env["PADDLE_CURRENT_IP"] == "10.9.0.1"
    assert server.env["PADDLE_PORT"] == "6171"
    assert server.env["PSFLEET_SERVER_INDEX"] == "2"
    assert server.env["PADDLE_PSERVERS_IP_PORT_LIST"] == expected_list
    assert server.env["PADDLE_TRAINERS_NUM"] == "3"
    assert server.env["PADDLE_TRAINER_IPS"] == "10.9.0.2,10.9.0.1,10.9.0.2"
    for name in ("PSFLEET_ENDPOINT_FILE", "PADDLE_TRAINER_ID", "RANK"):
        assert name not in server.env, name
    assert server.env["PATH"] == "/bin"
    assert server.log_path == tmp_path / "serverlog.2"
    assert not server.tee

    assert worker.env["TRAINING_ROLE"] == worker.env["PADDLE_TRAINING_ROLE"] == "TRAINER"
    assert worker.env["POD_IP"] == worker.env["PADDLE_CURRENT_IP"] == "10.9.0.1"
    assert worker.env["PADDLE_TRAINER_ID"] == "1"
    assert worker.env["PADDLE_TRAINERS_NUM"] == "3"
    assert worker.env["PADDLE_PSERVERS_IP_PORT_LIST"] == expected_list
    assert worker.env["PADDLE_TRAINER_IPS"] == "10.9.0.2,10.9.0.1,10.9.0.2"
    assert worker.env["PSFLEET_SERVER_WAIT_TIMEOUT_S"] == "42"
    assert "PADDLE_PORT" not in worker.env and "PSFLEET_ENDPOINT_FILE" not in worker.env
    assert worker.log_path == tmp_path / "workerlog.1"
    assert worker.tee


def test_start_port_fixes_the_one_host_ports(tmp_path: Path) -> None:
    config = LaunchConfig(command=("t.py",), server_num=2, worker_num=2, log_dir=tmp_path,
                          start_port=7100)
    layout = plan_job(config)

    server = server_spec(config, 1, {}, layout=layout)
    worker = worker_spec(config, 0, layout.server_endpoints, {}, layout=layout)

    assert layout.server_endpoints == ("127.0.0.1:7100", "127.0.0.1:7101")
    assert server.env["PADDLE_PORT"] == "7101"
    assert server.env["PADDLE_PSERVERS_IP_PORT_LIST"] == "127.0.0.1:7100,127.0.0.1:7101"
    assert "PSFLEET_ENDPOINT_FILE" not in server.env
    assert worker.env["PADDLE_PSERVERS_IP_PORT_LIST"] == "127.0.0.1:7100,127.0.0.1:7101"
    assert worker.tee  # worker 0


def test_local_addresses_from_proc_files(tmp_path: Path) -> None:
    (tmp_path / "fib_trie").write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.231.7.0\n        /24 link UNICAST\n"
        "     |-- 10.231.7.1\n        /32 host LOCAL\n     |-- 10.231.7.255\n"
        "        /32 link BROADCAST\n     |-- 127.0.0.1\n        /32 host LOCAL\n")
    (tmp_path / "if_inet6").write_text(
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "fd000000000000000000000000000002 04 40 00 82     eth0\n")

    found = local_addresses(tmp_path)

    assert found == {"10.231.7.1", "127.0.0.1", "::1", "fd00::2"}
    assert "127.0.0.1" in local_addresses()  # this host's real addresses
    assert host_matches("127.0.0.1", local_addresses())
    assert host_matches("::0001", ["::1"]) and not host_matches("10.231.7.2", found)


# -- flag errors: exit 2 naming the flag, nothing started ------------------------------


def _parse(*flags: str) -> LaunchConfig:
    return config_from_args(build_parser().parse_args([*flags, str(FLEET_JOB)]))


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--servers=10.9.0.1", "--workers=10.9.0.1"], "--servers: '10.9.0.1' is not IP:PORT"),
        (["--servers=10.9.0.1:x", "--workers=10.9.0.1"], "--servers"),
        (["--servers=:6170", "--workers=10.9.0.1"], "--servers"),
        (["--servers=10.9.0.1:0", "--workers=10.9.0.1"], "--servers"),
        (["--servers=10.9.0.1:70000", "--workers=10.9.0.1"], "--servers"),
        (["--servers=10.9.0.1:1,,10.9.0.1:2", "--workers=10.9.0.1"], "--servers"),
        (["--servers=10.9.0.1:1,10.9.0.1:1", "--workers=10.9.0.1"], "listed twice"),
        (["--servers=10.9.0.1:1", "--workers=10.9.0.1:5,10.9.0.1:5"], "--workers"),
        (["--servers=10.9.0.1:1", "--workers=10.9.0.1:port"], "--workers"),
        (["--servers=10.9.0.1:1", "--workers="], "--workers: empty"),
        (["--servers=10.9.0.1:1", "--workers=10.9.0.1", "--server_num=1"], "--server_num"),
        (["--servers=10.9.0.1:1", "--workers=10.9.0.1", "--worker_num=1"], "--worker_num"),
        (["--servers=10.9.0.1:1", "--workers=10.9.0.1", "--start_port=7000"], "--start_port"),
        (["--servers=10.9.0.1:1"], "--workers: required"),
        (["--workers=10.9.0.1"], "--servers: required"),
        (["--node_ip=10.9.0.1", "--server_num=1"], "--node_ip"),
        (["--server_num=2", "--start_port=65535"], "--start_port"),
        (["--server_num=1", "--start_port=0"], "--start_port"),
    ],
)
def test_bad_multi_node_flags_name_the_flag(flags: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        _parse(*flags)


def test_workers_without_ports_and_with_ports_mix() -> None:
    config = _parse("--servers= 10.9.0.1:1 ,10.9.0.2:1", "--workers=10.9.0.1,10.9.0.1:9,10.9.0.1")
    assert config.servers == ("10.9.0.1:1", "10.9.0.2:1")
    assert config.workers == ("10.9.0.1",) * 3


def test_node_in_neither_list_is_an_error_naming_addresses_and_lists(tmp_path: Path) -> None:
    config = _config(log_dir=tmp_path / "log")
    with pytest.raises(ConfigError) as detected:
        plan_job(config)
    assert "127.0.0.1" in str(detected.value)  # one of this host's detected addresses
    assert SERVERS in str(detected.value) and "10.9.0.2,10.9.0.1,10.9.0.2" in str(detected.value)

    r = run_command([*fleetrun(), f"--servers={SERVERS}", f"--workers={WORKERS}",
                     "--node_ip", "10.9.0.3", "--log_dir", str(tmp_path / "log"),
                     str(FLEET_JOB)], timeout=60)

    assert r.returncode == 2, r.stderr
    assert "10.9.0.3" in r.stderr and SERVERS in r.stderr and "--workers is" in r.stderr
    assert not (tmp_path / "log").exists()  # nothing was started


def test_bad_flag_exits_2_before_anything_starts(tmp_path: Path) -> None:
    r = run_command([*fleetrun(), "--servers=10.9.0.1:1,10.9.0.1:1", "--workers=10.9.0.1",
                     "--log_dir", str(tmp_path / "log"), str(FLEET_JOB)], timeout=60)

    assert r.returncode == 2
    assert "--servers" in r.stderr and "listed twice" in r.stderr
    assert not (tmp_path / "log").exists()


# -- real jobs on this host ------------------------------------------------------------


def _job_args(data: Path, out: Path) -> list[str]:
    return [str(FLEET_JOB), "--data", str(data), "--out_dir", str(out), "--epochs", "2"]


def _assert_trained(out: Path, workers: int, lines: int) -> dict[str, object]:
    results = [json.loads((out / f"worker.{k}.json").read_text()) for k in range(workers)]
    assert [r["worker_index"] for r in results] == list(range(workers))
    assert all(r["worker_num"] == workers and r["steps"] > 0 for r in results)
    assert sum(r["examples"] for r in results) == lines
    result: dict[str, object] = json.loads((out / "result.json").read_text())
    assert result["loss_after"] < result["loss_before"], result  # type: ignore[operator]
    return result


def _run_with_ports(tmp_path: Path, make_argv: Callable[[list[int], Path], list[str]],
                    ports: Callable[[], list[int]]) -> tuple[subprocess.CompletedProcess[str],
                                                             list[int], Path, float]:
    """Run ``make_argv(ports, run_dir)``; once more with fresh ports if a bind failed."""
    for attempt in (1, 2):
        run_dir = tmp_path / f"run{attempt}"
        (run_dir / "out").mkdir(parents=True)
        chosen = ports()
        started = time.monotonic()
        r = run_command(make_argv(chosen, run_dir), JOB_TIMEOUT_S, cwd=run_dir)
        elapsed_s = time.monotonic() - started
        if r.returncode == 0 or "cannot bind" not in r.stderr or attempt == 2:
            return r, chosen, run_dir, elapsed_s
    raise AssertionError("unreachable")


@pytest.mark.slow
def test_fleet_job_on_fixed_server_ports(tmp_path: Path,
                                         data_slice: Callable[..., Path]) -> None:
    data = data_slice(DATA_LINES)

    def argv(ports: list[int], run_dir: Path) -> list[str]:
        servers = ",".join(f"127.0.0.1:{p}" for p in ports)
        return [*fleetrun(), f"--servers={servers}", "--workers=127.0.0.1,127.0.0.1",
                f"--log_dir={run_dir / 'log'}", "--stop_grace_s=3",
                *_job_args(data, run_dir / "out")]

    r, ports, run_dir, _ = _run_with_ports(tmp_path, argv, lambda: free_ports(2))

    assert r.returncode == 0, r.stderr[-3000:]
    result = _assert_trained(run_dir / "out", 2, DATA_LINES)
    assert result["server_endpoints"] == [f"127.0.0.1:{p}" for p in ports]
    assert "runs server(s) 0, 1 and worker(s) 0, 1" in r.stderr
    assert "server 0 exited 0" in r.stderr and "server 1 exited 0" in r.stderr
    assert not (run_dir / "log" / ".endpoints").exists()  # no endpoint files needed
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_start_port_binds_consecutive_ports(tmp_path: Path,
                                            data_slice: Callable[..., Path]) -> None:
    data = data_slice(DATA_LINES)

    # One worker: --start_port places the servers (two, so the ports must be
    # consecutive); the workers only read the list, which the result records.
    def argv(ports: list[int], run_dir: Path) -> list[str]:
        return [*fleetrun(), "--server_num=2", "--worker_num=1", f"--start_port={ports[0]}",
                f"--log_dir={run_dir / 'log'}", "--stop_grace_s=3",
                *_job_args(data, run_dir / "out")]

    r, ports, run_dir, _ = _run_with_ports(tmp_path, argv,
                                           lambda: free_ports(2, consecutive=True))

    assert r.returncode == 0, r.stderr[-3000:]
    result = _assert_trained(run_dir / "out", 1, DATA_LINES)
    assert result["server_endpoints"] == [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[0] + 1}"]
    assert not (run_dir / "log" / ".endpoints").exists()
    assert_no_processes_mentioning(str(tmp_path))


def test_taken_server_port_fails_fast_naming_it(tmp_path: Path,
                                                data_slice: Callable[..., Path]) -> None:
    data = data_slice(DATA_LINES)
    (free,) = free_ports(1)
    out = tmp_path / "out"
    out.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = run_command([*fleetrun(), f"--servers=127.0.0.1:{free},127.0.0.1:{port}",
                         "--workers=127.0.0.1", f"--log_dir={tmp_path / 'log'}",
                         "--stop_grace_s=3", *_job_args(data, out)], JOB_TIMEOUT_S,
                        cwd=tmp_path)

    assert r.returncode == 1, r.stderr[-3000:]
    assert f"server 1 cannot bind 127.0.0.1:{port}" in r.stderr
    assert "--servers" in r.stderr and "Nothing was started" in r.stderr
    assert not list((tmp_path / "log").glob("*log.*"))  # no process was started
    assert_no_processes_mentioning(str(tmp_path))


@contextlib.contextmanager
def _launchers() -> Iterator[list[subprocess.Popen[str]]]:
    """Popen objects started inside; on exit, SIGTERM (fleetrun forwards it), then kill."""
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=20)
        left = [p for p in procs if p.poll() is None]
        if left:
            tree: list[psutil.Process] = []
            for proc in left:
                with contextlib.suppress(psutil.Error):
                    tree += [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
            kill_processes(tree)
            for proc in left:
                proc.communicate()


JOB_TOKEN = "launchers-of-one-job-share-this-token"


def _start(argv: Sequence[str], cwd: Path) -> subprocess.Popen[str]:
    # The launchers of one job share its token, as on real nodes (docs/security.md).
    return subprocess.Popen(list(argv), env=clean_env({"PSFLEET_AUTH_TOKEN": JOB_TOKEN}),
                            cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


@pytest.mark.slow
def test_job_split_over_two_launchers_by_node_ip(tmp_path: Path,
                                                 data_slice: Callable[..., Path]) -> None:
    """"Node" 127.0.0.1 runs both servers, "node" 127.0.0.2 both workers.

    On Linux all of 127.0.0.0/8 is this host's loopback, so this exercises the
    servers-only lifecycle (they exit 0 once worker 0 stops them over RPC) and the
    workers-only one on a single machine.
    """
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.2", 0))
    except OSError as e:
        pytest.skip(f"127.0.0.2 is not a local address here: {e}")
    data = data_slice(DATA_LINES)
    out = tmp_path / "out"
    out.mkdir()
    ports = free_ports(2)
    servers = ",".join(f"127.0.0.1:{p}" for p in ports)

    def argv(node: str) -> list[str]:
        return [*fleetrun(), f"--servers={servers}", "--workers=127.0.0.2,127.0.0.2",
                f"--node_ip={node}", f"--log_dir={tmp_path / node}", "--stop_grace_s=3",
                *_job_args(data, out)]

    with _launchers() as procs:
        procs.append(_start(argv("127.0.0.1"), tmp_path))
        procs.append(_start(argv("127.0.0.2"), tmp_path))
        results = [p.communicate(timeout=JOB_TIMEOUT_S) for p in procs]
    (_, servers_err), (_, workers_err) = results

    assert [p.returncode for p in procs] == [0, 0], servers_err[-2000:] + workers_err[-2000:]
    _assert_trained(out, 2, DATA_LINES)
    assert "runs server(s) 0, 1 of a job" in servers_err
    assert "no worker on this node" in servers_err
    assert "server 0 exited 0" in servers_err and "SIGTERM" not in servers_err
    assert "runs worker(s) 0, 1 of a job" in workers_err
    assert sorted(p.name for p in (tmp_path / "127.0.0.1").iterdir()) == [
        "serverlog.0", "serverlog.1"]
    assert sorted(p.name for p in (tmp_path / "127.0.0.2").iterdir()) == [
        "workerlog.0", "workerlog.1"]
    assert_no_processes_mentioning(str(tmp_path))
