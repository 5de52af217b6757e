"""DistributeTranspilerConfig and DistributeTranspiler.transpile without processes:
validation (errors name the field and the allowed values) and the strategy chosen."""

from __future__ import annotations

import os

import pytest
import torch

from psfleet import fleet
from psfleet.errors import ConfigError, FatalError

pytestmark = pytest.mark.unit

SERVERS = "127.0.0.1:6174,127.0.0.1:6175"


def test_config_defaults_are_the_seeds() -> None:
    c = fleet.DistributeTranspilerConfig()
    assert (c.slice_var_up, c.split_method, c.min_block_size, c.enable_dc_asgd, c.mode,
            c.print_log) == (True, "RoundRobin", 8192, False, "pserver", False)
    c.split_method = "HashName"
    c.min_block_size = 81920
    assert fleet.DistributeTranspilerConfig(mode="nccl2").mode == "nccl2"


@pytest.mark.parametrize(("field", "value", "named"), [
    ("split_method", "Random", ["split_method: 'Random' is not one of RoundRobin, HashName"]),
    ("mode", "geo", ["mode: 'geo' is not one of pserver, nccl2"]),
    ("slice_var_up", 1, ["slice_var_up: 1 is not True or False"]),
    ("min_block_size", 0, ["min_block_size: 0 must be an integer >= 1"]),
    ("min_block_size", 8.5, ["min_block_size: 8.5"]),
    ("wait_port", False, ["wait_port: unknown field", "slice_var_up, split_method, "
                          "min_block_size, enable_dc_asgd, mode, print_log"]),
    ("sync_mode", False, ["sync_mode: unknown field (pass sync_mode to transpile())"]),
    ("geo_sgd_mode", True, ["GEO is not part of the transpiler"]),
])
def test_bad_config_names_the_field(field: str, value: object, named: list[str]) -> None:
    c = fleet.DistributeTranspilerConfig()
    with pytest.raises(ConfigError) as error:
        setattr(c, field, value)
    with pytest.raises(ConfigError):
        fleet.DistributeTranspilerConfig(**{field: value})
    for text in named:
        assert text in str(error.value)


def _program() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_sync_mode_and_config_become_the_strategy() -> None:
    config = fleet.DistributeTranspilerConfig(slice_var_up=False, split_method="HashName",
                                              min_block_size=1024)
    t = fleet.DistributeTranspiler(config)
    t.transpile(1, pservers=SERVERS, trainers=2)
    assert t.strategy is not None
    assert (t.strategy.mode, t.strategy.slice_var_up, t.strategy.split_method,
            t.strategy.min_block_size, t.strategy.dc_asgd) == ("sync", False, "HashName",
                                                                1024, False)
    config.enable_dc_asgd = True
    t.transpile(0, pservers=SERVERS, trainers="10.0.0.1,10.0.0.2,10.0.0.3", sync_mode=False)
    assert (t.strategy.mode, t.strategy.dc_asgd, t.worker_num) == ("async", True, 3)
    program = t.get_pserver_program("127.0.0.1:6175")
    assert t.get_startup_program("127.0.0.1:6175", program) is program.startup
    assert t.get_startup_program("127.0.0.1:6174").endpoint == "127.0.0.1:6174"


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"trainer_id": 2, "trainers": 2}, "trainer_id: 2 must be in 0..1"),
    ({"trainer_id": 0, "trainers": 0}, "trainers: 0 is neither a count"),
    ({"trainer_id": 0, "trainers": ""}, "trainers: '' is neither a count"),
    ({"trainer_id": 0, "pservers": "127.0.0.1"}, "pservers: '127.0.0.1' is not host:port"),
    ({"trainer_id": 0, "pservers": "127.0.0.1:0"}, "pservers: '127.0.0.1:0' has port 0"),
    ({"trainer_id": 0, "pservers": "a:1,a:1"}, "lists an endpoint twice"),
    ({"trainer_id": 0, "startup_program": object()}, "startup_program: psfleet has no"),
    ({"trainer_id": 0, "program": torch.nn.Linear(1, 1)}, "is not a (model, optimizer) pair"),
])
def test_bad_transpile_arguments_name_the_argument(kwargs: dict[str, object],
                                                   named: str) -> None:
    with pytest.raises(ConfigError) as error:
        fleet.DistributeTranspiler().transpile(**kwargs)  # type: ignore[arg-type]
    assert named in str(error.value)


def test_misuse_is_explained() -> None:
    t = fleet.DistributeTranspiler(fleet.DistributeTranspilerConfig(enable_dc_asgd=True))
    with pytest.raises(FatalError, match="transpile"):
        t.get_pserver_program("127.0.0.1:6174")
    with pytest.raises(ConfigError, match="enable_dc_asgd compensates async delays"):
        t.transpile(0, pservers=SERVERS, trainers=2)
    t.config.enable_dc_asgd = False
    t.transpile(0, pservers=SERVERS, trainers=2)
    with pytest.raises(ConfigError, match=r"endpoint: '127.0.0.1:7000' is not one of pservers"):
        t.get_pserver_program("127.0.0.1:7000")
    with pytest.raises(ConfigError, match="pserver_program serves '127.0.0.1:6175'"):
        t.get_startup_program("127.0.0.1:6174", t.get_pserver_program("127.0.0.1:6175"))
    with pytest.raises(ConfigError, match="pass model and optimizer"):
        t.get_trainer_program().start()


def test_nccl2_mode_has_no_servers_and_exports_the_rendezvous(
        monkeypatch: pytest.MonkeyPatch) -> None:
    names = ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS",
             "PADDLE_CURRENT_ENDPOINT")
    for name in names:
        monkeypatch.setenv(name, "")  # restored (unset) after the test
    t = fleet.DistributeTranspiler(fleet.DistributeTranspilerConfig(mode="nccl2"))
    trainers = "127.0.0.1:6170,127.0.0.1:6171"
    with pytest.raises(ConfigError, match="current_endpoint: '127.0.0.1:6170' is not entry 1"):
        t.transpile(1, trainers=trainers, current_endpoint="127.0.0.1:6170")
    t.transpile(1, program=_program(), trainers=trainers, current_endpoint="127.0.0.1:6171")
    assert t.strategy is not None and t.strategy.mode == "collective"
    with pytest.raises(ConfigError, match="there are no servers"):
        t.get_pserver_program("127.0.0.1:6174")
    t.export_collective_env()
    assert [os.environ[n] for n in names] == ["1", "2", trainers, "127.0.0.1:6171"]
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    with pytest.raises(ConfigError, match="PADDLE_TRAINER_ID is '0' but transpile"):
        t.export_collective_env()
