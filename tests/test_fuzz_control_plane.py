"""Fuzz the replication control plane of live servers (issue 44, findings 1 and 4).

Two server processes (``tests/_fuzz_server.py``: ``run_server`` on 127.0.0.1, port 0,
under a 3 GiB ``RLIMIT_AS``, with an auth token) take mutated control-plane requests
(``tests/_fuzz_control.py``) with the job's token, over a raw channel with a 10 s
deadline:

- an **unreplicated** server (launched with replication 1, as fleetrun's are) gets every
  control-plane method: each request is refused (FAILED_PRECONDITION, or
  INVALID_ARGUMENT for a Drain or a body it cannot read), and its tables read back
  identical after. Before, a random ``SetReplicas`` gave it a layout, and a map then
  left it refusing its own table ("share 1 is served by no live copy");
- a **replicated** server (not told its replication; given a valid 2-host layout
  whose second host is down) gets SetReplicas, MergeMap, Failover, Rejoin, CopyShare
  and ReceiveShare: every status is one of OK, INVALID_ARGUMENT, FAILED_PRECONDITION,
  ABORTED (a share served elsewhere) or RESOURCE_EXHAUSTED, never INTERNAL, UNKNOWN,
  DEADLINE_EXCEEDED or UNAVAILABLE. Before, 600 such requests gave 275 INTERNAL
  tracebacks (a negative incarnation in ``map_to_message``, unequal ``dead_hosts`` /
  ``dead_incarnations`` in ``map_from_message``, a KeyError for an unknown share in
  ``CopyShare``), and 30,000 shares in one SetReplicas wedged the server.

For both, the server's log has no traceback (nor a ``--- Logging error ---``) after the
fuzz, and the process is up after every batch.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from _fuzz_control import CONTROL_METHODS, REPLICATED_METHODS, control_requests
from _fuzz_requests import FuzzRequest
from _fuzz_server import TOKEN, FuzzServer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig
from psfleet.ps.types import PushMode
from psfleet.rpc import RpcConfig
from psfleet.rpc import psfleet_pb2 as pb

pytestmark = [pytest.mark.job, pytest.mark.slow]

BATCH = 4
EXAMPLES = {"unreplicated": 30, "replicated": 20}  # x BATCH requests per method
CLIENT_CONFIG = RpcConfig(deadline_s=20.0, max_retries=1, backoff_initial_s=0.05,
                          auth_token=TOKEN)
KEYS = np.arange(1, 2000, 37, dtype=np.uint64)
DEAD_PEER = "127.0.0.1:9"  # the replicated layout's second host: nothing listens there
ALLOWED = {
    "unreplicated": {"FAILED_PRECONDITION", "INVALID_ARGUMENT"},
    "replicated": {"OK", "INVALID_ARGUMENT", "FAILED_PRECONDITION", "ABORTED",
                   "RESOURCE_EXHAUSTED"},
}
SETTINGS = settings(derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck), print_blob=False)
_TRACEBACKS = ("Traceback (most recent call last)", "--- Logging error ---")


@dataclass
class Served:
    server: FuzzServer
    kind: str
    client: RemoteClient | None = None
    expected: np.ndarray | None = None

    def assert_serves_its_table(self) -> None:
        assert self.client is not None and self.expected is not None
        rows = self.client.pull_sparse(0, KEYS, create=False)
        assert rows.tobytes() == self.expected.tobytes(), "its table changed"

    def assert_no_traceback(self) -> None:
        log = self.server.log_path.read_text(errors="replace")
        for mark in _TRACEBACKS:
            at = log.find(mark)
            assert at < 0, f"the {self.kind} server logged a traceback:\n{log[at:at + 3000]}"


def _start(tmp_path_factory: pytest.TempPathFactory, kind: str) -> Iterator[Served]:
    root = tmp_path_factory.mktemp(kind)
    server = FuzzServer.start(root, replication=1 if kind == "unreplicated" else None)
    served = Served(server, kind)
    try:
        if kind == "unreplicated":
            client = served.client = RemoteClient([server.endpoint], CLIENT_CONFIG)
            client.create_sparse_table(0, SparseTableConfig(
                name="own", dim=4, rule=RuleConfig(name="sgd"), initializer="zeros"))
            values = np.random.default_rng(3).normal(size=(KEYS.size, 4)).astype(np.float32)
            client.push_sparse(0, KEYS, values, mode=PushMode.DELTA)
            served.expected = values
            served.assert_serves_its_table()
        else:
            layout = pb.ReplicasRequest(endpoints=[server.endpoint, DEAD_PEER], host_index=0,
                                        replication=2, shares=2)
            outcome = server.send("SetReplicas", layout.SerializeToString(), TOKEN)
            assert outcome.code == "OK", outcome
        yield served
    finally:
        if served.client is not None:
            served.client.close()
        code = server.stop()
    assert code == 0, f"the {kind} server exited {code} on Stop\n{server.log_tail()}"


@pytest.fixture(scope="module")
def unreplicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _start(tmp_path_factory, "unreplicated")


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _start(tmp_path_factory, "replicated")


def _fuzz(served: Served, method: str) -> Counter[str]:
    codes: Counter[str] = Counter()
    violations: list[str] = []
    allowed = ALLOWED[served.kind]

    @settings(SETTINGS, max_examples=EXAMPLES[served.kind])
    @given(batch=st.lists(control_requests(method, avoid_host0=served.kind == "replicated"),
                          min_size=BATCH, max_size=BATCH))
    def run(batch: list[FuzzRequest]) -> None:
        for req in batch:
            outcome = served.server.send(req.method, req.payload, req.token)
            codes[outcome.code] += 1
            if outcome.code not in allowed:
                violations.append(f"{method} [{req.label}]: {outcome.code} "
                                  f"{outcome.details[:300]!r}")
        served.server.assert_alive(after=f"a batch ending {method} [{batch[-1].label}]")

    started = time.monotonic()
    run()
    print(f"{served.kind} {method}: {dict(codes)} in {time.monotonic() - started:.1f} s")
    assert not violations, (f"{len(violations)} of {sum(codes.values())} requests got a "
                            f"status outside {sorted(allowed)}:\n  " + "\n  ".join(violations[:20]))
    assert sum(codes.values()) == EXAMPLES[served.kind] * BATCH
    return codes


@pytest.mark.parametrize("method", CONTROL_METHODS)
def test_unreplicated_server_refuses_the_control_plane_and_keeps_its_table(
        unreplicated: Served, method: str) -> None:
    codes = _fuzz(unreplicated, method)
    assert codes["FAILED_PRECONDITION"] > 0 or method == "Drain", codes
    unreplicated.assert_serves_its_table()
    unreplicated.assert_no_traceback()


@pytest.mark.parametrize("method", REPLICATED_METHODS)
def test_replicated_server_answers_every_control_request_with_a_clear_status(
        replicated: Served, method: str) -> None:
    _fuzz(replicated, method)
    outcome = replicated.server.send("Stats", pb.StatsRequest().SerializeToString(), TOKEN)
    assert outcome.code == "OK", outcome  # still serving
    replicated.assert_no_traceback()
