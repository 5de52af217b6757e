"""Run folders: every run of the YAML runner writes ``<model_save_path>/<run name>/``.

A run folder holds what the run produced, so a second run never overwrites the
first's::

    output/
      20261124-093012/        one run (runner.run_name, or its start time)
        config.yaml           the effective config (overrides applied; paths absolute)
        metrics.json          worker 0's metrics (rec.reporting)
        curves.png            the curves (rec.curves)
        tensorboard/          the event files (rec.curves)
        log/                  a local job's logs, one file per process (launch)
        model/                the exported inference model (runner.export_model)
        exchange/             files workers exchange (global shuffle, sync counts)
      latest -> 20261124-093012

``psfleet train`` names the run before it starts any process (:func:`name_run`) and
hands the name to every process of the job (``-o runner.run_name=NAME``); worker 0
opens the folder (:func:`open_run_folder`): it writes ``config.yaml`` and points
``latest`` at it. A process started some other way (``fleetrun`` or ``torchrun`` on
a ``psfleet train`` command without ``runner.run_name``) uses the folder ``run``.

Naming an existing run folder (``-o runner.run_name=NAME``) continues that run: an
interrupted or failed run resumes from its checkpoints (``runner.checkpoint``); a
run that finished (its metrics.json's ``interrupted`` entry is null) is an error,
since continuing would replace its results.

Checkpoints stay where ``runner.checkpoint.checkpoint_dir`` says (relative to the
YAML file): the next run of the same config resumes from them, as Paddle's
``CheckpointConfig`` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from psfleet.errors import ConfigError
from psfleet.fleet.role_info import restart_num
from psfleet.rec.config import TrainConfig
from psfleet.rec.config_load import dump_config

__all__ = ["CONFIG_NAME", "LATEST", "DEFAULT_RUN_NAME", "name_run", "check_run_folder",
           "open_run_folder", "find_run_folder"]

#: The effective config in a run folder.
CONFIG_NAME = "config.yaml"
#: The link in ``model_save_path`` to the newest run folder.
LATEST = "latest"
#: The run folder of a job process started without a run name.
DEFAULT_RUN_NAME = "run"


def name_run(config: TrainConfig, now: float | None = None) -> TrainConfig:
    """``config`` with ``runner.run_name`` set: kept if given, else the local start
    time ``YYYYmmdd-HHMMSS`` (``-2``, ``-3`` ... appended when that folder exists).

    Args:
        config: a loaded config.
        now: the start time, seconds since the epoch (default: now).
    """
    runner = config.runner
    if runner.run_name is not None:
        return config
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    name, n = stamp, 1
    while (runner.model_save_path / name).exists():
        n += 1
        name = f"{stamp}-{n}"
    return config.model_copy(update={"runner": runner.model_copy(update={"run_name": name})})


def _finished(metrics_path: Path) -> bool:
    """Whether ``metrics_path`` is the metrics.json of a run that ran to its end."""
    try:
        metrics = json.loads(metrics_path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(metrics, dict) and metrics.get("interrupted") is None


def check_run_folder(config: TrainConfig) -> None:
    """Refuse to continue a run that finished (see the module doc). A process the
    launcher restarted (``PSFLEET_RESTART_NUM`` > 0) continues its own job's folder
    whatever its metrics.json says: e.g. a sync job restarted whole after a process
    failed once worker 0 had written it.

    Raises:
        ConfigError: the run folder's metrics.json is a finished run's (names the
            folder, and what to do).
    """
    folder = config.runner.run_dir
    if restart_num() == 0 and _finished(folder / "metrics.json"):
        if config.runner.run_name is None:  # processes started by hand or by mpirun
            raise ConfigError(
                f"runner.run_name is not set, so this job writes {folder}, which holds a "
                "finished run (its metrics.json): name this run (-o runner.run_name=NAME; "
                "only psfleet train's own launcher names runs by their start time) or "
                "delete that folder")
        raise ConfigError(
            f"runner.run_name: {config.runner.run_name!r}: {folder} holds a finished run "
            "(its metrics.json); choose another run_name, leave it unset for a new "
            "time-stamped folder, or delete that folder")


def open_run_folder(config: TrainConfig) -> Path:
    """Create the run folder, write its ``config.yaml`` and point ``latest`` at it
    (worker 0, before training).

    Returns:
        The run folder.

    Raises:
        ConfigError: the run folder holds a finished run (:func:`check_run_folder`).
        OSError: the folder cannot be written.
    """
    check_run_folder(config)
    folder = config.runner.run_dir
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{CONFIG_NAME}.{os.getpid()}"
    temporary.write_text(dump_config(config))
    os.replace(temporary, folder / CONFIG_NAME)
    _point_latest(folder)
    return folder


def _point_latest(folder: Path) -> None:
    """Make ``<model_save_path>/latest`` a relative link to ``folder``, atomically
    (a new link renamed over the old one). A file system without symbolic links gets
    a text file ``latest`` holding the name instead."""
    link = folder.parent / LATEST
    temporary = folder.parent / f".{LATEST}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    try:
        temporary.symlink_to(folder.name, target_is_directory=True)
    except OSError:
        temporary.write_text(folder.name + "\n")
    os.replace(temporary, link)


def find_run_folder(path: Path) -> Path | None:
    """The run folder ``path`` names: a run folder itself (it holds ``config.yaml``), or
    a ``model_save_path`` (its ``latest`` run); None when it is neither."""
    if (path / CONFIG_NAME).is_file():
        return path
    latest = path / LATEST
    if latest.is_file():  # the text-file form of the link
        latest = path / latest.read_text().strip()
    if (latest / CONFIG_NAME).is_file():
        return latest.resolve()
    return None
