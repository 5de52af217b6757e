"""MPIRoleMaker's server-list exchange and fleet.init()'s choice of role maker, without
mpirun: the collective is a fake world of threads (``allgather`` is injectable), and
this node's address and free ports are stubbed, so no socket is opened.

tests/test_mpi_job.py runs the real thing under mpirun.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from psfleet.errors import ConfigError
from psfleet.fleet import Fleet, _mpi
from psfleet.fleet.role_maker import (
    MPIRoleMaker,
    PaddleCloudRoleMaker,
    Role,
    RoleInfo,
    default_role_maker,
)

pytestmark = pytest.mark.unit


class FakeWorld:
    """``size`` ranks, one thread each; ``allgather(rank)`` is rank's collective."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls = 0
        self._slots: list[Any] = [None] * size
        self._barrier = threading.Barrier(size, timeout=10)
        self._lock = threading.Lock()

    def allgather(self, rank: int) -> _mpi.Allgather:
        def gather(value: Any) -> list[Any]:
            with self._lock:
                self.calls += 1
            self._slots[rank] = value
            self._barrier.wait()  # every rank has put its value
            gathered = list(self._slots)
            self._barrier.wait()  # every rank has read them
            return gathered
        return gather


def _mpi_env(rank: int, size: int, **extra: str) -> dict[str, str]:
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size), **extra}


def run_ranks(envs: Sequence[Mapping[str, str]], server_num: int | None = 2
              ) -> list[RoleInfo | ConfigError]:
    """generate_role() on every rank at once; each rank's role or its ConfigError."""
    world = FakeWorld(len(envs))

    def rank_role(rank: int) -> RoleInfo | ConfigError:
        maker = MPIRoleMaker(server_num, environ=envs[rank], allgather=world.allgather(rank))
        try:
            return maker.generate_role()
        except ConfigError as e:
            return e

    with ThreadPoolExecutor(len(envs)) as pool:
        results = list(pool.map(rank_role, range(len(envs))))
    assert world.calls == len(envs)  # every rank took part exactly once
    return results


def roles_of(results: Sequence[RoleInfo | ConfigError]) -> list[RoleInfo]:
    assert all(isinstance(r, RoleInfo) for r in results), results
    return [r for r in results if isinstance(r, RoleInfo)]


def one_error(results: Sequence[RoleInfo | ConfigError]) -> str:
    """The message every rank raised (they must all raise the same)."""
    messages = {str(r) for r in results}
    assert all(isinstance(r, ConfigError) for r in results), results
    assert len(messages) == 1, messages
    return messages.pop()


@pytest.fixture
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Stub this node's address (10.9.8.7) and free ports (7001, 7002, ...); yields the
    hosts free_port was asked about."""
    lock = threading.Lock()
    asked: list[str] = []

    def free_port(host: str) -> int:
        with lock:
            asked.append(host)
            return 7000 + len(asked)

    monkeypatch.setattr(_mpi, "node_address", lambda: "10.9.8.7")
    monkeypatch.setattr(_mpi, "free_port", free_port)
    yield asked


# -- the exchange -------------------------------------------------------------------------

def test_every_rank_gets_the_servers_in_rank_order_and_one_generated_token() -> None:
    envs = [_mpi_env(0, 4, POD_IP="10.0.0.1", PADDLE_PORT="6170"),
            _mpi_env(1, 4, POD_IP="10.0.0.2", PADDLE_PORT="6171"),
            _mpi_env(2, 4, POD_IP="10.0.0.3"), _mpi_env(3, 4)]
    roles = roles_of(run_ranks(envs))
    servers = ("10.0.0.1:6170", "10.0.0.2:6171")
    token = roles[0].auth_token
    assert token is not None and len(token) >= 40  # secrets.token_urlsafe(32): 43 chars
    assert roles == [
        RoleInfo(Role.SERVER, 0, 2, server_index=0, server_endpoints=servers,
                 bind_endpoint="10.0.0.1:6170", auth_token=token),
        RoleInfo(Role.SERVER, 0, 2, server_index=1, server_endpoints=servers,
                 bind_endpoint="10.0.0.2:6171", auth_token=token),
        RoleInfo(Role.WORKER, 0, 2, server_endpoints=servers, auth_token=token),
        RoleInfo(Role.WORKER, 1, 2, server_endpoints=servers, auth_token=token),
    ]
    assert token not in repr(roles[0])  # a secret stays out of logs


def test_a_server_without_pod_ip_offers_this_nodes_address_and_a_free_port(
        no_sockets: list[str]) -> None:
    envs = [_mpi_env(0, 3), _mpi_env(1, 3, PADDLE_CURRENT_IP="10.0.0.2"),
            _mpi_env(2, 3, PADDLE_PORT="6170")]
    roles = roles_of(run_ranks(envs))
    # Rank 0 takes the node's address, rank 1 PADDLE_CURRENT_IP; both a free port on it
    # (which rank asked first is up to the threads). The worker asks for nothing.
    assert sorted(no_sockets) == ["10.0.0.2", "10.9.8.7"]
    ports = {host: 7001 + i for i, host in enumerate(no_sockets)}
    servers = (f"10.9.8.7:{ports['10.9.8.7']}", f"10.0.0.2:{ports['10.0.0.2']}")
    assert [r.server_endpoints for r in roles] == [servers] * 3
    assert [r.bind_endpoint for r in roles] == [*servers, None]
    assert [r.role for r in roles] == [Role.SERVER, Role.SERVER, Role.WORKER]


def test_port_zero_takes_a_free_port(no_sockets: list[str]) -> None:
    roles = roles_of(run_ranks([_mpi_env(0, 2, POD_IP="10.0.0.1", PADDLE_PORT="0"),
                                _mpi_env(1, 2)], server_num=1))
    assert no_sockets == ["10.0.0.1"]
    assert roles[1].server_endpoints == ("10.0.0.1:7001",)


def test_a_token_in_the_environment_is_kept() -> None:
    envs = [_mpi_env(r, 3, POD_IP="10.0.0.1", PADDLE_PORT="6170", PSFLEET_AUTH_TOKEN="s3")
            for r in range(3)]
    roles = roles_of(run_ranks(envs, server_num=1))
    assert [r.auth_token for r in roles] == [None, None, None]  # fleet reads the variable
    assert roles[2] == RoleInfo(Role.WORKER, 1, 2, server_endpoints=("10.0.0.1:6170",))


def test_a_listed_server_list_makes_no_mpi_call() -> None:
    def no_mpi(value: Any) -> list[Any]:
        raise AssertionError("no MPI call when the list is set")

    environ = _mpi_env(1, 3, PADDLE_PSERVERS_IP_PORT_LIST="10.0.0.1:6170,10.0.0.2:6170")
    assert MPIRoleMaker(2, environ=environ, allgather=no_mpi).generate_role() == RoleInfo(
        Role.SERVER, 0, 1, server_index=1, server_endpoints=("10.0.0.1:6170", "10.0.0.2:6170"),
        bind_endpoint="10.0.0.2:6170")


@pytest.mark.parametrize(("envs", "server_num", "pattern"), [
    # One rank's own variable is wrong: it still takes part, and every rank names it.
    ([_mpi_env(0, 3, POD_IP="10.0.0.1", PADDLE_PORT="6170"),
      _mpi_env(1, 3, POD_IP="10.0.0.2", PADDLE_PORT="x"), _mpi_env(2, 3)], 2,
     "the MPI ranks could not agree on the servers: rank 1: PADDLE_PORT: 'x' is not an "
     "integer"),
    ([_mpi_env(0, 2, POD_IP="10.0.0.1", PADDLE_CURRENT_IP="10.0.0.9", PADDLE_PORT="1"),
      _mpi_env(1, 2)], 1,
     "rank 0: POD_IP is '10.0.0.1' but PADDLE_CURRENT_IP is '10.0.0.9'"),
    ([_mpi_env(0, 3, PSFLEET_SERVER_NUM="1", POD_IP="10.0.0.1", PADDLE_PORT="1"),
      _mpi_env(1, 3, PSFLEET_SERVER_NUM="1"), _mpi_env(2, 3)], None,
     "rank 2: MPIRoleMaker: server_num is not given and PSFLEET_SERVER_NUM is not set"),
    ([_mpi_env(0, 3, PSFLEET_SERVER_NUM="1", POD_IP="10.0.0.1", PADDLE_PORT="1"),
      _mpi_env(1, 3, PSFLEET_SERVER_NUM="3"), _mpi_env(2, 3, PSFLEET_SERVER_NUM="1")], None,
     r"rank 1: OMPI_COMM_WORLD_SIZE is 3 but PSFLEET_SERVER_NUM is 3: no rank is left"),
    # Both valid, but different: the ranks would disagree on who serves.
    ([_mpi_env(0, 3, PSFLEET_SERVER_NUM="1", POD_IP="10.0.0.1", PADDLE_PORT="1"),
      _mpi_env(1, 3, PSFLEET_SERVER_NUM="2", POD_IP="10.0.0.1", PADDLE_PORT="2"),
      _mpi_env(2, 3, PSFLEET_SERVER_NUM="1")], None,
     r"the MPI ranks disagree on the server count \(ranks \[0, 2\] say 1; \[1\] say 2\): give "
     "every rank the same PSFLEET_SERVER_NUM"),
    # mpirun -x PADDLE_PORT=6170 on one node: both servers would bind one endpoint.
    ([_mpi_env(r, 4, POD_IP="10.0.0.1", PADDLE_PORT="6170") for r in range(4)], 2,
     r"servers 0 and 1 \(ranks 0 and 1\) both offer 10.0.0.1:6170: PADDLE_PORT is the same "
     "for every rank of a node; unset it"),
    ([_mpi_env(0, 2, POD_IP="10.0.0.1", PADDLE_PORT="1", PSFLEET_AUTH_TOKEN="s3"),
      _mpi_env(1, 2)], 1,
     r"PSFLEET_AUTH_TOKEN is set on ranks \[0\] only: pass it to every rank"),
])
def test_every_rank_raises_the_same_error(envs: list[dict[str, str]], server_num: int | None,
                                          pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        raise ConfigError(one_error(run_ranks(envs, server_num)))


def test_a_world_that_is_not_the_launchers_is_named() -> None:
    # mpi4py built for another MPI than mpirun's: each process is a world of one.
    maker = MPIRoleMaker(1, environ=_mpi_env(2, 4, POD_IP="10.0.0.1"),
                         allgather=lambda value: [value])
    with pytest.raises(ConfigError, match=r"MPI's COMM_WORLD has 1 ranks \(whose launcher ranks "
                       r"are \[2\]\) but the launcher started 4: mpi4py loads another MPI "
                       "library than the one whose mpirun started the job"):
        maker.generate_role()


def test_without_rank_variables_no_mpi_call_is_made() -> None:
    def no_mpi(value: Any) -> list[Any]:
        raise AssertionError("no MPI call outside mpirun")

    with pytest.raises(ConfigError, match="MPIRoleMaker: none of OMPI_COMM_WORLD_RANK/"):
        MPIRoleMaker(1, environ={}, allgather=no_mpi).generate_role()


def test_without_mpi4py_both_fixes_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # find_spec: not installed
    with pytest.raises(ConfigError) as raised:
        MPIRoleMaker(1, environ=_mpi_env(0, 2)).generate_role()
    assert str(raised.value) == (
        "MPIRoleMaker: no server list is set and mpi4py, which would exchange one, is not "
        "installed: pip install 'psfleet[mpi]' (mpi4py; its wheel uses the MPI library of "
        "the mpirun that starts the job, e.g. Debian's openmpi-bin), or set "
        "PADDLE_PSERVERS_IP_PORT_LIST to every server's host:port in server-rank order")


# -- this node's address --------------------------------------------------------------------

class _FakeUdp:
    def __init__(self, source: str | None) -> None:
        self.source = source

    def __enter__(self) -> _FakeUdp:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def connect(self, address: tuple[str, int]) -> None:
        if self.source is None:
            raise OSError(101, "Network is unreachable")

    def getsockname(self) -> tuple[str, int]:
        assert self.source is not None
        return self.source, 40000


@pytest.mark.parametrize(("route", "resolved", "expected"), [
    ("10.1.2.3", ["127.0.1.1"], "10.1.2.3"),  # the route's source address
    (None, ["127.0.1.1", "10.4.5.6"], "10.4.5.6"),  # no route: the host name's, not loopback
    ("127.0.0.1", ["192.168.1.5"], "192.168.1.5"),
    (None, ["127.0.1.1"], "127.0.0.1"),  # loopback only
])
def test_node_address_prefers_an_address_other_nodes_reach(
        monkeypatch: pytest.MonkeyPatch, route: str | None, resolved: list[str],
        expected: str) -> None:
    def getaddrinfo(host: str, port: None, family: int) -> list[tuple[Any, ...]]:
        assert (host, family) == ("node1", socket.AF_INET)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0)) for ip in resolved]

    fake = SimpleNamespace(AF_INET=socket.AF_INET, SOCK_DGRAM=socket.SOCK_DGRAM,
                           socket=lambda *a: _FakeUdp(route), gethostname=lambda: "node1",
                           getaddrinfo=getaddrinfo)
    monkeypatch.setattr(_mpi, "socket", fake)  # only _mpi's view of the module
    assert _mpi.node_address() == expected


# -- fleet.init() without a role maker -----------------------------------------------------

TWO = "10.0.0.1:6170,10.0.0.2:6170"


@pytest.mark.parametrize(("environ", "maker", "why"), [
    ({}, PaddleCloudRoleMaker, "no TRAINING_ROLE and no MPI rank variable is set"),
    (_mpi_env(0, 4, TRAINING_ROLE="TRAINER"), PaddleCloudRoleMaker,
     "TRAINING_ROLE is set, which wins over OMPI_COMM_WORLD_RANK"),
    (_mpi_env(0, 4, PADDLE_TRAINING_ROLE="PSERVER"), PaddleCloudRoleMaker,
     "PADDLE_TRAINING_ROLE is set, which wins over OMPI_COMM_WORLD_RANK"),
    (_mpi_env(3, 4), MPIRoleMaker, "OMPI_COMM_WORLD_RANK is set (mpirun) and no TRAINING_ROLE; "
     "no PSFLEET_SERVER_NUM: half of the 4 ranks (2) serve"),
    (_mpi_env(3, 4, PSFLEET_SERVER_NUM="1"), MPIRoleMaker,
     "OMPI_COMM_WORLD_RANK is set (mpirun) and no TRAINING_ROLE; PSFLEET_SERVER_NUM: 1 ranks "
     "serve"),
    ({"PMI_RANK": "0", "PMI_SIZE": "3"}, MPIRoleMaker,
     "PMI_RANK is set (mpirun) and no TRAINING_ROLE; no PSFLEET_SERVER_NUM: half of the 3 "
     "ranks (1) serve"),
    (_mpi_env(0, 1), PaddleCloudRoleMaker, "OMPI_COMM_WORLD_RANK is set (mpirun) and no "
     "TRAINING_ROLE; one rank (OMPI_COMM_WORLD_SIZE is 1) and no PSFLEET_SERVER_NUM: it trains "
     "alone"),
])
def test_default_role_maker_is_chosen_and_said_why(environ: dict[str, str], maker: type,
                                                   why: str) -> None:
    chosen, reason = default_role_maker(environ)
    assert type(chosen) is maker
    assert reason == why


@pytest.mark.parametrize(("environ", "expected"), [
    # Half the ranks serve, ranks 0 .. size/2-1; the odd one out is a worker.
    (_mpi_env(1, 4, PADDLE_PSERVERS_IP_PORT_LIST=TWO),
     RoleInfo(Role.SERVER, 0, 2, server_index=1, server_endpoints=tuple(TWO.split(",")),
              bind_endpoint="10.0.0.2:6170")),
    (_mpi_env(4, 5, PADDLE_PSERVERS_IP_PORT_LIST=TWO),
     RoleInfo(Role.WORKER, 2, 3, server_endpoints=tuple(TWO.split(",")))),
    (_mpi_env(2, 3, PSFLEET_SERVER_NUM="1", PADDLE_PSERVERS_IP_PORT_LIST="10.0.0.1:6170"),
     RoleInfo(Role.WORKER, 1, 2, server_endpoints=("10.0.0.1:6170",))),
    # mpirun -np 1: trains alone, as without mpirun.
    (_mpi_env(0, 1), RoleInfo(Role.WORKER, 0, 1)),
])
def test_default_role_maker_roles(environ: dict[str, str], expected: RoleInfo) -> None:
    role = default_role_maker(environ)[0].generate_role()
    assert role == expected
    assert role.is_local is (expected.server_endpoints == ())


@pytest.mark.parametrize(("environ", "pattern"), [
    ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"),
    ({"PMI_SIZE": "2"}, "PMI_SIZE is set but PMI_RANK is not"),
    (_mpi_env(0, 4, PSFLEET_SERVER_NUM="two"), "PSFLEET_SERVER_NUM: 'two' is not an integer"),
    (_mpi_env(0, 4, PSFLEET_SERVER_NUM="0"), "PSFLEET_SERVER_NUM: 0 must be >= 1"),
    (_mpi_env(5, 4), r"OMPI_COMM_WORLD_RANK: 5 must be < OMPI_COMM_WORLD_SIZE \(4\)"),
])
def test_default_role_maker_errors(environ: dict[str, str], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        default_role_maker(environ)


@pytest.fixture
def fleet_log() -> Iterator[list[str]]:
    """INFO messages of psfleet.fleet.process_role (its own handler: psfleet's logger may not
    propagate to pytest's)."""
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("psfleet.fleet.process_role")
    log.addHandler(handler)
    try:
        yield messages
    finally:
        log.removeHandler(handler)


def _clear_job_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("PADDLE_", "PSFLEET_", "OMPI_", "PMI_")) or name in (
                "TRAINING_ROLE", "POD_IP"):
            monkeypatch.delenv(name)


def test_fleet_init_picks_mpi_from_the_environment_and_logs_why(
        monkeypatch: pytest.MonkeyPatch, fleet_log: list[str]) -> None:
    _clear_job_env(monkeypatch)
    for name, value in _mpi_env(3, 4, PADDLE_PSERVERS_IP_PORT_LIST=TWO).items():
        monkeypatch.setenv(name, value)
    f = Fleet()
    f.init()
    try:
        assert (f.is_worker(), f.worker_index(), f.worker_num(), f.server_endpoints()) == (
            True, 1, 2, TWO.split(","))
        assert ("fleet.init: role maker MPIRoleMaker (OMPI_COMM_WORLD_RANK is set (mpirun) and "
                "no TRAINING_ROLE; no PSFLEET_SERVER_NUM: half of the 4 ranks (2) serve)"
                in fleet_log)
    finally:
        f.reset()


def test_fleet_uses_the_token_the_ranks_shared(monkeypatch: pytest.MonkeyPatch,
                                               fleet_log: list[str]) -> None:
    _clear_job_env(monkeypatch)
    # fleet.init sets it: set-then-delete makes monkeypatch remove it afterwards.
    monkeypatch.setenv("PSFLEET_AUTH_TOKEN", "placeholder")
    monkeypatch.delenv("PSFLEET_AUTH_TOKEN")
    others = [_mpi.Offer(0, 3, 1, "10.0.0.1:6170", "shared-secret"), _mpi.Offer(1, 3, 1)]

    def allgather(value: Any) -> list[Any]:
        return [*others, value]

    f = Fleet()
    f.init(MPIRoleMaker(1, environ=_mpi_env(2, 3), allgather=allgather))
    try:
        assert f.server_endpoints() == ["10.0.0.1:6170"] and f.worker_index() == 1
        assert f.rpc_config.auth_token == "shared-secret"
        # Code building its config from the environment gets it too (the runner's readers).
        assert os.environ["PSFLEET_AUTH_TOKEN"] == "shared-secret"
        assert "fleet.init: worker 1 of 2, servers 10.0.0.1:6170" in fleet_log[0]
    finally:
        f.reset()


def test_fleet_keeps_a_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_job_env(monkeypatch)
    monkeypatch.setenv("PSFLEET_AUTH_TOKEN", "mine")
    others = [_mpi.Offer(0, 2, 1, "10.0.0.1:6170", None, has_env_token=True)]
    f = Fleet()
    f.init(MPIRoleMaker(1, environ={**_mpi_env(1, 2), "PSFLEET_AUTH_TOKEN": "mine"},
                        allgather=lambda value: [*others, value]))
    try:
        assert f.rpc_config.auth_token == "mine"
    finally:
        f.reset()
