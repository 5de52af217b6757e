"""``psfleet init`` / ``psfleet example`` (psfleet.cli.starter) and the shipped templates.

Done-when (issue 16, item 9): every template, written by ``init``, trains on the data
of the ``psfleet datagen`` command ``init`` prints (at 3,000 rows, 1 epoch, in this
process) to a finite test AUC above 0.55 and not above the generator's optimum on that
file; ``example`` prints only the config's path on stdout; an existing config is
exit 2 naming it unless ``--force``; the wheel ships every template.

The commands run through a parser built around :func:`starter.register` and the
dispatch of ``psfleet.cli.main.main`` (ConfigError -> "psfleet: error: ...", exit 2),
so these tests do not depend on main.py's wiring.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from psfleet import fleet
from psfleet.cli import starter
from psfleet.cli.main import main as psfleet_main
from psfleet.errors import ConfigError
from psfleet.rec.config import TrainConfig

pytestmark = pytest.mark.e2e

RunCli = Callable[..., subprocess.CompletedProcess[str]]
TEMPLATES = [(m, d) for m in starter.MODELS for d in starter.DATA_KINDS]
SMALL_ROWS, SMALL_TEST_ROWS = 3000, 1000
JOB_ROWS = 20_000  # 2 async workers: 157 steps each
MIN_AUC = 0.55
# The optimum is the AUC of the true probabilities on the test file; a model trained on
# 3,000 rows can exceed it on 1,000 test rows only by sampling noise.
OPTIMUM_SLACK = 0.02
_TEST_AUC = re.compile(r"test auc ([0-9.]+|nan)")
_KEY_LINE = re.compile(r"^\s*(- )?[A-Za-z_]+:")


def _run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``psfleet ARGV`` for the starter commands, as main() dispatches them: returns
    (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="psfleet")
    starter.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    capsys.readouterr()
    try:
        code = args.handler(args)
    except ConfigError as exc:
        print(f"psfleet: error: {exc}", file=sys.stderr)
        code = 2
    out, err = capsys.readouterr()
    return code, out, err


def _datagen_line(stdout: str) -> list[str]:
    lines = [line.strip() for line in stdout.splitlines()
             if line.strip().startswith("psfleet datagen ")]
    assert len(lines) == 1, stdout
    return shlex.split(lines[0])


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _with_rows(argv: list[str], rows: int, test_rows: int) -> list[str]:
    argv = list(argv)
    argv[argv.index("--rows") + 1] = str(rows)
    argv[argv.index("--test_rows") + 1] = str(test_rows)
    return argv


# -- the templates themselves -------------------------------------------------------------


@pytest.mark.parametrize(("model", "data"), TEMPLATES)
def test_template_comments_every_key_and_reads_the_datagen_files(model: str, data: str) -> None:
    template = starter.load_template(model, data)
    for number, line in enumerate(template.text.splitlines(), 1):
        if _KEY_LINE.match(line):
            comment = line.partition(" # ")[2]
            assert len(comment.split()) >= 3, f"{model}_{data}.yaml:{number}: {line!r}"
    config = TrainConfig.model_validate(yaml.safe_load(template.text))
    assert config.runner.model == model
    assert config.runner.parser == ("criteo" if data == "criteo" else "csv")
    argv = list(template.datagen)
    assert argv[0] == data
    assert Path(_option(argv, "--out")) == config.runner.train_data_dir
    assert Path(_option(argv, "--test_out")) == config.runner.test_data_dir
    assert (config.cluster.server_num, config.cluster.worker_num) == (1, 2)


def test_every_example_is_a_template_and_names_differ() -> None:
    assert {"criteo_dnn", "deepfm", "wide_deep", "multivalued_csv"} <= set(starter.EXAMPLES)
    for model, data in starter.EXAMPLES.values():
        assert starter.load_template(model, data).model == model
    assert starter.EXAMPLES["multivalued_csv"] == ("dnn", "multihot")


# -- psfleet init ------------------------------------------------------------------------------


def test_init_writes_the_template_and_prints_the_next_commands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["init", "--model", "wide_deep", "--data", "multihot", "run"], capsys)
    assert (code, err) == (0, "")
    template = starter.load_template("wide_deep", "multihot")
    assert (tmp_path / "run" / "config.yaml").read_text() == template.text
    assert (tmp_path / "run" / "data").is_dir()
    commands = [line.strip() for line in out.splitlines()[1:3]]
    assert commands == [
        "psfleet datagen multihot --rows 100000 --seed 1 --out run/data/train.csv "
        "--test_rows 20000 --test_out run/data/test.csv",
        "psfleet train -m run/config.yaml"]
    assert out.startswith("psfleet: wrote run/config.yaml: wide_deep on a synthetic CSV")


def test_init_defaults_to_dnn_on_criteo(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["init", str(tmp_path / "d")], capsys)
    assert code == 0
    assert (tmp_path / "d" / "config.yaml").read_text() == \
        starter.load_template("dnn", "criteo").text
    argv = _datagen_line(out)
    assert argv[:3] == ["psfleet", "datagen", "criteo"]
    assert _option(argv, "--out") == str(tmp_path / "d" / "data" / "train.txt")


def test_init_refuses_an_existing_config_unless_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    assert _run(["init", str(folder)], capsys)[0] == 0
    config = folder / "config.yaml"
    config.write_text("# mine\n")
    code, out, err = _run(["init", "--model", "deepfm", str(folder)], capsys)
    assert (code, out) == (2, "")
    assert f"DIR: '{config}' already exists; pass --force" in err
    assert config.read_text() == "# mine\n"
    code, _, _ = _run(["init", "--model", "deepfm", "--force", str(folder)], capsys)
    assert code == 0
    assert config.read_text() == starter.load_template("deepfm", "criteo").text


@pytest.mark.parametrize(("argv", "message"), [
    (["init", "--model", "lr", "x"],
     "--model: 'lr' is not one of dnn, wide_deep, deepfm, dcn_v2"),
    (["init", "--data", "avazu", "x"], "--data: 'avazu' is not one of criteo, multihot"),
])
def test_init_names_a_bad_choice(argv: list[str], message: str, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(argv, capsys)
    assert (code, out, err.strip()) == (2, "", f"psfleet: error: {message}")
    assert not (tmp_path / "x").exists()


def test_init_into_a_file_names_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    code, _, err = _run(["init", str(tmp_path / "f")], capsys)
    assert code == 2
    assert f"DIR: '{tmp_path / 'f'}' is a file, not a folder" in err


# -- psfleet example ---------------------------------------------------------------------------


def test_example_prints_only_the_config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["example", "criteo_dnn"], capsys)
    assert (code, out) == (0, "criteo_dnn/config.yaml\n")
    assert Path(out.strip()).read_text() == starter.load_template("dnn", "criteo").text
    assert ("psfleet datagen criteo --rows 100000 --seed 1 --out criteo_dnn/data/train.txt "
            "--test_rows 20000 --test_out criteo_dnn/data/test.txt") in err
    assert "psfleet train -m criteo_dnn/config.yaml" in err
    # Again over the unchanged copy: the same path, not an error (so $(...) reruns).
    assert _run(["example", "criteo_dnn"], capsys)[:2] == (0, "criteo_dnn/config.yaml\n")
    Path(out.strip()).write_text("# edited\n")
    code, out2, err = _run(["example", "criteo_dnn"], capsys)
    assert (code, out2) == (2, "")
    assert "--out: 'criteo_dnn/config.yaml' already exists; pass --force" in err
    assert _run(["example", "criteo_dnn", "--force"], capsys)[:2] == \
        (0, "criteo_dnn/config.yaml\n")
    code, out, err = _run(["example", "multivalued_csv", "--out", "mine"], capsys)
    assert (code, out) == (0, "mine/config.yaml\n")
    assert "--out mine/data/train.csv" in err


def test_example_list_has_one_line_per_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["example", "--list"], capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == list(starter.EXAMPLES)
    assert lines[0].split(None, 1)[1] == "dnn on synthetic Criteo-like TSV"


@pytest.mark.parametrize(("argv", "message"), [
    (["example", "nope"], "NAME: 'nope' is not one of criteo_dnn"),
    (["example"], "NAME: required, one of criteo_dnn"),
    (["example", "deepfm", "--list"], "NAME: 'deepfm' given with --list"),
])
def test_example_names_a_bad_name(argv: list[str], message: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(argv, capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"psfleet: error: {message}")
    assert list(tmp_path.iterdir()) == []


# -- the templates train ---------------------------------------------------------------------


@pytest.mark.parametrize(("model", "data"), [
    pytest.param(m, d, marks=() if m == "dnn" else pytest.mark.slow)
    for m, d in TEMPLATES])
def test_template_trains_on_the_data_of_its_printed_command(
        model: str, data: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    code, out, _ = _run(["init", "--model", model, "--data", data, str(folder)], capsys)
    assert code == 0
    argv = _with_rows(_datagen_line(out), SMALL_ROWS, SMALL_TEST_ROWS)
    assert psfleet_main(argv[1:]) == 0
    test_file = Path(_option(argv, "--test_out"))
    optimum = json.loads(Path(f"{test_file}.json").read_text())["optimum_auc"]
    capsys.readouterr()
    try:
        code = psfleet_main(["train", "-q", "-m", str(folder / "config.yaml"),
                             "-o", "cluster.server_num=0", "-o", "cluster.worker_num=1",
                             "-o", "runner.export_model=false"])
    finally:
        fleet.reset()
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    match = _TEST_AUC.search(out)
    assert match, out
    test_auc = float(match.group(1))
    assert math.isfinite(test_auc)
    assert MIN_AUC < test_auc <= optimum + OPTIMUM_SLACK, (test_auc, optimum)


@pytest.mark.slow
def test_printed_commands_train_a_local_job(tmp_path: Path, run_cli: RunCli,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The example as written (1 server x 2 workers), run as a user would: the printed
    commands, from the folder where ``psfleet example`` ran, through the CLI's processes."""
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["example", "criteo_dnn"], capsys)
    assert (code, out) == (0, "criteo_dnn/config.yaml\n")
    argv = _with_rows(_datagen_line(err), JOB_ROWS, SMALL_TEST_ROWS)
    r = run_cli(argv[1:], timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run_cli(["train", "-q", "-m", out.strip()], timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    match = _TEST_AUC.search(r.stdout)
    assert match, r.stdout
    optimum = json.loads(Path("criteo_dnn/data/test.txt.json").read_text())["optimum_auc"]
    assert MIN_AUC < float(match.group(1)) <= optimum + OPTIMUM_SLACK, r.stdout


# -- the wheel ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_wheel_ships_every_template(repo_root: Path, tmp_path: Path) -> None:
    # Build from a copy: a build in the checkout would leave build/ in it.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo_root / name, source / name)
    shutil.copytree(repo_root / "psfleet", source / "psfleet",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                        "-q", "-w", str(wheels)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [wheel] = wheels.glob("psfleet-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        shipped = sorted(n for n in names if n.startswith("psfleet/templates/"))
        assert shipped == sorted(f"psfleet/templates/{m}_{d}.yaml" for m, d in TEMPLATES)
        for model, data in TEMPLATES:
            text = archive.read(f"psfleet/templates/{model}_{data}.yaml").decode()
            assert text == starter.load_template(model, data).text
    assert "psfleet/cli/starter.py" in names
