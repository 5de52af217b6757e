"""Checkpoints on storage: atomic publish, checksums, fallback, pruning, failing writes,
incompatible configs and consistent snapshots under concurrent pushes.

Servers run in this process on 127.0.0.1 (real gRPC); storage is a real fsspec
filesystem: local paths, ``file://`` and ``memory://``, and ``fullmem://``, a memory
filesystem whose writes fail once a byte budget is spent (a full disk).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

from psfleet.checkpoint import CheckpointError, CheckpointStore, Manifest
from psfleet.checkpoint.compat import check_compatible
from psfleet.errors import RemoteError
from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig, start_server
from psfleet.rpc import RpcConfig

pytestmark = pytest.mark.service

# The checkpoints go to pytest's tmp_path and memory filesystems: the servers may write
# there (docs/security.md).
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=8,
                   storage_roots=(tempfile.gettempdir(), "memory://", "fullmem://"))
SHAPES = [(40, 30), (30,)]
TOTAL = sum(int(np.prod(s)) for s in SHAPES)


@contextmanager
def servers(count: int) -> Iterator[RemoteClient]:
    with ExitStack() as stack:
        endpoints = []
        for _ in range(count):
            _, server = start_server("127.0.0.1", 0, CONFIG)
            stack.callback(server.stop)
            endpoints.append(server.endpoint)
        client = RemoteClient(endpoints, CONFIG)
        stack.callback(client.close)
        yield client


def create_tables(client: RemoteClient, rule: str = "adam", dim: int = 5,
                  initializer: str = "uniform") -> RuleConfig:
    config = RuleConfig(name=rule, learning_rate=0.1)
    client.create_sparse_table(0, SparseTableConfig(name="emb", dim=dim, rule=config,
                                                    initializer=initializer))
    client.create_dense_table(1, "dense", SHAPES, config, np.zeros(TOTAL, np.float32))
    return config


def train_a_little(client: RemoteClient, seed: int, steps: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 2**63, size=2000, dtype=np.uint64))
    for _ in range(steps):
        batch = np.unique(rng.choice(keys, 600))
        client.pull_sparse(0, batch)
        client.push_sparse(0, batch, rng.normal(size=(batch.size, 5)).astype(np.float32))
        client.push_dense(1, rng.normal(size=TOTAL).astype(np.float32))
    return keys


def checkpoint(store: CheckpointStore, client: RemoteClient, step: int) -> str:
    pending = store.begin(step)
    pending.add(client.save(pending.storage.url))
    return store.commit(pending, Manifest(step=step, server_num=len(client.endpoints)))


@pytest.mark.parametrize("url_kind", ["path", "file", "memory"])
def test_checkpoint_round_trip_into_another_server_count(url_kind: str, tmp_path: Path) -> None:
    url = {"path": str(tmp_path / "ck"), "file": f"file://{tmp_path / 'ck'}",
           "memory": f"memory://ck-{uuid.uuid4().hex}"}[url_kind]
    store = CheckpointStore(url)
    with servers(2) as source:
        create_tables(source)
        keys = train_a_little(source, seed=1)
        rows = source.pull_sparse(0, keys, create=False)
        dense = source.pull_dense(1)
        checkpoint(store, source, step=3)
    latest = store.latest()
    assert latest is not None and latest.manifest.step == 3
    assert latest.name.startswith("ckpt-") and latest.name.endswith("-step3")
    assert all(f.startswith("server-") for f in latest.manifest.files)
    with servers(3) as target:
        create_tables(target)
        target.load(latest.storage.url)
        assert target.pull_sparse(0, keys, create=False).tobytes() == rows.tobytes()
        assert target.pull_dense(1).tobytes() == dense.tobytes()


def test_only_the_last_max_num_checkpoints_are_kept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, max_num_checkpoints=2)
    with servers(1) as client:
        create_tables(client)
        for step in range(4):
            train_a_little(client, seed=step, steps=1)
            checkpoint(store, client, step)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-000003-step2", "ckpt-000004-step3"]


def _two_checkpoints(tmp_path: Path) -> tuple[CheckpointStore, bytes, bytes]:
    """Checkpoints at step 1 and 2; returns the store and step 1's dense values."""
    store = CheckpointStore(tmp_path / "ck")
    with servers(2) as client:
        create_tables(client)
        train_a_little(client, seed=1)
        dense1 = client.pull_dense(1).tobytes()
        checkpoint(store, client, 1)
        train_a_little(client, seed=2)
        dense2 = client.pull_dense(1).tobytes()
        checkpoint(store, client, 2)
    return store, dense1, dense2


def _dense_of(store_url: str) -> bytes:
    with servers(1) as client:
        create_tables(client)
        client.load(store_url)
        return client.pull_dense(1).tobytes()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_checkpoint_names_the_file_and_resume_falls_back(
        damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, dense1, dense2 = _two_checkpoints(tmp_path)
    newest = tmp_path / "ck" / "ckpt-000002-step2"
    assert _dense_of(str(newest)) == dense2
    victim = newest / "server-1" / "table-0.sparse"
    data = victim.read_bytes()
    if damage == "flip":
        victim.write_bytes(data[:-7] + bytes([data[-7] ^ 0xFF]) + data[-6:])
    elif damage == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    else:
        victim.unlink()
    with pytest.raises(CheckpointError, match=r"server-1/table-0\.sparse"):
        store.verify(newest.name)
    with caplog.at_level(logging.WARNING):
        latest = store.latest()
    assert latest is not None and latest.manifest.step == 1
    assert "server-1/table-0.sparse" in caplog.text and "ckpt-000002-step2" in caplog.text
    assert _dense_of(latest.storage.url) == dense1


def test_an_unfinished_checkpoint_is_ignored(tmp_path: Path) -> None:
    store, dense1, dense2 = _two_checkpoints(tmp_path)
    # A crash after the files but before the manifest; and a folder without manifest.
    with servers(1) as client:
        create_tables(client)
        pending = store.begin(3)
        client.save(pending.storage.url)
    (tmp_path / "ck" / "ckpt-000009-step9").mkdir()
    latest = store.latest()
    assert latest is not None and latest.manifest.step == 2
    assert _dense_of(latest.storage.url) == dense2


class FullMemoryFileSystem(MemoryFileSystem):
    """A memory filesystem that fails writes once ``budget`` bytes were written."""

    protocol = "fullmem"
    store: dict[str, Any] = {}
    pseudo_dirs = [""]
    budget = 1 << 40

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(super()._strip_protocol(path.removeprefix("fullmem://")))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        handle = super()._open(path, mode, **kwargs)
        if "w" not in mode:
            return handle
        fs = type(self)

        class Full(MemoryFile):  # type: ignore[misc]
            def write(self, data: Any) -> int:
                size = memoryview(data).nbytes
                if size > fs.budget:
                    raise OSError(28, "No space left on device", path)
                fs.budget -= size
                return super().write(data)  # type: ignore[no-any-return]

        full = Full(fs=self, path=handle.path)
        full.commit()  # as MemoryFileSystem._open does: the store holds this file
        return full


@pytest.fixture
def full_fs() -> Iterator[type[FullMemoryFileSystem]]:
    fsspec.register_implementation("fullmem", FullMemoryFileSystem, clobber=True)
    FullMemoryFileSystem.store = {}
    FullMemoryFileSystem.budget = 1 << 40
    yield FullMemoryFileSystem
    FullMemoryFileSystem.store = {}


def test_a_failing_write_leaves_the_previous_checkpoint_intact(
        full_fs: type[FullMemoryFileSystem]) -> None:
    store = CheckpointStore("fullmem://job")
    with servers(2) as client:
        create_tables(client)
        train_a_little(client, seed=1)
        expected = client.pull_dense(1).tobytes()
        checkpoint(store, client, 1)
        train_a_little(client, seed=2)
        full_fs.budget = 3000  # the disk fills up during the next save
        pending = store.begin(2)
        with pytest.raises(RemoteError, match="No space left on device"):
            client.save(pending.storage.url)
        store.abort(pending)
    full_fs.budget = 1 << 40
    assert [n for n in store.storage.listdir() if not n.startswith(".cursors")] == [
        "ckpt-000001-step1"]
    latest = store.latest()
    assert latest is not None and latest.manifest.step == 1
    assert _dense_of(latest.storage.url) == expected


def test_a_checkpoint_of_another_model_names_the_table_and_both_values(tmp_path: Path) -> None:
    manifest = Manifest(
        sparse_tables={"emb": {"dim": 9, "num_buckets": 4096, "rule": {"name": "adam"}}},
        dense={"shapes": [[10, 4], [4]], "rule": {"name": "adam"}})
    adam = {"name": "adam"}
    ok = {"emb": {"dim": 9, "num_buckets": 4096, "rule": adam}}
    check_compatible(manifest, "ck", ok, [[10, 4], [4]], adam)
    with pytest.raises(CheckpointError, match=r"'emb' dim is 9 in the checkpoint, 7 in this"):
        check_compatible(manifest, "ck", {"emb": {**ok["emb"], "dim": 7}}, [[10, 4], [4]],
                         adam)
    with pytest.raises(CheckpointError, match=r"parameter 0 shape is \(10, 4\) in the "
                                              r"checkpoint, \(12, 4\)"):
        check_compatible(manifest, "ck", ok, [[12, 4], [4]], adam)
    with pytest.raises(CheckpointError, match=r"'emb' optimizer rule is 'adam'.*'sgd'"):
        check_compatible(manifest, "ck", {"emb": {**ok["emb"], "rule": {"name": "sgd"}}},
                         [[10, 4], [4]], {"name": "sgd"})


def test_servers_reject_rows_of_another_rule_naming_the_table(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    with servers(1) as client:
        create_tables(client, rule="adam")
        train_a_little(client, seed=1)
        checkpoint(store, client, 1)
    latest = store.latest()
    assert latest is not None
    with servers(2) as client:
        create_tables(client, rule="sgd")
        with pytest.raises(RemoteError, match=r"'emb'.*rows of 16 floats.*'sgd' needs 5"):
            client.load(latest.storage.url)


def test_snapshot_under_concurrent_async_pushes_is_consistent(tmp_path: Path) -> None:
    """Each push moves every row (all shards) by exactly -lr: a snapshot taken while
    pushes run must see every row at the same value (no push half applied)."""
    store = CheckpointStore(tmp_path, max_num_checkpoints=10)
    keys = np.arange(1, 3001, dtype=np.uint64)
    with servers(1) as client:
        rule = RuleConfig(name="sgd", learning_rate=1.0)
        client.create_sparse_table(0, SparseTableConfig(name="emb", dim=5, rule=rule,
                                                        initializer="zeros"))
        client.create_dense_table(1, "dense", SHAPES, rule, np.zeros(TOTAL, np.float32))
        stop = threading.Event()
        ones = np.ones((keys.size, 5), np.float32)
        # Every row exists before the first snapshot (under load the threads may not
        # have pushed yet, and the test would read a header as rows).
        client.push_sparse(0, keys, ones)

        def push() -> None:
            while not stop.is_set():
                client.push_sparse(0, keys, ones)

        threads = [threading.Thread(target=push) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for step in range(5):
                checkpoint(store, client, step)
        finally:
            stop.set()
            for t in threads:
                t.join()
    values = []
    for entry in sorted(tmp_path.glob("ckpt-*/server-0/table-0.sparse")):
        data = entry.read_bytes()
        rows = np.frombuffer(data[-keys.size * 5 * 4:], np.float32).reshape(-1, 5)
        assert np.unique(rows).size == 1, f"{entry}: rows at different steps"
        values.append(float(rows[0, 0]))
    assert len(values) == 5 and values[-1] < 0
