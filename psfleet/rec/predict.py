"""Export after training and offline scoring of an exported model (``psfleet predict``).

:func:`export_trained_model` is what the runner's worker 0 calls after the test
evaluation (``runner.export_model``, on by default): ``fleet.save_inference_model``
with the model name, hyper-parameters and test metrics as manifest metadata.

:func:`predict` scores a data file with an exported model, with no server and no
fleet: the file is read by the same reader as the runner's test evaluation and the
scores are exactly the evaluation's (the tables' key-seeded initializer gives the
rows of keys never trained on), so its AUC equals the in-training test AUC.

Rows without a label (``csv`` with a header, or ``parquet``, whose files lack the
``columns.label`` column) are scored too: the scores are written with the label field
empty (``<TAB>probability``) and there is no AUC or log loss (None). Formats whose label
is positional (``criteo``, ``slot``, ``libsvm``, ``csv`` without a header or with a
numbered label) need a label field on every line; a placeholder works, but then the
AUC and log loss mean nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from psfleet import fleet
from psfleet.data import Batch, ColumnsConfig
from psfleet.data.columnar import has_label_column
from psfleet.errors import ConfigError, DataError
from psfleet.export import InferenceManifest, load_inference_model
from psfleet.metrics import auc, log_loss
from psfleet.rec.config import TrainConfig, parser_kind, parser_schema
from psfleet.rec.features import DEFAULT_TABLE, model_inputs, table_specs
from psfleet.rec.readers import build_test_reader, data_files

__all__ = ["export_trained_model", "predict", "check_compatible"]


def export_trained_model(config: TrainConfig, model: nn.Module, metrics: dict[str, Any],
                         sample: Batch | None) -> None:
    """Export ``model`` to ``runner.model_dir`` (worker 0, after training).

    Args:
        config: the job's config.
        model: the trained model, dense parameters fresh.
        metrics: the run's metrics; its ``test`` entry goes into the manifest.
        sample: any batch of the data (its shapes define the model's inputs); None
            takes the model's ``num_slots`` / ``num_dense``.
    """
    runner = config.runner
    path = runner.model_dir
    metadata: dict[str, object] = {
        "model": runner.model, "sync_mode": runner.sync_mode,
        "hyper_parameters": config.hyper_parameters.model_dump(mode="json", by_alias=True),
        "server_num": metrics.get("server_num"), "worker_num": metrics.get("worker_num"),
        "test": metrics.get("test"),
    }
    examples = None if sample is None else (sample.sparse[:2], sample.dense[:2])
    fleet.save_inference_model(str(path), model, examples, metadata)


def check_compatible(manifest: InferenceManifest, config: TrainConfig, model_dir: str) -> None:
    """Check that an exported model is the one ``config`` describes.

    Raises:
        ConfigError: the model name, a table's dim, or what a table reads (its
            features, pooling, ``shared_ids``) differs (names the manifest field, the
            config field and both values).
    """
    where = f"{model_dir}/manifest.json"
    exported = manifest.metadata.get("model")
    if exported is not None and exported != config.runner.model:
        raise ConfigError(f"{where}: model {exported!r}, but the config's runner.model is "
                          f"{config.runner.model!r}; pass the config the model was trained with")
    specs = {spec.name: spec for spec in table_specs(
        config.hyper_parameters, parser_schema(config.runner))}
    for table in manifest.sparse_tables:
        spec = specs.get(table.name)
        if spec is None:
            continue
        key = ("hyper_parameters.sparse_feature_dim" if table.name == DEFAULT_TABLE
               else f"the dim of hyper_parameters.tables {table.name!r}")
        if table.dim != spec.dim:
            raise ConfigError(f"{where}: table {table.name!r} has dim {table.dim}, but "
                              f"{key} is {spec.dim}; pass the config the model was trained "
                              "with")
        inputs = table.inputs
        if inputs is None:
            continue
        for field, exported, configured in (
                ("features", inputs.features, list(spec.features)),
                ("pools", inputs.pooling, spec.pooling if inputs.pooling else None),
                ("shared_ids", inputs.shared_ids, spec.shared_ids)):
            if exported != configured:
                raise ConfigError(f"{where}: table {table.name!r} {field} {exported!r} in the "
                                  f"export, but hyper_parameters.tables {table.name!r} says "
                                  f"{configured!r}; pass the config the model was trained "
                                  "with")


def _write_scores(out: Path, labels: np.ndarray | None, probs: np.ndarray) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as f:
            if labels is None:
                f.writelines(f"\t{p:.9g}\n" for p in probs)
            else:
                f.writelines(f"{int(y)}\t{p:.9g}\n"
                             for y, p in zip(labels, probs, strict=True))
    except OSError as exc:
        raise DataError(f"--out {str(out)!r}: cannot be written: {exc}") from None


def _unlabelled(config: TrainConfig, files: list[str]) -> bool:
    """Whether the data files lack the label column (module docstring); all must agree.

    Raises:
        DataError: some files hold the label column and others do not (names one of each).
    """
    columns = config.runner.columns
    if not isinstance(columns, ColumnsConfig):
        return False
    kind = parser_kind(config.runner)
    present = {f: has_label_column(Path(f), columns, kind) for f in files}
    with_label = [f for f, has in present.items() if has]
    if not with_label or len(with_label) == len(files):
        return not with_label
    without = next(f for f, has in present.items() if not has)
    raise DataError(f"--data: {with_label[0]!r} has the label column {columns.label!r} "
                    f"but {without!r} has not; score labelled and unlabelled files "
                    "separately")


def predict(config: TrainConfig, model_dir: str, data: Path | list[Path],
            out: Path | None = None) -> dict[str, Any]:
    """Score ``data`` with the exported model in ``model_dir``; no server needed.

    Args:
        config: the config the model was trained with (reader and model checks).
        model_dir: the inference model directory (local path or fsspec URL).
        data: a data file or directory (or a list of them), in the runner's
            test-data format.
        out: if given, write one ``label<TAB>probability`` line per example there,
            in file order (the label empty for files without the label column).

    Returns:
        ``{"auc", "logloss", "examples", "files", "labelled"}`` (``files``: the data
        files read, in order; ``labelled`` False: the files have no label column, and
        ``auc`` and ``logloss`` are None).

    Raises:
        DataError: the model directory, a file of it or the data is missing or
            unreadable, the data does not fit the model's inputs, or only some files
            hold the label column (names it).
        ConfigError: the model does not match ``config`` (see :func:`check_compatible`).
    """
    model = load_inference_model(model_dir)
    check_compatible(model.manifest, config, model_dir)
    try:
        files = [str(f) for f in data_files(data, config.runner)]
    except DataError as exc:
        raise DataError(f"--data: {exc}") from None
    unlabelled = _unlabelled(config, files)
    update: dict[str, Any] = {"test_data_dir": data}
    columns = config.runner.columns
    if unlabelled and columns is not None:
        update["columns"] = columns.model_copy(update={"label": None})
    # The runner's test reader (same parser and options as the in-training evaluation).
    reader = build_test_reader(config.model_copy(update={
        "runner": config.runner.model_copy(update=update)}))
    if reader is None:  # cannot happen: test_data_dir is set
        raise DataError(f"--data {str(data)!r}: the runner built no test reader")
    torch.set_num_threads(config.runner.thread_num)
    labels, probs = [], []
    for batch in reader:
        try:
            logits = model(*model_inputs(batch))
        except ConfigError as exc:
            raise DataError(f"--data {str(data)!r} does not fit the model in {model_dir}: "
                            f"{exc}") from None
        labels.append(batch.labels.numpy())
        probs.append(torch.sigmoid(logits).numpy())
    if not labels:
        raise DataError(f"--data {str(data)!r}: no well-formed example to score")
    y, p = np.concatenate(labels), np.concatenate(probs)
    if out is not None:
        _write_scores(out, None if unlabelled else y, p)
    if unlabelled:
        return {"auc": None, "logloss": None, "examples": int(p.size), "files": files,
                "labelled": False}
    return {"auc": auc(y, p), "logloss": log_loss(y, p), "examples": int(y.size),
            "files": files, "labelled": True}
