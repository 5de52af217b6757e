"""The row lifecycle (accessor ``ctr``, issue 17) through the table service, on real
servers on 127.0.0.1 (``psfleet.ps.start_server``).

- Stats and /metrics count admitted, rejected, evicted and deleted rows per table: a
  count_filter table (admit_count 2) rejects every first sighting and admits at the
  second; a capped table evicts so that rows + evicted == admitted and rows <= cap;
  dense tables report zeros; the Prometheus counters equal Stats.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig, TableService, start_server
from psfleet.ps.metrics_exporter import MetricsExporter
from psfleet.rpc import RpcConfig
from psfleet.rpc.server import RunningServer

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=4)
DIM = 4
SGD = RuleConfig(name="sgd", learning_rate=0.1)


@dataclass
class Served:
    """In-process servers and a client of all of them."""

    services: list[TableService]
    servers: list[RunningServer]
    client: RemoteClient


def _serve(count: int) -> Iterator[Served]:
    started = [start_server(HOST, 0, CONFIG) for _ in range(count)]
    client = RemoteClient([f"{HOST}:{s.port}" for _, s in started], CONFIG)
    try:
        yield Served([svc for svc, _ in started], [s for _, s in started], client)
    finally:
        client.close()
        for _, server in started:
            server.stop(0.5)


@pytest.fixture
def one_server() -> Iterator[Served]:
    yield from _serve(1)


def _scrape(endpoint: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, s.labels.get("table_id", "")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _keys(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(1, 2**40, size=count * 2).astype(np.uint64))
    return rng.permutation(keys)[:count]


def test_stats_and_metrics_count_the_lifecycle(one_server: Served) -> None:
    client = one_server.client
    client.create_sparse_table(0, SparseTableConfig(
        name="filtered", dim=DIM, rule=SGD, num_shards=2,
        accessor={"name": "ctr", "admission": "count_filter", "admit_count": 2}))
    cap = 100
    client.create_sparse_table(1, SparseTableConfig(
        name="capped", dim=DIM, rule=SGD, num_shards=2,
        accessor={"name": "ctr", "max_rows": cap, "eviction": "lru"}))
    client.create_dense_table(2, "mlp", [(2, 5)], SGD, np.zeros(10, np.float32))
    keys = _keys(60, seed=1)
    client.pull_sparse(0, keys)  # first sightings: rejected, rows of zeros
    stats = {t.table_id: t for t in client.stats()[0].tables}
    assert (stats[0].admitted, stats[0].rejected, stats[0].rows) == (0, keys.size, 0)
    client.pull_sparse(0, keys)  # second sightings: admitted
    stream = _keys(500, seed=2)
    for part in np.array_split(stream, 10):  # 500 new ids through a cap of 100
        client.pull_sparse(1, part)

    stats = {t.table_id: t for t in client.stats()[0].tables}
    assert (stats[0].admitted, stats[0].rejected, stats[0].rows) == (
        keys.size, keys.size, keys.size)
    assert (stats[0].evicted, stats[0].deleted) == (0, 0)
    capped = stats[1]
    assert capped.admitted == stream.size and capped.rejected == 0
    assert capped.rows <= cap and capped.evicted > 0
    assert capped.rows + capped.evicted == capped.admitted
    assert (stats[2].admitted, stats[2].rejected, stats[2].evicted, stats[2].deleted) == (
        0, 0, 0, 0)
    table = one_server.services[0].tables[1]
    counts = table.lifecycle_counts()  # type: ignore[union-attr]
    assert (counts.admitted, counts.evicted) == (capped.admitted, capped.evicted)

    exporter = MetricsExporter.start(one_server.services[0], HOST, 0, server_index=0)
    try:
        got = _scrape(exporter.endpoint)
    finally:
        exporter.close()
    for tid, t in stats.items():
        for field in ("admitted", "rejected", "evicted", "deleted"):
            assert got[(f"psfleet_table_{field}_rows_total", str(tid))] == getattr(t, field)
