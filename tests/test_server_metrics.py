"""A server's Prometheus /metrics and ``psfleet status`` against a live server.

- ``run_server`` (the serving loop, in a thread here) serves /metrics on a free port
  and writes it into its endpoint file after the gRPC endpoint (whose first line is
  read as before); the rows gauge equals Stats' rows; the counters count exactly the
  pulls and pushes made (requests and rows), and grow with more; the endpoint goes
  away with the server (the leak check holds). ``PSFLEET_METRICS_PORT=off`` serves
  none; a malformed value or a taken port is a ConfigError naming the variable.
- The in-process tables (LocalClient) count the same requests.
- ``psfleet status`` (``main(argv)`` in process) prints each table's rows, the rates
  (averages since start, or over an interval) and the uptime; an endpoint that does not
  answer exits 1 naming it; a folder without endpoint files exits 2.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from psfleet.cli.main import main as cli_main
from psfleet.errors import ConfigError
from psfleet.ps import LocalClient, RemoteClient, RuleConfig, SparseTableConfig, TableService
from psfleet.ps.client import TableClient
from psfleet.ps.metrics_exporter import MetricsExporter, metrics_port_from_env
from psfleet.ps.request_counters import RequestCounts
from psfleet.ps.server import run_server
from psfleet.rpc import RpcClient, RpcConfig
from psfleet.rpc import messages as msg
from psfleet.rpc.endpoint_file import read_endpoint_file, read_metrics_endpoint

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=4)
DIM = 4
SGD = RuleConfig(name="sgd", learning_rate=0.1)


@dataclass
class LiveServer:
    """A ``run_server`` serving loop in a thread, its endpoint file and a client."""

    endpoint_file: Path
    endpoint: str
    client: RemoteClient


def _wait_for(path: Path, thread: threading.Thread, timeout_s: float = 15.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        endpoint = read_endpoint_file(path)
        if endpoint is not None:
            return endpoint
        assert thread.is_alive(), "run_server ended before writing its endpoint file"
        time.sleep(0.02)
    raise AssertionError(f"no endpoint file {path} after {timeout_s} s")


@pytest.fixture
def live_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    """Server 0 of a job whose log folder is ``tmp_path`` (``.endpoints/server.0``)."""
    monkeypatch.delenv("PSFLEET_METRICS_PORT", raising=False)
    endpoint_file = tmp_path / ".endpoints" / "server.0"
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            run_server(HOST, 0, CONFIG, endpoint_file, server_index=0)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=serve, name="test-run-server")
    thread.start()
    client: RemoteClient | None = None
    try:
        endpoint = _wait_for(endpoint_file, thread)
        client = RemoteClient([endpoint], CONFIG)
        yield LiveServer(endpoint_file, endpoint, client)
    finally:
        if client is not None:
            client.stop_servers(0)
            client.close()
        thread.join(15.0)
    assert not thread.is_alive(), "run_server did not stop"
    assert errors == []


def _scrape(endpoint: str) -> dict[tuple[str, str], float]:
    """(sample name, table_id) -> value of ``http://ENDPOINT/metrics``."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as reply:
        assert reply.headers.get_content_type() == "text/plain"
        text = reply.read().decode()
    return {(s.name, s.labels.get("table_id", "")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _fill(client: TableClient, seed: int = 0) -> tuple[np.ndarray, int]:
    """A sparse table 0 and a dense table 1; 3 pulls and 2 pushes of distinct keys to
    table 0, one dense pull. Returns table 0's distinct keys and the dense size."""
    client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD))
    dense_size = 10
    client.create_dense_table(1, "mlp", [(2, 5)], SGD, np.zeros(dense_size, np.float32))
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 2**40, size=200).astype(np.uint64))
    first, second = keys[:120], keys[120:]
    client.pull_sparse(0, first)
    client.push_sparse(0, first, rng.normal(size=(first.size, DIM)).astype(np.float32))
    client.pull_sparse(0, second)
    client.push_sparse(0, second, rng.normal(size=(second.size, DIM)).astype(np.float32))
    client.pull_sparse(0, keys, create=False)
    client.pull_dense(1)
    return keys, dense_size


def test_metrics_match_stats_and_count_requests(live_server: LiveServer) -> None:
    keys, dense_size = _fill(live_server.client)
    metrics = read_metrics_endpoint(live_server.endpoint_file)
    assert metrics is not None and metrics.startswith(f"{HOST}:")
    # The file's first line is the gRPC endpoint, as old readers expect.
    lines = live_server.endpoint_file.read_text().splitlines()
    assert lines == [live_server.endpoint, f"metrics {metrics}"]

    got = _scrape(metrics)
    stats = {t.table_id: t for t in live_server.client.stats()[0].tables}
    assert stats[0].rows == keys.size and stats[1].rows == dense_size
    assert got[("psfleet_table_rows", "0")] == stats[0].rows
    assert got[("psfleet_table_rows", "1")] == stats[1].rows
    assert got[("psfleet_table_memory_bytes", "0")] == stats[0].memory_bytes > 0
    assert got[("psfleet_table_pulls_total", "0")] == 3
    assert got[("psfleet_table_pulled_rows_total", "0")] == 2 * keys.size
    assert got[("psfleet_table_pushes_total", "0")] == 2
    assert got[("psfleet_table_pushed_rows_total", "0")] == keys.size
    assert got[("psfleet_table_pulls_total", "1")] == 1
    assert got[("psfleet_table_pulled_rows_total", "1")] == dense_size
    assert got[("psfleet_table_pushes_total", "1")] == 0
    assert got[("psfleet_table_rejected_pushes_total", "0")] == 0
    assert got[("psfleet_server_index", "")] == 0
    assert 0 < got[("psfleet_server_uptime_seconds", "")] < 60
    # Stats carries the same counts (what TensorBoard and psfleet status read).
    assert (stats[0].pulls, stats[0].pulled_rows, stats[0].pushes, stats[0].pushed_rows) == (
        3, 2 * keys.size, 2, keys.size)
    assert (stats[1].pulls, stats[1].pulled_rows, stats[1].pushes) == (1, dense_size, 0)

    # More pulls: the counters grow by exactly what was done.
    live_server.client.pull_sparse(0, keys[:7])
    live_server.client.pull_sparse(0, keys[:5])
    later = _scrape(metrics)
    assert later[("psfleet_table_pulls_total", "0")] == 5
    assert later[("psfleet_table_pulled_rows_total", "0")] == 2 * keys.size + 12
    assert later[("psfleet_server_uptime_seconds", "")] > got[("psfleet_server_uptime_seconds", "")]

    # A push of NaN is refused and counted as rejected, nothing else changes.
    bad = np.full((2, DIM), np.nan, np.float32)
    with pytest.raises(ConfigError, match="NaN"):
        live_server.client.push_sparse(0, keys[:2], bad)
    after_bad = _scrape(metrics)
    assert after_bad[("psfleet_table_rejected_pushes_total", "0")] == 1
    assert after_bad[("psfleet_table_pushes_total", "0")] == 2


def test_metrics_endpoint_stops_with_the_server(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PSFLEET_METRICS_PORT", raising=False)
    endpoint_file = tmp_path / "server.3"
    thread = threading.Thread(target=run_server, args=(HOST, 0, CONFIG, endpoint_file),
                              kwargs={"server_index": 3})
    thread.start()
    endpoint = _wait_for(endpoint_file, thread)
    metrics = read_metrics_endpoint(endpoint_file)
    assert metrics is not None
    assert _scrape(metrics)[("psfleet_server_index", "")] == 3
    rpc = RpcClient(endpoint, CONFIG)
    rpc.call("Stop", msg.StopRequest(worker_index=0))
    rpc.close()
    thread.join(15.0)
    assert not thread.is_alive()
    host, port = metrics.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()


def test_metrics_off_writes_only_the_grpc_endpoint(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSFLEET_METRICS_PORT", "off")
    endpoint_file = tmp_path / "server.0"
    thread = threading.Thread(target=run_server, args=(HOST, 0, CONFIG, endpoint_file))
    thread.start()
    endpoint = _wait_for(endpoint_file, thread)
    try:
        assert endpoint_file.read_text() == f"{endpoint}\n"
        assert read_metrics_endpoint(endpoint_file) is None
    finally:
        rpc = RpcClient(endpoint, CONFIG)
        rpc.call("Stop", msg.StopRequest(worker_index=0))
        rpc.close()
        thread.join(15.0)
    assert not thread.is_alive()


def test_metrics_port_setting_and_a_taken_port() -> None:
    assert metrics_port_from_env({}) == 0
    assert metrics_port_from_env({"PSFLEET_METRICS_PORT": "OFF"}) is None
    assert metrics_port_from_env({"PSFLEET_METRICS_PORT": " 9100 "}) == 9100
    for bad in ("ninety", "-1", "70000"):
        with pytest.raises(ConfigError, match="PSFLEET_METRICS_PORT"):
            metrics_port_from_env({"PSFLEET_METRICS_PORT": bad})
    service = TableService()
    first = MetricsExporter.start(service, HOST, 0)
    try:
        with pytest.raises(ConfigError, match=rf"{first.port}.*PSFLEET_METRICS_PORT"):
            MetricsExporter.start(service, HOST, first.port)
        assert _scrape(first.endpoint)[("psfleet_server_index", "")] == -1
    finally:
        first.close()
    first.close()  # idempotent


def _status(capsys: pytest.CaptureFixture[str], target: str, *options: str
            ) -> tuple[int, list[list[str]], str]:
    code = cli_main(["status", target, *options])
    out, err = capsys.readouterr()
    return code, [line.split() for line in out.splitlines()], err


def test_status_prints_each_table_of_a_live_server(
        live_server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    keys, dense_size = _fill(live_server.client)
    log_dir = str(live_server.endpoint_file.parent.parent)
    code, rows, err = _status(capsys, log_dir, "--interval_s", "0")
    assert (code, err) == (0, "")
    assert rows[0] == ["server", "endpoint", "table_id", "table", "rows", "memory",
                       "disk_rows", "disk", "pulls/s", "pushes/s", "uptime"]
    by_table = {r[2]: r for r in rows[1:]}
    emb, mlp = by_table["0"], by_table["1"]
    assert emb[:5] == ["0", live_server.endpoint, "0", "emb", str(keys.size)]
    assert mlp[:5] == ["0", live_server.endpoint, "1", "mlp", str(dense_size)]
    # --interval_s 0: averages since the start, over a few seconds at most.
    assert emb[7:9] == mlp[7:9] == ["-", "-"]  # no disk tier
    assert float(emb[9]) > 0 and float(emb[10]) > 0 and float(mlp[9]) > 0
    assert mlp[10] == "0.0" and emb[11].endswith("s")

    # Over an interval with no traffic: 0 requests per second.
    code, rows, err = _status(capsys, log_dir, "--interval_s", "0.3")
    assert (code, err) == (0, "")
    assert [r[9:11] for r in rows[1:]] == [["0.0", "0.0"], ["0.0", "0.0"]]

    # The endpoint itself: the same rows and counts (all from Stats).
    code, rows, err = _status(capsys, live_server.endpoint, "--interval_s", "0")
    assert (code, err) == (0, "")
    assert [r[4] for r in rows[1:]] == [str(keys.size), str(dense_size)]
    assert float(rows[1][9]) > 0 and rows[2][10] == "0.0"


def test_status_names_the_server_that_does_not_answer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = f"{HOST}:1"  # a privileged port: nothing listens there
    code, rows, err = _status(capsys, dead, "--timeout_s", "3")
    assert code == 1 and rows == []
    assert f"server 0 at {dead}" in err and "unavailable" in err

    code, _, err = _status(capsys, str(tmp_path))
    assert code == 2 and "no endpoint files" in err
    code, _, err = _status(capsys, "127.0.0.1:70000")
    assert code == 2 and "not host:port" in err
    # a finished run's folder: its servers are gone, and status says why
    log = tmp_path / "run" / "log" / ".endpoints"
    log.mkdir(parents=True)
    (log / "server.0").write_text(f"{dead}\n")
    (tmp_path / "run" / "metrics.json").write_text('{"interrupted": null}')
    code, _, err = _status(capsys, str(tmp_path / "run"), "--timeout_s", "3")
    assert code == 1 and f"the run {tmp_path / 'run'} has finished" in err


def test_in_process_tables_count_the_same_requests() -> None:
    """A worker's in-process tables (LocalClient, server_num 0) count through the same
    service code as a server's."""
    local = LocalClient()
    keys, dense_size = _fill(local)
    counts = local.service.counters.snapshot()
    assert counts == {0: RequestCounts(pulls=3, pulled_rows=2 * keys.size, pushes=2,
                                       pushed_rows=keys.size),
                      1: RequestCounts(pulls=1, pulled_rows=dense_size)}
