"""A test that needs ``../shared/data`` fails, naming what is missing and how to get
it, when the folder is not there: it is never skipped (conftest.require_shared_data,
behind the ``criteo_dir`` fixture)."""

from __future__ import annotations

from pathlib import Path

import conftest
import pytest

pytestmark = pytest.mark.unit


def test_a_missing_folder_fails_the_test_naming_it_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "shared" / "data" / "criteo_kaggle_sample"
    with pytest.raises(pytest.fail.Exception) as failed:
        conftest.require_shared_data(missing)
    message = str(failed.value)
    assert str(missing) in message
    assert "../shared/data/criteo_kaggle_sample" in message
    assert "missing train.csv, dev.csv, test.csv" in message
    assert "clone the project with ../shared beside it" in message
    assert not isinstance(failed.value, pytest.skip.Exception)


def test_a_folder_missing_one_file_names_that_file(tmp_path: Path) -> None:
    for name in ("train.csv", "test.csv"):
        (tmp_path / name).write_text("0\t1\n", encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match=r"is missing dev\.csv: clone"):
        conftest.require_shared_data(tmp_path)


def test_the_default_is_the_criteo_sample_beside_the_repository(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, criteo_dir: Path) -> None:
    beside = conftest.REPO_ROOT.parent / "shared" / "data" / "criteo_kaggle_sample"
    assert criteo_dir == beside.resolve()
    assert conftest.require_shared_data() == criteo_dir
    monkeypatch.setattr(conftest, "CRITEO_DIR", tmp_path / "nowhere")
    with pytest.raises(pytest.fail.Exception, match="nowhere"):
        conftest.require_shared_data()
