"""``psfleet train`` reads the role as the role makers do (issue 40): ``pserver`` is a
server to the CLI too, which once compared ``TRAINING_ROLE`` with ``"PSERVER"`` exactly
and gave a lowercase server a worker's signal handlers."""

from __future__ import annotations

import argparse
import signal

import pytest

from psfleet.cli import main as cli
from psfleet.fleet.role_maker import env_role
from psfleet.types import Role

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("variable", ["TRAINING_ROLE", "PADDLE_TRAINING_ROLE"])
@pytest.mark.parametrize(("raw", "role"), [("PSERVER", Role.SERVER), ("pserver", Role.SERVER),
                                           (" Pserver ", Role.SERVER), ("trainer", Role.WORKER),
                                           ("TRAINER", Role.WORKER)])
def test_every_spelling_of_a_role_means_one_role(variable: str, raw: str, role: Role,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAINING_ROLE", "PADDLE_TRAINING_ROLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, raw)
    assert env_role() == (role, variable)
    seen: list[object] = []

    def handlers_while_training(args: argparse.Namespace) -> int:
        seen.append(signal.getsignal(signal.SIGTERM))
        return 0

    monkeypatch.setattr(cli, "_train", handlers_while_training)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["train", "-m", "config.yaml"]) == 0
    # A server keeps the default SIGTERM handler; a worker's turns it into an interrupt.
    assert (seen[0] is before) is (role is Role.SERVER)


def test_an_unknown_role_is_a_config_error_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("PADDLE_TRAINING_ROLE", raising=False)
    monkeypatch.setenv("TRAINING_ROLE", "pserverr")
    assert cli.main(["train", "-m", "config.yaml"]) == 2
    assert "TRAINING_ROLE: 'pserverr' is not one of PSERVER, TRAINER" in capsys.readouterr().err
