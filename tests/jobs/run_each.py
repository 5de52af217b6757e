"""Several single-process runs of a job script in one process (tests' CPU: each
process start imports torch, about 3 CPU-seconds): ``job.py A :: B`` runs A, then B.

Only runs with no job environment (fleetrun's variables) may share a process.
"""

from __future__ import annotations

from collections.abc import Callable

from psfleet import fleet


def run_each(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run ``main`` once for each ``::``-separated part of ``argv``, with a fresh fleet
    for each (the previous run stopped its worker: forget its role and model); the
    first non-zero exit code stops it and is returned."""
    parts: list[list[str]] = [[]]
    for arg in argv:
        if arg == "::":
            parts.append([])
        else:
            parts[-1].append(arg)
    for i, part in enumerate(parts):
        if i:
            fleet.reset()
        code = main(part)
        if code:
            return code
    return 0
