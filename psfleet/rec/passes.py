"""Online training by pass: the plan of passes, the end of a pass, the per-pass record.

With ``runner.train_passes`` the job trains pass 1, 2, ... in order, each
``runner.epochs`` times, on a reader built for that pass's files. Epochs are numbered
across passes (pass k, 0-based, holds epochs ``k * epochs .. (k + 1) * epochs - 1``),
so a checkpoint's cursor ``(epoch, batch)`` says the pass too, and a restarted job
resumes in the pass (and at the batch) where it stopped. After the last epoch of a
pass every worker runs :func:`end_pass` (``runner.after_pass``: shrink, set_date, the
pass's save) and worker 0 writes the pass's entry of ``metrics.json``
(:class:`PassBook`): per table the rows and bytes after the pass (summed over the
servers) and the rows admitted, rejected, evicted and deleted during it, then the
pass's validation figures. The entries travel in each checkpoint (``extra``), so a
resumed run keeps the entries of the passes done before it stopped.

Without ``train_passes`` the plan is one pass (``runner.train_data_dir``) and nothing
here runs at its end.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psfleet import fleet
from psfleet.checkpoint import CheckpointConfig, CheckpointStore
from psfleet.ps.types import SaveMode
from psfleet.rec.config import TrainConfig, parser_schema
from psfleet.rec.features import table_specs
from psfleet.rec.online_config import AfterPassConfig, SaveAfterPass
from psfleet.rpc.messages import StatsResponse

__all__ = ["COUNTERS", "SAVES_DIR", "PassBook", "PassPlan", "end_pass", "pass_save_dir",
           "restored_passes", "sparse_table_names", "table_totals"]

logger = logging.getLogger(__name__)

#: The folder of the per-pass saves in the run folder: ``saves/pass-<k>``.
SAVES_DIR = "saves"

#: Lifecycle counters of a table's Stats, counted per pass in metrics.json.
COUNTERS = ("admitted", "rejected", "evicted", "deleted", "spilled", "promoted")


@dataclass(frozen=True)
class PassPlan:
    """The passes of a run and the epochs of each.

    Attributes:
        paths: ``runner.train_passes`` (a file or folder each), or None: one pass,
            ``runner.train_data_dir``, and no end-of-pass actions.
        epochs: epochs per pass (``runner.epochs``).
    """

    paths: tuple[Path, ...] | None
    epochs: int

    @classmethod
    def of(cls, config: TrainConfig) -> PassPlan:
        """The plan of ``config``'s runner section."""
        runner = config.runner
        passes = runner.train_passes
        return cls(tuple(passes) if passes is not None else None, runner.epochs)

    @property
    def online(self) -> bool:
        """Whether the data is a list of passes (``runner.train_passes``)."""
        return self.paths is not None

    @property
    def count(self) -> int:
        """The number of passes (1 without ``train_passes``)."""
        return len(self.paths) if self.paths is not None else 1

    @property
    def total_epochs(self) -> int:
        """Epochs of the whole run, every pass."""
        return self.count * self.epochs

    def pass_of(self, epoch: int) -> int:
        """The 0-based pass of 0-based run epoch ``epoch`` (the last pass for the
        cursor at the end of the run)."""
        return min(epoch // self.epochs, self.count - 1)

    def ends_pass(self, epoch: int) -> bool:
        """Whether run epoch ``epoch`` is the last of its pass (online only)."""
        return self.online and (epoch + 1) % self.epochs == 0

    def config_for(self, config: TrainConfig, k: int) -> TrainConfig:
        """``config`` whose ``train_data_dir`` is pass ``k``'s path (the config itself
        when not online)."""
        if self.paths is None:
            return config
        runner = config.runner.model_copy(update={"train_data_dir": self.paths[k]})
        return config.model_copy(update={"runner": runner})

    def start_pass(self, checkpoint: CheckpointConfig | None) -> int:
        """The pass of the newest complete checkpoint's cursor (0 without one): the
        pass whose reader a (re)starting worker builds first. Reads the manifest only;
        the checkpoint is loaded later (``resume_cursor``), and a different cursor
        there (the newest was damaged) makes the trainer build that pass's reader."""
        if checkpoint is None or not self.online:
            return 0
        latest = CheckpointStore(checkpoint.checkpoint_dir).latest()
        return self.pass_of(latest.manifest.epoch) if latest is not None else 0


def restored_passes(checkpoint: CheckpointConfig | None) -> list[dict[str, Any]]:
    """The pass entries stored in the newest complete checkpoint (``extra["passes"]``),
    or [] (no checkpoint, or one taken before any pass ended)."""
    if checkpoint is None:
        return []
    latest = CheckpointStore(checkpoint.checkpoint_dir).latest()
    entries = latest.manifest.extra.get("passes") if latest is not None else None
    return list(entries) if isinstance(entries, list) else []


def table_totals(stats: Sequence[StatsResponse],
                 names: Collection[str] | None = None) -> dict[str, dict[str, int]]:
    """Per table name (only ``names`` when given, e.g. the sparse tables): ``rows``,
    ``bytes`` (memory), ``disk_rows``, ``disk_bytes`` and the lifecycle counters
    (:data:`COUNTERS`) summed over the servers' Stats."""
    totals: dict[str, dict[str, int]] = {}
    for server in stats:
        for table in server.tables:
            if names is not None and table.name not in names:
                continue
            into = totals.setdefault(table.name, dict.fromkeys(
                ("rows", "bytes", "disk_rows", "disk_bytes", *COUNTERS), 0))
            into["rows"] += int(table.rows)
            into["bytes"] += int(table.memory_bytes)
            into["disk_rows"] += int(table.disk_rows)
            into["disk_bytes"] += int(table.disk_bytes)
            for name in COUNTERS:
                into[name] += int(getattr(table, name))
    return totals


class PassBook:
    """Worker 0's record of the passes (metrics.json ``passes``).

    Args:
        entries: the entries of passes done before a restart (:func:`restored_passes`).
        baseline: the tables' totals when this process started training
            (:func:`table_totals`), or None: fresh servers, every counter 0.
    """

    def __init__(self, entries: list[dict[str, Any]],
                 baseline: dict[str, dict[str, int]] | None) -> None:
        self.entries = entries
        self._previous = baseline or {}

    def record(self, k: int, epoch: int, path: Path,
               totals: dict[str, dict[str, int]] | None, shrunk: int | None,
               saved: str | None) -> dict[str, Any]:
        """Add pass ``k``'s entry (0-based ``k``, run epochs done ``epoch``).

        Per table: ``rows``, ``bytes``, ``disk_rows`` and ``disk_bytes`` after the
        pass; each counter of
        :data:`COUNTERS` as its growth during the pass (the total now minus the total
        at the previous pass's end; the total itself when it went down, i.e. a
        server restarted and counts from 0 again). ``tables`` is None in collective
        mode (no servers). ``valid`` is filled by the trainer.

        Returns:
            ``{"pass", "epoch", "data", "tables", "shrink_deleted", "save", "valid"}``.
        """
        tables: dict[str, dict[str, int]] | None = None
        if totals is not None:
            tables = {}
            for name, now in totals.items():
                before = self._previous.get(name, {})
                row = {key: now[key] for key in ("rows", "bytes", "disk_rows", "disk_bytes")}
                for counter in COUNTERS:
                    grown = now[counter] - before.get(counter, 0)
                    row[counter] = grown if grown >= 0 else now[counter]
                tables[name] = row
            self._previous = totals
        entry: dict[str, Any] = {"pass": k + 1, "epoch": epoch, "data": str(path),
                                 "tables": tables, "shrink_deleted": shrunk, "save": saved,
                                 "valid": None}
        self.entries.append(entry)
        return entry


def sparse_table_names(config: TrainConfig) -> list[str]:
    """The names of the model's sparse tables (those a pass entry reports)."""
    schema = parser_schema(config.runner)
    return [spec.name for spec in table_specs(config.hyper_parameters, schema)]


def pass_save_dir(config: TrainConfig, k: int) -> Path:
    """Where pass ``k``'s (0-based) save goes: ``<run folder>/saves/pass-<k+1>``."""
    return config.runner.run_dir / SAVES_DIR / f"pass-{k + 1}"


def _save_mode(save: SaveAfterPass, k: int) -> SaveMode:
    """The save mode of pass ``k`` (``save`` is not ``none``): ``delta`` saves a base
    at the first pass."""
    if save == "delta":
        return "base" if k == 0 else "delta"
    return "base" if save == "base" else "full"


def end_pass(config: TrainConfig, k: int, epoch: int, path: Path,
             book: PassBook | None) -> dict[str, Any] | None:
    """The end of pass ``k`` (0-based; ``epoch`` run epochs done); every worker calls it.

    In order: ``fleet.shrink()`` and ``fleet.set_date()`` when ``runner.after_pass``
    says so (each holds the job's barriers); then every worker flushes and meets the
    others; worker 0 (``book`` given) writes the pass's save
    (:func:`pass_save_dir`) and reads every server's Stats into the pass's entry,
    while the others wait at a second barrier (no push changes the tables meanwhile).

    Returns:
        The pass's entry on worker 0 (:meth:`PassBook.record`), else None.

    Raises:
        RpcError: a server did not answer; OSError: the save's folder cannot be made.
    """
    after = config.runner.after_pass or AfterPassConfig()
    shrunk = fleet.shrink() if after.shrink else None
    if after.set_date:
        fleet.set_date(day_id=k + 1)
    fleet.flush()
    fleet.barrier_worker()
    entry: dict[str, Any] | None = None
    if book is not None:
        saved = None
        if after.save != "none":
            folder = pass_save_dir(config, k)
            folder.mkdir(parents=True, exist_ok=True)
            fleet.save_persistables(str(folder), mode=_save_mode(after.save, k))
            saved = str(folder)
        totals = None if fleet.is_collective() else table_totals(
            fleet.server_stats(), sparse_table_names(config))
        entry = book.record(k, epoch, path, totals, shrunk, saved)
        logger.info("pass %d ended (%s): %s%s", k + 1, path, ", ".join(
            f"{name} {t['rows']} rows, +{t['admitted']} admitted, {t['evicted']} evicted, "
            f"{t['deleted']} deleted" for name, t in (entry["tables"] or {}).items()),
            f"; saved {saved}" if saved else "")
    fleet.barrier_worker()
    return entry
