"""Tests of SparseEmbedding + DistributedOptimizer over in-process tables, and of the
async communicator against the local one.

The embedding and optimizer are bound by hand to a step collector, as the worker
runtime (``fleet.init_worker``) does, so no process-wide fleet state is touched.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from psfleet.errors import ConfigError, FatalError
from psfleet.fleet import DistributedOptimizer
from psfleet.fleet.step import StepCollector
from psfleet.nn import SparseEmbedding, live_embeddings
from psfleet.ps import LocalClient, RuleConfig
from psfleet.ps.client import PushHandle
from psfleet.ps.communicator import (
    AsyncCommunicator,
    AsyncConfig,
    Communicator,
    LocalCommunicator,
    merge_sparse,
)
from psfleet.ps.merge import sum_equal_keys
from psfleet.ps.routing import RoutedKeys, keys_of

pytestmark = pytest.mark.unit

DIM = 4
SPARSE_ID, DENSE_ID = 0, 1


class RecordingCommunicator(LocalCommunicator):
    """A LocalCommunicator that records every sparse push."""

    def __init__(self, client: LocalClient) -> None:
        super().__init__(client)
        self.sparse_pushes: list[tuple[np.ndarray, np.ndarray]] = []

    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    grads: np.ndarray) -> None:
        self.sparse_pushes.append((keys_of(keys).copy(), grads.copy()))
        super().push_sparse(table_id, keys, grads)


@dataclass
class Worker:
    embedding: SparseEmbedding
    dense: torch.nn.Linear
    optimizer: DistributedOptimizer
    client: LocalClient
    communicator: RecordingCommunicator
    step: StepCollector

    def rows(self, keys: np.ndarray) -> np.ndarray:
        """What the table holds for ``keys`` now (not creating rows)."""
        return self.client.service.tables[SPARSE_ID].pull(keys.view(np.uint64), create=False)


def _bind(optimizer_cls: type[torch.optim.SGD | torch.optim.Adam], lr: float,
          name: str) -> Worker:
    embedding = SparseEmbedding(DIM, name=name, initial_range=0.5)
    dense = torch.nn.Linear(DIM, 1)
    optimizer = DistributedOptimizer(optimizer_cls(dense.parameters(), lr=lr))
    client = LocalClient()
    communicator = RecordingCommunicator(client)
    # What fleet.init_worker does, with in-process tables.
    client.create_sparse_table(SPARSE_ID, embedding.table_config(optimizer.rule))
    step = StepCollector(communicator, {SPARSE_ID: DIM}, DENSE_ID)
    embedding.bind(step, SPARSE_ID)
    client.create_dense_table(DENSE_ID, "dense", [p.numel() for p in optimizer.params],
                              optimizer.rule, optimizer.flat_values())
    optimizer.bind(step)
    communicator.start()
    return Worker(embedding, dense, optimizer, client, communicator, step)


@pytest.fixture
def sgd_worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
    worker = _bind(torch.optim.SGD, 0.1, f"emb_{request.node.name}")
    yield worker
    worker.communicator.stop()


IDS = torch.tensor([[3, 7, 3], [2**62, 7, 3], [-5, 3, 2**62]], dtype=torch.int64)  # [B, S]


def test_forward_gathers_the_table_rows(sgd_worker: Worker) -> None:
    out = sgd_worker.embedding(IDS)
    assert out.shape == (3, 3, DIM) and out.dtype == torch.float32
    table = sgd_worker.client.service.tables[SPARSE_ID]
    assert len(table) == 4  # the distinct ids, created on first pull
    expected = sgd_worker.rows(IDS.reshape(-1).numpy()).reshape(3, 3, DIM)
    assert np.array_equal(out.detach().numpy(), expected)
    assert not np.array_equal(expected[0, 0], expected[0, 1])  # rows differ per id


def test_step_applies_minus_lr_times_summed_gradient(sgd_worker: Worker) -> None:
    w = sgd_worker
    keys = np.unique(IDS.numpy())
    before = w.rows(keys)
    dense_before = [p.detach().clone() for p in w.dense.parameters()]
    out = w.embedding(IDS)  # [B, S, D]
    weights = torch.from_numpy(np.random.default_rng(0).normal(size=(3, 3, DIM))
                               .astype(np.float32))
    loss = (out * weights).sum() + w.dense(out).sum()
    w.optimizer.zero_grad()
    loss.backward()
    dense_grads = [p.grad.clone() for p in w.dense.parameters()]  # type: ignore[union-attr]
    w.optimizer.step()

    # d loss / d out[b, s] = weights[b, s] + dense.weight; summed over equal ids.
    per_position = (weights + dense_before[0][0]).numpy().astype(np.float64)
    flat_ids = IDS.reshape(-1).numpy()
    summed = np.stack([per_position.reshape(-1, DIM)[flat_ids == k].sum(axis=0)
                       for k in keys.view(np.int64)])
    np.testing.assert_allclose(w.rows(keys), before - 0.1 * summed, rtol=0, atol=1e-6)
    assert len(w.communicator.sparse_pushes) == 1
    pushed = w.communicator.sparse_pushes[0][0]
    assert pushed.dtype == np.uint64
    assert sorted(pushed.tolist()) == sorted(keys.view(np.uint64).tolist())
    # The dense parameters went through the dense table and came back updated.
    for p, p0, g in zip(w.dense.parameters(), dense_before, dense_grads, strict=True):
        torch.testing.assert_close(p.detach(), p0 - 0.1 * g, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(w.client.pull_dense(DENSE_ID), w.optimizer.flat_values())


def test_two_forwards_before_a_step_are_one_push() -> None:
    w = _bind(torch.optim.Adam, 0.01, "emb_two_forwards")
    try:
        ids1 = torch.tensor([1, 2, 2, 9], dtype=torch.int64)
        ids2 = torch.tensor([[9, 4], [1, 1]], dtype=torch.int64)
        keys = np.array([1, 2, 4, 9], np.uint64)
        before = w.rows(keys)
        out1, out2 = w.embedding(ids1), w.embedding(ids2)
        assert torch.equal(out1[3], out2[0, 0])  # id 9 read twice: one row
        rng = np.random.default_rng(1)
        w1 = torch.from_numpy(rng.normal(size=(4, DIM)).astype(np.float32))
        w2 = torch.from_numpy(rng.normal(size=(2, 2, DIM)).astype(np.float32))
        ((out1 * w1).sum() + (out2 * w2).sum()).backward()
        w.optimizer.step()

        assert len(w.communicator.sparse_pushes) == 1
        pushed_keys, pushed_grads = w.communicator.sparse_pushes[0]
        assert pushed_keys.tolist() == keys.tolist()
        g = np.stack([w1[0].numpy() + w2[1, 0].numpy() + w2[1, 1].numpy(),  # id 1
                      w1[1].numpy() + w1[2].numpy(),  # id 2
                      w2[0, 1].numpy(),  # id 4
                      w1[3].numpy() + w2[0, 0].numpy()]).astype(np.float64)  # id 9
        np.testing.assert_allclose(pushed_grads, g, rtol=1e-6, atol=1e-7)
        # One Adam step with the summed gradient: w - lr * g / (|g| + eps).
        np.testing.assert_allclose(w.rows(keys), before - 0.01 * g / (np.abs(g) + 1e-8),
                                   rtol=0, atol=1e-6)
        assert w.step.pending_rows == 0  # the step's push took every row
        assert w.step.sparse_pushes == 1
    finally:
        w.communicator.stop()


def test_eval_and_no_grad_do_not_create_rows(sgd_worker: Worker) -> None:
    w = sgd_worker
    table = w.client.service.tables[SPARSE_ID]
    w.embedding(torch.tensor([100], dtype=torch.int64))
    assert len(table) == 1
    w.embedding.eval()
    out = w.embedding(IDS)
    assert len(table) == 1
    with torch.no_grad():
        w.embedding.train()
        again = w.embedding(IDS)
    assert len(table) == 1
    assert torch.equal(out, again)  # the initial values, read but not stored
    w.embedding.train()
    stored = w.embedding(IDS)
    assert len(table) == 5
    assert torch.equal(stored.detach(), out)
    assert w.step.push_sparse_grads() == 0  # no backward: nothing to push


def test_unbound_embedding_says_to_call_init_worker() -> None:
    embedding = SparseEmbedding(DIM, name="emb_unbound")
    with pytest.raises(FatalError, match=r"'emb_unbound'.*init_worker"):
        embedding(torch.tensor([1], dtype=torch.int64))


def test_int32_ids_are_rejected(sgd_worker: Worker) -> None:
    with pytest.raises(ConfigError, match="int64"):
        sgd_worker.embedding(torch.tensor([1], dtype=torch.int32))


def test_duplicate_embedding_names_are_a_config_error() -> None:
    first = SparseEmbedding(DIM, name="emb_dup")
    second = SparseEmbedding(DIM, name="emb_dup")
    try:
        with pytest.raises(ConfigError, match="emb_dup"):
            live_embeddings()
    finally:
        del first, second
        gc.collect()
    assert "emb_dup" not in [e.name for e in live_embeddings()]


def test_an_unreachable_embedding_in_a_cycle_does_not_clash() -> None:
    """A model built before and dropped, but kept by a reference cycle until the
    collector runs (a notebook cell run again), is not taken for a live one."""
    gc.disable()  # the cycle below stays until collected
    try:
        old = SparseEmbedding(DIM, name="emb_again")
        old.cycle = [old]  # a reference cycle: refcounting alone never frees it
        del old
        new = SparseEmbedding(DIM, name="emb_again")
        assert [e for e in live_embeddings() if e.name == "emb_again"] == [new]
    finally:
        gc.enable()


def test_optimizer_step_before_bind_is_fatal() -> None:
    dense = torch.nn.Linear(2, 1)
    optimizer = DistributedOptimizer(torch.optim.SGD(dense.parameters(), lr=0.1))
    with pytest.raises(FatalError, match="init_worker"):
        optimizer.step()


def test_merge_sparse_sums_equal_keys() -> None:
    keys = [np.array([3, 1, 2**63], np.uint64), np.array([1, 5], np.uint64),
            np.array([3], np.uint64)]
    grads = [np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32),
             np.array([[10.0, 20.0], [7.0, 8.0]], np.float32),
             np.array([[100.0, 200.0]], np.float32)]
    merged_keys, merged = merge_sparse(keys, grads)
    assert merged_keys.dtype == np.uint64
    assert merged_keys.tolist() == [1, 3, 5, 2**63]
    assert merged.tolist() == [[13.0, 24.0], [101.0, 202.0], [7.0, 8.0], [5.0, 6.0]]
    assert all(g[0, 0] in (1.0, 10.0, 100.0) for g in grads)  # inputs untouched


def test_equal_keys_sum_the_same_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server without torch (async, GEO) sums with numpy's add.at: bit for bit what
    torch's index_add_ gives a worker."""
    rng = np.random.default_rng(4)
    keys = rng.integers(0, 300, size=4000).astype(np.uint64)
    values = rng.normal(size=(4000, 9)).astype(np.float32)
    with_torch = sum_equal_keys(keys, values)
    monkeypatch.setitem(sys.modules, "torch", None)  # as in a process that never imported it
    without = sum_equal_keys(keys, values)
    assert np.array_equal(with_torch[0], without[0]) and with_torch[0].size == 300  # < 4000
    np.testing.assert_array_equal(with_torch[1], without[1])


def _pushes(seed: int, n: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``n`` steps of (distinct sparse keys, their gradients, a dense gradient)."""
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(n):
        keys = np.unique(rng.integers(0, 40, size=25).astype(np.uint64))  # overlapping
        steps.append((keys, rng.normal(size=(keys.size, DIM)).astype(np.float32),
                      rng.normal(size=10).astype(np.float32)))
    return steps


def _tables(rule: RuleConfig, client: LocalClient | None = None) -> LocalClient:
    client = client or LocalClient()
    embedding_config = SparseEmbedding(DIM, name="emb_async", initial_range=0.5).table_config(rule)
    client.create_sparse_table(SPARSE_ID, embedding_config)
    client.create_dense_table(DENSE_ID, "dense", [4, 6], rule, np.ones(10, np.float32))
    return client


def _run(communicator: Communicator, steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
         flush_each: bool) -> None:
    communicator.start()
    try:
        for keys, grads, dense in steps:
            communicator.push_sparse(SPARSE_ID, keys, grads)
            communicator.push_dense(DENSE_ID, dense)
            communicator.end_step()
            if flush_each:
                communicator.flush()
        communicator.flush()
    finally:
        communicator.stop()


def _state(client: LocalClient) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys, rows = client.service.tables[SPARSE_ID].items()
    return keys, rows, client.service.tables[DENSE_ID].state()[0]


def test_async_communicator_without_merging_equals_local() -> None:
    rule = RuleConfig(name="adam", learning_rate=0.01)
    steps = _pushes(0, 12)
    local, remote = _tables(rule), _tables(rule)
    _run(LocalCommunicator(local), steps, flush_each=True)
    _run(AsyncCommunicator(remote, AsyncConfig(k_steps=1)), steps, flush_each=True)
    for a, b in zip(_state(local), _state(remote), strict=True):
        assert np.array_equal(a, b)
    assert len(local.service.tables[SPARSE_ID]) > 30


class GatedClient(LocalClient):
    """In-process tables whose sparse pushes wait for ``gate`` (so steps queue up)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.sparse_pushes = 0

    def start_push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                          grads: np.ndarray, *args: Any) -> PushHandle:
        self.gate.wait(timeout=20)
        self.sparse_pushes += 1
        return super().start_push_sparse(table_id, keys, grads, *args)


def test_async_communicator_merges_queued_steps() -> None:
    # With SGD, applying the sum of queued gradients equals applying them one by one.
    rule = RuleConfig(name="sgd", learning_rate=0.1)
    steps = _pushes(1, 30)
    local = _tables(rule)
    _run(LocalCommunicator(local), steps, flush_each=True)

    gated = GatedClient()
    _tables(rule, gated)
    communicator = AsyncCommunicator(gated, AsyncConfig(send_queue_size=64,
                                                        max_merge_var_num=64))
    communicator.start()
    try:
        for i, (keys, grads, dense) in enumerate(steps):
            if i == 1:  # two pushes to one table within a step are merged too
                half = keys.size // 2
                communicator.push_sparse(SPARSE_ID, keys[:half], grads[:half])
                communicator.push_sparse(SPARSE_ID, keys[half:], grads[half:])
            else:
                communicator.push_sparse(SPARSE_ID, keys, grads)
            communicator.push_dense(DENSE_ID, dense)
            communicator.end_step()
        gated.gate.set()  # the sender was stuck on the first step; the rest queued
        communicator.flush()
    finally:
        gated.gate.set()
        communicator.stop()
    assert communicator.merged_steps >= 25
    assert gated.sparse_pushes == 30 - communicator.merged_steps
    for a, b in zip(_state(local), _state(gated), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_async_fresh_dense_follows_k_steps() -> None:
    rule = RuleConfig(name="sgd", learning_rate=0.5)
    client = _tables(rule)
    communicator = AsyncCommunicator(client, AsyncConfig(k_steps=1))
    communicator.start()
    try:
        assert communicator.fresh_dense(DENSE_ID) is None
        communicator.push_dense(DENSE_ID, np.full(10, 2.0, np.float32))
        communicator.flush()
        np.testing.assert_array_equal(communicator.fresh_dense(DENSE_ID),
                                      np.zeros(10, np.float32))  # 1 - 0.5 * 2
        assert communicator.fresh_dense(DENSE_ID) is None  # handed out once
    finally:
        communicator.stop()


def test_async_send_failure_surfaces_at_flush_and_stop_ends_the_thread() -> None:
    client = _tables(RuleConfig(name="sgd"))
    communicator = AsyncCommunicator(client, AsyncConfig())
    communicator.push_dense(DENSE_ID, np.zeros(10, np.float32))
    with pytest.raises(FatalError, match="init_worker"):
        communicator.end_step()  # not started
    threads_before = set(threading.enumerate())
    communicator.start()
    try:
        communicator.push_sparse(SPARSE_ID, np.array([1, 2], np.uint64),
                                 np.zeros((2, DIM + 1), np.float32))  # wrong width
        with pytest.raises(FatalError, match=r"send thread failed.*expected \(2, 4\)"):
            communicator.flush()
    finally:
        with pytest.raises(FatalError):
            communicator.stop()  # stop flushes, which reports the failure again
    assert set(threading.enumerate()) <= threads_before  # the send thread ended
    communicator.stop()  # idempotent
