"""fleetrun protects a job by default (issue 15, finding 2; docs/security.md).

Real jobs through fleetrun on the Criteo slice (``tests/jobs/gated_job.py``: the
fleet_job whose workers wait for a go file, so the test can talk to the live server as
an outsider first):

- Without PSFLEET_AUTH_TOKEN fleetrun generates one: a hand client without it is
  refused (Stop and Save UNAUTHENTICATED, nothing written, the job unharmed); the
  token is in ``LOG_DIR/.auth_token`` (0600) while the job runs and on no command line
  or log line; the job still trains to exit 0.
- ``--tls self-signed``: key 0600 and certificate in ``LOG_DIR/tls``; a plaintext
  client is refused with the clear error; a TLS client with the certificate works; the
  1x2 job trains end to end over TLS (its Stats client included).
- A job spanning nodes without PSFLEET_AUTH_TOKEN exits 2 before starting anything.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import clean_env, kill_processes, processes_mentioning, run_command

from psfleet.errors import ConfigError
from psfleet.rpc import RpcClient, RpcConfig
from psfleet.rpc import messages as msg
from psfleet.rpc.endpoint_file import read_endpoint_file
from psfleet.rpc.tls import TlsConfig

pytestmark = [pytest.mark.job, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
GATED_JOB = REPO / "tests" / "jobs" / "gated_job.py"
DATA_LINES = 400
JOB_TIMEOUT_S = 150.0


def _fleetrun() -> list[str]:
    return [sys.executable, "-m", "psfleet.launch.main"]


@contextmanager
def _gated_job(tmp_path: Path, data: Path, *flags: str, workers: int = 1
               ) -> Iterator[tuple[subprocess.Popen[str], Path, Path, Path]]:
    """Start a 1 x ``workers`` gated job; yield (launcher, log_dir, go_file, out_dir).
    The job is killed if the test leaves it running."""
    log_dir, out, go = tmp_path / "log", tmp_path / "out", tmp_path / "go"
    out.mkdir()
    argv = [*_fleetrun(), "--server_num", "1", "--worker_num", str(workers),
            f"--log_dir={log_dir}", "--stop_grace_s=3", *flags, str(GATED_JOB),
            "--go_file", str(go), "--data", str(data), "--out_dir", str(out), "--epochs", "2"]
    proc = subprocess.Popen(argv, env=clean_env(), cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        yield proc, log_dir, go, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_processes(processes_mentioning(str(tmp_path)))


def _server_endpoint(log_dir: Path, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        endpoint = read_endpoint_file(log_dir / ".endpoints" / "server.0")
        if endpoint is not None:
            return endpoint
        if proc.poll() is not None:
            pytest.fail(f"fleetrun exited {proc.returncode}: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    pytest.fail("the server did not report its endpoint within 60 s")


def _finish(proc: subprocess.Popen[str], go: Path, out: Path, workers: int) -> str:
    go.touch()
    try:
        _, err = proc.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job did not finish within {JOB_TIMEOUT_S:.0f} s")
    assert proc.returncode == 0, err[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["loss_after"] < result["loss_before"], result
    assert [len(server) for server in result["tables"]] == [2]  # Stats over the job's channel
    steps = [json.loads((out / f"worker.{k}.json").read_text())["steps"] for k in range(workers)]
    assert all(s > 0 for s in steps)
    return err


def _client(endpoint: str, **fields: object) -> RpcClient:
    return RpcClient(endpoint, RpcConfig(deadline_s=10.0, max_retries=0, **fields))  # type: ignore[arg-type]


def test_a_local_job_without_a_token_gets_one_and_refuses_hand_clients(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    data = data_slice(DATA_LINES)
    with _gated_job(tmp_path, data) as (proc, log_dir, go, out):
        endpoint = _server_endpoint(log_dir, proc)
        token_file = log_dir / ".auth_token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert len(token) >= 43  # secrets.token_urlsafe(32)
        outsider = _client(endpoint)
        try:
            with pytest.raises(ConfigError, match="missing or wrong auth token"):
                outsider.call("Stop", msg.StopRequest(worker_index=0))
            with pytest.raises(ConfigError, match="missing or wrong auth token"):
                outsider.call("Save", msg.SaveRequest(dirname=str(out / "stolen")))
            assert outsider.is_serving()  # health checks need no token
        finally:
            outsider.close()
        insider = _client(endpoint, auth_token=token)
        try:
            assert list(insider.call("Stats", msg.StatsRequest()).tables) == []
        finally:
            insider.close()
        for child in processes_mentioning(str(GATED_JOB)):  # never on a command line
            assert all(token not in part for part in child.cmdline())
        err = _finish(proc, go, out, workers=1)
    assert not (out / "stolen").exists()
    assert not token_file.exists()  # removed with the job
    logs = [err] + [p.read_text(errors="replace") for p in log_dir.iterdir() if p.is_file()]
    assert all(token not in text for text in logs)
    assert "generated this job's auth token" in err


def test_a_tls_job_trains_end_to_end_and_refuses_plaintext_clients(
        tmp_path: Path, data_slice: Callable[..., Path]) -> None:
    data = data_slice(DATA_LINES)
    with _gated_job(tmp_path, data, "--tls", "self-signed", workers=2) as (
            proc, log_dir, go, out):
        endpoint = _server_endpoint(log_dir, proc)
        cert, key = log_dir / "tls" / "cert.pem", log_dir / "tls" / "key.pem"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        token = (log_dir / ".auth_token").read_text().strip()
        plain = _client(endpoint, auth_token=token)
        try:
            with pytest.raises(ConfigError, match=rf"server {endpoint} wants TLS and this "
                                                  r"client speaks plaintext: set PSFLEET_TLS_CA"):
                plain.call("Stop", msg.StopRequest(worker_index=0))
        finally:
            plain.close()
        secured = _client(endpoint, auth_token=token, tls=TlsConfig(ca=str(cert)))
        try:
            assert secured.is_serving()
            assert list(secured.call("Stats", msg.StatsRequest()).tables) == []
        finally:
            secured.close()
        err = _finish(proc, go, out, workers=2)
    assert "TLS: self-signed certificate" in err
    assert "(TLS; auth token required" in (log_dir / "serverlog.0").read_text()


def test_a_job_spanning_nodes_without_a_token_starts_nothing(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    result = run_command(
        [*_fleetrun(), "--servers=127.0.0.1:6170", "--workers=127.0.0.2",
         "--node_ip=127.0.0.1", f"--log_dir={log_dir}", str(GATED_JOB)], timeout=60.0,
        cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "PSFLEET_AUTH_TOKEN is not set, and this job has processes on other nodes" in (
        result.stderr)
    assert "export PSFLEET_AUTH_TOKEN=" in result.stderr and "Nothing was started" in (
        result.stderr)
    assert not list(log_dir.glob("*log.*"))
