"""Test tiers: every test module carries exactly one tier marker line, and CI (README's
Test command, run verbatim by .ci/run) runs every tier and the import contracts.

Tiers (pyproject.toml's ``markers``): ``unit`` (pure, in process, no sockets),
``service`` (in-process servers on 127.0.0.1), ``job`` (real multi-process jobs),
``e2e`` (the CLI end to end on real data); ``slow`` on top for tests over ~3 s, so that
``python -m pytest -q -m "not slow"`` stays a fast tier."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.unit

TIERS = ("unit", "service", "job", "e2e")
MARKER_LINE = re.compile(
    r"^pytestmark = (?:pytest\.mark\.(\w+)|\[pytest\.mark\.(\w+), pytest\.mark\.slow\])$",
    re.M)


def _test_modules() -> list[Path]:
    return sorted((REPO_ROOT / "tests").glob("test_*.py"))


def test_every_test_module_has_exactly_one_tier_marker_line() -> None:
    problems = []
    for path in _test_modules():
        found = [a or b for a, b in MARKER_LINE.findall(path.read_text(encoding="utf-8"))]
        if len(found) != 1 or found[0] not in TIERS:
            problems.append(f"{path.name}: {found or 'no tier marker line'}")
    assert not problems, (
        "each tests/test_*.py needs exactly one line `pytestmark = pytest.mark.<tier>` "
        f"(or `[pytest.mark.<tier>, pytest.mark.slow]`), tier one of {TIERS}:\n  "
        + "\n  ".join(problems))


def test_ci_runs_every_tier_and_the_import_contracts() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    command = next(c for c in re.findall(r"```bash\n(.*?)\n```", readme, re.S)
                   if "pytest" in c)
    assert command in (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "lint-imports" in command
    # The first pytest runs every tier; a later one may repeat tiers (the numpy kernels).
    pytest_call = command[command.index("python -m pytest") + len("python -m pytest"):]
    pytest_call = pytest_call.split("&&")[0]
    assert not re.search(r"\s(-m|-k|--deselect|--ignore)\b", pytest_call), (
        f"CI must run every tier, but README's Test command filters: pytest{pytest_call}")
    assert 'PSFLEET_TABLE_BACKEND=numpy python -m pytest -q -n auto --dist loadscope -m ' \
        '"unit or service"' in command  # the table kernels' reference, its tiers again
    assert 'python -m pytest -q -n auto -m "not slow"' in readme  # the fast tier is documented
