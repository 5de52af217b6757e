"""Replication with real jobs (``psfleet train``, real processes, 127.0.0.1).

Sync mode with SGD (a fixed order of updates): a 3-server job with
``cluster.replication: 2`` whose server 1 is SIGKILLed mid-epoch, and not restarted,
ends with every key's row and the dense parameters equal to an undisturbed run's
(issue 20's first done-when): the other copy of each share it held took over, and no
round was lost or applied twice.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import clean_env, run_command, run_folder
from test_checkpoint_resume import (
    _checkpoints,
    _final_parameters,
    _job_process,
    _manifest,
    _train_argv,
    _wait_for,
    _wait_for_checkpoint,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _config(tmp_path: Path, name: str, train: Path, test: Path, replication: int) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps({
        "runner": {"train_data_dir": str(train), "test_data_dir": str(test), "epochs": 1,
                   "batch_size": 8, "sync_mode": "sync", "seed": 11,
                   "model_save_path": str(tmp_path / f"out-{name}"), "export_model": False,
                   "checkpoint": {"checkpoint_dir": str(tmp_path / f"ck-{name}"),
                                  "epoch_interval": 1, "step_interval": 10,
                                  "max_num_checkpoints": 2}},
        "hyper_parameters": {"fc_sizes": [32, 16],
                             "optimizer": {"class": "SGD", "learning_rate": 0.05}},
        "cluster": {"server_num": 3, "worker_num": 2, "replication": replication},
    }))
    return path


def _async_config(tmp_path: Path, name: str, data_slice: Callable[..., Path], epochs: int,
                  checkpoint: dict[str, int] | None = None, **cluster: int) -> Path:
    """:func:`_config` of an async, replication-2 job of ``epochs`` epochs on 3000 rows,
    with ``checkpoint`` and ``cluster`` settings changed."""
    train, test = data_slice(3000), data_slice(400, source="dev.csv")
    config = _config(tmp_path, name, train, test, replication=2)
    raw = json.loads(config.read_text())
    raw["runner"].update(sync_mode="async", epochs=epochs)
    raw["runner"]["checkpoint"].update(checkpoint or {})
    raw["cluster"].update(cluster)
    config.write_text(json.dumps(raw))
    return config


@contextlib.contextmanager
def _job(config: Path, env: dict[str, str] | None) -> Iterator[subprocess.Popen[str]]:
    """``psfleet train`` of ``config`` (``env`` added), stderr piped; killed at the end
    if it still runs."""
    job = subprocess.Popen(_train_argv(config), env=clean_env(env), text=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
    try:
        yield job
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def _kill_server_1_mid_epoch(tmp_path: Path, config: Path, name: str,
                             env: dict[str, str] | None = None,
                             hold_workers: bool = False) -> tuple[Path, str]:
    """Run ``config``'s job (``env`` added to the environment), SIGKILL its server 1 once
    the checkpoint after batch 10 is published, and wait for the job, which must exit 0.
    With ``hold_workers`` the workers are stopped (SIGSTOP) from the kill until the
    restarted server 1 has started, so its rejoin happens while training goes on however
    slow the restart is on a loaded machine. Returns (run folder, stderr)."""
    with _job(config, env) as job:
        _wait_for_checkpoint(job, tmp_path / f"ck-{name}", 10)
        run = run_folder(tmp_path / f"out-{name}")
        workers = [_job_process(run / "config.yaml", "PADDLE_TRAINER_ID", str(i))
                   for i in range(2)] if hold_workers else []
        _signal(workers, "suspend")
        try:
            _job_process(run / "config.yaml", "PSFLEET_SERVER_INDEX", "1").kill()
            if workers:
                _hold(workers, job, lambda: "incarnation 1" in _read(run / "log" / "serverlog.1"))
        finally:
            _signal(workers, "resume")
        _, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    return run, err


def _signal(workers: list[psutil.Process], action: str) -> None:
    """``suspend`` or ``resume`` each worker still alive (one that failed meanwhile is
    reported by the job's exit)."""
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            getattr(worker, action)()


def _hold(workers: list[psutil.Process], job: subprocess.Popen[str],
          until: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Keep the stopped ``workers`` stopped until ``until()``, letting them run 0.1 s
    every 10 s (fleetrun's hang detection kills a child stopped for 30 s)."""
    deadline = time.monotonic() + timeout_s
    stopped_at = time.monotonic()
    while not until():
        if job.poll() is not None:
            pytest.fail(f"the job ended (exit {job.returncode}) while its workers were held")
        if time.monotonic() > deadline:
            pytest.fail(f"the workers were held {timeout_s:g} s without the condition")
        if time.monotonic() - stopped_at > 10:
            _signal(workers, "resume")
            time.sleep(0.1)
            _signal(workers, "suspend")
            stopped_at = time.monotonic()
        time.sleep(0.02)


def _assert_rows_kept(tmp_path: Path, checkpoints: Path, when: str) -> None:
    """Every key of the checkpoint after batch 20 is in the newest checkpoint."""
    early = tmp_path / "ck-early"
    first = next(p for p in _checkpoints(checkpoints) if _manifest(p)["batch"] == 20)
    shutil.copytree(first, early / first.name)
    early_keys, _, _ = _final_parameters(early)
    keys, _, _ = _final_parameters(checkpoints)
    assert early_keys.size > 500
    assert np.isin(early_keys, keys).all(), f"rows created {when} were lost"


def _read(path: Path) -> str:
    """``path``'s text; empty while it does not exist."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_sync_job_survives_a_killed_server_with_every_row_equal(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    train, test = data_slice(800), data_slice(200, source="dev.csv")
    reference = _config(tmp_path, "ref", train, test, replication=1)
    r = run_command(_train_argv(reference), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]

    config = _config(tmp_path, "cut", train, test, replication=2)
    run, err = _kill_server_1_mid_epoch(tmp_path, config, "cut")
    steps = [int(_manifest(p)["step"]) for p in _checkpoints(tmp_path / "ck-cut")]  # type: ignore[call-overload]
    assert max(steps) == 400 // 8, "the job did not train its whole epoch"
    assert "not restarted (replication 2)" in err
    logs = run / "log"
    assert "server 1 (pid" in err and "SIGKILL" in err
    worker_log = (logs / "workerlog.0").read_text() + (logs / "workerlog.1").read_text()
    assert "is dead" in worker_log, "no call was failed over"
    assert "now serves share 1" in (logs / "serverlog.2").read_text()

    ref_keys, ref_rows, ref_dense = _final_parameters(tmp_path / "ck-ref")
    keys, rows, dense = _final_parameters(tmp_path / "ck-cut")
    assert keys.size > 1000
    assert np.array_equal(keys, ref_keys)
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(dense, ref_dense)


def test_async_job_with_a_killed_server_restarted_rejoins(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    """Async, replication 2, ``max_restarts: 1``: server 1 is SIGKILLed mid-epoch and
    restarted; the restarted server is filled with copies of its shares while training
    goes on, serves its own share again, and the job ends with a sane AUC. Each copy
    travels in parts of at most 64 KiB (``PSFLEET_COPY_CHUNK_BYTES``), so its files
    are cut into pieces and joined again."""
    config = _async_config(tmp_path, "rejoin", data_slice, 3, max_restarts=1)
    run, err = _kill_server_1_mid_epoch(tmp_path, config, "rejoin",
                                        {"PSFLEET_COPY_CHUNK_BYTES": str(64 << 10)},
                                        hold_workers=True)
    assert "restarting it (restart 1 of --max_restarts 1)" in err
    restarted = (run / "log" / "serverlog.1").read_text()
    assert "rejoined: holds shares [0, 1]" in restarted, restarted[-3000:]
    assert "now serves share 1" in restarted
    # Shares 0 and 1 were copied from their primaries, servers 0 and 2, in parts.
    primaries = "".join((run / "log" / f"serverlog.{i}").read_text() for i in (0, 2))
    copies = re.findall(r"copied share (\d) \((\d+) bytes in (\d+) messages\)", primaries)
    assert sorted(share for share, _, _ in copies) == ["0", "1"], copies
    for _, size, messages in copies:
        assert int(messages) == int(size) // (64 << 10) + 1, copies
    assert re.search(r"filled share 0: \{0: [1-9]\d*, ", restarted), restarted[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test"]["auc"] > 0.6


def test_async_job_survives_two_dead_servers_one_after_the_other(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    """Async, replication 2, no restarts: server 1 is SIGKILLed mid-epoch and the live
    servers take new copies of its shares (refill, ``PSFLEET_REFILL_DELAY_S=0``); then
    server 2 is SIGKILLed too. Server 0 serves every share, the job trains to its end,
    and every row the job had before the kills is in its last checkpoint."""
    config = _async_config(tmp_path, "twice", data_slice, 2,
                           {"step_interval": 20, "max_num_checkpoints": 1000})
    checkpoints = tmp_path / "ck-twice"
    with _job(config, {"PSFLEET_REFILL_DELAY_S": "0"}) as job:
        _wait_for_checkpoint(job, checkpoints, 20)
        logs = run_folder(tmp_path / "out-twice") / "log"
        _job_process(logs.parent / "config.yaml", "PSFLEET_SERVER_INDEX", "1").kill()
        _wait_for("the refill of shares 0 and 1", lambda: re.search(
            r"copied share 0 ", _read(logs / "serverlog.0")) is not None and re.search(
            r"copied share 1 ", _read(logs / "serverlog.2")) is not None, job)
        assert job.poll() is None, "the job ended before its second server died"
        second_kill_at = max(int(_manifest(p)["batch"]) for p in _checkpoints(checkpoints))  # type: ignore[call-overload]
        _job_process(logs.parent / "config.yaml", "PSFLEET_SERVER_INDEX", "2").kill()
        _, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    assert err.count("not restarted (replication 2)") == 2, err[-3000:]
    assert "takes a new one from host 0" in _read(logs / "serverlog.2")  # share 0
    server_0 = _read(logs / "serverlog.0")
    assert "takes a new one from host 2" in server_0  # share 1
    assert "now serves share 2" in server_0
    batches = [int(_manifest(p)["batch"]) for p in _checkpoints(checkpoints)]  # type: ignore[call-overload]
    assert max(batches) > second_kill_at + 20, "no training after the second kill"

    _assert_rows_kept(tmp_path, checkpoints, "before the kills")
    metrics = json.loads((logs.parent / "metrics.json").read_text())
    assert metrics["test"]["auc"] > 0.6


def test_async_job_grows_by_a_server_that_takes_a_third_of_the_shares(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    """Async 2 servers x 2 workers, replication 2, 6 shares: ``psfleet grow`` mid-epoch
    has fleetrun start server 2, which joins and takes a third of the copies (4 of 12)
    and serves 2 of the 6 shares; the job trains to its end, every row it had before the
    grow is in its last checkpoint (written as 6 shares), and the AUC is sane. The
    workers are held (SIGSTOP) while the command runs, so the job trains on the grown
    servers however slow the machine (the moves under concurrent pushes are
    tests/test_grow.py's). Then server 0 is SIGKILLed: fleetrun restarts it with the
    job's first two servers' list (with the added one in it, it took itself for host 0
    of 3 and refused the workers), and it takes back the four shares it held."""
    config = _async_config(tmp_path, "grow", data_slice, 2,
                           {"step_interval": 20, "max_num_checkpoints": 1000},
                           server_num=2, shares=6, max_restarts=1)
    checkpoints = tmp_path / "ck-grow"
    with _job(config, None) as job:
        _wait_for_checkpoint(job, checkpoints, 20)
        run = run_folder(tmp_path / "out-grow")
        workers = [_job_process(run / "config.yaml", "PADDLE_TRAINER_ID", str(i))
                   for i in range(2)]
        _signal(workers, "suspend")
        grow = subprocess.Popen([sys.executable, "-m", "psfleet.cli.main", "grow", str(run)],
                                env=clean_env(None), text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        logs = run / "log"
        try:
            _hold(workers, job, lambda: grow.poll() is not None, timeout_s=180)
            grown, grow_err = grow.communicate(timeout=10)
            assert grow.returncode == 0, grown[-3000:] + grow_err[-3000:]
            _job_process(run / "config.yaml", "PSFLEET_SERVER_INDEX", "0").kill()
            _hold(workers, job, lambda: "rejoined: holds" in _read(logs / "serverlog.0"))
        finally:
            if grow.poll() is None:
                grow.kill()
                grow.wait()
            _signal(workers, "resume")
        grown_at = max(int(_manifest(p)["step"]) for p in _checkpoints(checkpoints))  # type: ignore[call-overload]
        _, err = job.communicate(timeout=240)
    assert "server(s) [2] joined the job" in grown
    rows = re.findall(r"^\s+(\d)\s+\S+\s+([\d,]+)\s+([\d,-]+)$", grown, re.M)
    assert [(i, len(held.split(",")), len(served.split(","))) for i, held, served in rows] == [
        ("0", 4, 2), ("1", 4, 2), ("2", 4, 2)], grown
    assert job.returncode == 0, err[-3000:]
    assert "joined the job as host 2" in _read(logs / "serverlog.2")
    held = [int(s) for s in rows[0][1].split(",")]
    restarted = _read(logs / "serverlog.0")
    assert "host 0 of 2 (incarnation 1)" in restarted, restarted[-3000:]
    assert f"rejoined: holds shares {held}" in restarted, restarted[-3000:]
    steps = [int(_manifest(p)["step"]) for p in _checkpoints(checkpoints)]  # type: ignore[call-overload]
    assert max(steps) > grown_at + 100, "no training after the grow"
    latest = max(_checkpoints(checkpoints), key=lambda p: int(_manifest(p)["step"]))  # type: ignore[call-overload]
    assert sorted(p.name for p in latest.glob("server-*")) == [f"server-{i}" for i in range(6)]

    _assert_rows_kept(tmp_path, checkpoints, "before the grow")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test"]["auc"] > 0.6


def test_hang_detection_never_kills_the_last_live_copy_of_a_share(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    """Async, 2 servers, replication 2, ``PSFLEET_HEALTH_TIMEOUT_S=3`` (issue 44, finding
    2c): server 1 is SIGKILLed (server 0 then serves every share), then server 0 is
    stopped (SIGSTOP) for three timeouts, as a starved host can leave a live server.
    fleetrun must not SIGKILL it (it holds the last live copy of every share: before,
    it did, and the job was lost); it warns once, and once resumed the job ends exit 0."""
    config = _async_config(tmp_path, "last", data_slice, 2, server_num=2, worker_num=1)
    with _job(config, {"PSFLEET_HEALTH_TIMEOUT_S": "3"}) as job:
        _wait_for_checkpoint(job, tmp_path / "ck-last", 10)
        run = run_folder(tmp_path / "out-last")
        _job_process(run / "config.yaml", "PSFLEET_SERVER_INDEX", "1").kill()
        _wait_for("the fail-over to server 0", lambda: "now serves share 1" in _read(
            run / "log" / "serverlog.0"), job)
        server_0 = _job_process(run / "config.yaml", "PSFLEET_SERVER_INDEX", "0")
        server_0.suspend()
        try:
            time.sleep(9)
            assert job.poll() is None, "the job ended while server 0 was stopped"
            assert server_0.is_running() and server_0.status() == psutil.STATUS_STOPPED
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                server_0.resume()
        _, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    assert err.count("may hold the last live copy of their shares: not killed") == 1, err[-3000:]
    assert "fleetrun killed it" not in err
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test"]["auc"] > 0.6
