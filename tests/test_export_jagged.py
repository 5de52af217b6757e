"""Export and offline scoring of models over several tables, multi-valued (pooled),
weighted and ``shared_ids`` ones: the loaded model's logits equal the eager model's in
the in-training evaluation (``psfleet.rec.trainer.evaluate``) on the same data.

The data: the shared Criteo sample (criteo parser, InMemoryDataset); C14..C26 regrouped
into the multi-valued features ``ctx_a`` / ``ctx_b`` of their present values (0 to 6 and
0 to 7 ids per example, ``jobs/model_oracle_job.py``); the weighted variant gives each
id a weight from its key. The models train a few steps on in-process tables (so some
rows are trained and the test file's unseen keys take initial rows), are exported with
``fleet.save_inference_model`` and scored on dev.csv.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import require_shared_data
from jobs.model_oracle_job import SCHEMA, multi_hot_batch
from torch import nn

from psfleet import fleet
from psfleet.data import Batch, InMemoryDataset, make_parser
from psfleet.data.jagged import KeyedJagged
from psfleet.data.types import FeatureSchema
from psfleet.errors import ConfigError, DataError
from psfleet.export import load_inference_model
from psfleet.fleet import Fleet, Role, UserDefinedRoleMaker
from psfleet.metrics import auc, log_loss
from psfleet.nn import EmbeddingTableSpec, FeatureEmbeddings
from psfleet.rec.config_load import load_config
from psfleet.rec.features import model_inputs
from psfleet.rec.models import build_model
from psfleet.rec.predict import predict
from psfleet.rec.readers import build_test_reader
from psfleet.rec.trainer import evaluate, train

pytestmark = [pytest.mark.unit, pytest.mark.slow]

DATA_DIR = require_shared_data()  # ../shared/data/criteo_kaggle_sample, or fail
CRITEO = FeatureSchema(dense=SCHEMA.dense, sparse=tuple(f"C{i}" for i in range(1, 27)))
WEIGHTED = replace(SCHEMA, weighted=True)
C = [f"C{i}" for i in range(1, 14)]


def _criteo(source: str, rows: int, batch: int) -> list[Batch]:
    dataset = InMemoryDataset(batch, make_parser("criteo"))
    dataset.set_filelist([DATA_DIR / source])
    dataset.load_into_memory()
    dataset.truncate(rows)
    return list(dataset)


def _weighted(batch: Batch) -> Batch:
    """``batch`` with a weight per multi-valued id, 1/8 .. 2 from the key's low bits."""
    jagged = batch.jagged
    assert jagged is not None
    weights = ((jagged.values & 15) + 1).to(torch.float32) / 8
    return replace(batch, jagged=KeyedJagged(jagged.keys, jagged.values, jagged.lengths,
                                             weights, jagged.stride))


# name -> (model, schema, tables, batch transform)
CASES = {
    "single": ("dnn", CRITEO, (EmbeddingTableSpec("emb", 4, CRITEO.sparse),), None),
    "mixed_mean": ("wide_deep", SCHEMA, (
        EmbeddingTableSpec("ids", 4, tuple(C[:7])),
        EmbeddingTableSpec("mixed", 3, (*C[7:], "ctx_a"), pooling="mean"),
        EmbeddingTableSpec("ctx", 5, ("ctx_b",), pooling="sqrtn")), multi_hot_batch),
    "weighted": ("deepfm", WEIGHTED, (
        EmbeddingTableSpec("ids", 4, tuple(C)),
        EmbeddingTableSpec("context", 4, ("ctx_a", "ctx_b"), pooling="mean")),
        lambda b: _weighted(multi_hot_batch(b))),
    "shared": ("dcn_v2", SCHEMA, (
        EmbeddingTableSpec("ids", 4, tuple(C[:11])),
        EmbeddingTableSpec("pair", 4, tuple(C[11:]), shared_ids=True),
        EmbeddingTableSpec("ctx", 4, ("ctx_a", "ctx_b"), pooling="sum", shared_ids=True)),
        multi_hot_batch),
}


@pytest.fixture(scope="module")
def criteo() -> dict[str, list[Batch]]:
    return {"train": _criteo("train.csv", 512, 64), "dev": _criteo("dev.csv", 409, 100)}


class _LocalFleet:
    """A worker on in-process tables (no servers) that trains ``model`` with Adam."""

    def __init__(self, model: nn.Module) -> None:
        self.fleet = Fleet()
        self.fleet.init(UserDefinedRoleMaker(0, Role.WORKER, 1, []))
        self.fleet.distributed_model(model)
        self.optimizer = self.fleet.distributed_optimizer(
            torch.optim.Adam(model.parameters(), lr=0.01))
        self.fleet.init_worker()

    def train(self, model: nn.Module, batches: list[Batch]) -> None:
        for batch in batches:
            self.optimizer.zero_grad()
            logits = model(*model_inputs(batch))
            nn.functional.binary_cross_entropy_with_logits(logits, batch.labels).backward()
            self.optimizer.step()


def _eval_logits(model: nn.Module, batches: list[Batch]) -> torch.Tensor:
    """The logits of trainer.evaluate's forward (eval mode, no grad, model_inputs)."""
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(*model_inputs(b)) for b in batches])
    model.train()
    return out


@pytest.fixture(scope="module", params=list(CASES))
def exported(request: pytest.FixtureRequest, criteo: dict[str, list[Batch]],
             tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[str, nn.Module, Path, list[Batch]]]:
    name = request.param
    model_name, schema, tables, transform = CASES[name]
    train, dev = ([transform(b) for b in criteo[k]] if transform else criteo[k]
                  for k in ("train", "dev"))
    torch.manual_seed(0)
    model = build_model(model_name, embeddings=FeatureEmbeddings(schema, tables),
                        num_dense=len(schema.dense), fc_sizes=(16, 8))
    local = _LocalFleet(model)
    try:
        local.train(model, train)
        path = tmp_path_factory.mktemp(name) / "model"
        local.fleet.save_inference_model(str(path), model, (dev[0].sparse[:2],
                                                            dev[0].dense[:2]))
        yield name, model, path, dev
    finally:
        local.fleet.stop_worker()


def test_exported_scores_equal_the_in_training_evaluation(
        exported: tuple[str, nn.Module, Path, list[Batch]]) -> None:
    name, model, path, dev = exported
    loaded = load_inference_model(path)

    got = torch.cat([loaded(*model_inputs(b)) for b in dev])
    expected = _eval_logits(model, dev)
    metrics = evaluate(model, dev)

    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    labels = torch.cat([b.labels for b in dev]).numpy()
    probs = torch.sigmoid(got).numpy()
    assert metrics["examples"] == got.numel() == 409
    assert abs(auc(labels, probs) - metrics["auc"]) <= 1e-9
    assert abs(log_loss(labels, probs) - metrics["logloss"]) <= 1e-6
    assert model.training  # restored after the export ...
    assert all("forward" not in m.__dict__ for m in model.modules())  # ... and its modules


def test_manifest_describes_each_tables_inputs(
        exported: tuple[str, nn.Module, Path, list[Batch]]) -> None:
    name, _, path, _ = exported
    raw = json.loads((path / "manifest.json").read_text())
    tables = {t["name"]: t for t in raw["sparse_tables"]}
    inputs = raw["dense_model"]["inputs"]
    if name == "single":  # batch-keyed: format 1's layout, unchanged
        assert "features" not in raw and "inputs" not in tables["emb"]
        assert inputs == ["positions", "dense", "rows_0"]
        return
    assert raw["features"] == {"dense": list(SCHEMA.dense), "sparse": C,
                               "multi": ["ctx_a", "ctx_b"], "weighted": name == "weighted"}
    order = [t["name"] for t in raw["sparse_tables"]]
    if name == "mixed_mean":  # two groups: the deep tables, then the model's wide table
        assert order == ["ids", "mixed", "ctx", "wide"]
        assert tables["mixed"]["inputs"] == {"group": 0, "table": 1, "features": [
            *C[7:], "ctx_a"], "pooling": "mean", "shared_ids": False}
        assert tables["ids"]["inputs"]["pooling"] is None
        assert tables["wide"]["inputs"]["group"] == 1
        assert inputs == ["positions", "dense", "positions_0", "rows_0", "positions_1",
                          "offsets_1", "rows_1", "positions_2", "offsets_2", "weights_2",
                          "rows_2", "positions_3", "offsets_3", "rows_3"]
    if name == "weighted":  # weighted mean and sum both take per-id weights
        assert inputs.count("weights_1") == inputs.count("weights_2") == 1
    if name == "shared":
        assert tables["pair"]["inputs"]["shared_ids"] and tables["ctx"]["inputs"]["shared_ids"]
        assert tables["pair"]["inputs"]["pooling"] is None


def test_data_that_does_not_fit_is_named(
        exported: tuple[str, nn.Module, Path, list[Batch]]) -> None:
    name, _, path, dev = exported
    if name == "single":
        return
    loaded = load_inference_model(path)
    batch = dev[0]
    assert batch.jagged is not None
    with pytest.raises(ConfigError, match=r"jagged: the model reads the multi-valued "
                                          r"features \['ctx_a', 'ctx_b'\]"):
        loaded(batch.sparse, batch.dense)
    with pytest.raises(ConfigError, match=r"features \['ctx_b'\] are missing"):
        loaded(batch.sparse, batch.dense, batch.jagged.select(["ctx_a"]))
    other = (multi_hot_batch(_criteo("dev.csv", 100, 100)[0]) if name == "weighted"
             else _weighted(batch))
    assert other.jagged is not None
    with pytest.raises(ConfigError, match=r"weights per id, but the model was exported "
                                          r"for data with(out)? them"):
        loaded(other.sparse, other.dense, other.jagged)


def test_a_damaged_table_inputs_entry_is_a_data_error(
        exported: tuple[str, nn.Module, Path, list[Batch]], tmp_path: Path) -> None:
    name, _, path, _ = exported
    if name != "mixed_mean":
        return
    raw = json.loads((path / "manifest.json").read_text())
    raw["sparse_tables"][1]["inputs"]["pooling"] = None  # a pooled table made a gather
    copy = tmp_path / "model"
    copy.mkdir()
    for item in path.rglob("*"):
        if item.is_file():
            (copy / item.relative_to(path)).parent.mkdir(parents=True, exist_ok=True)
            (copy / item.relative_to(path)).write_bytes(item.read_bytes())
    (copy / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(DataError, match=r"table 'mixed': pooling None does not fit"):
        load_inference_model(copy)


# -- psfleet predict through the runner's test reader ------------------------------------
def _csv(source: str, dest: Path, rows: int) -> Path:
    """``rows`` Criteo lines as CSV: label, I1..I13 (missing: 0), C1..C13 and ``ctx``,
    the present values of C14..C26 joined with ``|``."""
    lines = ["label," + ",".join([*SCHEMA.dense, *C, "ctx"])]
    with (DATA_DIR / source).open(encoding="utf-8") as f:
        for _, line in zip(range(rows), f, strict=False):
            fields = line.rstrip("\n").split("\t")
            ints = [v or "0" for v in fields[1:14]]
            ctx = "|".join(v for v in fields[27:40] if v)
            lines.append(",".join([fields[0], *ints, *fields[14:27], ctx]))
    dest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dest


def test_predict_scores_jagged_data_as_the_evaluation(tmp_path: Path) -> None:
    train_csv, test = _csv("train.csv", tmp_path / "train.csv", 600), _csv(
        "dev.csv", tmp_path / "test.csv", 300)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(f"""
runner:
  train_data_dir: {train_csv}
  test_data_dir: {test}
  parser: csv
  columns:
    label: label
    dense: {list(SCHEMA.dense)}
    sparse: {C}
    multi: [ctx]
  model: wide_deep
  batch_size: 100
hyper_parameters:
  optimizer: {{class: Adam, learning_rate: 0.01}}
  fc_sizes: [16, 8]
  tables:
    - {{name: ids, dim: 4, features: {C[:10]}}}
    - {{name: mixed, dim: 4, features: {[*C[10:], "ctx"]}, pooling: mean, shared_ids: true}}
""", encoding="utf-8")
    config = load_config(config_file)
    # runner.inference_model_path set after loading: config.py refuses it with
    # multi-valued features until this export carries them
    path = tmp_path / "model"
    exporting = config.model_copy(update={"runner": config.runner.model_copy(update={
        "inference_model_path": path, "model_save_path": tmp_path / "out", "epochs": 1})})
    reader = build_test_reader(config)
    assert reader is not None
    first = next(iter(reader))
    assert first.jagged is not None and first.jagged.keys == ("ctx",)

    try:
        metrics = train(exporting)  # alone, on in-process tables: the runner's whole path
    finally:
        fleet.reset()  # train() leaves this process's fleet as a job's process does

    assert metrics is not None
    expected = metrics["test"]
    scores = tmp_path / "scores.tsv"
    got = predict(config, str(path), test, scores)

    assert got["examples"] == expected["examples"] == 300
    assert abs(got["auc"] - expected["auc"]) <= 1e-9
    assert abs(got["logloss"] - expected["logloss"]) <= 1e-6
    assert np.loadtxt(scores, delimiter="\t", ndmin=2).shape == (300, 2)
    broken = config.model_copy(update={"hyper_parameters": config.hyper_parameters.model_copy(
        update={"tables": [t.model_copy(update={"pooling": "sum"}) if t.name == "mixed" else t
                           for t in config.hyper_parameters.tables or []]})})
    with pytest.raises(ConfigError,
                       match=r"table 'mixed' pools 'mean' in the export, but .* says 'sum'"):
        predict(broken, str(path), test)
