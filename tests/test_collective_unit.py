"""Collective mode without processes: reading the environment, planning a launch.

- ``rendezvous_from_env`` reads torchrun's and the seeds' variables; a rank or world
  size given twice with two values is an error naming both values.
- fleetrun's collective flags: mode inference, flags of the other mode rejected,
  ``--devices`` without a GPU, one GPU per rank, ranks of each node of ``--ips``.
- The environment fleetrun gives each rank reads back as that rank.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from psfleet.collective import RendezvousSpec, rendezvous_from_env
from psfleet.errors import ConfigError
from psfleet.launch.collective import (
    DEFAULT_MULTI_NODE_PORT,
    CollectiveOptions,
    assign_devices,
    plan_collective,
    rank_environment,
)
from psfleet.launch.main import build_parser, collective_from_args

pytestmark = pytest.mark.unit

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500"}


def test_torchrun_variables() -> None:
    spec = rendezvous_from_env(TORCHRUN)
    assert spec == RendezvousSpec(rank=1, world_size=2, local_rank=1, master_addr="10.0.0.1",
                                  master_port=29500, source="RANK")
    agent = rendezvous_from_env({**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True",
                                 "TORCHELASTIC_RESTART_COUNT": "2"})
    assert agent.agent_store and agent.restart_count == 2


def test_seed_variables_endpoints_and_ips() -> None:
    spec = rendezvous_from_env({
        "PADDLE_TRAINER_ID": "2", "PADDLE_TRAINERS_NUM": "3",
        "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170",
        "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6170"})
    assert (spec.rank, spec.world_size, spec.master_endpoint) == (2, 3, "10.0.0.1:6170")
    spec = rendezvous_from_env({"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINER_IPS": "10.0.0.1,10.0.0.2",
                                "PADDLE_PORT": "6070", "PADDLE_CURRENT_IP": "10.0.0.2"})
    assert (spec.rank, spec.world_size, spec.master_endpoint) == (1, 2, "10.0.0.1:6070")


def test_no_variables_is_one_rank_alone() -> None:
    spec = rendezvous_from_env({})
    assert (spec.rank, spec.world_size, spec.master_addr) == (0, 1, None)


@pytest.mark.parametrize(("environ", "named"), [
    ({**TORCHRUN, "PADDLE_TRAINERS_NUM": "3"}, ["WORLD_SIZE is 2", "PADDLE_TRAINERS_NUM is 3"]),
    ({**TORCHRUN, "PADDLE_TRAINER_ID": "0"}, ["RANK is 1", "PADDLE_TRAINER_ID is 0"]),
    ({"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "2",
      "PADDLE_TRAINER_ENDPOINTS": "a:1,b:1,c:1"}, ["PADDLE_TRAINERS_NUM is 2", "(entries) is 3"]),
    ({"RANK": "0"}, ["RANK is set but WORLD_SIZE is not"]),
    ({"MASTER_ADDR": "x", "RANK": "0", "WORLD_SIZE": "1"}, ["MASTER_PORT"]),
    ({**TORCHRUN, "RANK": "2"}, ["RANK: 2 must be < the world size 2"]),
    ({"RANK": "1", "WORLD_SIZE": "2"}, ["no rendezvous endpoint", "MASTER_ADDR"]),
    ({"WORLD_SIZE": "2", "RANK": "x"}, ["RANK: 'x' is not an integer"]),
    ({"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINER_ENDPOINTS": "a:1,b:1",
      "PADDLE_CURRENT_ENDPOINT": "a:1"}, ["PADDLE_CURRENT_ENDPOINT is 'a:1'", "'b:1'"]),
])
def test_inconsistent_variables_name_both_values(environ: dict[str, str],
                                                 named: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        rendezvous_from_env(environ)
    for text in named:
        assert text in str(error.value)


def _args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args([*flags, "train.py"])


def test_mode_from_flags() -> None:
    assert collective_from_args(_args("--server_num", "1")) is None
    options = collective_from_args(_args("--nproc_per_node", "3"))
    assert options is not None and options.nproc_per_node == 3
    options = collective_from_args(_args("--mode", "collective", "--gpus", "0,1"))
    assert options is not None and options.devices == ("0", "1")


@pytest.mark.parametrize(("flags", "named"), [
    (["--mode", "collective", "--server_num", "1"], "--server_num"),
    (["--nproc_per_node", "2", "--worker_num", "2"], "--worker_num"),
    (["--mode", "ps", "--nproc_per_node", "2"], "--nproc_per_node"),
    (["--nproc_per_node", "0"], "--nproc_per_node"),
    (["--devices", "0,1", "--nproc_per_node", "3"], "--devices"),
    (["--devices", "gpu0"], "--devices"),
    (["--ips", "10.0.0.1,10.0.0.1"], "--ips"),
    (["--mode", "collective", "--max_restarts", "1"], "--max_restarts"),
])
def test_bad_collective_flags_name_the_flag(flags: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        collective_from_args(_args(*flags))


def test_devices_need_a_gpu_and_go_one_per_rank() -> None:
    with pytest.raises(ConfigError, match="no GPU"):
        assign_devices(CollectiveOptions(devices=("0",)), 1, gpus=())
    assert assign_devices(CollectiveOptions(), 2, gpus=()) == [None, None]
    assert assign_devices(CollectiveOptions(), 3, gpus=("4", "5")) == ["4", "5", "4"]
    assert assign_devices(CollectiveOptions(devices=("1", "0")), 2, gpus=("4", "5")) == ["5", "4"]
    with pytest.raises(ConfigError, match="GPU 2 is not visible"):
        assign_devices(CollectiveOptions(devices=("2",)), 1, gpus=("4", "5"))


def test_each_node_of_ips_runs_its_ranks() -> None:
    options = CollectiveOptions(ips=("10.0.0.1", "10.0.0.2"))
    plan = plan_collective(options, 2, node_addresses=["10.0.0.2"])
    assert (plan.world_size, plan.node_rank, plan.local_ranks) == (4, 1, (2, 3))
    assert (plan.master_host, plan.master_port) == ("10.0.0.1", DEFAULT_MULTI_NODE_PORT)
    with pytest.raises(ConfigError, match="not in --ips"):
        plan_collective(options, 2, node_addresses=["10.0.0.3"])


def test_rank_environment_reads_back_as_that_rank(tmp_path: Path) -> None:
    plan = plan_collective(CollectiveOptions(ips=("10.0.0.1", "10.0.0.2")), 2,
                           node_addresses=["10.0.0.2"])
    inherited = {"PATH": "/bin", "RANK": "7", "TORCHELASTIC_RUN_ID": "old"}
    for rank in plan.local_ranks:
        environ = rank_environment(plan, rank, 6170, "1", inherited)
        assert environ["PATH"] == "/bin" and "TORCHELASTIC_RUN_ID" not in environ
        assert environ["CUDA_VISIBLE_DEVICES"] == "1"
        spec = rendezvous_from_env(environ)
        assert (spec.rank, spec.world_size, spec.local_rank) == (rank, 4, rank - 2)
        assert spec.master_endpoint == "10.0.0.1:6170" and spec.agent_store
