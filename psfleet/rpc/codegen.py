"""Regenerate ``psfleet_pb2.py(i)`` and ``psfleet_pb2_grpc.py`` from ``psfleet.proto``.

Run ``python -m psfleet.rpc.codegen`` after editing the proto (needs grpcio-tools,
part of the ``test`` extra). The generated modules are committed so that users do
not need grpcio-tools; ``tests/test_rpc_codegen.py`` checks they are current.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

__all__ = ["generate"]

_RPC_DIR = Path(__file__).resolve().parent
_ROOT = _RPC_DIR.parent.parent
_OUTPUTS = ("psfleet_pb2.py", "psfleet_pb2.pyi", "psfleet_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Generate the modules under ``out_root/psfleet/rpc/`` and return their paths.

    Raises:
        RuntimeError: protoc reported an error (its exit code is in the message).
    """
    from grpc_tools import protoc  # imported here: only needed by developers

    proto = _RPC_DIR / "psfleet.proto"
    (out_root / "psfleet" / "rpc").mkdir(parents=True, exist_ok=True)
    code = protoc.main(
        [
            "protoc",
            f"-I{_ROOT}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(proto.relative_to(_ROOT)),
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code} on {proto}")
    return [out_root / "psfleet" / "rpc" / name for name in _OUTPUTS]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(Path(tmp)):
            (_RPC_DIR / path.name).write_bytes(path.read_bytes())
            print(f"wrote {_RPC_DIR / path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
