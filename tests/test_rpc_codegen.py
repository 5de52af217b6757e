"""The committed generated modules of psfleet.proto are current, byte for byte.

When this fails, run ``python -m psfleet.rpc.codegen`` and commit the result.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import psfleet.rpc
from psfleet.rpc.codegen import generate

pytestmark = pytest.mark.unit

RPC_DIR = Path(psfleet.rpc.__file__).resolve().parent


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    paths = generate(tmp_path_factory.mktemp("codegen"))
    return {p.name: p.read_bytes() for p in paths}


def test_codegen_writes_the_three_modules(generated: dict[str, bytes]) -> None:
    assert sorted(generated) == ["psfleet_pb2.py", "psfleet_pb2.pyi", "psfleet_pb2_grpc.py"]
    assert b"ParameterServer" in generated["psfleet_pb2_grpc.py"]


@pytest.mark.parametrize("name", ["psfleet_pb2.py", "psfleet_pb2.pyi", "psfleet_pb2_grpc.py"])
def test_committed_module_equals_freshly_generated(generated: dict[str, bytes],
                                                   name: str) -> None:
    committed = (RPC_DIR / name).read_bytes()
    assert committed == generated[name], (
        f"psfleet/rpc/{name} is stale: run `python -m psfleet.rpc.codegen`")


def test_push_mode_is_the_wire_enum_every_value_exported() -> None:
    """``ps.types.PushMode`` mirrors the proto's ``PushMode`` (mypy needs a class), and
    ``rpc.messages`` exports every wire value: AGGREGATE was once missing there."""
    from psfleet.ps.types import PushMode
    from psfleet.rpc import messages as msg
    from psfleet.rpc import psfleet_pb2

    wire = dict(psfleet_pb2.PushMode.items())
    assert {mode.name: mode.value for mode in PushMode} == wire
    assert {name: getattr(msg, name) for name in wire} == wire
    assert set(wire) <= set(msg.__all__)
