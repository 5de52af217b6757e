"""A server launched as fleetrun launches one learns the job's settings from its
environment, not from the first request (issue 44, findings 4 and 5).

One real server process (``fleet.init(); fleet.init_server(); fleet.run_server()`` with
fleetrun's server variables: ``PADDLE_TRAINERS_NUM=2``, no replication, port 0 and an
endpoint file) takes requests over real gRPC on 127.0.0.1:

- a Barrier naming ``worker_num`` 255 is refused (INVALID_ARGUMENT naming the job's 2),
  and one of worker 0 of 2 is served: before, the first Barrier fixed the count, so a
  random one (255) locked the job's own workers out;
- ``SetReplicas`` and ``MergeMap`` are refused (FAILED_PRECONDITION): the server was
  launched without replication, so no request can take its own tables from it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from conftest import clean_env

from psfleet.rpc import messages as msg
from psfleet.rpc.endpoint_file import read_endpoint_file
from psfleet.rpc.server import AUTH_METADATA_KEY

pytestmark = [pytest.mark.job, pytest.mark.slow]

TOKEN = "launch-settings-token"
_SERVER = "from psfleet import fleet; fleet.init(); fleet.init_server(); fleet.run_server()"


def _send(endpoint: str, method: str, request: object) -> tuple[str, str]:
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(f"/psfleet.ParameterServer/{method}")
        try:
            call(request.SerializeToString(), timeout=10.0,  # type: ignore[attr-defined]
                 metadata=[(AUTH_METADATA_KEY, TOKEN)])
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or ""
    return "OK", ""


def test_launched_server_knows_worker_num_and_that_it_is_not_replicated(tmp_path: Path) -> None:
    endpoint_file = tmp_path / "server.0"
    env = clean_env({"TRAINING_ROLE": "PSERVER", "POD_IP": "127.0.0.1", "PADDLE_PORT": "0",
                     "PSFLEET_SERVER_INDEX": "0", "PSFLEET_ENDPOINT_FILE": str(endpoint_file),
                     "PADDLE_TRAINERS_NUM": "2", "PSFLEET_AUTH_TOKEN": TOKEN,
                     "PSFLEET_METRICS_PORT": "off"})
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], env=env, cwd=tmp_path,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        endpoint = None
        while endpoint is None:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not listen within 60 s"
            time.sleep(0.05)
            endpoint = read_endpoint_file(endpoint_file)

        code, details = _send(endpoint, "Barrier", msg.BarrierRequest(
            name="b", worker_index=0, worker_num=255, seq=1))
        assert code == "INVALID_ARGUMENT", (code, details)
        assert "worker_num 255 differs from this job's worker_num 2" in details
        # Worker 0 of 2 arrives (the other never comes: a long poll that is not done yet).
        assert _send(endpoint, "Barrier", msg.BarrierRequest(
            name="b", worker_index=0, worker_num=2, seq=1)) == ("OK", "")

        for method, request in (
                ("SetReplicas", msg.ReplicasRequest(endpoints=["127.0.0.1:9", endpoint],
                                                    host_index=1, replication=1)),
                ("MergeMap", msg.ShareMapMessage(dead_hosts=[0], dead_incarnations=[0]))):
            code, details = _send(endpoint, method, request)
            assert code == "FAILED_PRECONDITION", (method, code, details)
            assert "started without replication" in details
        assert _send(endpoint, "Stop", msg.StopRequest()) == ("OK", "")
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
