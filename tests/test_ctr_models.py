"""The runner's CTR models over a schema (dnn, wide_deep, deepfm, dcn_v2): formulas
against brute force, PaddleRec's initialisation, config errors, and training on real
Criteo rows with multi-valued features through the fleet API (in-process tables).

The data: the shared Criteo sample parsed by the ``criteo`` parser (InMemoryDataset),
C14..C26 regrouped into two multi-valued features of the present values
(``jobs/model_oracle_job.py``: 0 to 6 and 0 to 7 ids per example).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from conftest import require_shared_data
from jobs.model_oracle_job import SCHEMA, TABLES, multi_hot_batch
from torch import Tensor, nn

from psfleet.data import Batch, CriteoReader, InMemoryDataset, make_parser
from psfleet.data.types import FeatureSchema
from psfleet.errors import ConfigError
from psfleet.fleet import DistributedOptimizer, Fleet, Role, UserDefinedRoleMaker
from psfleet.metrics import auc
from psfleet.nn import EmbeddingTableSpec, FeatureEmbeddings, SparseEmbedding
from psfleet.rec.models import (
    DNN,
    CrossNetwork,
    DCNv2,
    DeepFM,
    WideDeep,
    build_model,
    fm_second_order,
)

pytestmark = pytest.mark.unit

DATA_DIR = require_shared_data()  # ../shared/data/criteo_kaggle_sample, or fail
MODELS = {"dnn": DNN, "wide_deep": WideDeep, "deepfm": DeepFM, "dcn_v2": DCNv2}
FC_SIZES = (32, 16)


@pytest.fixture(scope="module")
def batches() -> list[Batch]:
    """The first 512 rows of train.csv in batches of 64, with SCHEMA's features."""
    dataset = InMemoryDataset(64, make_parser("criteo"))
    dataset.set_filelist([DATA_DIR / "train.csv"])
    dataset.load_into_memory()
    dataset.truncate(512)
    return [multi_hot_batch(b) for b in dataset]


def make_model(name: str, seed: int = 0, tables: tuple[EmbeddingTableSpec, ...] = TABLES,
               **extra: object) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(name, embeddings=FeatureEmbeddings(SCHEMA, tables),
                       num_dense=len(SCHEMA.dense), fc_sizes=FC_SIZES, **extra)


@contextlib.contextmanager
def local_fleet(model: nn.Module, lr: float = 0.01
                ) -> Iterator[tuple[Fleet, DistributedOptimizer]]:
    """A worker on in-process tables (no servers) training ``model`` with Adam."""
    fleet = Fleet()
    fleet.init(UserDefinedRoleMaker(0, Role.WORKER, 1, []))
    fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=lr))
    fleet.init_worker()
    try:
        yield fleet, optimizer
    finally:
        fleet.stop_worker()


def tables_of(model: nn.Module) -> dict[str, int]:
    """Table name -> table id of every sparse table of ``model``."""
    return {m.name: m.table_id for m in model.modules() if isinstance(m, SparseEmbedding)}


def logits_of(model: nn.Module, batch: Batch) -> Tensor:
    out: Tensor = model(batch.sparse, batch.dense, batch.jagged)
    return out


# -- formulas -------------------------------------------------------------------------


def test_fm_term_equals_the_brute_force_pairwise_sum() -> None:
    generator = torch.Generator().manual_seed(1)
    embedded = torch.randn(7, 5, 3, generator=generator, dtype=torch.float64)

    pairs = sum(
        (embedded[:, i] * embedded[:, j]).sum(dim=1)
        for i, j in itertools.combinations(range(5), 2))

    assert torch.allclose(fm_second_order(embedded), pairs, atol=1e-12)
    assert fm_second_order(embedded[:, :1]).abs().max() < 1e-12  # one field: no pairs


def test_cross_layers_follow_dcn_v2_equation_1() -> None:
    generator = torch.Generator().manual_seed(2)
    cross = CrossNetwork(6, 2, generator).double()
    with torch.no_grad():
        for layer in cross.layers:  # non-zero biases, so the b_l term is tested too
            layer.bias.normal_(generator=generator)
    x0 = torch.randn(4, 6, generator=generator, dtype=torch.float64)
    (w0, b0), (w1, b1) = ((lay.weight, lay.bias) for lay in cross.layers)

    x1 = x0 * (x0 @ w0.T + b0) + x0
    x2 = x0 * (x1 @ w1.T + b1) + x1

    assert torch.allclose(cross(x0), x2, atol=1e-12)


def test_deepfm_logit_is_first_order_plus_pairwise_plus_deep(batches: list[Batch]) -> None:
    model = make_model("deepfm")
    assert isinstance(model, DeepFM)
    batch = batches[0]
    with local_fleet(model):
        logits = logits_of(model, batch)
        parts = model.embeddings(batch.sparse, batch.jagged)  # [B, 13, 4], [B, 2, 4]
        fields = torch.cat(parts, dim=1).double()  # [B, 15, 4]
        pairs = sum((fields[:, i] * fields[:, j]).sum(dim=1)
                    for i, j in itertools.combinations(range(15), 2))
        first = model.first_order(batch.sparse, batch.dense, batch.jagged)
        deep = model.deep(torch.cat([parts[0].flatten(1), parts[1].flatten(1), batch.dense],
                                    dim=1)).squeeze(1)
    assert torch.allclose(logits.double(), first.double() + pairs + deep.double(), atol=1e-5)


def test_wide_part_sums_a_weight_per_id_plus_a_linear_of_dense(batches: list[Batch]) -> None:
    model = make_model("wide_deep")
    assert isinstance(model, WideDeep)
    batch = batches[1]
    with local_fleet(model) as (fleet, _):
        wide = model.wide(batch.sparse, batch.dense, batch.jagged)
        deep = model.deep(torch.cat([model.embeddings.flatten(
            model.embeddings(batch.sparse, batch.jagged)), batch.dense], dim=1)).squeeze(1)
        logits = logits_of(model, batch)
        # Brute force: the wide table's row of every id the example holds, summed.
        assert batch.jagged is not None
        single = batch.sparse.numpy().view(np.uint64)  # [B, 13]
        multi = batch.jagged.values.numpy().view(np.uint64)
        keys = np.unique(np.concatenate([single.ravel(), multi]))
        weight = dict(zip(keys.tolist(), fleet.client.pull_sparse(
            tables_of(model)["wide"], keys, create=False)[:, 0].tolist(), strict=True))
        per_example = [sum(weight[k] for k in row) for row in single.tolist()]
        owner = np.repeat(np.tile(np.arange(len(batch)), 2), batch.jagged.lengths.numpy())
        for key, example in zip(multi.tolist(), owner.tolist(), strict=True):
            per_example[example] += weight[key]
    assert model.wide.dense is not None
    linear = batch.dense.double() @ model.wide.dense.weight.double().T[:, 0]
    expected = torch.tensor(per_example, dtype=torch.float64) + linear
    assert torch.allclose(wide.double(), expected, atol=1e-5)
    assert torch.allclose(logits, wide + deep, atol=1e-6)


# -- construction ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_initialisation_follows_paddlerec_and_the_seed(name: str) -> None:
    model = make_model(name, seed=5)
    again = make_model(name, seed=5)
    other = make_model(name, seed=6)
    assert isinstance(model, MODELS[name])
    assert model.schema == SCHEMA
    params = dict(model.named_parameters())
    assert all(torch.equal(p, q) for p, q in zip(params.values(), again.parameters(),
                                                 strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(params.values(), other.parameters(),
                                                     strict=True))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert all(torch.all(m.bias == 0) for m in linears)
    biggest = max(linears, key=lambda m: m.weight.numel())
    assert biggest.weight.mean().item() == pytest.approx(0.0, abs=0.01)
    assert biggest.weight.std().item() == pytest.approx(1 / math.sqrt(biggest.in_features),
                                                        rel=0.05)
    width = 13 * 4 + 2 * 4 + 13  # ids + context tables, then the dense features
    first_deep = next(m for m in (model.mlp if name == "dnn" else model.deep)
                      if isinstance(m, nn.Linear))
    assert first_deep.in_features == width


def test_layer_shapes_of_each_model() -> None:
    width = 13 * 4 + 2 * 4 + 13
    dcn = make_model("dcn_v2", cross_layers=2)
    assert isinstance(dcn, DCNv2)
    assert [tuple(lay.weight.shape) for lay in dcn.cross.layers] == [(width, width)] * 2
    assert [(m.in_features, m.out_features) for m in dcn.deep if isinstance(m, nn.Linear)] \
        == [(width, 32), (32, 16), (16, 1)]
    for name in ("wide_deep", "deepfm"):
        model = make_model(name)
        linear = model.wide if name == "wide_deep" else model.first_order
        assert [t.name for t in linear.wide.tables] == ["wide"]
        assert linear.wide.tables[0].dim == 1 and linear.wide.tables[0].features == \
            SCHEMA.features and linear.wide.tables[0].rule is None
        assert (linear.dense.in_features, linear.dense.out_features) == (13, 1)


def test_config_errors_name_the_problem() -> None:
    embeddings = FeatureEmbeddings(SCHEMA, TABLES)
    with pytest.raises(ConfigError, match=r"'dcn_v2': unknown argument\(s\) cross_layer;"):
        build_model("dcn_v2", embeddings=embeddings, num_dense=13, cross_layer=2)
    with pytest.raises(ConfigError, match=r"'deepfm': unknown argument\(s\) cross_layers"):
        build_model("deepfm", embeddings=embeddings, cross_layers=2)
    with pytest.raises(ConfigError, match="embedding_dim come from the FeatureEmbeddings"):
        build_model("dnn", embeddings=embeddings, embedding_dim=4)
    with pytest.raises(ConfigError, match="num_dense 12 differs from the schema's 13"):
        build_model("wide_deep", embeddings=embeddings, num_dense=12)
    with pytest.raises(ConfigError, match="cross_layers: 0 must be >= 1"):
        build_model("dcn_v2", embeddings=embeddings, cross_layers=0)
    with pytest.raises(ConfigError, match="fc_sizes"):
        build_model("deepfm", embeddings=embeddings, fc_sizes=[8, 0])
    with pytest.raises(ConfigError, match="embeddings must be a psfleet.nn.FeatureEmbeddings"):
        build_model("deepfm", embeddings=SparseEmbedding(4, name="not_features"))
    wide = (EmbeddingTableSpec("wide", 4, SCHEMA.sparse), TABLES[1])
    with pytest.raises(ConfigError, match="'wide' is the model's first-order table"):
        build_model("wide_deep", embeddings=FeatureEmbeddings(SCHEMA, wide))


def test_deepfm_needs_every_table_of_one_dim() -> None:
    tables = (TABLES[0], EmbeddingTableSpec("context", 8, SCHEMA.multi))
    with pytest.raises(ConfigError, match=r"one dim; got ids: 4, context: 8"):
        build_model("deepfm", embeddings=FeatureEmbeddings(SCHEMA, tables))
    for name in ("dnn", "wide_deep", "dcn_v2"):  # the others take any dims
        model = build_model(name, embeddings=FeatureEmbeddings(SCHEMA, tables))
        assert next(m for m in model.modules() if isinstance(m, nn.Linear)).in_features \
            == 13 * 4 + 2 * 8 + 13


# -- through the fleet API ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_gives_a_logit_per_example_and_checks_shapes(
        name: str, batches: list[Batch]) -> None:
    model = make_model(name)
    batch = batches[0]
    with local_fleet(model):
        logits = logits_of(model, batch)
        assert logits.shape == (64,) and logits.dtype == torch.float32
        assert torch.isfinite(logits).all() and logits.std() > 0
        with pytest.raises(ConfigError, match=r"sparse_ids: expected shape \[B, 13\]"):
            model(torch.zeros(4, 26, dtype=torch.int64), torch.zeros(4, 13), batch.jagged)
        with pytest.raises(ConfigError, match=r"dense: expected shape \[64, 13\]"):
            model(batch.sparse, batch.dense[:, :12], batch.jagged)
        with pytest.raises(ConfigError, match="jagged: the schema has multi-valued"):
            model(batch.sparse, batch.dense)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_gradients_reach_every_parameter_and_table(name: str, batches: list[Batch]) -> None:
    model = make_model(name)
    batch = batches[2]
    assert batch.jagged is not None
    single = np.unique(batch.sparse.numpy().view(np.uint64))
    multi = np.unique(batch.jagged.values.numpy().view(np.uint64))
    keys = {"ids": single, "context": multi, "wide": np.union1d(single, multi)}
    with local_fleet(model) as (fleet, optimizer):
        tables = tables_of(model)
        assert sorted(tables) == (["context", "ids", "wide"]
                                  if name in ("wide_deep", "deepfm") else ["context", "ids"])
        loss = nn.functional.binary_cross_entropy_with_logits(logits_of(model, batch),
                                                              batch.labels)
        optimizer.zero_grad()
        loss.backward()
        for pname, param in model.named_parameters():
            assert param.grad is not None and param.grad.abs().sum() > 0, pname
        before = {t: fleet.client.pull_sparse(i, keys[t], create=False)
                  for t, i in tables.items()}
        optimizer.step()
        fleet.flush()
        for table, table_id in tables.items():
            after = fleet.client.pull_sparse(table_id, keys[table], create=False)
            moved = np.any(after != before[table], axis=1)
            assert moved.mean() > 0.95, (table, moved.mean())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_model_learns_real_rows_through_fleet(name: str, batches: list[Batch]) -> None:
    model = make_model(name)
    loss_fn = nn.BCEWithLogitsLoss()
    with local_fleet(model) as (_, optimizer):
        epoch_losses = []
        for _ in range(5):
            total = 0.0
            for batch in batches:
                loss = loss_fn(logits_of(model, batch), batch.labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item()
            epoch_losses.append(total / len(batches))
        with torch.no_grad():
            labels = torch.cat([b.labels for b in batches])
            probs = torch.cat([torch.sigmoid(logits_of(model, b)) for b in batches])
    assert epoch_losses[-1] < 0.7 * epoch_losses[0], epoch_losses
    assert auc(labels, probs) > 0.85  # fits the rows it trained on


# -- dnn: both forms ------------------------------------------------------------------


def test_dnn_over_one_table_equals_the_fixed_width_dnn() -> None:
    """A FeatureEmbeddings with one table over Criteo's 26 slots is the classic DNN."""
    batch = next(iter(CriteoReader([DATA_DIR / "dev.csv"], batch_size=32)))
    criteo = FeatureSchema(dense=tuple(f"I{i}" for i in range(1, 14)),
                           sparse=tuple(f"C{i}" for i in range(1, 27)))
    torch.manual_seed(3)
    classic = DNN(SparseEmbedding(4, name="embedding"), embedding_dim=4, fc_sizes=(16, 8))
    torch.manual_seed(3)
    schema_form = build_model("dnn", embeddings=FeatureEmbeddings(
        criteo, [EmbeddingTableSpec("embedding", 4, criteo.sparse)]), fc_sizes=(16, 8))
    assert isinstance(schema_form, DNN)
    assert classic.schema == schema_form.schema == criteo
    assert all(torch.equal(p, q) for p, q in zip(classic.parameters(),
                                                 schema_form.parameters(), strict=True))
    with local_fleet(classic):
        expected = classic(batch.sparse, batch.dense)
    with local_fleet(schema_form):
        got = schema_form(batch.sparse, batch.dense)
    assert torch.equal(got, expected)
    with pytest.raises(ConfigError, match="jagged: this dnn reads fixed-width slots only"):
        classic(batch.sparse, batch.dense, multi_hot_batch(batch).jagged)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_schema_without_dense_or_multi_valued_features(name: str) -> None:
    """Criteo's 26 slots only: no dense input (no dense Linear), jagged None."""
    batch = next(iter(CriteoReader([DATA_DIR / "dev.csv"], batch_size=16)))
    schema = FeatureSchema(dense=(), sparse=tuple(f"C{i}" for i in range(1, 27)))
    torch.manual_seed(0)
    model = build_model(name, embeddings=FeatureEmbeddings(
        schema, [EmbeddingTableSpec("slots", 3, schema.sparse)]), num_dense=0, fc_sizes=[8])
    no_dense = batch.dense[:, :0]
    with local_fleet(model) as (_, optimizer):
        logits = model(batch.sparse, no_dense)
        assert logits.shape == (16,) and torch.isfinite(logits).all()
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with pytest.raises(ConfigError, match=r"dense: expected shape \[16, 0\]"):
            model(batch.sparse, batch.dense)
    first = next(m for m in model.modules() if isinstance(m, nn.Linear))
    assert first.in_features == 26 * 3
