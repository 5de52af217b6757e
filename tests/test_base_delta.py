"""Base and delta saves with tombstones, show/click-score admission and at-most-once
Shrink (issue 17), on real table servers on 127.0.0.1 and in process.

- Reference check: a ctr table on 2 gRPC servers (a small max_rows cap with
  lowest-score eviction, shrink deleting rows) gets random pushes with shows and
  clicks; a base save, then 3 rounds of (pushes, shrink, age, delta save). With
  thresholds 0 the base and deltas carry every live row, so replaying base + 3
  deltas (``psfleet.ps.restore.replay``) equals the live tables exactly: keys, values
  and rule state, statistics. Loading the same chain into 3 servers and into 1
  server (``TableClient.load`` of the base, then each delta) gives the same rows.
- Tombstones: a key deleted by shrink after the base is in the base, in the next
  delta's ``.tomb`` file and absent after the replay; a key deleted and pushed again
  is present with its new values.
- Threshold selection: a base writes exactly the rows with score >= base_threshold
  and unseen_days <= delta_keep_days (oracle from the statistics before the save)
  and zeroes every delta_score; a delta writes exactly those with also delta_score
  >= delta_threshold and zeroes theirs only.
- show_click_score admission against a reference dict model (pending score sums,
  admission when the sum reaches admit_score, gradients of pending ids dropped,
  pulls of pending ids read the initializer without storing).
- A retried Shrink (same request id) decays show once; a new id decays again.
- Bad values are ConfigErrors naming the field: accessor.base_threshold -1,
  accessor.admit_score nan, show_click_score without name ctr, save mode "bogus",
  a delta of a capped table without the ctr accessor (a table without any lifecycle
  writes every row in a delta), a server preloading a delta save.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from psfleet.errors import ConfigError
from psfleet.export.save import read_saved_rows
from psfleet.nn.table_checks import check_accessor
from psfleet.ps import RemoteClient, RuleConfig, SparseTable, SparseTableConfig, start_server
from psfleet.ps.client import TableClient
from psfleet.ps.persist_delta import read_tombstones, saved_mode, snapshot_mode
from psfleet.ps.restore import replay
from psfleet.ps.service import TableService
from psfleet.ps.transport import InProcessTransport
from psfleet.rpc import RpcConfig
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
RPC = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=4)
DIM = 4
EXACT = SparseTableConfig(
    name="bd", dim=DIM, rule=RuleConfig(name="adam", learning_rate=0.01), num_shards=4,
    num_buckets=64, accessor={
        "name": "ctr", "max_rows": 160, "eviction": "lowest_score",
        "evict_batch_fraction": 0.05, "show_click_decay_rate": 0.9,
        "delete_threshold": 0.25, "delete_after_unseen_days": 2,
        "base_threshold": 0, "delta_threshold": 0, "delta_keep_days": 1e9})


def _served(count: int, root: Path) -> Iterator[tuple[RemoteClient, list[TableService]]]:
    config = dataclasses.replace(RPC, storage_roots=(str(root),))
    started = [start_server(HOST, 0, config) for _ in range(count)]
    client = RemoteClient([f"{HOST}:{s.port}" for _, s in started], config)
    try:
        yield client, [svc for svc, _ in started]
    finally:
        client.close()
        for _, server in started:
            server.stop(0.5)


def _gather(tables: list[SparseTable]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, rows with rule state, stats) over ``tables``, sorted by key."""
    keys = np.concatenate([t.items()[0] for t in tables])
    rows = np.concatenate([t.items()[1] for t in tables])
    skeys = np.concatenate([t.stats_items()[0] for t in tables])
    stats = np.concatenate([t.stats_items()[1] for t in tables])
    order, sorder = np.argsort(keys), np.argsort(skeys)
    np.testing.assert_array_equal(keys[order], skeys[sorder])
    return keys[order], rows[order], stats[sorder]


def _tables(services: list[TableService], table_id: int = 0) -> list[SparseTable]:
    out = [s.tables[table_id] for s in services]
    assert all(isinstance(t, SparseTable) for t in out)
    return out  # type: ignore[return-value]


def _assert_same(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> None:
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def _push_round(client: TableClient, rng: np.random.Generator, pool: np.ndarray,
                n: int) -> None:
    keys = np.unique(rng.choice(pool, size=n))
    shows = rng.integers(1, 5, size=keys.size).astype(np.float32)
    clicks = np.minimum(rng.integers(0, 3, size=keys.size), shows).astype(np.float32)
    grads = rng.normal(size=(keys.size, DIM)).astype(np.float32)
    client.push_sparse(0, keys, grads, shows=shows, clicks=clicks)


def test_base_plus_three_deltas_replay_equals_the_live_table(tmp_path: Path) -> None:
    rng = np.random.default_rng(17)
    pool = rng.integers(1, 2**50, size=900).astype(np.uint64)
    saves = [tmp_path / "base", *(tmp_path / f"delta-{i}" for i in range(3))]
    for client, services in _served(2, tmp_path):
        client.create_sparse_table(0, EXACT)
        for _ in range(3):
            _push_round(client, rng, pool, 250)
        client.age_one_day()
        client.shrink()
        client.save(str(saves[0]), mode="base")
        evicted = deleted = 0
        for delta in saves[1:]:
            for _ in range(2):
                _push_round(client, rng, pool, 250)
            deleted += client.shrink()
            client.age_one_day()
            client.save(str(delta), mode="delta")
        stats = [t for r in client.stats() for t in r.tables]
        evicted = sum(int(t.evicted) for t in stats)
        live = _gather(_tables(services))
    assert evicted > 0 and deleted > 0  # both kinds of tombstones happened
    assert [saved_mode(s) for s in saves] == ["base", "delta", "delta", "delta"]
    assert sum(read_tombstones(d, 0, EXACT).size for d in saves[1:]) > 0
    assert live[0].size > 100 and float(live[2][:, 3].max()) == 0.0  # delta_scores reset
    replayed = replay(saves[0], saves[1:])
    table = replayed[0]
    assert isinstance(table, SparseTable)
    _assert_same(_gather([table]), live)
    # The same chain loaded into another server count, in order: more servers, as
    # the rows of 2 full servers (max_rows 160 each) do not fit in one.
    for count in (3, 4):
        for client, services in _served(count, tmp_path):
            client.create_sparse_table(0, EXACT)
            for save in saves:
                client.load(str(save))
            _assert_same(_gather(_tables(services)), live)


def _in_process(config: SparseTableConfig) -> tuple[TableClient, TableService]:
    service = TableService()
    client = TableClient([InProcessTransport(service)])
    client.create_sparse_table(0, config)
    return client, service


def test_a_deleted_key_is_a_tombstone_and_a_readmitted_key_is_present(tmp_path: Path
                                                                        ) -> None:
    client, service = _in_process(EXACT)
    gone, back, stay = (np.array([k], dtype=np.uint64) for k in (11, 22, 33))
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    g = np.full((1, DIM), 0.5, np.float32)
    client.push_sparse(0, np.concatenate([gone, back]), np.vstack([g, g]),
                       shows=np.full(2, 2.0, np.float32), clicks=np.zeros(2, np.float32))
    client.push_sparse(0, stay, g, shows=one * 9, clicks=one * 3)
    client.save(str(tmp_path / "base"), mode="base")
    # score of gone/back: 2 * 0.9 * 0.1 = 0.18 < delete_threshold 0.25; stay keeps
    assert client.shrink() == 2
    client.push_sparse(0, back, g * 3, shows=one * 5, clicks=zero)  # a new row for 22
    client.save(str(tmp_path / "d1"), mode="delta")
    table = service.tables[0]
    assert isinstance(table, SparseTable)
    np.testing.assert_array_equal(read_tombstones(tmp_path / "d1", 0, EXACT), gone)
    replayed = replay(tmp_path / "base", [tmp_path / "d1"])[0]
    assert isinstance(replayed, SparseTable)
    np.testing.assert_array_equal(replayed.contains(np.concatenate([gone, back, stay])),
                                  [False, True, True])
    _assert_same(_gather([replayed]), _gather([table]))
    base_only = replay(tmp_path / "base")[0]
    assert isinstance(base_only, SparseTable)
    assert base_only.contains(gone).all()
    manifest_free = sorted(p.name for p in (tmp_path / "d1" / "server-0").iterdir())
    assert manifest_free == ["save.json", "table-0.sparse", "table-0.stats",
                             "table-0.tomb", "tables.json"]
    assert json.loads((tmp_path / "d1/server-0/save.json").read_text()) == {"mode": "delta"}


def test_base_and_delta_select_rows_by_the_thresholds() -> None:
    config = EXACT.model_copy(update={"accessor": EXACT.accessor.model_copy(update={
        "max_rows": None, "base_threshold": 1.0, "delta_threshold": 0.5,
        "delta_keep_days": 1.0})})
    table = SparseTable(config)
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(1, 2**40, size=600).astype(np.uint64))
    grads = np.zeros((keys.size, DIM), np.float32)

    def push(part: np.ndarray) -> None:
        shows = rng.integers(0, 12, size=part.size).astype(np.float32)
        clicks = np.minimum(rng.integers(0, 3, size=part.size), shows).astype(np.float32)
        table.push(keys[part], grads[part], shows=shows, clicks=clicks)

    push(np.arange(keys.size))
    table.age_one_day()
    table.age_one_day()
    push(np.arange(0, keys.size, 2))

    def expected(delta: bool) -> np.ndarray:
        k, s = table.stats_items()
        score = (s[:, 0] - s[:, 1]) * np.float32(0.1) + s[:, 1]
        keep = (score >= 1.0) & (s[:, 2] <= 1.0)
        return k[keep & (s[:, 3] >= 0.5)] if delta else k[keep]

    want = expected(False)
    base = snapshot_mode({0: table}, "base")
    assert 0 < want.size < keys.size
    np.testing.assert_array_equal(base.tables[0][1], want)
    assert float(np.abs(table.stats_items()[1][:, 3]).max()) == 0.0
    push(np.arange(0, keys.size, 3))
    before = table.stats_items()[1][:, 3].copy()
    want = expected(True)
    delta = snapshot_mode({0: table}, "delta")
    assert want.size > 0
    np.testing.assert_array_equal(delta.tables[0][1], want)
    np.testing.assert_array_equal(delta.stats[0][0], want)
    after_keys, after = table.stats_items()
    chosen = np.isin(after_keys, want)
    assert (after[chosen, 3] == 0).all()
    np.testing.assert_array_equal(after[~chosen, 3], before[~chosen])


def test_show_click_score_admission_matches_a_reference_model() -> None:
    config = SparseTableConfig(
        name="adm", dim=DIM, rule=RuleConfig(name="sgd", learning_rate=0.5), num_shards=2,
        num_buckets=16, accessor={"name": "ctr", "admission": "show_click_score",
                                  "admit_score": 1.5, "pending_slots": 1 << 16})
    table, fresh = SparseTable(config), SparseTable(config)
    rng = np.random.default_rng(3)
    pool = np.arange(1, 60, dtype=np.uint64)
    pending: dict[int, np.float32] = {}
    values: dict[int, np.ndarray] = {}
    for step in range(40):
        keys = np.unique(rng.choice(pool, size=12))
        if step % 5 == 4:  # a pull of pending ids reads the initializer, stores nothing
            got = table.pull(keys)
            want = np.stack([values.get(int(k), fresh.pull(keys[i:i + 1], create=False)[0])
                             for i, k in enumerate(keys)])
            np.testing.assert_array_equal(got, want)
            continue
        with_counts = step % 3 != 0
        shows = rng.integers(0, 4, size=keys.size).astype(np.float32)
        clicks = np.minimum(rng.integers(0, 2, size=keys.size), shows).astype(np.float32)
        grads = rng.normal(size=(keys.size, DIM)).astype(np.float32)
        if with_counts:
            table.push(keys, grads, shows=shows, clicks=clicks)
            scores = (shows - clicks) * np.float32(0.1) + clicks * np.float32(1.0)
        else:  # no counts: each key counts as show 1, click 0
            table.push(keys, grads)
            scores = np.full(keys.size, np.float32(0.1))
        for i, k in enumerate(int(k) for k in keys):
            if k not in values:
                pending[k] = pending.get(k, np.float32(0)) + scores[i]
                if pending[k] < np.float32(1.5):
                    continue
                del pending[k]
                values[k] = fresh.pull(keys[i:i + 1], create=False)[0]
            values[k] = values[k] - np.float32(0.5) * grads[i]
    got_keys, rows = table.items()
    assert 0 < len(values) < pool.size
    np.testing.assert_array_equal(got_keys, np.array(sorted(values), dtype=np.uint64))
    want = np.stack([values[int(k)] for k in got_keys])
    np.testing.assert_allclose(rows[:, :DIM], want, rtol=1e-6, atol=1e-7)
    assert table.lifecycle_counts().admitted == len(values)


def test_a_retried_shrink_decays_once() -> None:
    client, service = _in_process(EXACT)
    keys = np.arange(1, 6, dtype=np.uint64)
    client.push_sparse(0, keys, np.zeros((5, DIM), np.float32),
                       shows=np.full(5, 10, np.float32), clicks=np.ones(5, np.float32))
    table = service.tables[0]
    assert isinstance(table, SparseTable)
    request = msg.ShrinkRequest(all_tables=True, request_id=msg.PushId(client_id=7, seq=1))
    service.Shrink(request)
    service.Shrink(request)  # the client's retry after a lost reply
    service.AgeOneDay(msg.AgeOneDayRequest(all_tables=True,
                                           request_id=msg.PushId(client_id=7, seq=2)))
    service.AgeOneDay(msg.AgeOneDayRequest(all_tables=True,
                                           request_id=msg.PushId(client_id=7, seq=2)))
    stats = table.stats_items()[1]
    np.testing.assert_array_equal(stats[:, 0], np.float32(10) * np.float32(0.9))
    np.testing.assert_array_equal(stats[:, 1], np.float32(0.9))
    np.testing.assert_array_equal(stats[:, 2], 1.0)
    service.Shrink(msg.ShrinkRequest(all_tables=True,
                                     request_id=msg.PushId(client_id=7, seq=3)))
    np.testing.assert_array_equal(table.stats_items()[1][:, 0],
                                  np.float32(10) * np.float32(0.9) * np.float32(0.9))


@pytest.mark.parametrize(("accessor", "field"), [
    ({"base_threshold": -1}, "accessor.base_threshold"),
    ({"delta_threshold": float("inf")}, "accessor.delta_threshold"),
    ({"name": "ctr", "admission": "show_click_score", "admit_score": float("nan")},
     "accessor.admit_score"),
    ({"admission": "show_click_score"}, "accessor.admission"),
])
def test_bad_values_name_the_field(accessor: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        check_accessor(accessor, "emb")


def test_bad_save_modes_are_config_errors(tmp_path: Path) -> None:
    client, service = _in_process(EXACT)
    with pytest.raises(ConfigError, match="mode 'bogus'"):
        client.save(str(tmp_path / "x"), mode="bogus")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="mode 'bogus'"):
        service.Save(msg.SaveRequest(dirname=str(tmp_path / "y"), mode="bogus"))
    client.create_sparse_table(1, SparseTableConfig(name="plain", dim=DIM))
    client.pull_sparse(1, np.arange(1, 9, dtype=np.uint64))
    client.save(str(tmp_path / "w"), mode="delta")  # no lifecycle: every row, exact
    assert saved_mode(tmp_path / "w") == "delta"
    saved_keys, _ = read_saved_rows(tmp_path / "w", 1, SparseTableConfig(name="plain",
                                                                         dim=DIM))
    np.testing.assert_array_equal(saved_keys, np.arange(1, 9, dtype=np.uint64))
    preloading = TableClient([InProcessTransport(TableService(preload_dir=tmp_path / "w"))])
    with pytest.raises(ConfigError, match="a delta save; start from its base"):
        preloading.create_sparse_table(1, SparseTableConfig(name="plain", dim=DIM))
    client.create_sparse_table(2, SparseTableConfig(name="capped", dim=DIM,
                                                    accessor={"max_rows": 4}))
    with pytest.raises(ConfigError, match=r"'capped'.*no ctr accessor"):
        client.save(str(tmp_path / "z"), mode="delta")
    assert not (tmp_path / "z").exists()
