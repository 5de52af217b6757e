"""Tests of psfleet.fleet.role_maker and rule_from_optimizer, on fixed environments."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from psfleet.errors import ConfigError
from psfleet.fleet import (
    PaddleCloudRoleMaker,
    Role,
    RoleInfo,
    UserDefinedRoleMaker,
    rule_from_optimizer,
)
from psfleet.ps.types import RuleConfig

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
