"""A process imports what its role runs (issue 40): ``psfleet``'s subcommands are
imported only when named (``psfleet.cli.commands``), so a server or worker started as
``psfleet train`` does not pay for ``k8s``, ``drain`` or ``parity``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from psfleet.cli.commands import SUBCOMMANDS
from psfleet.cli.main import main

pytestmark = pytest.mark.unit


def test_help_lists_every_subcommand_with_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help lines
    for name, (_, text) in SUBCOMMANDS.items():
        assert f"{name} {' '.join(text.split())}" in out


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_a_named_subcommand_gets_its_full_parser(name: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main([name, "--help"])
    assert stop.value.code == 0
    assert "usage: psfleet " + name in capsys.readouterr().out


def test_train_imports_no_other_subcommand_nor_the_rpc_stack() -> None:
    code = ("import sys\n"
            "from psfleet.cli.main import build_parser\n"
            "args = build_parser(['train', '-m', 'c.yaml']).parse_args(['train', '-m', 'c.yaml'])\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith("
            "('psfleet.cli.', 'psfleet.cluster', 'psfleet.rpc', 'grpc', 'torch', 'pyarrow')))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout.split()
    assert loaded == ["psfleet.cli.commands", "psfleet.cli.console", "psfleet.cli.main"]
