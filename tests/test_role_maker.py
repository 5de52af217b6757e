"""Tests of psfleet.fleet.role_maker and rule_from_optimizer, on fixed environments."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from psfleet.errors import ConfigError
from psfleet.fleet import (
    MPIRoleMaker,
    PaddleCloudRoleMaker,
    Role,
    RoleInfo,
    SlurmRoleMaker,
    UserDefinedRoleMaker,
    rule_from_optimizer,
)
from psfleet.ps.types import RuleConfig

pytestmark = pytest.mark.unit

SERVERS = "127.0.0.1:6170,127.0.0.1:6171, 10.0.0.2:6170"
ENDPOINTS = ("127.0.0.1:6170", "127.0.0.1:6171", "10.0.0.2:6170")


def role_of(environ: dict[str, str]) -> RoleInfo:
    return PaddleCloudRoleMaker(environ).generate_role()


def test_empty_environment_is_a_local_worker() -> None:
    for environ in ({}, {"PADDLE_PSERVERS_IP_PORT_LIST": "", "TRAINING_ROLE": ""}):
        info = role_of(environ)
        assert info == RoleInfo(Role.WORKER, worker_index=0, worker_num=1)
        assert info.is_local
        assert info.server_index == -1 and info.bind_endpoint is None


def test_trainer_from_paddle_variables() -> None:
    info = role_of({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                    "PADDLE_TRAINERS_NUM": "4", "PADDLE_TRAINER_ID": "3"})
    assert info.role is Role.WORKER
    assert (info.worker_index, info.worker_num) == (3, 4)
    assert info.server_endpoints == ENDPOINTS
    assert not info.is_local
    assert info.server_index == -1 and info.bind_endpoint is None


def test_paddle_training_role_is_an_alternative_name() -> None:
    worker = role_of({"PADDLE_TRAINING_ROLE": "trainer", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                      "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "1"})
    assert worker.role is Role.WORKER and worker.worker_index == 1
    server = role_of({"PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                      "POD_IP": "127.0.0.1", "PADDLE_PORT": "6170"})
    assert server.role is Role.SERVER and server.server_index == 0


def test_server_finds_its_endpoint_in_the_list() -> None:
    info = role_of({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                    "POD_IP": "10.0.0.2", "PADDLE_PORT": "6170", "PADDLE_TRAINERS_NUM": "5"})
    assert info.role is Role.SERVER
    assert info.server_index == 2
    assert info.bind_endpoint == "10.0.0.2:6170"
    assert info.server_endpoints == ENDPOINTS
    assert info.worker_num == 5 and info.worker_index == 0
    assert info.endpoint_file is None
    assert not info.is_local
    # PADDLE_CURRENT_IP names the address too.
    other = role_of({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                     "PADDLE_CURRENT_IP": "127.0.0.1", "PADDLE_PORT": "6171"})
    assert other.server_index == 1 and other.bind_endpoint == "127.0.0.1:6171"


def test_server_index_given_with_port_zero(tmp_path: Path) -> None:
    info = role_of({"TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1", "PADDLE_PORT": "0",
                    "PSFLEET_SERVER_INDEX": "2",
                    "PSFLEET_ENDPOINT_FILE": str(tmp_path / "server.2")})
    assert info.role is Role.SERVER
    assert info.server_index == 2
    assert info.bind_endpoint == "127.0.0.1:0"
    assert info.server_endpoints == ()
    assert info.endpoint_file == tmp_path / "server.2"


@pytest.mark.parametrize(("environ", "pattern"), [
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PORT": "6170",
      "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS}, "POD_IP"),
    ({"TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1",
      "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS}, "PADDLE_PORT"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINERS_NUM": "2",
      "PADDLE_TRAINER_ID": "2"}, r"PADDLE_TRAINER_ID: 2 must be < PADDLE_TRAINERS_NUM \(2\)"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINERS_NUM": "2",
      "PADDLE_TRAINER_ID": "-1"}, "PADDLE_TRAINER_ID: -1 must be >= 0"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINERS_NUM": "2"},
     "PADDLE_TRAINER_ID is not set"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:6170,abc"},
     "PADDLE_PSERVERS_IP_PORT_LIST: 'abc' is not host:port"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:99999"},
     "PADDLE_PSERVERS_IP_PORT_LIST: '127.0.0.1:99999' is not host:port"),
    ({"PADDLE_TRAINERS_NUM": "two"}, "PADDLE_TRAINERS_NUM: 'two' is not an integer"),
    ({"PADDLE_TRAINERS_NUM": "0"}, "PADDLE_TRAINERS_NUM: 0 must be >= 1"),
    ({"TRAINING_ROLE": "CHIEF"}, "TRAINING_ROLE: 'CHIEF' is not one of PSERVER, TRAINER"),
    ({"TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1", "PADDLE_PORT": "9999",
      "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS},
     r"127\.0\.0\.1:9999 .*not in PADDLE_PSERVERS_IP_PORT_LIST"),
    ({"PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "0"},
     "PADDLE_TRAINERS_NUM is 2 but PADDLE_PSERVERS_IP_PORT_LIST is empty"),
    ({"TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1", "PADDLE_PORT": "0",
      "PSFLEET_SERVER_INDEX": "x"}, "PSFLEET_SERVER_INDEX: 'x' is not an integer"),
])
def test_inconsistent_environment_names_the_variable(environ: dict[str, str],
                                                      pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        role_of(environ)


def test_user_defined_role_maker() -> None:
    endpoints = ["127.0.0.1:6170", "127.0.0.1:6171"]
    worker = UserDefinedRoleMaker(1, Role.WORKER, 3, endpoints).generate_role()
    assert worker == RoleInfo(Role.WORKER, 1, 3, server_endpoints=tuple(endpoints))
    server = UserDefinedRoleMaker(1, Role.SERVER, 3, endpoints).generate_role()
    assert server.role is Role.SERVER
    assert server.server_index == 1 and server.bind_endpoint == "127.0.0.1:6171"
    assert server.worker_num == 3
    local = UserDefinedRoleMaker(0, Role.WORKER, 1, []).generate_role()
    assert local.is_local


@pytest.mark.parametrize(("args", "pattern"), [
    ((2, Role.SERVER, 1, ["127.0.0.1:6170", "127.0.0.1:6171"]),
     r"current_id: 2 is not a server index \(0\.\.1\)"),
    ((3, Role.WORKER, 3, ["127.0.0.1:6170"]), r"current_id: 3 must be in 0\.\.2"),
    ((-1, Role.WORKER, 3, ["127.0.0.1:6170"]), r"current_id: -1 must be in 0\.\.2"),
    ((0, Role.WORKER, 1, ["localhost"]), "server_endpoints: 'localhost' is not host:port"),
])
def test_user_defined_role_maker_errors(args: tuple[int, Role, int, list[str]],
                                        pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        UserDefinedRoleMaker(*args).generate_role()


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(3))]


def test_rule_from_optimizer_maps_hyper_parameters() -> None:
    adam = torch.optim.Adam(_params(), lr=0.02, betas=(0.8, 0.99), eps=1e-6)
    assert rule_from_optimizer(adam) == RuleConfig(
        name="adam", learning_rate=0.02, beta1=0.8, beta2=0.99, epsilon=1e-6)
    assert rule_from_optimizer(torch.optim.SGD(_params(), lr=0.3)) == RuleConfig(
        name="sgd", learning_rate=0.3)
    adagrad = torch.optim.Adagrad(_params(), lr=0.05, eps=1e-9, initial_accumulator_value=0.1)
    assert rule_from_optimizer(adagrad) == RuleConfig(
        name="adagrad", learning_rate=0.05, epsilon=1e-9, initial_accumulator=0.1)
    # torch's defaults map to the same defaults.
    default_adam = rule_from_optimizer(torch.optim.Adam(_params()))
    assert (default_adam.learning_rate, default_adam.beta1, default_adam.beta2,
            default_adam.epsilon) == (0.001, 0.9, 0.999, 1e-8)
    assert rule_from_optimizer(torch.optim.Adagrad(_params())).epsilon == 1e-10


@pytest.mark.parametrize(("make", "pattern"), [
    (lambda p: torch.optim.Adam(p, weight_decay=0.1), r"Adam: weight_decay=0\.1 is not"),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), r"SGD: momentum=0\.9 is not"),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "SGD: momentum=0.9"),
    (lambda p: torch.optim.Adam(p, amsgrad=True), "Adam: amsgrad=True is not"),
    (lambda p: torch.optim.Adagrad(p, lr_decay=0.01), r"Adagrad: lr_decay=0\.01 is not"),
    (lambda p: torch.optim.RMSprop(p), "RMSprop has no table rule.*Adam.*SGD.*Adagrad"),
    (lambda p: torch.optim.SGD([{"params": p[:1], "lr": 0.1}, {"params": p[1:], "lr": 0.2}]),
     "param groups differ in 'lr'"),
])
def test_rule_from_optimizer_rejects_what_tables_cannot_apply(make: object,
                                                              pattern: str) -> None:
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    optimizer = make(params)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=pattern):
        rule_from_optimizer(optimizer)


# -- PaddleCloudRoleMaker: every variable of both seed generations ---------------------

def test_server_list_from_pserver_ips_and_one_port() -> None:
    worker = role_of({"PADDLE_PSERVER_IPS": "10.0.0.1, 10.0.0.2", "PADDLE_PSERVER_PORT": "6170",
                      "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "1"})
    assert worker.server_endpoints == ("10.0.0.1:6170", "10.0.0.2:6170")
    server = role_of({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2",
                      "PADDLE_PSERVER_PORT": "6170", "POD_IP": "10.0.0.2",
                      "PADDLE_PORT": "6170"})
    assert server.server_index == 1 and server.bind_endpoint == "10.0.0.2:6170"


def test_server_list_from_pserver_ips_and_aligned_ports() -> None:
    info = role_of({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVER_IPS": "127.0.0.1,127.0.0.1",
                    "PADDLE_PSERVER_PORT": "6170,6171", "POD_IP": "127.0.0.1",
                    "PADDLE_PORT": "6171"})
    assert info.server_endpoints == ("127.0.0.1:6170", "127.0.0.1:6171")
    assert info.server_index == 1


def test_the_gpubox_port_array_stands_for_pserver_port() -> None:
    info = role_of({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVER_IPS": "127.0.0.1,127.0.0.1",
                    "PADDLE_PSERVER_PORT_ARRAY": "(6170 6171)", "POD_IP": "127.0.0.1",
                    "PADDLE_PORT": "6171"})
    assert info.server_endpoints == ("127.0.0.1:6170", "127.0.0.1:6171")
    assert info.server_index == 1
    with pytest.raises(ConfigError, match="PADDLE_PSERVER_PORT '6170' and "
                                          "PADDLE_PSERVER_PORT_ARRAY '.6171.' disagree"):
        role_of({"PADDLE_PSERVER_IPS": "127.0.0.1", "PADDLE_PSERVER_PORT": "6170",
                 "PADDLE_PSERVER_PORT_ARRAY": "(6171)"})


def test_both_server_lists_given_and_agreeing() -> None:
    info = role_of({"PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.1:6170,10.0.0.2:6171",
                    "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2",
                    "PADDLE_PSERVER_PORT": "6170,6171"})
    assert info.server_endpoints == ("10.0.0.1:6170", "10.0.0.2:6171")


@pytest.mark.parametrize(("environ", "num", "ips"), [
    ({"PADDLE_TRAINERS": "3"}, 3, ()),
    ({"PADDLE_TRAINERS": "10.0.0.1,10.0.0.2,10.0.0.3"}, 3, ("10.0.0.1", "10.0.0.2", "10.0.0.3")),
    ({"PADDLE_TRAINERS": "10.0.0.7"}, 1, ("10.0.0.7",)),
    ({"PADDLE_TRAINERS_NUM": "3", "PADDLE_TRAINERS": "3"}, 3, ()),
    ({"PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINERS": "10.0.0.1,10.0.0.2"}, 2,
     ("10.0.0.1", "10.0.0.2")),
    ({"PADDLE_TRAINER_IPS": "10.0.0.1,10.0.0.2"}, 2, ("10.0.0.1", "10.0.0.2")),
    ({"PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_IPS": "node-a,node-b"}, 2,
     ("node-a", "node-b")),
    ({"PADDLE_TRAINERS": "2", "PADDLE_TRAINER_IPS": "10.0.0.1,10.0.0.2"}, 2,
     ("10.0.0.1", "10.0.0.2")),
    ({"PADDLE_TRAINERS": "10.0.0.1,10.0.0.2", "PADDLE_TRAINER_IPS": "10.0.0.1,10.0.0.2"}, 2,
     ("10.0.0.1", "10.0.0.2")),
])
def test_worker_count_from_every_variable(environ: dict[str, str], num: int,
                                          ips: tuple[str, ...]) -> None:
    info = role_of({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINER_ID": "0",
                    **environ})
    assert (info.worker_num, info.worker_ips) == (num, ips)
    server = role_of({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                      "POD_IP": "127.0.0.1", "PADDLE_PORT": "6170", **environ})
    assert (server.worker_num, server.worker_ips) == (num, ips)


def test_last_worker_index_is_accepted_from_old_count() -> None:
    info = role_of({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINER_ID": "2",
                    "PADDLE_TRAINERS": "10.0.0.1,10.0.0.2,10.0.0.3"})
    assert (info.worker_index, info.worker_num) == (2, 3)


def test_role_names_are_case_insensitive_and_may_be_given_twice() -> None:
    info = role_of({"TRAINING_ROLE": "pserver", "PADDLE_TRAINING_ROLE": "PSERVER",
                    "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "POD_IP": "127.0.0.1",
                    "PADDLE_PORT": "6170"})
    assert info.role is Role.SERVER


def test_server_matches_either_ip_variable() -> None:
    # POD_IP is the pod's address, PADDLE_CURRENT_IP the one in the list: the listed one.
    info = role_of({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                    "POD_IP": "192.168.1.1", "PADDLE_CURRENT_IP": "10.0.0.2",
                    "PADDLE_PORT": "6170"})
    assert info.server_index == 2 and info.bind_endpoint == "10.0.0.2:6170"


def test_server_index_given_with_a_list() -> None:
    # Binds 0.0.0.0:6171 as told, with the list's index.
    info = role_of({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                    "POD_IP": "0.0.0.0", "PADDLE_PORT": "6171", "PSFLEET_SERVER_INDEX": "1"})
    assert info.server_index == 1 and info.bind_endpoint == "0.0.0.0:6171"
    assert info.server_endpoints == ENDPOINTS
    # Without POD_IP / PADDLE_PORT it binds its entry of the list.
    entry = role_of({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                     "PSFLEET_SERVER_INDEX": "2"})
    assert entry.server_index == 2 and entry.bind_endpoint == "10.0.0.2:6170"


def test_trainer_ignores_server_only_and_torchrun_variables() -> None:
    info = role_of({"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
                    "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "0", "POD_IP": "1.2.3.4",
                    "PADDLE_PORT": "1", "RANK": "5", "WORLD_SIZE": "8"})
    assert info == RoleInfo(Role.WORKER, 0, 2, server_endpoints=ENDPOINTS)
    # torchrun's variables alone do not make a distributed PS job.
    assert role_of({"RANK": "1", "WORLD_SIZE": "4"}).is_local


@pytest.mark.parametrize(("environ", "pattern"), [
    # roles
    ({"TRAINING_ROLE": "HETER_TRAINER"},
     "TRAINING_ROLE: 'HETER_TRAINER' is not one of PSERVER, TRAINER.*heterogeneous"),
    ({"PADDLE_TRAINING_ROLE": "worker"},
     "PADDLE_TRAINING_ROLE: 'worker' is not one of PSERVER, TRAINER"),
    ({"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINING_ROLE": "PSERVER"},
     "TRAINING_ROLE is 'TRAINER' but PADDLE_TRAINING_ROLE is 'PSERVER'"),
    # server lists
    ({"PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.1:6170,10.0.0.2:6170",
      "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.3", "PADDLE_PSERVER_PORT": "6170"},
     "PADDLE_PSERVERS_IP_PORT_LIST '10.0.0.1:6170,10.0.0.2:6170' and PADDLE_PSERVER_IPS "
     r"\+ PADDLE_PSERVER_PORT \('10.0.0.1:6170,10.0.0.3:6170'\) disagree"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.2:6170,10.0.0.1:6170",
      "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2", "PADDLE_PSERVER_PORT": "6170"}, "disagree"),
    ({"PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2"},
     "PADDLE_PSERVER_IPS is '10.0.0.1,10.0.0.2' but PADDLE_PSERVER_PORT is not set"),
    ({"PADDLE_PSERVER_PORT": "6170"},
     "PADDLE_PSERVER_PORT is '6170' but PADDLE_PSERVER_IPS is not set"),
    ({"PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2,10.0.0.3", "PADDLE_PSERVER_PORT": "6170,6171"},
     "PADDLE_PSERVER_PORT '6170,6171' lists 2 ports but PADDLE_PSERVER_IPS "
     "'10.0.0.1,10.0.0.2,10.0.0.3' lists 3 IPs"),
    ({"PADDLE_PSERVER_IPS": "10.0.0.1", "PADDLE_PSERVER_PORT": "http"},
     r"PADDLE_PSERVER_PORT: 'http' is not a port \(1\.\.65535\)"),
    ({"PADDLE_PSERVER_IPS": "10.0.0.1", "PADDLE_PSERVER_PORT": "70000"},
     "PADDLE_PSERVER_PORT: '70000' is not a port"),
    ({"PADDLE_PSERVER_IPS": "10.0.0.1:6170", "PADDLE_PSERVER_PORT": "6170"},
     "PADDLE_PSERVER_IPS: '10.0.0.1:6170' is not an IP address or host name"),
    ({"PADDLE_PSERVER_IPS": "127.0.0.1,127.0.0.1", "PADDLE_PSERVER_PORT": "6170"},
     r"PADDLE_PSERVER_IPS \+ PADDLE_PSERVER_PORT: '127.0.0.1:6170' appears twice"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:6170,127.0.0.1:6170"},
     "PADDLE_PSERVERS_IP_PORT_LIST: '127.0.0.1:6170' appears twice"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:0"},
     "PADDLE_PSERVERS_IP_PORT_LIST: '127.0.0.1:0' has port 0"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": ":6170"},
     "PADDLE_PSERVERS_IP_PORT_LIST: ':6170' is not host:port"),
    # worker counts
    ({"PADDLE_TRAINERS_NUM": "4", "PADDLE_TRAINERS": "3"},
     r"PADDLE_TRAINERS_NUM is 4 but PADDLE_TRAINERS is '3' \(3 workers\)"),
    ({"PADDLE_TRAINERS_NUM": "1", "PADDLE_TRAINERS": "10.0.0.1,10.0.0.2"},
     r"PADDLE_TRAINERS_NUM is 1 but PADDLE_TRAINERS is '10.0.0.1,10.0.0.2' \(2 workers\)"),
    ({"PADDLE_TRAINERS": "two"},
     "PADDLE_TRAINERS: 'two' is neither a worker count nor a comma list of IP addresses"),
    ({"PADDLE_TRAINERS": "10.0.0.1,node-b"}, r"PADDLE_TRAINERS: .*\('node-b'\)"),
    ({"PADDLE_TRAINERS": "0"}, "PADDLE_TRAINERS: 0 must be >= 1"),
    ({"PADDLE_TRAINERS_NUM": "2.5"}, "PADDLE_TRAINERS_NUM: '2.5' is not an integer"),
    ({"PADDLE_TRAINERS_NUM": "3", "PADDLE_TRAINER_IPS": "10.0.0.1,10.0.0.2"},
     "PADDLE_TRAINER_IPS '10.0.0.1,10.0.0.2' lists 2 IPs but PADDLE_TRAINERS_NUM is 3"),
    ({"PADDLE_TRAINERS": "3", "PADDLE_TRAINER_IPS": "10.0.0.1"},
     "PADDLE_TRAINER_IPS '10.0.0.1' lists 1 IPs but PADDLE_TRAINERS is 3"),
    ({"PADDLE_TRAINERS": "10.0.0.1,10.0.0.2", "PADDLE_TRAINER_IPS": "10.0.0.1,10.0.0.3"},
     "PADDLE_TRAINERS '10.0.0.1,10.0.0.2' and PADDLE_TRAINER_IPS '10.0.0.1,10.0.0.3' list "
     "different workers"),
    ({"PADDLE_TRAINER_IPS": "10.0.0.1:8000"},
     "PADDLE_TRAINER_IPS: '10.0.0.1:8000' is not an IP address or host name"),
    # trainer ids
    ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINERS": "10.0.0.1,10.0.0.2",
      "PADDLE_TRAINER_ID": "2"},
     r"PADDLE_TRAINER_ID: 2 must be < PADDLE_TRAINERS \(2\): worker indices are 0\.\.1"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINER_IPS": "10.0.0.1,10.0.0.2",
      "PADDLE_TRAINER_ID": "5"}, r"PADDLE_TRAINER_ID: 5 must be < PADDLE_TRAINER_IPS \(2\)"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINERS": "3"},
     "PADDLE_TRAINER_ID is not set but PADDLE_TRAINERS is 3"),
    ({"PADDLE_PSERVERS_IP_PORT_LIST": SERVERS, "PADDLE_TRAINERS_NUM": "2",
      "PADDLE_TRAINER_ID": "one"}, "PADDLE_TRAINER_ID: 'one' is not an integer"),
    ({"PADDLE_TRAINERS": "2", "PADDLE_TRAINER_ID": "0"},
     "PADDLE_TRAINERS is 2 but PADDLE_PSERVERS_IP_PORT_LIST is empty"),
    # servers
    ({"TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1", "PADDLE_PORT": "6170"},
     "TRAINING_ROLE is PSERVER but no server list is set: set PADDLE_PSERVERS_IP_PORT_LIST"),
    ({"PADDLE_TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1", "PADDLE_PORT": "6170"},
     "PADDLE_TRAINING_ROLE is PSERVER but no server list is set"),
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2",
      "PADDLE_PSERVER_PORT": "6170", "POD_IP": "10.0.0.3", "PADDLE_PORT": "6170"},
     r"10\.0\.0\.3:6170 \(POD_IP:PADDLE_PORT\) is not in PADDLE_PSERVER_IPS \+ "
     r"PADDLE_PSERVER_PORT .*or PSFLEET_SERVER_INDEX"),
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
      "POD_IP": "10.9.9.9", "PADDLE_CURRENT_IP": "10.8.8.8", "PADDLE_PORT": "6170"},
     r"10\.9\.9\.9:6170 or 10\.8\.8\.8:6170 \(POD_IP:PADDLE_PORT\) is not in"),
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
      "POD_IP": "127.0.0.1", "PADDLE_PORT": "65536"}, "PADDLE_PORT: 65536 must be <= 65535"),
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
      "POD_IP": "127.0.0.1", "PADDLE_PORT": "x"}, "PADDLE_PORT: 'x' is not an integer"),
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
      "PSFLEET_SERVER_INDEX": "3"},
     "PSFLEET_SERVER_INDEX: 3 must be < the 3 servers in PADDLE_PSERVERS_IP_PORT_LIST"),
    ({"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": SERVERS,
      "POD_IP": "127.0.0.1", "PADDLE_PORT": "6171", "PSFLEET_SERVER_INDEX": "0"},
     "PSFLEET_SERVER_INDEX is 0 but POD_IP:PADDLE_PORT 127.0.0.1:6171 is entry 1"),
    ({"TRAINING_ROLE": "PSERVER", "PSFLEET_SERVER_INDEX": "0", "POD_IP": "127.0.0.1"},
     "POD_IP .*PADDLE_PORT are not both set"),
])
def test_every_inconsistency_is_named(environ: dict[str, str], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        role_of(environ)


# -- MPIRoleMaker / SlurmRoleMaker ----------------------------------------------------

TWO_SERVERS = "10.0.0.1:6170,10.0.0.2:6170"
TWO = ("10.0.0.1:6170", "10.0.0.2:6170")


def _mpi(rank: int, size: int, **extra: str) -> dict[str, str]:
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "PADDLE_PSERVERS_IP_PORT_LIST": TWO_SERVERS, **extra}


def _pmi(rank: int, size: int, **extra: str) -> dict[str, str]:
    return {"PMI_RANK": str(rank), "PMI_SIZE": str(size),
            "PADDLE_PSERVERS_IP_PORT_LIST": TWO_SERVERS, **extra}


def _slurm(rank: int, size: int, **extra: str) -> dict[str, str]:
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size), "SLURM_LOCALID": "0",
            "PADDLE_PSERVERS_IP_PORT_LIST": TWO_SERVERS, **extra}


MAKERS = [(MPIRoleMaker, _mpi), (MPIRoleMaker, _pmi), (SlurmRoleMaker, _slurm)]


@pytest.mark.parametrize(("maker", "environ"), MAKERS)
def test_rank_role_makers_split_ranks_into_servers_then_workers(
        maker: type[MPIRoleMaker], environ: Callable[..., dict[str, str]]) -> None:
    roles = [maker(2, environ=environ(rank, 5)).generate_role() for rank in range(5)]
    assert roles[0] == RoleInfo(Role.SERVER, 0, 3, server_index=0, server_endpoints=TWO,
                                bind_endpoint="10.0.0.1:6170")
    assert roles[1] == RoleInfo(Role.SERVER, 0, 3, server_index=1, server_endpoints=TWO,
                                bind_endpoint="10.0.0.2:6170")
    for rank in (2, 3, 4):
        assert roles[rank] == RoleInfo(Role.WORKER, rank - 2, 3, server_endpoints=TWO)
    # server_num from PSFLEET_SERVER_NUM when the argument is None.
    from_env = maker(environ=environ(1, 3, PSFLEET_SERVER_NUM="2")).generate_role()
    assert from_env.role is Role.SERVER and from_env.server_index == 1
    assert from_env.worker_num == 1
    # The argument wins over the variable.
    explicit = maker(1, environ=environ(1, 3, PSFLEET_SERVER_NUM="2",
                                        PADDLE_PSERVERS_IP_PORT_LIST="10.0.0.1:6170"))
    assert explicit.generate_role() == RoleInfo(Role.WORKER, 0, 2,
                                                server_endpoints=("10.0.0.1:6170",))


def test_rank_role_maker_binds_the_listed_address_as_given() -> None:
    info = MPIRoleMaker(1, environ=_mpi(0, 2, PADDLE_PSERVERS_IP_PORT_LIST="0.0.0.0:6170"))
    assert info.generate_role().bind_endpoint == "0.0.0.0:6170"
    # The old server list variables work too.
    old = SlurmRoleMaker(2, environ={"SLURM_PROCID": "1", "SLURM_NTASKS": "3",
                                     "PADDLE_PSERVER_IPS": "10.0.0.1,10.0.0.2",
                                     "PADDLE_PSERVER_PORT": "6170"}).generate_role()
    assert old.server_index == 1 and old.bind_endpoint == "10.0.0.2:6170"


def test_open_mpi_variables_come_before_pmi() -> None:
    environ = {**_pmi(4, 5), "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3"}
    info = MPIRoleMaker(2, environ=environ).generate_role()
    assert info.role is Role.SERVER and info.worker_num == 1


def test_rank_role_makers_ignore_paddle_role_variables() -> None:
    environ = _slurm(3, 4, TRAINING_ROLE="PSERVER", PADDLE_TRAINER_ID="0",
                     PADDLE_TRAINERS_NUM="9")
    assert SlurmRoleMaker(2, environ=environ).generate_role() == RoleInfo(
        Role.WORKER, 1, 2, server_endpoints=TWO)


@pytest.mark.parametrize(("make", "pattern"), [
    (lambda: MPIRoleMaker(2, environ={"PADDLE_PSERVERS_IP_PORT_LIST": TWO_SERVERS}),
     "MPIRoleMaker: none of OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE "
     "is set: start the job with mpirun"),
    (lambda: SlurmRoleMaker(2, environ={"SLURM_LOCALID": "0"}),
     "SlurmRoleMaker: none of SLURM_PROCID/SLURM_NTASKS is set: start the job with srun"),
    (lambda: MPIRoleMaker(2, environ={"OMPI_COMM_WORLD_RANK": "0"}),
     "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"),
    (lambda: MPIRoleMaker(2, environ={"PMI_SIZE": "4"}), "PMI_SIZE is set but PMI_RANK is not"),
    (lambda: SlurmRoleMaker(2, environ={"SLURM_PROCID": "0"}),
     "SLURM_PROCID is set but SLURM_NTASKS is not"),
    (lambda: MPIRoleMaker(2, environ=_mpi(0, 2)),
     "OMPI_COMM_WORLD_SIZE is 2 but server_num is 2: no rank is left for a worker"),
    (lambda: SlurmRoleMaker(environ=_slurm(0, 1, PSFLEET_SERVER_NUM="2")),
     "SLURM_NTASKS is 1 but PSFLEET_SERVER_NUM is 2: no rank is left for a worker"),
    (lambda: MPIRoleMaker(3, environ=_mpi(0, 5)),
     r"PADDLE_PSERVERS_IP_PORT_LIST lists 2 servers \['10.0.0.1:6170', '10.0.0.2:6170'\] "
     "but server_num is 3"),
    (lambda: SlurmRoleMaker(1, environ=_slurm(0, 5)),
     "PADDLE_PSERVERS_IP_PORT_LIST lists 2 servers .* but server_num is 1"),
    (lambda: SlurmRoleMaker(1, environ={"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}),
     r"PADDLE_PSERVERS_IP_PORT_LIST lists 0 servers \[\] but server_num is 1"),
    (lambda: MPIRoleMaker(environ=_pmi(0, 5)),
     "MPIRoleMaker: server_num is not given and PSFLEET_SERVER_NUM is not set"),
    (lambda: MPIRoleMaker(environ=_pmi(0, 5, PSFLEET_SERVER_NUM="two")),
     "PSFLEET_SERVER_NUM: 'two' is not an integer"),
    (lambda: MPIRoleMaker(environ=_pmi(0, 5, PSFLEET_SERVER_NUM="0")),
     "PSFLEET_SERVER_NUM: 0 must be >= 1"),
    (lambda: MPIRoleMaker(0, environ=_pmi(0, 5)), "server_num: 0 must be >= 1"),
    (lambda: MPIRoleMaker(True, environ=_pmi(0, 5)), "server_num: True is not an integer"),
    (lambda: MPIRoleMaker(2, environ=_pmi(5, 5)), r"PMI_RANK: 5 must be < PMI_SIZE \(5\)"),
    (lambda: MPIRoleMaker(2, environ=_mpi(0, "x")),  # type: ignore[arg-type]
     "OMPI_COMM_WORLD_SIZE: 'x' is not an integer"),
    (lambda: SlurmRoleMaker(2, environ=_slurm(-1, 4)), "SLURM_PROCID: -1 must be >= 0"),
    (lambda: SlurmRoleMaker(2, environ=_slurm(0, 4, PADDLE_PSERVERS_IP_PORT_LIST="a:1,b")),
     "PADDLE_PSERVERS_IP_PORT_LIST: 'b' is not host:port"),
])
def test_rank_role_maker_errors(make: Callable[[], MPIRoleMaker], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        make().generate_role()


def test_rank_role_makers_read_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in _slurm(2, 3).items():
        monkeypatch.setenv(name, value)
    assert SlurmRoleMaker(2).generate_role().worker_index == 0
