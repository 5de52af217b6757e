"""``psfleet slurm render`` (psfleet.cli.slurm, psfleet.cluster.slurm): what the sbatch
script says, and bad input named with exit 2.

The command runs through a parser built around :func:`psfleet.cli.slurm.register` and
the dispatch of ``psfleet.cli.main.main`` (ConfigError -> ``psfleet: error: ...``, exit
2), so these tests do not depend on main.py's wiring. What the script does when run is
tests/test_slurm_job.py's.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from psfleet.cli import slurm as slurm_cli
from psfleet.cluster.job import load_cluster_job
from psfleet.cluster.sbatch_options import SlurmOptions, parse_time
from psfleet.cluster.slurm import render_script
from psfleet.errors import ConfigError
from psfleet.launch.specs import JOB_VARIABLES

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "criteo_dnn" / "config.yaml"


def _run(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``psfleet slurm ARGV`` as main() dispatches it: (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="psfleet")
    slurm_cli.register(parser.add_subparsers(dest="command", required=True))
    capsys.readouterr()
    try:
        args = parser.parse_args(["slurm", *argv])
        code = args.handler(args)
    except SystemExit as exc:  # argparse: a missing or malformed argument
        code = int(exc.code or 0)
    except ConfigError as exc:
        print(f"psfleet: error: {exc}", file=sys.stderr)
        code = 2
    out, err = capsys.readouterr()
    return code, out, err


def _script(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> str:
    code, out, err = _run(["render", "-m", str(CONFIG), "--name", "ctr", "--workdir",
                           str(tmp_path / "work"), *args], capsys)
    assert code == 0, err
    return out


def _directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines()
            if line.startswith("#SBATCH ")]


def test_directives_name_the_job_its_tasks_and_the_flags(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = _script(capsys, tmp_path, "--partition", "cpu", "--time", "1-12:00:00",
                     "--nodes", "2", "--account", "ads", "--sbatch=--qos=high")
    assert script.startswith("#!/bin/bash\n")
    assert _directives(script) == [
        "--job-name=ctr", "--ntasks=3", "--output=ctr-%j.out", "--nodes=2",
        "--partition=cpu", "--time=1-12:00:00", "--account=ads", "--qos=high"]
    assert "# psfleet job ctr: 1 server (task 0) and 2 workers (tasks 1..2)" in script


def test_an_output_option_replaces_the_default_batch_output(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = _script(capsys, tmp_path, "--sbatch=--output=/logs/%x-%j.txt")
    assert _directives(script) == ["--job-name=ctr", "--ntasks=3", "--output=/logs/%x-%j.txt"]


def test_the_config_goes_to_the_workdir_verbatim(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    script = _script(capsys, tmp_path)
    workdir = tmp_path / "work"
    body = re.search(r"<<'PSFLEET_CONFIG'\n(.*?)^PSFLEET_CONFIG$", script, re.S | re.M)
    assert body is not None and body.group(1) == CONFIG.read_text()
    assert f"workdir={workdir}\n" in script
    assert 'config="$workdir/config.yaml"' in script
    # Every process reads that file; the run folder is one per submission.
    assert (f"psfleet train -m {workdir}/config.yaml "
            '-o "runner.run_name=ctr-${SLURM_JOB_ID}"') in script
    assert f'run_dir={workdir}/output/"ctr-$SLURM_JOB_ID"' in script


def test_overrides_reach_every_process_and_a_named_run_keeps_its_name(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = _script(capsys, tmp_path, "-o", "runner.epochs=1", "-o", "runner.run_name=exp1")
    workdir = tmp_path / "work"
    assert (f"psfleet train -m {workdir}/config.yaml -o runner.epochs=1 -o "
            "runner.run_name=exp1 -o runner.run_name=exp1") in script
    assert f"run_dir={workdir}/output/exp1\n" in script
    assert "SLURM_JOB_ID}" not in script.split("srun ")[1]


def test_roles_ports_and_the_step(capsys: pytest.CaptureFixture[str],
                                  tmp_path: Path) -> None:
    script = _script(capsys, tmp_path, "--port", "7000", "-o", "cluster.server_num=2",
                     "-o", "cluster.worker_num=3")
    assert "--ntasks=5" in _directives(script)
    assert "srun --ntasks=5 --distribution=block \\\n    --kill-on-bad-exit=1 --export=ALL" \
        in script
    assert "if (( rank < 2 )); then" in script
    assert "POD_IP=0.0.0.0 PADDLE_CURRENT_IP=0.0.0.0 PADDLE_PORT=$(( 7000 + rank ))" in script
    assert "worker=$(( rank - 2 ))" in script
    assert 'endpoints+=("${addr:-$node}:$(( 7000 + i ))")' in script
    assert "export PADDLE_TRAINERS_NUM=3" in script
    unset = script.split("\nunset ", 1)[1].split("\nexport", 1)[0]
    assert set(unset.replace("\\", " ").split()) == set(JOB_VARIABLES)
    assert "max_restarts=0\n" in script


def test_resources_become_per_task_options(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    script = _script(capsys, tmp_path, "-o", "cluster.resources.server.cpu=500m",
                     "-o", "cluster.resources.worker.cpu=1.5",
                     "-o", "cluster.resources.server.memory=3Gi",
                     "-o", "cluster.resources.worker.memory=1000M",
                     "-o", "cluster.resources.worker.gpu=1")
    assert _directives(script)[-3:] == [
        "--cpus-per-task=2", "--mem-per-cpu=1536M", "--gpus-per-task=1"]
    # srun (Slurm >= 22.05) does not inherit --cpus-per-task from sbatch.
    assert "--export=ALL --cpus-per-task=2 \\" in script


def test_restarts_rerun_the_step(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = _script(capsys, tmp_path, "-o", "cluster.max_restarts=2")
    assert "max_restarts=2\n" in script
    assert "PSFLEET_RESTART_NUM=$restart srun" in script


def test_a_config_line_equal_to_the_delimiter_changes_the_delimiter(tmp_path: Path) -> None:
    job = load_cluster_job(CONFIG, name="ctr", workdir=str(tmp_path))
    job = dataclasses.replace(job, config_text=job.config_text + "PSFLEET_CONFIG\n")
    script = render_script(job, SlurmOptions())
    assert "<<'PSFLEET_CONFIG_'\n" in script
    assert script.count("\nPSFLEET_CONFIG_\n") == 1


def test_workdir_defaults_to_the_config_folder(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    config = tmp_path / "proj" / "config.yaml"
    config.parent.mkdir()
    config.write_text(CONFIG.read_text())
    code, out, err = _run(["render", "-m", str(config)], capsys)
    assert code == 0, err
    assert f"workdir={config.parent}\n" in out
    assert "--job-name=proj" in _directives(out)  # config.yaml: named after its folder


def test_a_relative_workdir_is_made_absolute(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["render", "-m", str(CONFIG), "--workdir", "jobs/a"], capsys)
    assert code == 0, err
    assert f"workdir={tmp_path}/jobs/a\n" in out


def test_out_writes_an_executable_script(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    out_file = tmp_path / "job.sbatch"
    code, out, err = _run(["render", "-m", str(CONFIG), "--workdir", str(tmp_path / "w"),
                           "--out", str(out_file)], capsys)
    assert code == 0, err
    assert out == ""
    assert f"psfleet: wrote {out_file}; submit it with: sbatch {out_file}" in err
    assert out_file.read_text().startswith("#!/bin/bash\n")
    assert out_file.stat().st_mode & stat.S_IXUSR


@pytest.mark.parametrize("text", ["30", "1:30", "12:00:00", "100:00:00", "2-0", "2-12",
                                  "2-12:30", "1-00:00:00", "UNLIMITED", "infinite"])
def test_slurm_time_forms_are_accepted(text: str) -> None:
    assert parse_time(text) == text


@pytest.mark.parametrize(("args", "named"), [
    ([], "-m/--config"),
    (["-m", "{config}", "-o", "cluster.server_num=0"], "cluster.server_num"),
    (["-m", "{config}", "-o", "runner.bogus=1"], "bogus"),
    (["-m", "{config}", "-o", "runner.sync_mode=collective"], "collective"),
    (["-m", "{missing}"], "missing.yaml"),
    (["-m", "{config}", "--time", "1:75:00"], "--time"),
    (["-m", "{config}", "--time", "soon"], "--time"),
    (["-m", "{config}", "--time", "0:00:00"], "--time"),
    (["-m", "{config}", "--time", "1-24:00"], "--time"),
    (["-m", "{config}", "--nodes", "0"], "--nodes"),
    (["-m", "{config}", "--nodes", "4"], "--nodes: 4 must be in 1..3"),
    (["-m", "{config}", "--nodes", "two"], "--nodes"),
    (["-m", "{config}", "--port", "0"], "--port"),
    (["-m", "{config}", "--name", "Bad_Name"], "--name"),
    (["-m", "{config}", "--partition", "a b"], "--partition"),
    (["-m", "{config}", "--account", "x;rm"], "--account"),
    (["-m", "{config}", "--setup", "a\nb"], "--setup"),
    (["-m", "{config}", "--sbatch=--ntasks=4"], "--sbatch: '--ntasks=4' sets ntasks"),
    (["-m", "{config}", "--sbatch=-p big"], "use that instead"),
    (["-m", "{config}", "--sbatch=--cpus-per-task=4"], "cluster.resources"),
    (["-m", "{config}", "--sbatch", "qos=high"], "--sbatch"),
    (["-m", "{config}", "-o", "cluster.server_num=2", "-o", "cluster.replication=2"],
     "cluster.replication: 2: psfleet slurm render jobs keep one copy"),
])
def test_bad_input_exits_2_naming_it(args: list[str], named: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(config=CONFIG, missing=tmp_path / "missing.yaml") for a in args]
    code, out, err = _run(["render", *argv, "--workdir", str(tmp_path / "w")], capsys)
    assert code == 2
    assert out == ""
    assert named in err


def test_another_config_in_the_workdir_is_an_error(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "config.yaml").write_text("runner: {}\n")
    code, _, err = _run(["render", "-m", str(CONFIG), "--workdir", str(workdir)], capsys)
    assert code == 2
    assert f"--workdir: {workdir / 'config.yaml'} exists and holds another config" in err
    # The same text there (an earlier render's job) is no conflict.
    (workdir / "config.yaml").write_text(CONFIG.read_text())
    code, _, err = _run(["render", "-m", str(CONFIG), "--workdir", str(workdir)], capsys)
    assert code == 0, err
