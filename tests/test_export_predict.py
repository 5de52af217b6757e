"""Export after training and ``psfleet predict``: real processes, the real Criteo sample.

Done-when of the export: ``psfleet predict`` on the exported model gives the
in-training test AUC (metrics.json) to <= 1e-4, with 1 server x 2 workers and with
in-process tables (server_num 0); predict needs no server. Bad input (missing model
directory, another format version, another embedding dim, missing data) exits 2
naming the file or field. Training runs the real command (its processes); predict
runs the command's main() in the test's process (it starts none of its own).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_no_processes_mentioning, run_folder

from psfleet.cli.main import main
from psfleet.metrics import auc

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RunCli = Callable[..., subprocess.CompletedProcess[str]]

AUC_TOLERANCE = 1e-4
_RESULT = re.compile(r"predict auc ([0-9.]+), logloss ([0-9.]+) on (\d+) examples")


def _config(repo_root: Path) -> str:
    return str(repo_root / "examples" / "criteo_dnn" / "config.yaml")


def _train(run_cli: RunCli, repo_root: Path, out: Path, model: Path, train: Path, test: Path,
           server_num: int, worker_num: int) -> dict[str, float]:
    r = run_cli(["train", "-m", _config(repo_root),
                 "-o", f"runner.train_data_dir={train}", "-o", f"runner.test_data_dir={test}",
                 "-o", f"runner.model_save_path={out}", "-o", "runner.epochs=1",
                 "-o", f"runner.inference_model_path={model}",
                 "-o", "hyper_parameters.fc_sizes=[64, 32]",
                 "-o", f"cluster.server_num={server_num}",
                 "-o", f"cluster.worker_num={worker_num}"], timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (model / "manifest.json").is_file(), r.stderr[-3000:]
    test_metrics: dict[str, float] = json.loads(
        (run_folder(out) / "metrics.json").read_text())["test"]
    return test_metrics


def _predict(capsys: pytest.CaptureFixture[str], repo_root: Path, model: Path | str,
             data: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``psfleet predict``'s main() in this process (no server, no job: a process of
    its own would only add a torch import); its exit code, stdout and stderr."""
    argv = ["predict", "-m", _config(repo_root), "--model", str(model), "--data",
            str(data), *extra]
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)


def _result(r: subprocess.CompletedProcess[str]) -> tuple[float, float, int]:
    assert r.returncode == 0, r.stderr[-3000:]
    match = _RESULT.search(r.stdout)
    assert match, r.stdout
    return float(match[1]), float(match[2]), int(match[3])


def test_predict_after_one_server_two_workers_matches_the_training_auc(
        run_cli: RunCli, repo_root: Path, tmp_path: Path,
        data_slice: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    train, test = data_slice(1200), data_slice(400, source="dev.csv")
    model = tmp_path / "model"

    expected = _train(run_cli, repo_root, tmp_path / "out", model, train, test, 1, 2)
    assert_no_processes_mentioning(str(tmp_path / "out"))  # predict runs with no server
    got_auc, got_logloss, examples = _result(_predict(capsys, repo_root, model, test))

    assert examples == expected["examples"] == 400
    assert abs(got_auc - expected["auc"]) <= AUC_TOLERANCE, (got_auc, expected)
    assert abs(got_logloss - expected["logloss"]) <= AUC_TOLERANCE, (got_logloss, expected)
    manifest = json.loads((model / "manifest.json").read_text())
    assert manifest["metadata"]["server_num"] == 1 and manifest["metadata"]["worker_num"] == 2
    assert manifest["metadata"]["test"] == expected
    assert sorted(p.name for p in model.iterdir()) == ["dense_model.pt2", "manifest.json",
                                                       "sparse"]  # staging removed
    keys = np.load(model / "sparse" / "table-0.keys.npy")
    values = np.load(model / "sparse" / "table-0.values.npy")
    assert keys.dtype == np.uint64 and values.dtype == np.float32
    assert values.shape == (keys.size, 9) and keys.size == manifest["sparse_tables"][0]["rows"]
    assert keys.size > 1000 and bool(np.all(keys[1:] > keys[:-1]))  # sorted, distinct


def test_predict_in_process_tables_scores_file_and_bad_input(
        run_cli: RunCli, repo_root: Path, tmp_path: Path, data_slice: Callable[..., Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    train, test = data_slice(1200), data_slice(400, source="dev.csv")
    model, scores = tmp_path / "model", tmp_path / "scores.tsv"

    expected = _train(run_cli, repo_root, tmp_path / "out", model, train, test, 0, 1)
    r = _predict(capsys, repo_root, model, test, "--out", str(scores))
    got_auc, _, examples = _result(r)

    assert abs(got_auc - expected["auc"]) <= AUC_TOLERANCE, (got_auc, expected)
    assert examples == 400
    table = np.loadtxt(scores, delimiter="\t", ndmin=2)
    labels = [float(line.split("\t", 1)[0]) for line in test.read_text().splitlines()]
    np.testing.assert_array_equal(table[:, 0], labels)  # file order
    assert abs(auc(table[:, 0], table[:, 1]) - expected["auc"]) <= AUC_TOLERANCE

    # bad input (in process: the same main() as the command): exit 2 naming file or field
    def bad(model_dir: Path, data: Path, *extra: str) -> str:
        code = main(["predict", "-m", _config(repo_root), "--model", str(model_dir),
                     "--data", str(data), *extra])
        err = capsys.readouterr().err
        assert code == 2, err
        return err

    err = bad(tmp_path / "no_model", test)
    assert "no_model" in err and "does not exist" in err
    err = bad(model, tmp_path / "missing.csv")
    assert "--data" in err and "missing.csv" in err
    err = bad(model, test, "-o", "hyper_parameters.sparse_feature_dim=8")
    assert "manifest.json" in err and "sparse_feature_dim is 8" in err and "dim 9" in err
    err = bad(model, test, "-o", "runner.model=wide_deep")
    assert "runner.model is 'wide_deep'" in err and "model 'dnn'" in err
    manifest = model / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"format_version": 1',
                                                     '"format_version": 2'))
    err = bad(model, test)
    assert "manifest.json: format_version 2, this psfleet reads version 1" in err
