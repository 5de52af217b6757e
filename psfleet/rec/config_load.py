"""Reading a runner config: from a YAML file (``psfleet train -m``) or a mapping (the
Python API), with ``-o section.key=value`` overrides, into a validated
:class:`~psfleet.rec.config.TrainConfig`; and writing one back (a run folder's
``config.yaml``).

Messages name the file and every field path at fault, with the closest known key for
a misspelt one (``runner.epoch: unknown key; did you mean 'epochs'?``).
"""

from __future__ import annotations

import copy
import difflib
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from psfleet.checkpoint import CheckpointConfig
from psfleet.errors import ConfigError
from psfleet.rec.config import TrainConfig

__all__ = ["config_from_mapping", "dump_config", "load_config", "read_yaml"]


def _unknown_key(loc: tuple[int | str, ...]) -> str:
    """``section.key: unknown key``, with the closest known key and the known keys of
    that section (README.md's runner table explains them)."""
    path = ".".join(str(p) for p in loc)
    model: Any = TrainConfig
    for part in loc[:-1]:
        is_model = isinstance(model, type) and issubclass(model, BaseModel)
        if isinstance(part, int) or not is_model:  # a list's index: the model stays
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            field = next((f for f in model.model_fields.values() if f.alias == part), None)
        model = _section_model(field.annotation) if field is not None else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return f"{path}: unknown key (check its spelling against README.md)"
    known = sorted(f.alias or name for name, f in model.model_fields.items())
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{path}: unknown key; {hint}the keys are {', '.join(known)}"


def _section_model(annotation: Any) -> Any:
    """The model of a section's annotation: ``X``, ``X | None`` or ``list[X]`` -> X."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _section_model(arg)
        if found is not None:
            return found
    return None


def _format(error: ValidationError) -> str:
    lines = []
    for e in error.errors():
        path = ".".join(str(p) for p in e["loc"])
        value = e.get("input")
        message = e["msg"].removeprefix("Value error, ")
        # runner.a_sync_configs is the strategy's, whose messages name it as the
        # Python API spells it (strategy.a_sync_configs.k_steps)
        python_name = ".".join(["strategy", *map(str, e["loc"][1:])])
        if e["type"] == "extra_forbidden":
            lines.append(_unknown_key(e["loc"]))
        elif e["type"] == "literal_error":
            allowed = e.get("ctx", {}).get("expected", "")
            lines.append(f"{path}: {value!r} is not one of {allowed}")
        elif e["type"] == "missing":
            lines.append(f"{path}: required")
        elif isinstance(e.get("ctx", {}).get("error"), ConfigError):
            lines.append(str(e["ctx"]["error"]))  # a cross-field rule: names its fields
        elif message.startswith(python_name):  # the strategy's rule, at the YAML key
            lines.append(path + message.removeprefix(python_name))
        elif e["type"] == "value_error" and isinstance(value, dict):
            # a section's own rule: its message names the key; the section is not shown
            lines.append(f"{path}: {message}")
        else:
            lines.append(f"{path}: {value!r}: {message}")
    return "; ".join(lines)


def _resolve(value: Path | list[Path] | None, base: Path) -> Path | list[Path] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [base / v for v in value]
    return base / value


def _resolve_checkpoint(checkpoint: CheckpointConfig | None,
                        base: Path) -> CheckpointConfig | None:
    """A local relative ``checkpoint_dir`` becomes relative to the YAML's folder."""
    if checkpoint is None or "://" in checkpoint.checkpoint_dir:
        return checkpoint
    return checkpoint.model_copy(update={
        "checkpoint_dir": str(base / checkpoint.checkpoint_dir)})


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


def config_from_mapping(raw: Any, base: Path, source: str = "config",
                        overrides: Sequence[str] = ()) -> TrainConfig:
    """Validate a config given as a mapping (the YAML's content, or the Python API's
    dict); relative paths become relative to ``base``.

    Args:
        raw: ``{"runner": ..., "hyper_parameters": ..., "cluster": ...}``; not modified.
        base: the folder relative paths are relative to (a YAML file's folder).
        source: how messages name the config (the file's path).
        overrides: ``section.key=value`` assignments applied before validation.

    Raises:
        ConfigError: not a mapping, a malformed override, or a field unknown or
            invalid (the message names ``source`` and every field path at fault).
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with runner / hyper_parameters / "
                          "cluster sections")
    raw = copy.deepcopy(raw)
    for assignment in overrides:
        _override(raw, assignment)
    try:
        config = TrainConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_format(exc)}") from None
    runner = config.runner
    runner = runner.model_copy(update={
        "train_data_dir": _resolve(runner.train_data_dir, base),
        "train_passes": _resolve(runner.train_passes, base),
        "test_data_dir": _resolve(runner.test_data_dir, base),
        "valid_data_dir": _resolve(runner.valid_data_dir, base),
        "model_save_path": base / runner.model_save_path,
        "exchange_dir": _resolve(runner.exchange_dir, base),
        "pipe_cwd": _resolve(runner.pipe_cwd, base) or base,
        "checkpoint": _resolve_checkpoint(runner.checkpoint, base),
        "inference_model_path": _resolve(runner.inference_model_path, base),
    })
    return config.model_copy(update={"runner": runner})


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
    raw, base = read_yaml(Path(path))
    return config_from_mapping(raw, base, str(path), overrides)


def read_yaml(file: Path) -> tuple[Any, Path]:
    """A YAML config's content (not validated) and the folder its relative paths are
    relative to.

    Raises:
        ConfigError: the file is missing or not YAML (names it).
    """
    if not file.is_file():
        raise ConfigError(f"config file {str(file)!r} does not exist; pass -m PATH.yaml")
    try:
        return yaml.safe_load(file.read_text()), file.resolve().parent
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None


def dump_config(config: TrainConfig) -> str:
    """``config`` as YAML that :func:`load_config` reads back to an equal config (paths
    are absolute after loading, so the file may live anywhere)."""
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude_none=True),
                          sort_keys=False)
