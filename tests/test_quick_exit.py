"""``import psfleet`` makes the process skip the cyclic collector's pass over the objects
alive at exit (psfleet.quick_exit), and every exit handler still runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def test_objects_alive_at_exit_are_frozen_and_other_handlers_run(tmp_path: Path) -> None:
    out = tmp_path / "at_exit.txt"
    # Registered before psfleet's handler, so it runs after it (atexit: last in, first
    # out); the one registered after psfleet's runs before it.
    script = textwrap.dedent(f"""
        import atexit, gc
        def note(name):
            with open({str(out)!r}, "a") as f:
                f.write(f"{{name}} {{gc.get_freeze_count()}}\\n")
        atexit.register(note, "last")
        import psfleet
        atexit.register(note, "first")
        cycle = [None]
        cycle[0] = cycle
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    first, last = out.read_text().splitlines()
    assert first == "first 0"  # nothing frozen before psfleet's handler
    assert last.startswith("last ") and int(last.split()[1]) > 1000
