"""SparseEmbeddingBag and FeatureEmbeddings over in-process tables, against oracles.

- The pooled output of random jagged input (empty bags included) and the gradient the
  step pushes equal ``torch.nn.EmbeddingBag`` (``sum`` and ``mean``; weighted ``sum``)
  or a hand-written reference (weighted ``mean``, ``sqrtn``: TensorFlow's combiner)
  over the same initial rows, to 1e-6; after one SGD step the table holds
  EmbeddingBag's weight after one ``torch.optim.SGD`` step.
- FeatureEmbeddings: two tables of different dims (one single-valued only, one mixed),
  one pull and one push per table, shared ids, the single-valued fast path equal to a
  plain SparseEmbedding, each configuration error.

Modules are bound as ``fleet.init_worker`` binds them: a :class:`WorkerRuntime` with a
local role (no servers; ``LocalClient``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from psfleet.data.jagged import KeyedJagged
from psfleet.data.jagged_rows import JaggedRows
from psfleet.data.types import FeatureSchema
from psfleet.errors import ConfigError
from psfleet.fleet import DistributedOptimizer, DistributedStrategy, Role, RoleInfo
from psfleet.fleet.runtime import ParameterServerHooks, RuntimeConfig, WorkerRuntime
from psfleet.fleet.step import StepCollector
from psfleet.nn import (
    POOLINGS,
    EmbeddingTableSpec,
    FeatureEmbeddings,
    Pooling,
    SparseEmbedding,
    SparseEmbeddingBag,
    live_embeddings,
    use_prefetched,
)
from psfleet.ps import LocalClient, RuleConfig
from psfleet.ps.communicator import AsyncCommunicator
from psfleet.ps.routing import RoutedKeys, keys_of
from psfleet.rpc import RpcConfig

pytestmark = pytest.mark.unit

LR = 0.1
DIM = 5
ATOL = 1e-6
SGD = RuleConfig(name="sgd", learning_rate=LR)


# -- binding ----------------------------------------------------------------------------


@dataclass
class Bound:
    """A runtime over ``modules``' tables that records every sparse push."""

    runtime: WorkerRuntime
    pushes: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)

    def step(self) -> None:
        """``optimizer.step()`` (the step's pushes), then wait until they are applied."""
        self.runtime.optimizer.step()
        self.runtime.flush()

    def rows(self, table_id: int, keys: np.ndarray, create: bool = False) -> np.ndarray:
        """What table ``table_id`` holds for keys (int64 or uint64 [U]) now."""
        return self.runtime.client.pull_sparse(table_id, keys.view(np.uint64), create=create)


def bind(modules: Sequence[torch.nn.Module], servers: Sequence[str] = (),
         mode: str = "async") -> Bound:
    """Bind the SparseEmbeddings of ``modules`` through a WorkerRuntime (SGD, lr 0.1)."""
    bias = torch.nn.Parameter(torch.zeros(1))
    optimizer = DistributedOptimizer(torch.optim.SGD([bias], lr=LR))
    config = RuntimeConfig(RoleInfo(Role.WORKER, 0, 1, server_endpoints=tuple(servers)),
                           DistributedStrategy(mode=mode),  # type: ignore[arg-type]
                           RpcConfig(deadline_s=20.0), 10.0)
    embeddings = [m for module in modules for m in module.modules()
                  if isinstance(m, SparseEmbedding)]
    bound = Bound(WorkerRuntime.connect(config, ParameterServerHooks(), optimizer,
                                        embeddings))
    real_push = bound.runtime.communicator.push_sparse

    def record(table_id: int, keys: np.ndarray | RoutedKeys, grads: np.ndarray) -> None:
        bound.pushes.append((table_id, keys_of(keys).copy(), grads.copy()))
        real_push(table_id, keys, grads)

    bound.runtime.communicator.push_sparse = record  # type: ignore[method-assign]
    return bound


@pytest.fixture
def stop_after() -> Iterator[list[Bound]]:
    """Runtimes appended here are stopped after the test."""
    started: list[Bound] = []
    yield started
    for bound in started:
        bound.runtime.stop()


# -- random jagged input and the references ---------------------------------------------


def random_bags(rng: np.random.Generator, bags: int, max_len: int = 6, vocab: int = 40,
                weighted: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """values int64 [N] (ids repeat within and across bags; some above 2^63 as uint64
    bits), offsets int64 [bags + 1] with about a quarter empty bags (the first and
    last always), weights float32 [N] in [-0.5, 2) or None."""
    lengths = rng.integers(1, max_len + 1, size=bags)
    lengths[rng.random(bags) < 0.25] = 0
    lengths[0] = lengths[-1] = 0
    pool = np.concatenate([rng.integers(0, 2**40, size=vocab - 2, dtype=np.uint64),
                           np.array([2**63 + 5, 2**64 - 3], np.uint64)])
    values = pool[rng.integers(0, vocab, size=int(lengths.sum()))].view(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    weights = (rng.uniform(-0.5, 2.0, size=values.size).astype(np.float32) if weighted
               else None)
    return (torch.from_numpy(values), torch.from_numpy(offsets),
            None if weights is None else torch.from_numpy(weights))


def reference_pool(rows: torch.Tensor, index: torch.Tensor, offsets: torch.Tensor,
                   weights: torch.Tensor | None, pooling: Pooling) -> torch.Tensor:
    """The pooling's formula (nn.types.Pooling) bag by bag: Tensor[K, D], float64.

    A loop per bag on purpose: it is the oracle, written the obvious way (TensorFlow's
    ``embedding_lookup_sparse`` combiners; zeros for an empty bag or a zero sum)."""
    out = []
    for k in range(offsets.numel() - 1):
        start, stop = int(offsets[k]), int(offsets[k + 1])
        e = rows[index[start:stop]].double()  # [n, D]
        w = (torch.ones(stop - start, dtype=torch.float64) if weights is None
             else weights[start:stop].double())
        total = (w[:, None] * e).sum(0)
        denominator = {"sum": torch.tensor(1.0, dtype=torch.float64), "mean": w.sum(),
                       "sqrtn": (w * w).sum().sqrt()}[pooling]
        out.append(total / denominator if float(denominator) != 0 else total * 0)
    return torch.stack(out)


def check_against_reference(bound: Bound, bag: SparseEmbeddingBag, pooling: Pooling,
                            weighted: bool, seed: int) -> None:
    """Forward, backward, push and one SGD step of ``bag`` against the oracle."""
    rng = np.random.default_rng(seed)
    values, offsets, weights = random_bags(rng, bags=33, weighted=weighted)
    keys, index = torch.unique(values, return_inverse=True)
    initial = torch.from_numpy(bound.rows(bag.table_id, keys.numpy(), create=True))  # [U, D]
    grad_out = torch.from_numpy(rng.normal(size=(offsets.numel() - 1, DIM))
                                .astype(np.float32))

    out = bag(values, offsets, weights)
    (out * grad_out).sum().backward()
    bound.step()

    torch_mode = pooling != "sqrtn" and not (weighted and pooling == "mean")
    if torch_mode:  # torch.nn.EmbeddingBag is the oracle
        reference = torch.nn.EmbeddingBag.from_pretrained(initial.clone(), freeze=False,
                                                          mode=pooling,
                                                          include_last_offset=True)
        expected = reference(index, offsets, per_sample_weights=weights)
        ref_weight = reference.weight
    else:  # the hand-written formula, differentiated by autograd
        ref_weight = torch.nn.Parameter(initial.clone().double())
        expected = reference_pool(ref_weight, index, offsets, weights, pooling)
    (expected * grad_out).sum().backward()
    assert ref_weight.grad is not None
    torch.optim.SGD([ref_weight], lr=LR).step()

    assert out.shape == (offsets.numel() - 1, DIM) and out.dtype == torch.float32
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=0,
                               atol=ATOL)
    empty = (offsets[1:] == offsets[:-1]).numpy()
    assert empty[0] and empty[-1] and not out[torch.from_numpy(empty)].any()
    # One push for the table: the distinct keys and EmbeddingBag's weight gradient.
    [(table_id, pushed_keys, pushed_grads)] = bound.pushes
    assert table_id == bag.table_id
    order = np.argsort(pushed_keys.view(np.int64))
    assert np.array_equal(pushed_keys.view(np.int64)[order], keys.numpy())
    np.testing.assert_allclose(pushed_grads[order], ref_weight.grad.numpy(), rtol=0,
                               atol=ATOL)
    # The table after one SGD step holds EmbeddingBag's weight after one SGD step.
    np.testing.assert_allclose(bound.rows(bag.table_id, keys.numpy()),
                               ref_weight.detach().numpy(), rtol=0, atol=ATOL)


# -- SparseEmbeddingBag -----------------------------------------------------------------


CASES = [(p, w) for p in POOLINGS for w in (False, True)]


@pytest.mark.parametrize(("pooling", "weighted"), CASES,
                         ids=[f"{p}-{'weighted' if w else 'plain'}" for p, w in CASES])
def test_bag_equals_torch_embedding_bag_forward_gradient_and_sgd_step(
        pooling: Pooling, weighted: bool, stop_after: list[Bound]) -> None:
    bag = SparseEmbeddingBag(DIM, name=f"bag_{pooling}_{weighted}", pooling=pooling,
                             initial_range=0.5)
    stop_after.append(bound := bind([bag]))
    check_against_reference(bound, bag, pooling, weighted, seed=len(pooling) + weighted)


def test_all_bags_empty_pools_zeros_and_pushes_nothing(stop_after: list[Bound]) -> None:
    bag = SparseEmbeddingBag(DIM, name="bag_all_empty", pooling="mean")
    stop_after.append(bound := bind([bag]))
    out = bag(torch.zeros(0, dtype=torch.int64), torch.zeros(4, dtype=torch.int64))
    assert out.shape == (3, DIM) and not out.any()
    out.sum().backward()
    bound.step()
    [(_, keys, grads)] = bound.pushes
    assert keys.size == 0 and grads.shape == (0, DIM)


def test_two_bag_forwards_of_one_table_are_one_merged_push(stop_after: list[Bound]) -> None:
    bag = SparseEmbeddingBag(DIM, name="bag_twice", pooling="sum")
    stop_after.append(bound := bind([bag]))
    a = bag(torch.tensor([7, 8, 7]), torch.tensor([0, 2, 3]))
    b = bag(torch.tensor([8, 9]), torch.tensor([0, 2]))
    (a.sum() + 2 * b.sum()).backward()
    bound.step()
    [(_, keys, grads)] = bound.pushes
    order = np.argsort(keys)
    assert keys[order].tolist() == [7, 8, 9]
    np.testing.assert_allclose(grads[order], [[2.0] * DIM, [3.0] * DIM, [2.0] * DIM],
                               rtol=0, atol=ATOL)


def test_bad_bag_arguments_are_config_errors(stop_after: list[Bound]) -> None:
    with pytest.raises(ConfigError, match=r"'bag_bad_pooling'.*'max' is not one of sum, "
                                          r"mean, sqrtn"):
        SparseEmbeddingBag(DIM, name="bag_bad_pooling", pooling="max")  # type: ignore[arg-type]
    bag = SparseEmbeddingBag(DIM, name="bag_bad_args")
    stop_after.append(bind([bag]))
    values = torch.tensor([1, 2, 3])
    with pytest.raises(ConfigError, match="from 0 to 3"):
        bag(values, torch.tensor([0, 2]))  # does not end at N
    with pytest.raises(ConfigError, match="non-decreasing"):
        bag(values, torch.tensor([0, 2, 1, 3]))
    with pytest.raises(ConfigError, match="offsets must be int64"):
        bag(values, torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ConfigError, match="weights must be float32"):
        bag(values, torch.tensor([0, 3]), torch.ones(2))
    with pytest.raises(ConfigError, match="ids must be int64"):
        bag(values.int(), torch.tensor([0, 3]))


# -- FeatureEmbeddings ------------------------------------------------------------------


SCHEMA = FeatureSchema(dense=("d0",), sparse=("user", "age", "item", "city"),
                       multi=("history", "tags"))


def two_tables(shared: bool = False, pooling: Pooling = "mean") -> list[EmbeddingTableSpec]:
    """A single-valued table (dim 3) and a mixed one (dim 4: an item and its history
    and tags)."""
    return [EmbeddingTableSpec("fe_people", 3, ("city", "user", "age"), initial_range=0.5),
            EmbeddingTableSpec("fe_items", 4, ("history", "item", "tags"), pooling=pooling,
                               initial_range=0.5, shared_ids=shared)]


def random_batch(rng: np.random.Generator, batch: int, weighted: bool = False,
                 keys: tuple[str, ...] = ("tags", "history")
                 ) -> tuple[torch.Tensor, KeyedJagged]:
    """Keys as the parsers make them, ``((slot + 1) << 33) | id`` with ids from a small
    vocabulary (so raw ids repeat across features); jagged keys in the order given."""
    slot = {name: i for i, name in enumerate(SCHEMA.features)}
    raw = rng.integers(0, 12, size=(batch, 4)).astype(np.uint64)
    sparse = raw | np.array([(slot[n] + 1) << 33 for n in SCHEMA.sparse], np.uint64)
    lengths = rng.integers(0, 5, size=(batch, len(keys))).astype(np.int32)
    lengths[:1] = 0  # an example with every bag empty
    prefixes = np.repeat(np.tile(np.array([(slot[k] + 1) << 33 for k in keys], np.uint64),
                                 batch), lengths.reshape(-1))
    values = rng.integers(0, 12, size=int(lengths.sum())).astype(np.uint64) | prefixes
    weights = (rng.uniform(0.1, 2.0, size=values.size).astype(np.float32) if weighted
               else None)
    jagged = KeyedJagged.from_rows(keys, JaggedRows(values, lengths, weights))
    return torch.from_numpy(sparse.view(np.int64)), jagged


def table_modules(features: FeatureEmbeddings) -> list[SparseEmbedding]:
    """``features.embeddings`` typed: one SparseEmbedding (or bag) per table."""
    modules = list(features.embeddings)
    assert all(isinstance(m, SparseEmbedding) for m in modules)
    return modules  # type: ignore[return-value]


def expected_table(bound: Bound, table_id: int, sparse: torch.Tensor, jagged: KeyedJagged,
                   spec: EmbeddingTableSpec, shared_prefix: int | None) -> torch.Tensor:
    """Table ``spec``'s output [B, F_t, D] from the rows the table holds, feature by
    feature and example by example (the oracle)."""
    batch = sparse.shape[0]
    out = torch.zeros(batch, len(spec.features), spec.dim, dtype=torch.float64)
    starts = np.concatenate([[0], np.cumsum(jagged.length_per_key())])
    for f, name in enumerate(spec.features):
        for b in range(batch):
            if name in SCHEMA.sparse:
                ids = sparse[b, SCHEMA.sparse.index(name)].reshape(1)
                w = None
            else:
                k = jagged.keys.index(name)
                first = int(starts[k] + jagged.lengths[k * batch:k * batch + b].sum())
                n = int(jagged.lengths[k * batch + b])
                ids = jagged.values[first:first + n]
                w = None if jagged.weights is None else jagged.weights[first:first + n]
            if shared_prefix is not None:
                ids = (ids & ((1 << 33) - 1)) | shared_prefix
            rows = torch.from_numpy(bound.rows(table_id, ids.numpy()))
            out[b, f] = reference_pool(rows, torch.arange(ids.numel()),
                                       torch.tensor([0, ids.numel()]), w, spec.pooling)[0]
    return out


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_two_tables_of_different_dims_pool_and_push_once_each(
        weighted: bool, stop_after: list[Bound]) -> None:
    specs = two_tables(pooling="sqrtn" if weighted else "mean")
    features = FeatureEmbeddings(SCHEMA, specs)
    people, items = features.embeddings
    assert type(people) is SparseEmbedding and type(items) is SparseEmbeddingBag
    assert features.output_dim == 3 * 3 + 3 * 4 and features.tables == tuple(specs)
    stop_after.append(bound := bind([features]))
    assert bound.runtime.tables.sparse_ids() == {"fe_items": 0, "fe_people": 1}
    rng = np.random.default_rng(3)
    sparse, jagged = random_batch(rng, 16, weighted=weighted)

    parts = features(sparse, jagged)
    assert [tuple(p.shape) for p in parts] == [(16, 3, 3), (16, 3, 4)]
    flat = features.flatten(parts)
    assert flat.shape == (16, features.output_dim)
    assert torch.equal(flat[:, 9:], parts[1].reshape(16, -1))
    for part, spec, module in zip(parts, specs, table_modules(features), strict=True):
        want = expected_table(bound, module.table_id, sparse, jagged, spec, None)
        np.testing.assert_allclose(part.detach().numpy(), want.numpy(), rtol=0, atol=ATOL)
    # Example 0: history and tags are empty bags (zeros), its item is a row.
    assert not parts[1][0, 0].any() and not parts[1][0, 2].any() and parts[1][0, 1].any()

    # One push per table; the item table's gradient sums every use of a key.
    (flat * torch.linspace(-1, 1, flat.shape[1])).sum().backward()
    bound.step()
    assert sorted(t for t, _, _ in bound.pushes) == [0, 1]
    assert bound.runtime.step.sparse_pushes == 2


def test_shared_ids_make_the_same_raw_id_one_row(stop_after: list[Bound]) -> None:
    features = FeatureEmbeddings(SCHEMA, two_tables(shared=True, pooling="sum"))
    stop_after.append(bound := bind([features]))
    item_slot = SCHEMA.features.index("history")  # the table's first feature
    prefix = (item_slot + 1) << 33
    slot_of = {n: (i + 1) << 33 for i, n in enumerate(SCHEMA.features)}
    sparse = torch.tensor([[slot_of["user"] | 1, slot_of["age"] | 1, slot_of["item"] | 5,
                            slot_of["city"] | 1]])
    jagged = KeyedJagged(("history", "tags"),
                         torch.tensor([slot_of["history"] | 5, slot_of["history"] | 6,
                                       slot_of["tags"] | 5]),
                         torch.tensor([2, 1], dtype=torch.int32), None, 1)
    # What each table reads: the people table its columns in spec order (per-slot
    # keys); the item table its bags, feature-major, under the table's one prefix.
    (people_ids, none, _), (values, offsets, weights) = features.table_inputs(sparse, jagged)
    assert none is None and people_ids.tolist() == [[sparse[0, 3], sparse[0, 0], sparse[0, 1]]]
    assert values.tolist() == [prefix | 5, prefix | 6, prefix | 5, prefix | 5]
    assert offsets is not None and offsets.tolist() == [0, 2, 3, 4] and weights is None
    people, items = features(sparse, jagged)
    # history = row(5) + row(6); item = row(5); tags = row(5): one row for raw id 5.
    assert torch.equal(items[0, 1], items[0, 2])
    rows = bound.rows(0, np.array([prefix | 5, prefix | 6], np.int64))
    np.testing.assert_allclose(items[0].detach().numpy(),
                               [rows[0] + rows[1], rows[0], rows[0]], rtol=0, atol=ATOL)
    # Without shared ids the people table keeps the per-slot keys: three rows.
    assert not torch.equal(people[0, 1], people[0, 2])
    (items.sum() + people.sum()).backward()
    bound.step()
    pushed = {t: (k, g) for t, k, g in bound.pushes}
    keys, grads = pushed[0]
    order = np.argsort(keys)
    assert keys[order].tolist() == [prefix | 5, prefix | 6]
    np.testing.assert_allclose(grads[order], [[3.0] * 4, [1.0] * 4], rtol=0, atol=ATOL)
    assert pushed[1][0].size == 3


def test_single_valued_fast_path_equals_a_plain_sparse_embedding(
        criteo_dir: Path, stop_after: list[Bound]) -> None:
    """On real Criteo rows: a single-valued table gives SparseEmbedding's output, and a
    table of every column in schema order is read without a copy of the ids."""
    from psfleet.data import NUM_SLOTS, parse_lines

    with (criteo_dir / "train.csv").open(encoding="utf-8") as f:
        lines = [line for _, line in zip(range(64), f, strict=False)]
    chunk = parse_lines(lines, "train.csv")
    sparse = torch.from_numpy(chunk.sparse.view(np.int64))  # [64, 26]
    slots = tuple(f"C{i + 1}" for i in range(NUM_SLOTS))
    schema = FeatureSchema(dense=(), sparse=slots)
    reordered = (slots[5], slots[0], slots[9])
    features = FeatureEmbeddings(schema, [
        EmbeddingTableSpec("fast_all", 4, slots[:], initial_range=0.5),
    ])
    picked = FeatureEmbeddings(FeatureSchema(dense=(), sparse=reordered), [
        EmbeddingTableSpec("fast_some", 4, reordered, initial_range=0.5)])
    plain = SparseEmbedding(4, name="fast_plain", initial_range=0.5)
    stop_after.append(bind([features, picked, plain]))
    [out] = features(sparse)
    expected = plain(sparse)  # same initializer, same keys: the same rows
    assert torch.equal(out, expected)
    assert features.flatten([out]).data_ptr() == out.data_ptr()  # a view
    cols = torch.tensor([5, 0, 9])
    [some] = picked(sparse[:, cols].contiguous())
    assert torch.equal(some, expected[:, cols])


def test_feature_embeddings_prefetch_is_consumed_by_the_forward() -> None:
    features = FeatureEmbeddings(SCHEMA, two_tables())
    client = LocalClient()
    communicator = AsyncCommunicator(client)
    step = StepCollector(communicator, {0: 3, 1: 4}, None)
    pulls: list[int] = []
    start_pull = step.start_pull

    def counting(table_id: int, keys: np.ndarray, create: bool) -> object:
        pulls.append(table_id)
        return start_pull(table_id, keys, create)

    step.start_pull = counting  # type: ignore[assignment]
    for table_id, module in enumerate(table_modules(features)):
        client.create_sparse_table(table_id, module.table_config(SGD))
        module.bind(step, table_id)
    sparse, jagged = random_batch(np.random.default_rng(9), 8)
    handles = features.prefetch(sparse, jagged)
    assert all(h is not None for h in handles) and pulls == [0, 1]
    copy = KeyedJagged(jagged.keys, jagged.values.clone(), jagged.lengths.clone(), None,
                       jagged.stride)
    with use_prefetched(handles):
        prefetched = features(sparse.clone(), copy)
    assert pulls == [0, 1]  # both tables used their prefetched rows
    fresh = features(sparse, jagged)
    assert pulls == [0, 1, 0, 1]
    for a, b in zip(prefetched, fresh, strict=True):
        assert torch.equal(a, b)
    features.eval()
    assert features.prefetch(sparse, jagged) == [None, None]  # only training prefetches


def test_an_empty_batch_gives_empty_outputs(stop_after: list[Bound]) -> None:
    features = FeatureEmbeddings(SCHEMA, two_tables())
    stop_after.append(bind([features]))
    sparse, jagged = random_batch(np.random.default_rng(2), 0)
    parts = features(sparse, jagged)
    assert [tuple(p.shape) for p in parts] == [(0, 3, 3), (0, 3, 4)]
    assert features.flatten(parts).shape == (0, features.output_dim)


def test_live_embeddings_see_each_table() -> None:
    gc.collect()  # modules of earlier tests, whose names repeat
    features = FeatureEmbeddings(SCHEMA, [
        EmbeddingTableSpec("live_people", 3, ("user", "age", "item", "city")),
        EmbeddingTableSpec("live_items", 4, ("history", "tags"))])
    live = {e.name: e for e in live_embeddings()}
    assert live["live_people"] is features.embeddings[0]
    assert live["live_items"] is features.embeddings[1]


def test_stack_needs_one_dim() -> None:
    a, b = torch.zeros(2, 3, 4), torch.ones(2, 1, 4)
    assert torch.equal(FeatureEmbeddings.stack([a, b]), torch.cat([a, b], dim=1))
    with pytest.raises(ConfigError, match=r"different dims \[4, 5\]"):
        FeatureEmbeddings.stack([a, torch.zeros(2, 1, 5)])


@pytest.mark.parametrize(("tables", "message"), [
    ([("t1", ("user", "age", "item", "city", "history"))], r"\['tags'\].*in no table"),
    ([("t1", ("user", "age", "item", "city", "history", "tags")), ("t2", ("tags",))],
     r"'tags' is in tables 't1' and 't2'"),
    ([("t1", ("user", "age", "item", "city", "history", "tags", "zip"))],
     r"'t1' names features \['zip'\] that are not in the schema"),
    ([("t1", ("user", "age", "item")), ("t1", ("city", "history", "tags"))],
     r"table names \['t1'\] are used more than once"),
    ([], "no tables"),
], ids=["unread", "twice", "unknown", "same_name", "none"])
def test_bad_table_specs_are_config_errors(tables: list[tuple[str, tuple[str, ...]]],
                                          message: str) -> None:
    specs = [EmbeddingTableSpec(name, 4, feats) for name, feats in tables]
    with pytest.raises(ConfigError, match=message):
        FeatureEmbeddings(SCHEMA, specs)


def test_bad_specs_and_inputs_are_config_errors(stop_after: list[Bound]) -> None:
    with pytest.raises(ConfigError, match="'t_empty': features is empty"):
        EmbeddingTableSpec("t_empty", 4, ())
    with pytest.raises(ConfigError, match=r"'t_rep': features \['a'\] are named more"):
        EmbeddingTableSpec("t_rep", 4, ("a", "b", "a"))
    with pytest.raises(ConfigError, match="'t_pool': pooling 'avg' is not one of"):
        EmbeddingTableSpec("t_pool", 4, ("a",), pooling="avg")  # type: ignore[arg-type]
    features = FeatureEmbeddings(SCHEMA, two_tables())
    stop_after.append(bind([features]))
    sparse, jagged = random_batch(np.random.default_rng(0), 4)
    with pytest.raises(ConfigError, match="jagged is None"):
        features(sparse)
    with pytest.raises(ConfigError, match=r"sparse must be int64 \[B, 4\]"):
        features(sparse[:, :3], jagged)
    with pytest.raises(ConfigError, match=r"must carry \['history', 'tags'\] for 2"):
        features(sparse[:2], jagged)
