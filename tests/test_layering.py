"""The Architecture arrows hold: import-linter's contracts (pyproject.toml's
``[tool.importlinter]``), run in process so that a plain pytest run catches a broken
arrow, not only ``lint-imports`` in README's Test command."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO_ROOT
from importlinter import configuration
from importlinter.application import use_cases

if sys.version_info >= (3, 11):
    import tomllib
else:  # import-linter depends on tomli where tomllib is missing
    import tomli as tomllib

pytestmark = pytest.mark.unit

PYPROJECT = REPO_ROOT / "pyproject.toml"


def _contracts() -> dict[str, dict]:
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def _psfleet_modules() -> set[str]:
    """Top-level packages and modules of psfleet, as ``psfleet.<name>``."""
    package = REPO_ROOT / "psfleet"
    names = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    names |= {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    return {f"psfleet.{name}" for name in names}


def test_import_contracts_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    configuration.configure()  # what the lint-imports command does on import
    kept = use_cases.lint_imports(config_filename=str(PYPROJECT), cache_dir=None,
                                  no_logo=True)
    report = capsys.readouterr().out
    assert kept, ("import-linter contracts broken: fix the import, or change README's "
                  f"Architecture and [tool.importlinter] together\n{report}")
    assert f"{len(_contracts())} kept, 0 broken" in report, report


def test_the_layers_name_every_module_of_psfleet() -> None:
    """A new top-level package or module must be placed in the layers contract (and in
    README's Architecture); import-linter alone would not check it."""
    layers = _contracts()["layers"]["layers"]
    layered = {name.strip().strip("()") for layer in layers
               for name in layer.replace(":", "|").split("|")}
    missing = _psfleet_modules() - layered
    assert missing == set(), (
        f"not placed in pyproject.toml's layers contract: {sorted(missing)}; add them "
        "there, and to README's Architecture, where they sit by their imports")
