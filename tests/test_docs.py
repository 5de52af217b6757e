"""README.md stays true to the code: the env table and the CI test command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from psfleet import env

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def test_env_table_is_generated_from_env_module() -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- env-table:start -->\n(.*?)\n<!-- env-table:end -->", readme, re.S)
    assert match, "README.md lost its env-table markers"
    assert match.group(1) == env.markdown_table(), (
        "README's environment table is stale: paste psfleet.env.markdown_table() into it")


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in ci.splitlines()
