"""Per-key show and click counts from the batch labels, in process.

The worker side of the ctr accessor's statistics: which example each id occurrence
belongs to (:class:`psfleet.nn.types.Occurrences`, rows of a batch or bags
feature-major), the counts a step pushes (show = occurrences, click = sum of the
occurrences' labels, Paddle's ``CollectLabelInfo``), their merge over forwards and
queued async steps (``merge_sparse_counts``), GEO's alignment of an interval's counts
to its deltas, and the errors (no labels, wrong length, bags not a whole number per
example). References are numpy bincounts over random batches with repeated ids.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from psfleet.errors import ConfigError, DataError
from psfleet.fleet import DistributedOptimizer
from psfleet.fleet.step import StepCollector
from psfleet.nn import SparseEmbedding, SparseEmbeddingBag
from psfleet.nn.types import Occurrences
from psfleet.ps import LocalClient
from psfleet.ps.client import PushHandle
from psfleet.ps.communicator import AsyncCommunicator, AsyncConfig, LocalCommunicator
from psfleet.ps.communicator.collective_mode import CollectiveCommunicator
from psfleet.ps.communicator.geo_mode import _aligned_counts
from psfleet.ps.communicator.types import Communicator
from psfleet.ps.merge import merge_pushes, merge_sparse, merge_sparse_counts
from psfleet.ps.routing import RoutedKeys
from psfleet.ps.table.sparse_table import SparseTable

pytestmark = pytest.mark.unit

DIM = 3
CTR, PLAIN, DENSE = 0, 1, 2


def _stats(client: LocalClient, table_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The in-process sparse table's (keys, stats float32[n, 4]) sorted by key."""
    table = client.service.tables[table_id]
    assert isinstance(table, SparseTable)
    return table.stats_items()


def _reference(keys: np.ndarray, example: np.ndarray, labels: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct keys, shows, clicks) of id occurrences ``keys`` in examples ``example``."""
    uniq, inverse = np.unique(keys, return_inverse=True)
    return (uniq, np.bincount(inverse, minlength=uniq.size).astype(np.float32),
            np.bincount(inverse, weights=labels[example], minlength=uniq.size
                        ).astype(np.float32))


def test_occurrences_of_rows_count_every_id_of_each_example() -> None:
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(0, 20, size=(16, 5, 2)))  # [B, S, T], repeats
    labels = rng.integers(0, 2, size=16).astype(np.float64)
    uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
    shows, clicks = Occurrences.of_rows(ids, inverse, "t").counts(labels, uniq.numel())
    example = np.repeat(np.arange(16), 10)
    _, want_shows, want_clicks = _reference(ids.numpy().reshape(-1), example, labels)
    np.testing.assert_array_equal(shows, want_shows)
    np.testing.assert_array_equal(clicks, want_clicks)
    assert shows.dtype == clicks.dtype == np.float32


def test_occurrences_of_feature_major_bags_map_bag_f_b_to_example_b() -> None:
    rng = np.random.default_rng(1)
    batch, features = 6, 3
    lengths = torch.from_numpy(rng.integers(0, 4, size=features * batch))  # empty bags too
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    values = torch.from_numpy(rng.integers(0, 9, size=int(offsets[-1])))
    labels = np.array([1, 0, 1, 1, 0, 0.5])
    uniq, inverse = torch.unique(values, return_inverse=True)
    occ = Occurrences.of_bags(offsets, inverse, batch, "t")
    bag = np.repeat(np.arange(features * batch), lengths.numpy())
    np.testing.assert_array_equal(occ.example.numpy(), bag % batch)
    _, want_shows, want_clicks = _reference(values.numpy(), bag % batch, labels)
    shows, clicks = occ.counts(labels, uniq.numel())
    np.testing.assert_array_equal(shows, want_shows)
    np.testing.assert_array_equal(clicks, want_clicks)
    with pytest.raises(ConfigError, match="18 bags are not a whole number of bags per "
                                          "example for batch_size=4"):
        Occurrences.of_bags(offsets, inverse, 4, "t")
    with pytest.raises(ConfigError, match="t: labels has 5 entries but the forward read a "
                                          "batch of 6 examples"):
        occ.counts(labels[:5], uniq.numel())


def test_merge_sparse_counts_sums_counts_like_gradients() -> None:
    rng = np.random.default_rng(2)
    keys = [np.unique(rng.integers(0, 30, size=n).astype(np.uint64)) for n in (12, 20, 7)]
    grads = [rng.normal(size=(k.size, DIM)).astype(np.float32) for k in keys]
    shows = [rng.integers(1, 5, size=k.size).astype(np.float32) for k in keys]
    clicks = [np.floor(s * rng.random(s.size)).astype(np.float32) for s in shows]
    merged, summed, merged_shows, merged_clicks = merge_sparse_counts(keys, grads, shows,
                                                                      clicks)
    want_keys, want_grads = merge_sparse(keys, grads)
    np.testing.assert_array_equal(merged, want_keys)
    np.testing.assert_allclose(summed, want_grads, rtol=0, atol=1e-6)
    all_keys = np.concatenate(keys)
    for got, parts in ((merged_shows, shows), (merged_clicks, clicks)):
        want = np.array([np.concatenate(parts)[all_keys == k].sum() for k in want_keys])
        np.testing.assert_array_equal(got, want)
    one = merge_sparse_counts(keys[:1], grads[:1], shows[:1], clicks[:1])
    assert one[0] is keys[0] and one[2] is shows[0]  # a single push as it is


def test_merge_pushes_gives_zero_counts_to_pushes_without_and_none_when_no_push_has_any(
        ) -> None:
    keys = [np.array([1, 2], np.uint64), np.array([2, 3], np.uint64)]
    grads = [np.ones((2, DIM), np.float32), np.ones((2, DIM), np.float32)]
    merged, summed, shows, clicks = merge_pushes(keys, grads, [None, np.array([4, 5], np.float32)],
                                                 [None, np.array([1, 2], np.float32)])
    np.testing.assert_array_equal(merged, [1, 2, 3])
    np.testing.assert_array_equal(summed[:, 0], [1, 2, 1])
    np.testing.assert_array_equal(shows, [0, 4, 5])  # type: ignore[arg-type]
    np.testing.assert_array_equal(clicks, [0, 1, 2])  # type: ignore[arg-type]
    assert merge_pushes(keys, grads, [None, None], [None, None])[2:] == (None, None)


def test_geo_aligns_the_intervals_counts_to_its_delta_keys() -> None:
    delta_keys = np.array([9, 4, 7, 1], dtype=np.uint64)  # the base's order, not sorted
    counts = [(np.array([4, 9], np.uint64), np.array([2, 1], np.float32),
               np.array([1, 0], np.float32)),
              (np.array([4, 1], np.uint64), np.array([3, 5], np.float32),
               np.array([3, 2], np.float32))]
    shows, clicks = _aligned_counts(delta_keys, counts)
    np.testing.assert_array_equal(shows, [1, 5, 0, 5])  # key 7 pulled, never pushed
    np.testing.assert_array_equal(clicks, [0, 4, 0, 2])


class _Worker:
    """A ctr embedding and a plain one over in-process tables, bound like init_worker."""

    def __init__(self, tag: str, communicator: type[Communicator] | None = None,
                 client: LocalClient | None = None, **kwargs: Any) -> None:
        self.ctr = SparseEmbedding(DIM, name=f"sc_{tag}", accessor={"name": "ctr"})
        self.plain = SparseEmbedding(DIM, name=f"sc_{tag}_plain")
        self.dense = torch.nn.Linear(DIM, 1)
        self.optimizer = DistributedOptimizer(torch.optim.SGD(self.dense.parameters(),
                                                              lr=0.1))
        self.client = client or LocalClient()
        self.communicator = (communicator or LocalCommunicator)(self.client, **kwargs)
        rule = self.optimizer.rule
        self.client.create_sparse_table(CTR, self.ctr.table_config(rule))
        self.client.create_sparse_table(PLAIN, self.plain.table_config(rule))
        self.step = StepCollector(self.communicator, {CTR: DIM, PLAIN: DIM}, DENSE,
                                  {CTR: self.ctr.name})
        self.ctr.bind(self.step, CTR)
        self.plain.bind(self.step, PLAIN)
        self.client.create_dense_table(DENSE, "dense", [4], rule,
                                       self.optimizer.flat_values())
        self.optimizer.bind(self.step)
        self.communicator.start()

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dense(self.ctr(ids).sum(1) + self.plain(ids).sum(1)).sum()

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        return _stats(self.client, CTR)


def _batches(seed: int, steps: int, batch: int = 8, width: int = 4
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    return [(torch.from_numpy(rng.integers(0, 25, size=(batch, width))),
             torch.from_numpy(rng.integers(0, 2, size=batch).astype(np.float32)))
            for _ in range(steps)]


def _expected(batches: list[tuple[torch.Tensor, torch.Tensor]], forwards: int = 1
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = np.concatenate([ids.numpy().reshape(-1) for ids, _ in batches] * forwards)
    width = batches[0][0].shape[1]
    labels = np.concatenate([np.repeat(lab.numpy(), width) for _, lab in batches] * forwards)
    uniq, shows, clicks = _reference(keys, np.arange(keys.size), labels.astype(np.float64))
    return uniq.astype(np.uint64), shows, clicks


def test_local_steps_push_counts_of_two_forwards_and_labels_of_shape_b1() -> None:
    worker = _Worker("local2")
    batches = _batches(3, 4)
    for ids, labels in batches:
        loss = worker.loss(ids) + worker.loss(ids)  # two forwards of each table: one push
        worker.optimizer.zero_grad()
        worker.optimizer.minimize(loss, labels=labels[:, None].to(torch.int64))
    keys, stats = worker.stats()
    want_keys, shows, clicks = _expected(batches, forwards=2)
    np.testing.assert_array_equal(keys, want_keys)
    np.testing.assert_array_equal(stats[:, 0], shows)
    np.testing.assert_array_equal(stats[:, 1], clicks)
    assert _stats(worker.client, PLAIN)[0].size == 0


def test_a_ctr_step_without_labels_names_the_table_and_pushes_nothing() -> None:
    worker = _Worker("nolabels")
    ids, labels = _batches(4, 1)[0]
    worker.optimizer.zero_grad()
    worker.loss(ids).backward()
    before = worker.client.pull_sparse(PLAIN, ids.reshape(-1).numpy().view(np.uint64),
                                       create=False)
    with pytest.raises(ConfigError, match=r"sparse table 'sc_nolabels' \(id 0\) has the ctr "
                                          r"accessor.*optimizer.step\(labels="):
        worker.optimizer.step()
    with pytest.raises(ConfigError, match=r"labels must be of shape \[B\] or \[B, 1\]"):
        worker.optimizer.step(labels=torch.zeros(8, 2))
    with pytest.raises(DataError, match=r"labels: 1 of 8 are not finite \(the first is "
                                        r"example 3: nan\)"):
        worker.optimizer.step(labels=torch.tensor([0, 1, 0, float("nan"), 0, 0, 1, 1]))
    after = worker.client.pull_sparse(PLAIN, ids.reshape(-1).numpy().view(np.uint64),
                                      create=False)
    np.testing.assert_array_equal(before, after)  # the plain table was not pushed either
    assert not worker.stats()[1].any() and worker.step.pending_rows > 0  # rows, no counts
    worker.optimizer.step(labels=labels)  # the recorded rows go with the right call
    np.testing.assert_array_equal(worker.stats()[1][:, 0], _expected([(ids, labels)])[1])
    assert not np.array_equal(before, worker.client.pull_sparse(
        PLAIN, ids.reshape(-1).numpy().view(np.uint64), create=False))


def test_a_step_that_did_not_read_the_ctr_table_needs_no_labels() -> None:
    worker = _Worker("unread")
    ids = torch.tensor([[1, 2]])
    worker.optimizer.zero_grad()
    worker.dense(worker.plain(ids).sum(1)).sum().backward()
    worker.optimizer.step()  # only the plain table was read: no counts to make
    assert worker.stats()[0].size == 0 and worker.step.pending_rows == 0


def test_bag_embedding_counts_with_feature_major_bags() -> None:
    client = LocalClient()
    bag = SparseEmbeddingBag(DIM, name="sc_bag", accessor={"name": "ctr"})
    step = StepCollector(LocalCommunicator(client), {0: DIM}, None, {0: bag.name})
    client.create_sparse_table(0, bag.table_config(DistributedOptimizer(
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)).rule))
    bag.bind(step, 0)
    values = torch.tensor([5, 6, 5, 7, 6, 6, 5])
    offsets = torch.tensor([0, 2, 3, 3, 5, 7])  # 5 bags: not 2 per example
    with pytest.raises(ConfigError, match="5 bags are not a whole number"):
        bag(values, offsets, batch_size=2)
    offsets = torch.tensor([0, 2, 3, 5, 7])  # 2 features x 2 examples: bags f * 2 + b
    bag(values, offsets, batch_size=2).sum().backward()
    step.end_step(None, torch.tensor([1.0, 0.0]))
    keys, stats = _stats(client, 0)
    # example 0: bags 0 (5, 6) and 2 (7, 6); example 1: bags 1 (5) and 3 (6, 5)
    np.testing.assert_array_equal(keys, [5, 6, 7])
    np.testing.assert_array_equal(stats[:, 0], [3, 3, 1])
    np.testing.assert_array_equal(stats[:, 1], [1, 2, 1])


class _GatedClient(LocalClient):
    """In-process tables whose sparse pushes wait for ``gate`` (so async steps queue)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.sparse_pushes = 0

    def start_push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                          grads: np.ndarray, *args: Any, **kwargs: Any) -> PushHandle:
        self.gate.wait(timeout=20)
        self.sparse_pushes += 1
        return super().start_push_sparse(table_id, keys, grads, *args, **kwargs)


@pytest.fixture
def gated() -> Iterator[_GatedClient]:
    client = _GatedClient()
    yield client
    client.gate.set()


def test_async_merged_steps_and_prefetched_rows_sum_their_counts(gated: _GatedClient
                                                                 ) -> None:
    worker = _Worker("async", AsyncCommunicator, gated,
                     config=AsyncConfig(send_queue_size=64, max_merge_var_num=64))
    batches = _batches(5, 12)
    try:
        for ids, labels in batches:
            handle = worker.ctr.prefetch(ids)  # async prefetches: the handle's inverse
            assert handle is not None
            with worker.ctr.use(handle):
                loss = worker.loss(ids)
            worker.optimizer.zero_grad()
            worker.optimizer.minimize(loss, labels=labels)
        gated.gate.set()  # the sender was stuck on the first step; the rest queued
        worker.communicator.flush()
    finally:
        gated.gate.set()
        worker.communicator.stop()
    assert worker.communicator.merged_steps >= 8  # type: ignore[attr-defined]
    keys, stats = worker.stats()
    want_keys, shows, clicks = _expected(batches)
    np.testing.assert_array_equal(keys, want_keys)
    np.testing.assert_array_equal(stats[:, 0], shows)
    np.testing.assert_array_equal(stats[:, 1], clicks)


def test_collective_mode_takes_no_counts_and_needs_no_labels() -> None:
    assert CollectiveCommunicator.takes_counts is False
    assert LocalCommunicator.takes_counts and AsyncCommunicator.takes_counts
    step = StepCollector(CollectiveCommunicator.__new__(CollectiveCommunicator), {0: DIM},
                         None, {0: "ctr"})
    assert step._ctr == {}  # noqa: SLF001 - counts are never made in collective mode


def test_feature_embeddings_count_every_feature_of_each_example_through_the_runtime(
        ) -> None:
    from psfleet.data.jagged import KeyedJagged
    from psfleet.data.jagged_rows import JaggedRows
    from psfleet.data.types import FeatureSchema
    from psfleet.fleet import DistributedStrategy, Role
    from psfleet.fleet.role_maker import RoleInfo
    from psfleet.fleet.runtime import ParameterServerHooks, RuntimeConfig, WorkerRuntime
    from psfleet.nn import EmbeddingTableSpec, FeatureEmbeddings
    from psfleet.rpc import RpcConfig

    schema = FeatureSchema(dense=(), sparse=("user", "item"), multi=("history",))
    features = FeatureEmbeddings(schema, [
        EmbeddingTableSpec("sc_fe_users", 2, ("user",), accessor={"name": "ctr"}),
        EmbeddingTableSpec("sc_fe_items", 3, ("item", "history"), accessor={"name": "ctr"},
                           shared_ids=True)])
    bias = torch.nn.Parameter(torch.zeros(1))
    optimizer = DistributedOptimizer(torch.optim.SGD([bias], lr=0.1))
    config = RuntimeConfig(RoleInfo(Role.WORKER, 0, 1), DistributedStrategy(),
                           RpcConfig(), 10.0)
    runtime = WorkerRuntime.connect(config, ParameterServerHooks(), optimizer,
                                    list(table_modules(features)))
    try:
        rng = np.random.default_rng(7)
        batch = 9
        raw = rng.integers(0, 6, size=(batch, 2)).astype(np.uint64)
        lengths = rng.integers(0, 4, size=(batch, 1)).astype(np.int32)
        history = rng.integers(0, 6, size=int(lengths.sum())).astype(np.uint64)
        labels = rng.integers(0, 2, size=batch).astype(np.float32)
        jagged = KeyedJagged.from_rows(("history",), JaggedRows(history, lengths))
        users, items = features(torch.from_numpy(raw.view(np.int64)), jagged)
        (users.sum() + items.sum() + bias).backward()
        optimizer.step(labels=torch.from_numpy(labels))
        runtime.flush()
        # The oracle, example by example: users read raw[:, 0]; items read raw[:, 1]
        # and the example's history ids, under one shared prefix (raw ids only here).
        starts = np.concatenate([[0], np.cumsum(lengths[:, 0])])
        item_ids = [np.concatenate([raw[b, 1:], history[starts[b]:starts[b + 1]]])
                    for b in range(batch)]
        item_keys = np.concatenate(item_ids)
        item_example = np.repeat(np.arange(batch), [ids.size for ids in item_ids])
        ids_by_table = {"sc_fe_users": (raw[:, 0], np.arange(batch)),
                        "sc_fe_items": (item_keys, item_example)}
        for name, (keys, example) in ids_by_table.items():
            table_id = runtime.tables.sparse_ids()[name]
            got_keys, stats = _stats(runtime.client, table_id)  # type: ignore[arg-type]
            _, shows, clicks = _reference(keys & np.uint64((1 << 33) - 1), example,
                                          labels.astype(np.float64))
            assert got_keys.size == shows.size
            np.testing.assert_array_equal(stats[:, 0], shows)
            np.testing.assert_array_equal(stats[:, 1], clicks)
    finally:
        runtime.stop()


def table_modules(features: torch.nn.Module) -> list[SparseEmbedding]:
    return [m for m in features.modules() if isinstance(m, SparseEmbedding)]
