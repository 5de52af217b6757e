"""The YAML runner's configuration, PaddleRec style, validated on load.

Sections: ``runner`` (data, epochs, batch size, mode, output), ``hyper_parameters``
(model shape and optimizer) and ``cluster`` (servers and workers). Unknown keys and
bad values are errors naming the field path and the allowed values, e.g.
``runner.sync_mode: 'asyc' is not one of 'sync', 'async', 'geo'``. Relative paths are relative to
the directory of the YAML file, so an example runs from any working directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from psfleet.errors import ConfigError

__all__ = ["RunnerConfig", "OptimizerConfig", "HyperParameters", "ClusterConfig",
           "TrainConfig", "load_config"]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RunnerConfig(_Section):
    """``runner``: what to train on and how.

    Attributes:
        train_data_dir: a file, a directory of files, or a list of them.
        test_data_dir: the same, for the test AUC at the end (optional).
        epochs: passes over the training data.
        batch_size: examples per worker per step (global batch = batch_size x
            worker_num).
        sync_mode: the parameter-server mode: ``sync``, ``async`` or ``geo``.
        geo_step: steps between GEO syncs (PaddleRec's default 400).
        thread_num: CPU threads of each worker's torch ops.
        print_interval: steps between progress-bar refreshes.
        model_save_path: output directory (metrics.json, logs).
        reader_type: ``DataLoader`` (in-memory reader of this release).
        model: registered model name (``dnn``).
        seed: seed of dense initialisation and shuffling.
        shuffle: shuffle each worker's examples every epoch.
    """

    train_data_dir: Path | list[Path]
    test_data_dir: Path | list[Path] | None = None
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(512, ge=1)
    sync_mode: Literal["sync", "async", "geo"] = "async"
    geo_step: int = Field(400, ge=1)
    thread_num: int = Field(1, ge=1)
    print_interval: int = Field(10, ge=1)
    model_save_path: Path = Path("output")
    reader_type: Literal["DataLoader"] = "DataLoader"
    model: str = "dnn"
    seed: int = Field(0, ge=0)
    shuffle: bool = True


class OptimizerConfig(_Section):
    """``hyper_parameters.optimizer``: ``class`` (Adam, SGD, Adagrad), ``learning_rate``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    class_: Literal["Adam", "SGD", "Adagrad"] = Field("Adam", alias="class")
    learning_rate: float = Field(0.001, gt=0)


class HyperParameters(_Section):
    """``hyper_parameters``: model shape and optimizer (PaddleRec's rank/dnn names)."""

    optimizer: OptimizerConfig = OptimizerConfig()
    sparse_feature_dim: int = Field(9, ge=1)
    fc_sizes: list[int] = [512, 256, 128, 32]
    embedding_initializer: Literal["uniform", "normal", "zeros"] = "uniform"
    embedding_init_range: float = Field(0.01, ge=0)

    @field_validator("fc_sizes")
    @classmethod
    def _positive(cls, sizes: list[int]) -> list[int]:
        if not sizes or any(s < 1 for s in sizes):
            raise ValueError("must be a non-empty list of positive layer widths")
        return sizes


class ClusterConfig(_Section):
    """``cluster``: ``server_num`` 0 trains in one process; >= 1 starts a local job."""

    server_num: int = Field(0, ge=0, le=64)
    worker_num: int = Field(1, ge=1, le=64)
    server_wait_timeout_s: float = Field(300.0, gt=0)


class TrainConfig(_Section):
    """The whole YAML file."""

    runner: RunnerConfig
    hyper_parameters: HyperParameters = HyperParameters()
    cluster: ClusterConfig = ClusterConfig()


def _format(error: ValidationError) -> str:
    lines = []
    for e in error.errors():
        path = ".".join(str(p) for p in e["loc"])
        value = e.get("input")
        if e["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key (check its spelling against README.md)")
        elif e["type"] == "literal_error":
            allowed = e.get("ctx", {}).get("expected", "")
            lines.append(f"{path}: {value!r} is not one of {allowed}")
        elif e["type"] == "missing":
            lines.append(f"{path}: required")
        else:
            lines.append(f"{path}: {value!r}: {e['msg']}")
    return "; ".join(lines)


def _resolve(value: Path | list[Path] | None, base: Path) -> Path | list[Path] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [base / v for v in value]
    return base / value


def _override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``section.key=value`` (value parsed as YAML) to the raw mapping."""
    path, sep, text = assignment.partition("=")
    keys = [k for k in path.strip().split(".") if k]
    if not sep or not keys:
        raise ConfigError(f"-o {assignment!r}: expected KEY.PATH=VALUE, "
                          "e.g. -o cluster.server_num=0")
    node = raw
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"-o {assignment!r}: {key!r} is not a section")
        node = child
    try:
        node[keys[-1]] = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"-o {assignment!r}: the value is not YAML: {exc}") from None


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read and validate a YAML config; relative paths become relative to its folder.

    Args:
        path: the YAML file.
        overrides: ``section.key=value`` assignments applied before validation
            (``psfleet train -o``), e.g. ``cluster.server_num=0``.

    Raises:
        ConfigError: the file is missing or not YAML, an override is malformed, or a
            field is unknown or invalid (the message names the file and every field
            path at fault).
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file {str(file)!r} does not exist; pass -m PATH.yaml")
    try:
        raw = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: expected a mapping with runner / hyper_parameters / "
                          "cluster sections")
    for assignment in overrides:
        _override(raw, assignment)
    try:
        config = TrainConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{file}: {_format(exc)}") from None
    base = file.resolve().parent
    runner = config.runner.model_copy(update={
        "train_data_dir": _resolve(config.runner.train_data_dir, base),
        "test_data_dir": _resolve(config.runner.test_data_dir, base),
        "model_save_path": base / config.runner.model_save_path,
    })
    return config.model_copy(update={"runner": runner})
