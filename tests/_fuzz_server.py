"""A live psfleet server in a subprocess for the fuzz test (tests/test_fuzz_server.py).

:class:`FuzzServer` starts ``psfleet.ps.server.run_server`` as a real process on
127.0.0.1 (port 0; the bound port read from its endpoint file), under an address-space
limit (``RLIMIT_AS``, set in the child before it execs), with an auth token, one worker
(``job_worker_num=1``: a Barrier or SYNC push of worker 0 of 1 completes at once, any
other worker count is refused), the job's replication (1 unless told otherwise, as
fleetrun's servers are) and a short barrier timeout. It sends raw request bytes
to any method over a channel without serializers (so undecodable bodies can be sent),
with a per-call deadline, and counts the statuses per method.
"""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from conftest import clean_env

from psfleet.rpc.endpoint_file import read_endpoint_file
from psfleet.rpc.server import AUTH_METADATA_KEY

__all__ = ["FuzzServer", "Outcome", "METHODS", "TOKEN", "WRONG_TOKEN", "MEMORY_LIMIT_BYTES",
           "CALL_TIMEOUT_S"]

METHODS = ("CreateTable", "PullSparse", "PushSparse", "PullDense", "PushDense", "Barrier",
           "Clock", "Save", "Load", "Stats", "Stop")
TOKEN = "fuzz-token-5f3a"
WRONG_TOKEN = "fuzz-token-5f3b"
MEMORY_LIMIT_BYTES = 3 << 30  # RLIMIT_AS of the server process
CALL_TIMEOUT_S = 10.0  # per-call deadline: a call still running then counts as a hang
START_TIMEOUT_S = 60.0

_SERVER_CODE = """
import sys
from pathlib import Path
from psfleet.logs import set_role, setup_logging
from psfleet.ps.server import run_server
from psfleet.rpc import RpcConfig
setup_logging("INFO")
set_role("server:0")
run_server("127.0.0.1", 0, RpcConfig.from_env(), Path(sys.argv[1]), job_worker_num=1,
           server_index=0, replication=int(sys.argv[2]) if sys.argv[2] else None)
"""


def _limit_memory() -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


@dataclass(frozen=True)
class Outcome:
    """One call's status: ``code`` is a grpc.StatusCode name (``OK`` on success)."""

    code: str
    details: str


@dataclass
class FuzzServer:
    """A server process and a raw channel to it. Start with :meth:`start`."""

    proc: subprocess.Popen[bytes]
    endpoint: str
    log_path: Path
    channel: grpc.Channel
    counts: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    @classmethod
    def start(cls, workdir: Path, replication: int | None = 1) -> FuzzServer:
        """Start the server with its working directory ``workdir/cwd``, its log in
        ``workdir/server.log`` and its storage roots ``workdir`` and ``memory://fuzz``
        (Save and Load elsewhere are refused); return once it listens. ``replication``:
        the job's, as a launched server is told it (1: unreplicated; None: not told,
        the first SetReplicas gives the layout).

        Raises:
            AssertionError: it exited or did not listen within START_TIMEOUT_S.
        """
        (workdir / "cwd").mkdir(parents=True, exist_ok=True)
        endpoint_file = workdir / "endpoint"
        log_path = workdir / "server.log"
        env = clean_env({"PSFLEET_AUTH_TOKEN": TOKEN, "PSFLEET_METRICS_PORT": "off",
                         "PSFLEET_RPC_DEADLINE_S": "2",
                         "PSFLEET_STORAGE_ROOTS": f"{workdir},memory://fuzz"})
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER_CODE, str(endpoint_file),
                 "" if replication is None else str(replication)], env=env,
                cwd=workdir / "cwd", stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_limit_memory)
        deadline = time.monotonic() + START_TIMEOUT_S
        endpoint = None
        while endpoint is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise AssertionError(f"fuzz server did not start (exit {proc.returncode}):\n"
                                     + log_path.read_text()[-3000:])
            time.sleep(0.05)
            endpoint = read_endpoint_file(endpoint_file)
        channel = grpc.insecure_channel(endpoint, options=[
            ("grpc.max_send_message_length", 1 << 30),
            ("grpc.max_receive_message_length", 1 << 30)])
        return cls(proc, endpoint, log_path, channel)

    def send(self, method: str, payload: bytes, token: str | None = TOKEN) -> Outcome:
        """Send ``payload`` (the request's wire bytes, decodable or not) to ``method``
        with ``token`` (None: no token) and a CALL_TIMEOUT_S deadline; count its status."""
        call = self.channel.unary_unary(f"/psfleet.ParameterServer/{method}",
                                        request_serializer=None, response_deserializer=None)
        metadata = () if token is None else ((AUTH_METADATA_KEY, token),)
        try:
            call(payload, timeout=CALL_TIMEOUT_S, metadata=metadata)
            outcome = Outcome("OK", "")
        except grpc.RpcError as exc:
            outcome = Outcome(exc.code().name, exc.details() or "")
        self.counts[method][outcome.code] += 1
        return outcome

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log."""
        return self.log_path.read_text(errors="replace")[-chars:]

    def assert_alive(self, after: str) -> None:
        """Fail naming ``after`` (the last batch) and the log tail if the process ended."""
        code = self.proc.poll()
        assert code is None, (f"the server process exited ({code}) after {after}\n"
                              f"--- server log\n{self.log_tail()}")

    def report(self) -> str:
        """Requests per method and status, one line per method, and the total."""
        lines = [f"{m:<12} {sum(c.values()):>6}  " + ", ".join(
            f"{code} {n}" for code, n in sorted(c.items())) for m, c in self.counts.items()]
        total = sum(sum(c.values()) for c in self.counts.values())
        return "\n".join([*lines, f"{'total':<12} {total:>6}"])

    def stop(self) -> int:
        """Stop the server with a Stop carrying the token; kill it if it is still running
        10 s later. Returns its exit code."""
        with contextlib.suppress(grpc.RpcError):
            self.channel.unary_unary("/psfleet.ParameterServer/Stop")(
                b"", timeout=CALL_TIMEOUT_S, metadata=((AUTH_METADATA_KEY, TOKEN),))
        self.channel.close()
        try:
            return self.proc.wait(10.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9
