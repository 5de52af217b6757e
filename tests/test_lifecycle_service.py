"""The row lifecycle (accessor ``ctr``, issue 17) through the table service, on real
servers on 127.0.0.1 (``psfleet.ps.start_server``).

- Stats and /metrics count admitted, rejected, evicted and deleted rows per table: a
  count_filter table (admit_count 2) rejects every first sighting and admits at the
  second; a capped table evicts so that rows + evicted == admitted and rows <= cap;
  dense tables report zeros; the Prometheus counters equal Stats.
- Shows and clicks travel with PushSparse: on two servers a ctr table's show and
  click per key equal the sums sent (APPLY, repeated keys across pushes; DELTA adds
  them without a gradient); a SYNC round of two workers sums both workers' counts
  and averages their gradients; the in-process LocalClient does the same. Counts of
  the wrong length, NaN or negative are INVALID_ARGUMENT naming the field.
- Shrink and AgeOneDay (TableClient.shrink / age_one_day, every server): rows pushed
  on day 0 only, aged twice, are deleted by a shrink with delete_after_unseen_days 1,
  exactly those (a reference set), and Stats counts them as deleted; a table without
  the ctr accessor is untouched; an unknown table is refused; with an auth token
  both rpcs are refused without it (UNAUTHENTICATED, as Save).
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from psfleet.errors import ConfigError, InvalidRequestError, RemoteError
from psfleet.ps import (
    LocalClient,
    RemoteClient,
    RuleConfig,
    SparseTable,
    SparseTableConfig,
    TableService,
    start_server,
)
from psfleet.ps.client import TableClient
from psfleet.ps.metrics_exporter import MetricsExporter
from psfleet.ps.types import PushMode
from psfleet.rpc import RpcClient, RpcConfig, codec
from psfleet.rpc import messages as msg
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


def _serve(count: int, config: RpcConfig = CONFIG) -> Iterator[Served]:
    started = [start_server(HOST, 0, config) for _ in range(count)]
    client = RemoteClient([f"{HOST}:{s.port}" for _, s in started], config)
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


CTR = SparseTableConfig(name="ctr", dim=DIM, rule=SGD, num_shards=2, num_buckets=64,
                        accessor={"name": "ctr"})


@pytest.fixture
def two_servers() -> Iterator[Served]:
    yield from _serve(2)


def _show_click(services: list[TableService], table_id: int = 0
                ) -> dict[int, tuple[float, float]]:
    """key -> (show, click) over every server's rows of ``table_id``."""
    out: dict[int, tuple[float, float]] = {}
    for service in services:
        table = service.tables[table_id]
        assert isinstance(table, SparseTable)
        keys, stats = table.stats_items()
        out.update({int(k): (float(s[0]), float(s[1])) for k, s in zip(keys, stats, strict=True)})
    return out


def _expected(pushes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
              ) -> dict[int, tuple[float, float]]:
    """The reference: per key, the sums of the shows and clicks sent."""
    out: dict[int, tuple[float, float]] = {}
    for keys, shows, clicks in pushes:
        for k, s, c in zip(keys.tolist(), shows.tolist(), clicks.tolist(),
                           strict=True):
            old = out.get(k, (0.0, 0.0))
            out[k] = (old[0] + s, old[1] + c)
    return out


def _assert_same(got: dict[int, tuple[float, float]],
                 expected: dict[int, tuple[float, float]]) -> None:
    assert sorted(got) == sorted(expected)
    np.testing.assert_allclose([got[k] for k in sorted(got)],
                               [expected[k] for k in sorted(got)], rtol=1e-6)


def _counts(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    shows = rng.integers(1, 5, size=n).astype(np.float32)
    clicks = np.minimum(rng.integers(0, 2, size=n), shows).astype(np.float32)
    return shows, clicks


def _push_and_check(client: TableClient, services: list[TableService]) -> None:
    client.create_sparse_table(0, CTR)
    rng = np.random.default_rng(3)
    keys = _keys(300, seed=4)
    sent = []
    for part in (keys[:200], keys[100:]):  # keys[100:200] pushed twice
        client.pull_sparse(0, part)
        shows, clicks = _counts(rng, part.size)
        client.push_sparse(0, part, np.zeros((part.size, DIM), np.float32),
                           shows=shows, clicks=clicks)
        sent.append((part, shows, clicks))
    # DELTA (geo): the counts are added to existing rows, with no gradient.
    shows, clicks = _counts(rng, 50)
    client.push_sparse(0, keys[:50], np.zeros((50, DIM), np.float32), PushMode.DELTA,
                       shows=shows, clicks=clicks)
    sent.append((keys[:50], shows, clicks))
    # A push without counts changes no statistics.
    client.push_sparse(0, keys[:10], np.zeros((10, DIM), np.float32))
    _assert_same(_show_click(services), _expected(sent))


def test_pushed_shows_and_clicks_are_summed_on_two_servers(two_servers: Served) -> None:
    _push_and_check(two_servers.client, two_servers.services)
    rows = [len(s.tables[0]) for s in two_servers.services]
    assert min(rows) > 0 and sum(rows) == 300  # both servers hold some keys


def test_in_process_tables_take_shows_and_clicks() -> None:
    client = LocalClient()
    _push_and_check(client, [client.service])


def test_a_sync_round_sums_the_workers_counts(two_servers: Served) -> None:
    endpoints = [f"{HOST}:{s.port}" for s in two_servers.servers]
    clients = [RemoteClient(endpoints, CONFIG, worker_index=w) for w in range(2)]
    try:
        for c in clients:
            c.create_sparse_table(0, CTR)
        keys = _keys(80, seed=5)
        before = clients[0].pull_sparse(0, keys)
        rng = np.random.default_rng(6)
        parts = [keys[:60], keys[20:]]  # keys[20:60] from both workers
        grads = [rng.normal(size=(p.size, DIM)).astype(np.float32) for p in parts]
        counts = [_counts(rng, p.size) for p in parts]
        errors: list[BaseException] = []

        def push(w: int) -> None:
            try:
                clients[w].push_sparse(0, parts[w], grads[w], PushMode.SYNC, step=1,
                                       worker_num=2, shows=counts[w][0], clicks=counts[w][1])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=push, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        _assert_same(_show_click(two_servers.services),
                     _expected([(parts[w], *counts[w]) for w in range(2)]))
        # The gradients are averaged over the round's 2 pushes (SGD, lr 0.1).
        summed = np.zeros_like(before)
        position = {int(k): i for i, k in enumerate(keys)}
        for part, g in zip(parts, grads, strict=True):
            summed[[position[int(k)] for k in part]] += g
        after = clients[0].pull_sparse(0, keys)
        np.testing.assert_allclose(after, before - 0.1 * summed / 2, rtol=1e-5, atol=1e-6)
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize(("field", "bad"), [("shows", -1.0), ("clicks", np.nan)])
def test_bad_counts_are_invalid_argument_naming_the_field(
        one_server: Served, field: str, bad: float) -> None:
    client = one_server.client
    client.create_sparse_table(0, CTR)
    keys = _keys(4, seed=7)
    counts = {"shows": np.ones(4, np.float32), "clicks": np.zeros(4, np.float32)}
    counts[field][2] = bad
    with pytest.raises(ConfigError, match=field):
        client.push_sparse(0, keys, np.zeros((4, DIM), np.float32), **counts)
    service = one_server.services[0]
    request = msg.PushSparseRequest(
        table_id=0, keys=codec.keys_to_bytes(keys),
        grads=codec.floats_to_bytes(np.zeros((4, DIM), np.float32)),
        shows=codec.floats_to_bytes(np.ones(3, np.float32)),
        clicks=codec.floats_to_bytes(np.zeros(4, np.float32)))
    with pytest.raises(InvalidRequestError, match="shows has 3 values for 4 keys"):
        service.PushSparse(request)
    request.shows, request.clicks = codec.floats_to_bytes(np.ones(4, np.float32)), b"abc"
    with pytest.raises(InvalidRequestError, match="clicks buffer of 3 bytes"):
        service.PushSparse(request)
    assert _show_click([service]) == {}  # nothing applied


def test_shrink_deletes_exactly_the_rows_unseen_too_long(two_servers: Served) -> None:
    client = two_servers.client
    client.create_sparse_table(0, SparseTableConfig(
        name="ctr", dim=DIM, rule=SGD, num_shards=2, num_buckets=64, accessor={
            "name": "ctr", "delete_after_unseen_days": 1, "delete_threshold": 0.0,
            "show_click_decay_rate": 1.0}))
    client.create_sparse_table(1, SparseTableConfig(name="plain", dim=DIM, rule=SGD))
    rng = np.random.default_rng(8)
    keys = _keys(300, seed=9)
    zeros = np.zeros((keys.size, DIM), np.float32)
    client.pull_sparse(0, keys)
    client.pull_sparse(1, keys)
    client.push_sparse(0, keys, zeros, shows=np.ones(keys.size, np.float32),
                       clicks=np.zeros(keys.size, np.float32))
    client.age_one_day()  # every row: unseen 1 day
    seen = keys[:100]
    shows, clicks = _counts(rng, seen.size)
    client.push_sparse(0, seen, zeros[:100], shows=shows, clicks=clicks)  # unseen 0
    client.age_one_day(0)  # seen: 1 day, the others: 2 days
    assert client.shrink(1) == 0  # no ctr accessor: nothing to shrink

    deleted = client.shrink()
    assert deleted == keys.size - seen.size
    survivors = np.sort(np.concatenate([s.tables[0].items()[0] for s in two_servers.services]))
    np.testing.assert_array_equal(survivors, np.sort(seen))
    assert sum(len(s.tables[1]) for s in two_servers.services) == keys.size
    stats = [{t.table_id: t for t in r.tables} for r in client.stats()]
    assert sum(s[0].deleted for s in stats) == deleted
    assert sum(s[0].rows for s in stats) == seen.size
    assert sum(s[1].deleted for s in stats) == 0
    assert client.shrink() == 0  # the survivors are 1 day unseen: kept
    with pytest.raises(RemoteError, match="no sparse table 7"):
        client.shrink(7)
    with pytest.raises(RemoteError, match="no sparse table 7"):
        client.age_one_day(7)


def test_lifecycle_rpcs_need_the_auth_token() -> None:
    config = RpcConfig(deadline_s=20.0, max_retries=0, server_threads=4,
                       auth_token="lifecycle-secret")
    for served in _serve(1, config):
        served.client.create_sparse_table(0, CTR)
        assert served.client.shrink() == 0  # with the token: served
        stranger = RpcClient(f"{HOST}:{served.servers[0].port}",
                             RpcConfig(deadline_s=20.0, max_retries=0))
        try:
            for method, request in (("Shrink", msg.ShrinkRequest(all_tables=True)),
                                    ("AgeOneDay", msg.AgeOneDayRequest(all_tables=True))):
                with pytest.raises(ConfigError, match="auth token"):
                    stranger.call(method, request)
        finally:
            stranger.close()
