"""Bad input gives a clear error (what, the offending value, what to do) and leaves
no process behind.

Covers ``psfleet train`` with bad data (missing, empty, malformed lines), bad
configuration (unknown optimizer, unknown key, bad sync_mode, missing file, bad -o,
workers without servers, use_gpu), a worker whose server never comes up, and a server
whose port is taken. Bad configuration and data in a job config (servers and
workers) exit 2 before any process starts: nothing under ``runner.model_save_path``
(no run folder, no log directory, no ``serverlog.0``).
Every process runs in a clean environment (conftest.clean_env); the autouse leak
check fails a test that leaves children behind.
"""

from __future__ import annotations

import gzip
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import assert_no_processes_mentioning, run_folder

pytestmark = pytest.mark.e2e

RunCli = Callable[..., subprocess.CompletedProcess[str]]

FAST = ["-o", "hyper_parameters.fc_sizes=[16]", "-o", "runner.epochs=1"]


@pytest.fixture
def config(repo_root: Path) -> Path:
    return repo_root / "examples" / "criteo_dnn" / "config.yaml"


def _local(config: Path, out: Path, train: Path | str, *extra: str) -> list[str]:
    """Arguments of a one-process run of ``config`` on ``train``."""
    return ["train", "-m", str(config), "-o", f"runner.train_data_dir={train}",
            "-o", "runner.test_data_dir=null", "-o", f"runner.model_save_path={out}",
            "-o", "cluster.server_num=0", "-o", "cluster.worker_num=1", *FAST, *extra]


# -- data -------------------------------------------------------------------------------


@pytest.mark.parametrize(("server_num", "worker_num"), [(0, 1), (1, 2)],
                         ids=["one_process", "1server_2workers"])
def test_missing_train_data_dir(run_cli: RunCli, config: Path, tmp_path: Path,
                                server_num: int, worker_num: int) -> None:
    missing = tmp_path / "no_such_dir"

    r = run_cli(["train", "-m", str(config), "-o", f"runner.train_data_dir={missing}",
                 "-o", f"runner.model_save_path={tmp_path / 'out'}",
                 "-o", f"cluster.server_num={server_num}",
                 "-o", f"cluster.worker_num={worker_num}"], timeout=60)

    assert r.returncode == 2, r.stderr[-3000:]
    assert "runner.train_data_dir" in r.stderr
    assert str(missing) in r.stderr
    assert "does not exist" in r.stderr
    # Checked before any process starts: no job, no run folder, no log directory.
    assert not (tmp_path / "out").exists()
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_empty_train_file(run_cli: RunCli, config: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")

    r = run_cli(_local(config, tmp_path / "out", empty), timeout=60)

    assert r.returncode == 2, r.stderr[-3000:]
    assert str(empty) in r.stderr
    assert "is empty" in r.stderr
    assert not (tmp_path / "out").exists()  # checked before training: no run folder
    assert_no_processes_mentioning(str(tmp_path))


def _job(config: Path, out: Path, *extra: str) -> list[str]:
    """Arguments of the example's job (1 server x 2 workers) writing to ``out``."""
    return ["train", "-m", str(config), "-o", f"runner.model_save_path={out}",
            "-o", "cluster.server_num=1", "-o", "cluster.worker_num=2", *FAST, *extra]


def _assert_nothing_started(out: Path) -> None:
    """Nothing under ``out`` (the model_save_path): no run folder, so no log folder,
    no ``serverlog.0``, no metrics.json."""
    assert not out.exists(), sorted(str(p.relative_to(out)) for p in out.rglob("*"))


@pytest.mark.parametrize(("extra", "env", "named"), [
    (("-o", "cluster.shares=1"), {}, "cluster.shares: 1 shares for 2 servers"),
    ((), {"PSFLEET_SHARES": "4"}, "PSFLEET_SHARES: 4 shares for 2 servers needs replication"),
], ids=["fewer_shares_than_servers", "shares_without_replication"])
def test_a_bad_share_count_exits_2_before_any_process(
        run_cli: RunCli, config: Path, tmp_path: Path, extra: tuple[str, ...],
        env: dict[str, str], named: str) -> None:
    out = tmp_path / "out"
    r = run_cli(_job(config, out, "-o", "cluster.server_num=2", *extra), env=env)
    assert r.returncode == 2, r.stderr[-3000:]
    assert named in r.stderr
    _assert_nothing_started(out)


@pytest.mark.parametrize("content", ["", "\n  \n\n"], ids=["zero_bytes", "blank_lines"])
def test_empty_data_file_in_a_job_exits_2_before_any_process(
        run_cli: RunCli, config: Path, tmp_path: Path, content: str) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text(content)
    out = tmp_path / "out"

    start = time.perf_counter()
    r = run_cli(_job(config, out, "-o", f"runner.train_data_dir={empty}"), timeout=60)
    elapsed = time.perf_counter() - start

    assert r.returncode == 2, r.stderr[-3000:]
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("psfleet: error: runner.train_data_dir:"), r.stderr[-3000:]
    assert repr(str(empty)) in error and "is empty" in error and "remove it" in error
    assert "starting" not in r.stdout  # the launcher never announced a job
    _assert_nothing_started(out)
    assert_no_processes_mentioning(str(tmp_path))
    print(f"empty data file ({content!r}): exit 2 after {elapsed:.2f} s")


def test_data_folder_without_files_exits_2_before_any_process(
        run_cli: RunCli, config: Path, tmp_path: Path) -> None:
    folder = tmp_path / "test_data"
    folder.mkdir()
    out = tmp_path / "out"

    r = run_cli(_job(config, out, "-o", f"runner.test_data_dir={folder}"), timeout=60)

    assert r.returncode == 2, r.stderr[-3000:]
    error = r.stderr.strip().splitlines()[-1]
    assert "runner.test_data_dir" in error and str(folder) in error
    assert "holds no data files" in error
    _assert_nothing_started(out)
    assert_no_processes_mentioning(str(tmp_path))


def test_use_gpu_exits_2_before_any_process(run_cli: RunCli, config: Path,
                                             tmp_path: Path) -> None:
    out = tmp_path / "out"

    start = time.perf_counter()
    r = run_cli(["train", "-m", str(config), "-o", "runner.use_gpu=true",
                 "-o", f"runner.model_save_path={out}"], timeout=60)
    elapsed = time.perf_counter() - start

    assert r.returncode == 2, r.stderr[-3000:]
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("psfleet: error:") and "runner.use_gpu" in error, r.stderr
    assert "use_gpu: false" in error  # what to do
    assert "Traceback" not in r.stderr
    _assert_nothing_started(out)
    assert_no_processes_mentioning(str(tmp_path))
    print(f"runner.use_gpu=true: exit 2 after {elapsed:.2f} s")


def test_compressed_data_file_exits_2_before_any_process(
        run_cli: RunCli, config: Path, tmp_path: Path, criteo_dir: Path) -> None:
    lines = (criteo_dir / "train.csv").read_bytes().splitlines(keepends=True)[:50]
    packed = tmp_path / "few.csv"
    packed.write_bytes(gzip.compress(b"".join(lines)))
    out = tmp_path / "out"

    r = run_cli(_job(config, out, "-o", f"runner.train_data_dir={packed}"), timeout=60)

    assert r.returncode == 2, r.stderr[-3000:]
    error = r.stderr.strip().splitlines()[-1]
    assert "runner.train_data_dir" in error and repr(str(packed)) in error
    assert "gzip-compressed" in error and "pipe_command" in error  # what to do
    _assert_nothing_started(out)
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow  # several seconds: the slow tier
@pytest.mark.parametrize("fraction", [None, 1.0])
def test_training_on_nothing_fails(run_cli: RunCli, config: Path, tmp_path: Path,
                                   fraction: float | None) -> None:
    # Every line malformed (comma-separated, not Criteo TSV): no example is trained, so
    # the run must not report success (it used to print a test AUC and exit 0). By
    # default the check before start stops it (the malformed fraction would, later);
    # with every line allowed to be malformed, the count of trained examples does.
    data = tmp_path / "commas.csv"
    data.write_text("".join(f"{i % 2},{i},{i * 3},abc\n" for i in range(40)))
    out = tmp_path / "out"
    extra = [] if fraction is None else ["-o", f"runner.max_malformed_fraction={fraction}"]

    r = run_cli([*_local(config, out, data), *extra], timeout=60)

    assert r.returncode != 0, r.stderr[-3000:]
    if fraction is None:  # refused before any process started
        assert r.returncode == 2
        assert "every one of its first 40 data lines is malformed" in r.stderr
        assert "commas.csv:1" in r.stderr  # the first bad line
        _assert_nothing_started(out)
    else:
        assert "skipped 40 malformed lines of 40" in r.stderr
        assert "trained on 0 examples" in r.stderr and "runner.parser" in r.stderr
        assert not (run_folder(out) / "metrics.json").exists()  # the run started, failed
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_malformed_lines_are_counted_skipped_and_named(
        run_cli: RunCli, config: Path, tmp_path: Path, criteo_dir: Path) -> None:
    good = (criteo_dir / "train.csv").read_text().splitlines(keepends=True)[:600]
    bad = ["garbage without tabs\n", "1\t2\t3\n", "7" + good[0][1:]]  # the last: label 7
    data = tmp_path / "mixed.csv"
    data.write_text("".join(good[:300] + bad + good[300:]))
    out = tmp_path / "out"

    r = run_cli([*_local(config, out, data), "-v"], timeout=60)  # -v: the INFO counts

    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{data}:301" in r.stderr  # the first malformed line, by file:line
    assert "skipped 3 malformed lines" in r.stderr
    assert (run_folder(out) / "metrics.json").is_file()
    assert "600 examples" in r.stderr
    assert_no_processes_mentioning(str(tmp_path))


# -- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(("override", "expected"), [
    ("hyper_parameters.optimizer.class=Foo",
     ["hyper_parameters.optimizer.class", "'Foo'", "Adam", "SGD", "Adagrad"]),
    ("runner.epoch=3", ["runner.epoch", "unknown key", "did you mean 'epochs'", "batch_size"]),
    ("runner.sync_mode=asyc", ["runner.sync_mode", "'asyc'", "async"]),
    ("runner", ["-o 'runner'", "KEY.PATH=VALUE"]),
    ("cluster.worker_num=2", ["cluster.worker_num", "server_num"]),
], ids=["unknown_optimizer", "unknown_key", "bad_sync_mode", "bad_o_syntax",
        "workers_without_servers"])
def test_bad_config_exits_2_naming_the_field(run_cli: RunCli, config: Path, tmp_path: Path,
                                             override: str, expected: list[str]) -> None:
    args = ["train", "-m", str(config), "-o", f"runner.model_save_path={tmp_path / 'out'}",
            "-o", "cluster.server_num=0", "-o", override]

    r = run_cli(args, timeout=60)

    assert r.returncode == 2, r.stderr[-3000:]
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("psfleet: error:"), r.stderr[-3000:]
    for text in expected:
        assert text in error
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_missing_config_file(run_cli: RunCli, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"

    r = run_cli(["train", "-m", str(missing)], timeout=60)

    assert r.returncode == 2
    assert str(missing) in r.stderr
    assert "does not exist" in r.stderr
    assert "Traceback" not in r.stderr


# -- servers ----------------------------------------------------------------------------


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port bound by a socket that never listens: connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port held by a listening socket of this process."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


@pytest.mark.slow
def test_worker_gives_up_on_a_server_that_never_comes_up(
        run_cli: RunCli, config: Path, tmp_path: Path, dead_port: int,
        data_slice: Callable[..., Path]) -> None:
    endpoint = f"127.0.0.1:{dead_port}"
    env = {"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": endpoint,
           "PADDLE_TRAINERS_NUM": "1", "PADDLE_TRAINER_ID": "0",
           "PSFLEET_SERVER_WAIT_TIMEOUT_S": "4"}
    args = ["train", "-m", str(config), "-o", f"runner.train_data_dir={data_slice(200)}",
            "-o", "runner.test_data_dir=null", "-o", f"runner.model_save_path={tmp_path}",
            *FAST]
    r = run_cli(args, timeout=120, env=env)

    assert r.returncode != 0, r.stderr[-3000:]
    # It honoured the 4 s timeout (a retry every 3 s), not the 300 s default.
    assert 1 <= r.stderr.count("server not ready, wait") <= 2, r.stderr[-3000:]
    assert "not ready endpoints" in r.stderr
    final = r.stderr.strip().splitlines()[-1]
    assert "not ready" in final
    assert endpoint in final
    assert "PSFLEET_SERVER_WAIT_TIMEOUT_S" in final  # what to do
    assert_no_processes_mentioning(str(tmp_path))


@pytest.mark.slow
def test_server_on_a_port_in_use_fails_fast(run_cli: RunCli, config: Path, tmp_path: Path,
                                            busy_port: int) -> None:
    env = {"TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1", "PADDLE_PORT": str(busy_port),
           "PADDLE_PSERVERS_IP_PORT_LIST": f"127.0.0.1:{busy_port}",
           "PADDLE_TRAINERS_NUM": "1"}
    args = ["train", "-m", str(config), "-o", f"runner.model_save_path={tmp_path}", *FAST]
    r = run_cli(args, timeout=120, env=env)

    assert r.returncode != 0, r.stderr[-3000:]
    assert "Server listening" not in r.stderr
    final = r.stderr.strip().splitlines()[-1]
    assert f"127.0.0.1:{busy_port}" in final
    assert "in use" in final
    assert "PADDLE_PORT" in final
    assert_no_processes_mentioning(str(tmp_path))
