"""The collective rendezvous port under the seeds' NCCL2 name, PADDLE_PSERVER_PORT.

The seeds start NCCL2 jobs with ``PADDLE_TRAINER_IPS``, ``PADDLE_TRAINER_ID``,
``PADDLE_CURRENT_IP`` and ``PADDLE_PSERVER_PORT`` ("used at the initial stage to
broadcast the NCCL ID"); psfleet also reads ``PADDLE_PORT``. Either names the port of
the first IP; both set to different ports is an error naming both.
"""

from __future__ import annotations

import pytest

from psfleet.collective import rendezvous_from_env
from psfleet.errors import ConfigError

pytestmark = pytest.mark.unit

SEEDS = {"PADDLE_TRAINER_IPS": "10.0.0.1,10.0.0.2", "PADDLE_TRAINER_ID": "1",
         "PADDLE_CURRENT_IP": "10.0.0.2"}


@pytest.mark.parametrize("ports", [
    {"PADDLE_PSERVER_PORT": "6174"},
    {"PADDLE_PORT": "6174"},
    {"PADDLE_PSERVER_PORT": "6174", "PADDLE_PORT": "6174"},
    {"PADDLE_PSERVER_PORT": "6174", "PADDLE_PORT": ""},  # empty is unset
])
def test_seeds_nccl2_port_is_the_first_ip_port(ports: dict[str, str]) -> None:
    spec = rendezvous_from_env({**SEEDS, **ports})
    assert (spec.rank, spec.world_size, spec.master_endpoint) == (1, 2, "10.0.0.1:6174")


def test_endpoints_and_master_take_precedence_over_the_port() -> None:
    spec = rendezvous_from_env({**SEEDS, "PADDLE_PSERVER_PORT": "6174",
                                "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:7000,10.0.0.2:7000"})
    assert spec.master_endpoint == "10.0.0.1:7000"
    spec = rendezvous_from_env({**SEEDS, "PADDLE_PSERVER_PORT": "6174",
                                "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500"})
    assert spec.master_endpoint == "10.0.0.9:29500"


@pytest.mark.parametrize(("ports", "named"), [
    ({"PADDLE_PSERVER_PORT": "6174", "PADDLE_PORT": "6175"},
     ["rendezvous port mismatch", "PADDLE_PSERVER_PORT is 6174", "PADDLE_PORT is 6175"]),
    ({"PADDLE_PSERVER_PORT": "6174,6175"}, ["PADDLE_PSERVER_PORT: '6174,6175'",
                                            "several ports"]),
    ({"PADDLE_PSERVER_PORT": "70000"}, ["PADDLE_PSERVER_PORT: 70000 must be <= 65535"]),
    ({"PADDLE_PSERVER_PORT": "0"}, ["PADDLE_PSERVER_PORT: 0 must be >= 1"]),
    ({"PADDLE_PSERVER_PORT": "x"}, ["PADDLE_PSERVER_PORT: 'x' is not an integer"]),
])
def test_bad_or_conflicting_ports_name_the_variables(ports: dict[str, str],
                                                     named: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        rendezvous_from_env({**SEEDS, **ports})
    for text in named:
        assert text in str(error.value)


def test_without_a_port_two_ranks_have_no_rendezvous() -> None:
    with pytest.raises(ConfigError, match="no rendezvous endpoint"):
        rendezvous_from_env(SEEDS)
