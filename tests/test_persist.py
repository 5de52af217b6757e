"""Saving tables and loading them into another number of servers."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pytest

from psfleet.errors import RemoteError
from psfleet.ps import LocalClient, RemoteClient, RuleConfig, SparseTableConfig, start_server
from psfleet.ps.persist import load_server, save_server
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.rpc import RpcConfig

pytestmark = pytest.mark.service

RULES = ["sgd", "adagrad", "adam"]
# The saves go to pytest's tmp_path: the servers may write there (docs/security.md).
SERVER_CONFIG = RpcConfig(storage_roots=(tempfile.gettempdir(),))
SHAPES = [(40, 30), (30,), (30, 1)]


@contextmanager
def servers(count: int) -> Iterator[RemoteClient]:
    with ExitStack() as stack:
        endpoints = []
        for _ in range(count):
            _, server = start_server("127.0.0.1", 0, SERVER_CONFIG)
            stack.callback(server.stop)
            endpoints.append(server.endpoint)
        client = RemoteClient(endpoints, RpcConfig())
        stack.callback(client.close)
        yield client


def train_a_little(client: RemoteClient | LocalClient, rule: str, seed: int) -> np.ndarray:
    """Create a sparse and a dense table, push random gradients; return the keys used."""
    rng = np.random.default_rng(seed)
    config = SparseTableConfig(name="emb", dim=5, rule=RuleConfig(name=rule, learning_rate=0.1))
    client.create_sparse_table(0, config)
    total = sum(int(np.prod(s)) for s in SHAPES)
    client.create_dense_table(1, "dense", SHAPES, config.rule,
                              rng.normal(size=total).astype(np.float32))
    keys = np.unique(rng.integers(0, 2**64 - 1, size=3000, dtype=np.uint64))
    for _ in range(4):
        batch = np.unique(rng.choice(keys, 800))
        client.pull_sparse(0, batch)
        client.push_sparse(0, batch, rng.normal(size=(batch.size, 5)).astype(np.float32))
        client.push_dense(1, rng.normal(size=total).astype(np.float32))
    return keys


@pytest.mark.parametrize("rule", RULES)
def test_save_then_load_into_one_two_three_servers_restores_every_row(
        rule: str, tmp_path: Path) -> None:
    with servers(2) as source:
        keys = train_a_little(source, rule, seed=1)
        expected_rows = source.pull_sparse(0, keys, create=False)
        expected_dense = source.pull_dense(1)
        saved_rows = sum(t.rows for s in source.stats() for t in s.tables if t.table_id == 0)
        source.save(str(tmp_path))
    for count in (1, 2, 3):
        with servers(count) as target:
            config = SparseTableConfig(name="emb", dim=5,
                                       rule=RuleConfig(name=rule, learning_rate=0.1))
            target.create_sparse_table(0, config)
            total = sum(int(np.prod(s)) for s in SHAPES)
            target.create_dense_table(1, "dense", SHAPES, config.rule,
                                      np.zeros(total, np.float32))
            target.load(str(tmp_path))
            assert np.array_equal(target.pull_sparse(0, keys, create=False), expected_rows)
            assert np.array_equal(target.pull_dense(1), expected_dense)
            loaded = [t.rows for s in target.stats() for t in s.tables if t.table_id == 0]
            assert sum(loaded) == saved_rows and len(loaded) == count


@pytest.mark.parametrize("rule", RULES)
def test_save_server_load_server_round_trip_is_byte_for_byte(rule: str, tmp_path: Path) -> None:
    """Values and optimizer state, per row, equal after reloading into 3 shards of servers."""
    client = LocalClient()
    train_a_little(client, rule, seed=2)
    table = client.service.tables[0]
    keys, rows = table.items()
    save_server({0: table}, tmp_path, 0, {})
    union_keys, union_rows = [], []
    for index in range(3):
        fresh = SparseTable(table.config)
        load_server({0: fresh}, tmp_path, index, 3, {})
        k, r = fresh.items()
        union_keys.append(k)
        union_rows.append(r)
    all_keys = np.concatenate(union_keys)
    order = np.argsort(all_keys)
    assert np.array_equal(all_keys[order], keys)
    assert np.concatenate(union_rows)[order].tobytes() == rows.tobytes()


def test_dense_state_survives_resharding(tmp_path: Path) -> None:
    """Adam's moments follow their elements when blocks land on other servers."""
    with servers(3) as source:
        train_a_little(source, "adam", seed=3)
        source.save(str(tmp_path))
        rng = np.random.default_rng(9)
        total = sum(int(np.prod(s)) for s in SHAPES)
        grads = rng.normal(size=total).astype(np.float32)
        source.push_dense(1, grads)
        expected = source.pull_dense(1)
    with servers(1) as target:
        config = RuleConfig(name="adam", learning_rate=0.1)
        target.create_sparse_table(0, SparseTableConfig(name="emb", dim=5, rule=config))
        target.create_dense_table(1, "dense", SHAPES, config, np.zeros(total, np.float32))
        target.load(str(tmp_path))
        target.push_dense(1, grads)  # the same step on restored moments and step count
        np.testing.assert_allclose(target.pull_dense(1), expected, rtol=0, atol=1e-6)


def test_loading_into_another_dim_names_the_table_and_both_dims(tmp_path: Path) -> None:
    client = LocalClient()
    train_a_little(client, "sgd", seed=4)
    save_server({0: client.service.tables[0]}, tmp_path, 0, {})
    other = SparseTable(SparseTableConfig(name="emb", dim=7))
    with pytest.raises(RemoteError, match=r"dim 5.*dim 7"):
        load_server({0: other}, tmp_path, 0, 1, {})


def test_servers_started_with_a_save_load_it_when_workers_create_tables(tmp_path: Path) -> None:
    """fleet.init_server(dirname): each table is loaded at CreateTable, re-sharded."""
    from psfleet.ps import TableService

    with servers(3) as source:
        keys = train_a_little(source, "adagrad", seed=5)
        expected_rows = source.pull_sparse(0, keys, create=False)
        expected_dense = source.pull_dense(1)
        source.save(str(tmp_path))
    with ExitStack() as stack:
        endpoints = []
        for _ in range(2):
            _, server = start_server("127.0.0.1", 0, RpcConfig(),
                                     TableService(preload_dir=tmp_path))
            stack.callback(server.stop)
            endpoints.append(server.endpoint)
        client = RemoteClient(endpoints, RpcConfig())
        stack.callback(client.close)
        rule = RuleConfig(name="adagrad", learning_rate=0.1)
        client.create_sparse_table(0, SparseTableConfig(name="emb", dim=5, rule=rule))
        total = sum(int(np.prod(s)) for s in SHAPES)
        client.create_dense_table(1, "dense", SHAPES, rule, np.zeros(total, np.float32))
        assert np.array_equal(client.pull_sparse(0, keys, create=False), expected_rows)
        assert np.array_equal(client.pull_dense(1), expected_dense)
