"""The Python API of the YAML runner: :func:`train` and :func:`predict`, for notebooks
and scripts (``psfleet train`` and ``psfleet predict`` are these plus a console).

::

    import psfleet

    result = psfleet.train("config.yaml", runner={"epochs": 2})   # or a dict config
    result.metrics["test"]["auc"], result.run_dir
    logits = result.model(sparse_ids, dense)                       # the exported model
    psfleet.predict(result.run_dir, "test.csv")["auc"]

Each call is one run with its own run folder (:mod:`psfleet.rec.run_folder`); fleet
state is per run (:meth:`psfleet.fleet.Fleet.reset`), so a process may train any
number of times. With ``cluster.server_num`` 0 the run trains in this process; with
servers (or a collective ``worker_num`` > 1) it starts the local job through the same
launcher as ``fleetrun`` and waits for it, its processes reading the run folder's
``config.yaml``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from psfleet.errors import ConfigError, FatalError
from psfleet.rec.config import TrainConfig
from psfleet.rec.config_load import config_from_mapping, read_yaml
from psfleet.rec.run_folder import (
    CONFIG_NAME,
    check_run_folder,
    find_run_folder,
    name_run,
    open_run_folder,
)

if TYPE_CHECKING:
    from psfleet.export import InferenceModel

__all__ = ["JobFailedError", "TrainResult", "job_launcher", "predict", "prepare", "train"]

logger = logging.getLogger(__name__)

ConfigSource = str | Path | Mapping[str, Any] | TrainConfig


class JobFailedError(FatalError):
    """A local job ended with a non-zero exit code (its launcher printed the failing
    process and its log); ``exit_code`` holds the code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        run_dir: the run folder (config.yaml, metrics.json, logs, curves, model).
        metrics: the run's metrics.json (:mod:`psfleet.rec.reporting`).
        model: the exported model, loaded (:class:`~psfleet.export.InferenceModel`:
            ``model(sparse_ids int64 [B, S], dense float32 [B, D][, jagged]) -> logits
            float32 [B]``); None with ``runner.export_model: false``.
        config: the effective config (overrides applied, run name set).
    """

    run_dir: Path
    metrics: dict[str, Any]
    model: InferenceModel | None
    config: TrainConfig


def _merge(raw: dict[str, Any], sections: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with each ``section={key: value}`` of ``sections`` merged in, key by key
    (nested mappings too)."""
    merged = copy.deepcopy(raw)
    for name, value in sections.items():
        if isinstance(value, Mapping) and isinstance(merged.get(name), dict):
            merged[name] = _merge(merged[name], value)
        else:
            merged[name] = copy.deepcopy(value)
    return merged


def prepare(config: ConfigSource, overrides: Sequence[str] = (),
            sections: Mapping[str, Mapping[str, Any]] | None = None) -> TrainConfig:
    """The checked config of a new run, named (``runner.run_name``), before any process
    starts.

    Args:
        config: a YAML path, a mapping with the YAML's sections (relative paths are
            relative to the current folder) or a loaded config.
        overrides: ``section.key=value`` assignments (``psfleet train -o``).
        sections: mappings merged into the sections, e.g. ``{"runner": {"epochs": 2}}``.

    Raises:
        ConfigError, DataError: the config, its data files or the run folder (a
            finished run's) at fault, named.
    """
    if isinstance(config, TrainConfig):
        if overrides or sections:
            raise ConfigError("overrides and sections apply to a YAML path or a mapping; "
                              "for a TrainConfig use its model_copy(update=...)")
        loaded = config
    else:
        if isinstance(config, Mapping):
            raw, base, source = dict(config), Path.cwd(), "config"
        else:
            raw, base = read_yaml(Path(config))
            source = str(config)
        loaded = config_from_mapping(_merge(raw, sections or {}), base, source, overrides)
    named = name_run(loaded)
    check_run_folder(named)
    # Imported here, after the config is read: a mistake in it is named in about a
    # second, before the data parsers and the model's torch are imported.
    from psfleet.rec.preflight import check_before_start

    check_before_start(named)
    return named


def job_launcher(config: TrainConfig, tee_stream: BinaryIO | None = None
                 ) -> tuple[Callable[[], int], str] | None:
    """How to start ``config``'s local job: a function that runs it (blocking; returns
    the exit code) and the processes it starts, as words; None when the run trains
    in this process (``cluster.server_num`` 0, not a collective job of several ranks).

    Every process reads the run folder's ``config.yaml``, which this writes
    (:func:`~psfleet.rec.run_folder.open_run_folder`); logs go to ``<run folder>/log``.
    """
    from psfleet.job.modes import mode_spec
    from psfleet.launch.console import plural
    from psfleet.replication import check_shares, replication_from_env, shares_from_env

    cluster = config.cluster
    collective = not mode_spec(config.runner.sync_mode).servers
    if not ((collective and cluster.worker_num > 1) or cluster.server_num >= 1):
        return None
    # PSFLEET_REPLICATION and PSFLEET_SHARES are checked before the run folder is made
    # (the YAML's are).
    replication = shares = None
    if not collective:
        replication = cluster.replication or replication_from_env(cluster.server_num)
        shares = (check_shares(cluster.shares, cluster.server_num, replication,
                               "cluster.shares") if cluster.shares
                  else shares_from_env(cluster.server_num, replication))
    run_dir = open_run_folder(config)
    command = ("-m", "psfleet.cli.main", "train", "-m", str(run_dir / CONFIG_NAME))
    log_dir = run_dir / "log"
    if collective:
        from psfleet.launch import CollectiveOptions, LaunchConfig, run_collective

        return functools.partial(run_collective, LaunchConfig(
            command=command, worker_num=cluster.worker_num, log_dir=log_dir,
            python_executable=sys.executable), CollectiveOptions(
            nproc_per_node=cluster.worker_num), tee_stream=tee_stream), \
            plural(cluster.worker_num, "rank")
    from psfleet.fleet.server_wait import server_wait_timeout_s
    from psfleet.launch import launch_local

    return functools.partial(
        launch_local, command, cluster.server_num, cluster.worker_num, log_dir,
        server_wait_timeout_s=server_wait_timeout_s(cluster.server_wait_timeout_s),
        max_restarts=cluster.max_restarts, tls=cluster.tls, tee_stream=tee_stream,
        # sync mode cannot take back one replaced worker mid-round: restart them all
        restart_policy=mode_spec(config.runner.sync_mode).restart_policy,
        checkpoint_dir=(str(config.runner.checkpoint.checkpoint_dir)
                        if config.runner.checkpoint else None),
        replication=replication, shares=shares), \
        f"{plural(cluster.server_num, 'server')} x {plural(cluster.worker_num, 'worker')}"


def train(config: ConfigSource, overrides: Sequence[str] = (), *, quiet: bool = False,
          **sections: Mapping[str, Any]) -> TrainResult:
    """Train the model ``config`` describes, in a new run folder; callable any number
    of times in one process.

    Args:
        config: a YAML path, a mapping with the YAML's sections (``runner``,
            ``hyper_parameters``, ``cluster``; relative paths are relative to the
            current folder), or a loaded :class:`~psfleet.rec.config.TrainConfig`.
        overrides: ``section.key=value`` assignments, as ``psfleet train -o``.
        quiet: show only psfleet's warnings and errors on stderr (no INFO lines, no
            progress bar; :func:`psfleet.logs.quiet`); the default shows the INFO lines
            (``PSFLEET_LOG_LEVEL``) unless the application configured logging itself.
        **sections: mappings merged into the config's sections, e.g.
            ``runner={"epochs": 2}, cluster={"server_num": 0}``.

    Returns:
        The run folder, its metrics, the exported model (loaded) and the config.

    Raises:
        ConfigError, DataError: a bad config or data file (named), before anything
            starts.
        JobFailedError: a local job ended with a non-zero exit code.
        KeyboardInterrupt: interrupted (metrics so far are in the run folder).
    """
    from psfleet import fleet, logs

    run_config = prepare(config, overrides, sections)
    runner = run_config.runner
    launch = job_launcher(run_config)
    with logs.quiet() if quiet else contextlib.nullcontext():
        if launch is None:
            from psfleet.rec.roles import run

            try:
                run(run_config)
            finally:
                fleet.reset()
            code = 0
        else:
            code = launch[0]()
    if code != 0:
        where = launch[1] if launch is not None else "this process"
        raise JobFailedError(f"the local job of {where} failed with exit code {code}; "
                             f"its logs are in {runner.run_dir / 'log'}", code)
    metrics_path = runner.run_dir / "metrics.json"
    try:
        metrics = json.loads(metrics_path.read_text())
    except (OSError, ValueError) as exc:
        raise FatalError(f"the run ended but {metrics_path} cannot be read: {exc}") from None
    from psfleet.export import load_inference_model  # torch: once the run is over

    model = load_inference_model(runner.model_dir) if runner.export_model else None
    return TrainResult(runner.run_dir, metrics, model, run_config)


def predict(model: str | Path, data: str | Path | Sequence[str | Path],
            config: str | Path | None = None, out: str | Path | None = None,
            overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Score ``data`` with an exported model; no server.

    Args:
        model: a run folder (or a ``model_save_path``: its ``latest`` run), whose
            ``config.yaml`` and ``model/`` are used; or an inference model folder
            (path or fsspec URL) with ``config``.
        data: data files or folders in the format the model was trained on.
        config: the YAML the model was trained with (default: the run folder's).
        out: write ``label<TAB>probability`` per example there (the label empty for
            files without the label column: docs/export.md).
        overrides: ``section.key=value`` assignments applied to the config.

    Returns:
        ``{"auc", "logloss", "examples", "files", "labelled", "model_dir"}``;
        ``auc`` and ``logloss`` None (``labelled`` False) for files without the label
        column.

    Raises:
        ConfigError: no config (``model`` is not a run folder and ``config`` is
            None), or the model does not match the config.
        DataError: the model or data is missing, unreadable or does not fit.
    """
    from psfleet.rec.config_load import load_config
    from psfleet.rec.predict import predict as score

    model_dir = str(model)
    run = None if "://" in model_dir else find_run_folder(Path(model_dir))
    if run is not None:
        config = config or run / CONFIG_NAME
        model_dir = str(run / "model")
    elif config is None:
        raise ConfigError(f"model {model_dir!r} is not a run folder (no {CONFIG_NAME} there, "
                          "nor a 'latest' run): give the config the model was trained with "
                          "(-m CONFIG.yaml)")
    loaded = load_config(config, overrides)
    if run is not None and not Path(model_dir).is_dir():
        model_dir = str(loaded.runner.model_dir)  # runner.inference_model_path
    paths = [Path(p) for p in ([data] if isinstance(data, str | Path) else data)]
    result = score(loaded, model_dir, paths[0] if len(paths) == 1 else paths,
                   Path(out) if out is not None else None)
    return {**result, "model_dir": model_dir}
