"""Export for serving, in process: lookup, dense tower, directory round trip.

Oracles: the training table's own evaluation pull (``pull(create=False)``: stored rows
as they are, other keys their key-seeded initial values) and the eager model.
- The offline lookup returns exactly what the training table returns for stored and
  unseen keys, for every initializer; a save from 1 or 3 "servers" reads back whole.
- An exported model (memory:// and local paths) scores a batch as the eager model
  with the table's rows does, for models with one and with two tables.
- A model computing with its key values outside its embeddings cannot be exported;
  a damaged or foreign directory is refused naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from psfleet.errors import ConfigError, DataError, FatalError
from psfleet.export import (
    SparseLookup,
    load_inference_model,
    read_manifest,
    save_inference_model,
)
from psfleet.export.save import read_saved_rows
from psfleet.nn import SparseEmbedding
from psfleet.ps import LocalClient
from psfleet.ps.persist import save_server
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import RuleConfig, SparseTableConfig
from psfleet.rec.models import DNN

pytestmark = pytest.mark.unit

RULE = RuleConfig(name="adam", learning_rate=0.05)


def _keys(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(1, 2**63, size=n, dtype=np.int64).view(np.uint64) * np.uint64(2)


def _trained_table(config: SparseTableConfig, keys: np.ndarray, seed: int = 0) -> SparseTable:
    rng = np.random.default_rng(seed)
    table = SparseTable(config)
    table.pull(keys)
    for _ in range(3):
        table.push(keys, rng.normal(size=(keys.size, config.dim)).astype(np.float32))
    return table


@pytest.mark.parametrize("initializer", ["uniform", "normal", "zeros"])
def test_lookup_equals_the_training_tables_evaluation_pull(initializer: str) -> None:
    rng = np.random.default_rng(1)
    config = SparseTableConfig(name="emb", dim=5, rule=RULE, initializer=initializer,
                               initial_range=0.3, seed=7)
    stored = _keys(rng, 2000)
    table = _trained_table(config, stored)
    keys, rows = table.items()
    lookup = SparseLookup(keys, np.ascontiguousarray(rows[:, :5]), initializer, 0.3, 7, "emb")
    unseen = _keys(rng, 500) + np.uint64(1)  # odd: never stored
    query = np.concatenate([stored[::3], unseen, stored[:10], unseen[:5]])

    got = lookup.lookup(query)

    np.testing.assert_array_equal(got, table.pull(query, create=False))
    assert lookup.contains(query).sum() == stored[::3].size + 10
    assert not table.contains(unseen).any()  # the evaluation pull created nothing
    if initializer != "zeros":
        assert np.abs(got[stored[::3].size:][:500]).max() > 0  # initializer rows, not zeros


def test_lookup_of_an_empty_table_gives_initial_rows() -> None:
    lookup = SparseLookup(np.zeros(0, np.uint64), np.zeros((0, 3), np.float32),
                          "uniform", 0.01, 0)
    keys = np.array([1, 5, 2**64 - 2], dtype=np.uint64)
    reference = SparseTable(SparseTableConfig(name="t", dim=3))
    np.testing.assert_array_equal(lookup.lookup(keys), reference.pull(keys, create=False))


def test_lookup_refuses_unsorted_keys() -> None:
    with pytest.raises(DataError, match="strictly ascending"):
        SparseLookup(np.array([3, 1], np.uint64), np.zeros((2, 2), np.float32), "zeros", 0, 0,
                     "emb")


@pytest.mark.parametrize("servers", [1, 3])
def test_rows_read_back_from_a_save_of_any_server_count(tmp_path: Path, servers: int) -> None:
    config = SparseTableConfig(name="emb", dim=4, rule=RULE, num_buckets=64)
    keys = _keys(np.random.default_rng(2), 3000)
    whole = _trained_table(config, keys)
    all_keys, all_rows = whole.items()
    for s in range(servers):  # server s holds the buckets b with b % servers == s
        part = SparseTable(config)
        mine = (all_keys % np.uint64(7)) % np.uint64(servers) == np.uint64(s)
        part.load(all_keys[mine], all_rows[mine])
        save_server({3: part}, tmp_path, s, {})

    got_keys, got_values = read_saved_rows(tmp_path, 3, config)

    np.testing.assert_array_equal(got_keys, all_keys)
    np.testing.assert_array_equal(got_values, all_rows[:, :4])


class _TableEmbedding(nn.Module):
    """The evaluation path: rows pulled from a table without creating them."""

    def __init__(self, table: SparseTable) -> None:
        super().__init__()
        self.table = table

    def forward(self, ids: Tensor) -> Tensor:
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        rows = torch.from_numpy(self.table.pull(uniq.numpy().view(np.uint64), create=False))
        return rows[inverse].reshape(*ids.shape, self.table.dim)


class _WideDeep(nn.Module):
    """Two tables, one read on a slice of the slots: positions must commute with it."""

    def __init__(self) -> None:
        super().__init__()
        self.deep = SparseEmbedding(4, name="export-test-deep")
        self.wide = SparseEmbedding(1, name="export-test-wide")
        self.mlp = nn.Sequential(nn.Linear(6 * 4 + 3, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, ids: Tensor, dense: Tensor) -> Tensor:
        deep = self.deep(ids).reshape(ids.shape[0], -1)
        wide = self.wide(ids[:, :2]).sum(dim=(1, 2))
        return self.mlp(torch.cat([deep, dense], dim=1)).squeeze(1) + wide


def _client_with(configs: list[SparseTableConfig], keys: np.ndarray) -> LocalClient:
    client = LocalClient()
    rng = np.random.default_rng(3)
    for table_id, config in enumerate(configs):
        client.create_sparse_table(table_id, config)
        client.pull_sparse(table_id, keys)
        client.push_sparse(table_id, keys,
                           rng.normal(size=(keys.size, config.dim)).astype(np.float32))
    return client


def _batch(keys: np.ndarray, slots: int, num_dense: int, rows: int) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(4)
    pool = np.concatenate([keys, keys[:50] + np.uint64(1)])  # some keys never trained on
    ids = rng.choice(pool, size=(rows, slots)).view(np.int64)
    return torch.from_numpy(ids), torch.from_numpy(rng.random((rows, num_dense), np.float32))


@pytest.mark.parametrize("where", ["local", "memory"])
def test_exported_dnn_scores_as_the_eager_model(tmp_path: Path, where: str) -> None:
    keys = _keys(np.random.default_rng(5), 400)
    embedding = SparseEmbedding(9, name="export-test-dnn", initializer="normal",
                                initial_range=0.05)
    config = embedding.table_config(RULE)
    client = _client_with([config], keys)
    model = DNN(embedding, embedding_dim=9, fc_sizes=[16, 8])
    dirname = str(tmp_path / "model") if where == "local" else f"memory://{tmp_path.name}/m"

    manifest = save_inference_model(dirname, model, client, {embedding.name: (0, config)},
                                    metadata={"model": "dnn"})
    loaded = load_inference_model(dirname)

    assert model.embedding is embedding and model.training  # restored after the export
    assert read_manifest(dirname) == manifest == loaded.manifest
    assert manifest.sparse_tables[0].rows == 400 and manifest.metadata == {"model": "dnn"}
    for rows in (1, 37):
        ids, dense = _batch(keys, 26, 13, rows)
        model.embedding = _TableEmbedding(client.service.tables[0])
        with torch.no_grad():
            expected = model(ids, dense)
        model.embedding = embedding
        torch.testing.assert_close(loaded(ids, dense), expected, rtol=1e-6, atol=1e-6)


def test_exported_model_with_two_tables(tmp_path: Path) -> None:
    keys = _keys(np.random.default_rng(6), 300)
    model = _WideDeep()
    configs = [model.deep.table_config(RULE), model.wide.table_config(RULE)]
    client = _client_with(configs, keys)
    ids, dense = _batch(keys, 6, 3, 20)

    save_inference_model(tmp_path, model, client,
                         {"export-test-deep": (0, configs[0]), "export-test-wide": (1, configs[1])},
                         example_inputs=(ids[:2], dense[:2]))
    loaded = load_inference_model(tmp_path)

    assert [t.name for t in loaded.manifest.sparse_tables] == ["export-test-deep",
                                                              "export-test-wide"]
    eager = _WideDeep()
    eager.load_state_dict(model.state_dict())
    eager.deep = _TableEmbedding(client.service.tables[0])  # type: ignore[assignment]
    eager.wide = _TableEmbedding(client.service.tables[1])  # type: ignore[assignment]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, dense), eager(ids, dense), rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match="dense: got"):
        loaded(ids, dense[:, :2])


class _UsesKeyValues(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = SparseEmbedding(2, name="export-test-keys")
        self.linear = nn.Linear(2, 1)

    def forward(self, ids: Tensor, dense: Tensor) -> Tensor:
        bias = (ids % 7).float().mean(dim=1)  # depends on the key values themselves
        return self.linear(self.embedding(ids).mean(dim=1)).squeeze(1) + bias


def test_a_model_using_its_key_values_is_refused(tmp_path: Path) -> None:
    model = _UsesKeyValues()
    config = model.embedding.table_config(RULE)
    client = _client_with([config], _keys(np.random.default_rng(7), 10))
    with pytest.raises(FatalError, match="only through its SparseEmbeddings"):
        save_inference_model(tmp_path, model, client, {"export-test-keys": (0, config)},
                             example_inputs=(torch.zeros(2, 3, dtype=torch.int64),
                                             torch.zeros(2, 1)))
    assert not (tmp_path / "manifest.json").exists()
    with pytest.raises(ConfigError, match="num_slots / num_dense"):
        save_inference_model(tmp_path, model, client, {"export-test-keys": (0, config)})


def test_damaged_directories_are_refused_naming_the_file(tmp_path: Path) -> None:
    keys = _keys(np.random.default_rng(8), 50)
    embedding = SparseEmbedding(3, name="export-test-damaged")
    config = embedding.table_config(RULE)
    save_inference_model(tmp_path, DNN(embedding, embedding_dim=3, fc_sizes=[4]),
                         _client_with([config], keys), {embedding.name: (0, config)})
    manifest = tmp_path / "manifest.json"
    raw = json.loads(manifest.read_text())

    with pytest.raises(DataError, match="does not exist"):
        load_inference_model(tmp_path / "nowhere")
    manifest.write_text(json.dumps({**raw, "format_version": 99}))
    with pytest.raises(DataError, match=r"manifest.json: format_version 99, this psfleet reads"):
        load_inference_model(tmp_path)
    manifest.write_text(json.dumps(raw))
    (tmp_path / "sparse" / "table-0.values.npy").unlink()
    with pytest.raises(DataError, match=r"table-0.values.npy does not exist"):
        load_inference_model(tmp_path)
    (tmp_path / "dense_model.pt2").write_bytes(b"not a zip")
    with pytest.raises(DataError, match=r"dense_model.pt2: not a loadable"):
        load_inference_model(tmp_path)
    manifest.unlink()
    with pytest.raises(DataError, match="export did not complete"):
        load_inference_model(tmp_path)
