"""``psfleet parity``: does distributed training score as well as one process?

Runs the user's config once in one process (the reference, tables in process:
``cluster.server_num=0``, ``cluster.worker_num=1``) and then in every configuration of
modes x servers x workers, each ``repeats`` times, one run after another (never side
by side: they would compete for cores), as ``psfleet train`` subprocesses. Every run
writes its own run folder ``<out>/runs/<name>`` (:mod:`psfleet.rec.run_folder`):
``single-r<r>`` for the reference, ``<mode>-<S>x<W>-r<r>`` for the others. Repeat r of
every configuration runs before repeat r+1, so a drift of the machine spreads over all.

The pieces, pure where they can be (so the summary is unit-tested on hand-made
metrics): :func:`parse_modes` / :func:`parse_counts` (the flags), :func:`plan_runs`
(the runs in order), :func:`run_overrides` (each run's ``-o``), :func:`execute` (the
subprocesses), :func:`run_record` (a run's record from its exit code and
``metrics.json``), :func:`summarise` (per configuration: median, min and max of the
test AUC and log loss, their differences to the reference's medians, COPC, examples/s,
and whether ``|AUC diff| <= tolerance``) and :func:`format_table`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from psfleet.errors import ConfigError
from psfleet.job.modes import mode_spec
from psfleet.rec.batch_note import global_batch_note
from psfleet.types import MODES

__all__ = ["REFERENCE", "PS_MODES", "RunSpec", "parse_modes", "parse_counts", "plan_runs",
           "run_overrides", "run_record", "execute", "summarise", "format_table",
           "train_command"]

#: The reference configuration's name (one process, tables in process).
REFERENCE = "single"
#: The parameter-server modes (they need servers >= 1).
PS_MODES = tuple(m for m in MODES if m != "collective")
_STDERR_TAIL_LINES = 20


@dataclass(frozen=True)
class RunSpec:
    """One planned ``psfleet train`` run.

    Attributes:
        configuration: the row it belongs to: ``single`` or ``<mode> <S>x<W>``.
        mode: ``runner.sync_mode`` of the run; None for the reference (as configured).
        server_num: ``cluster.server_num`` (0: the reference and collective mode).
        worker_num: ``cluster.worker_num``.
        repeat: 1-based repeat.
    """

    configuration: str
    mode: str | None
    server_num: int
    worker_num: int
    repeat: int

    @property
    def run_name(self) -> str:
        """The run folder's name: ``single-r1``, ``async-1x2-r1``."""
        if self.mode is None:
            return f"{REFERENCE}-r{self.repeat}"
        return f"{self.mode}-{self.server_num}x{self.worker_num}-r{self.repeat}"


def parse_modes(text: str) -> list[str]:
    """``--modes``: comma-separated modes, each one of :data:`~psfleet.types.MODES`,
    duplicates dropped (first kept).

    Raises:
        ConfigError: empty, or an unknown mode (names ``--modes`` and the known ones).
    """
    modes = list(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    if not modes:
        raise ConfigError(f"--modes: {text!r} names no mode; give some of {', '.join(MODES)}")
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
    return modes


def parse_counts(flag: str, text: str, minimum: int = 1) -> list[int]:
    """``--workers`` / ``--servers``: comma-separated integers >= ``minimum``,
    duplicates dropped (first kept).

    Raises:
        ConfigError: empty, not an integer, or below ``minimum`` (names ``flag``).
    """
    counts: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        try:
            value = int(part)
        except ValueError:
            raise ConfigError(f"{flag}: {part!r} in {text!r} is not an integer; give "
                              f"comma-separated integers >= {minimum}, e.g. 1,2") from None
        if value < minimum:
            raise ConfigError(f"{flag}: {value} must be >= {minimum}")
        if value not in counts:
            counts.append(value)
    return counts


def plan_runs(modes: Sequence[str], servers: Sequence[int], workers: Sequence[int],
              repeats: int) -> list[RunSpec]:
    """Every run in the order they run: per repeat, the reference, then each mode x
    servers x workers (collective: servers 0, one configuration per worker count).

    Raises:
        ConfigError: ``repeats`` < 1 (``--repeats``), or a parameter-server mode with
            servers 0 (``--servers``).
    """
    if repeats < 1:
        raise ConfigError(f"--repeats: {repeats} must be >= 1")
    for mode in modes:
        if mode_spec(mode).servers and 0 in servers:
            raise ConfigError(f"--servers: 0 with --modes {mode}: a parameter-server mode "
                              "needs servers >= 1 (0 is the single-process reference, "
                              "which always runs)")
    configurations: list[tuple[str, int, int]] = []
    for mode in modes:
        for s in (servers if mode_spec(mode).servers else [0]):
            configurations.extend((mode, s, w) for w in workers)
    return [spec for r in range(1, repeats + 1)
            for spec in [RunSpec(REFERENCE, None, 0, 1, r)] + [
                RunSpec(f"{m} {s}x{w}", m, s, w, r) for m, s, w in configurations]]


def run_overrides(spec: RunSpec, runs_dir: Path, configured_mode: str) -> list[str]:
    """The ``-o`` assignments parity adds to the user's for ``spec`` (after them, so
    they win): cluster, mode, run folder, no export; pass mode (``gpubox``) also its
    reader, ``InMemoryDataset`` (the same examples as the other readers). The
    reference keeps ``configured_mode`` unless that is ``collective`` or ``gpubox``
    (one process trains on tables in process, a parameter-server mode: ``async``)."""
    configured = mode_spec(configured_mode)
    mode = spec.mode or ("async" if configured.passes or not configured.servers
                         else configured_mode)
    reader = ["runner.reader_type=InMemoryDataset"] if mode_spec(mode).passes else []
    return [f"runner.sync_mode={mode}", f"cluster.server_num={spec.server_num}",
            f"cluster.worker_num={spec.worker_num}", f"runner.model_save_path={runs_dir}",
            f"runner.run_name={spec.run_name}", "runner.export_model=false", *reader]


def train_command(config: Path, overrides: Sequence[str]) -> list[str]:
    """``python -m psfleet.cli.main train -q -m CONFIG -o ...`` with this interpreter."""
    return [sys.executable, "-m", "psfleet.cli.main", "train", "-q", "-m", str(config),
            *(arg for o in overrides for arg in ("-o", o))]


def _tail(path: Path, lines: int = _STDERR_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_record(spec: RunSpec, run_folder: Path, exit_code: int, wall_s: float,
               stderr_path: Path | None = None) -> dict[str, Any]:
    """A run's record for parity.json: the spec, its run folder, exit code, wall
    seconds, its ``metrics.json`` (None when missing or unreadable) and ``error``
    (None when it finished: exit 0 and a test AUC; else why, with the tail of its
    stderr)."""
    metrics: dict[str, Any] | None = None
    try:
        loaded = json.loads((run_folder / "metrics.json").read_text())
        metrics = loaded if isinstance(loaded, dict) else None
    except (OSError, ValueError):
        pass
    test = (metrics or {}).get("test") or {}
    error = None
    if exit_code != 0:
        error = f"exit code {exit_code}"
    elif metrics is None:
        error = f"no readable {run_folder / 'metrics.json'}"
    elif not isinstance(test.get("auc"), int | float):
        error = "metrics.json has no test AUC"
    if error is not None and stderr_path is not None:
        error += f"; stderr ({stderr_path}) ends:\n{_tail(stderr_path)}"
    return {"configuration": spec.configuration, "mode": spec.mode,
            "server_num": spec.server_num, "worker_num": spec.worker_num,
            "repeat": spec.repeat, "run_name": spec.run_name, "run_folder": str(run_folder),
            "exit_code": exit_code, "wall_s": wall_s, "finished": error is None,
            "error": error, "metrics": metrics}


def execute(specs: Sequence[RunSpec], command: Callable[[RunSpec], list[str]],
            runs_dir: Path, logs_dir: Path,
            on_start: Callable[[int, RunSpec], None] | None = None,
            on_end: Callable[[int, dict[str, Any]], None] | None = None
            ) -> list[dict[str, Any]]:
    """Run ``command(spec)`` for each spec, one after another, stdout and stderr to
    ``logs_dir/<run name>.stdout|.stderr``; returns the :func:`run_record` of each.

    Blocks. A KeyboardInterrupt (Ctrl-C, or SIGTERM turned into one by the caller)
    while a run goes on sends it SIGINT (it stops as on Ctrl-C), waits up to 60 s,
    kills it if needed, and is re-raised.

    Args:
        on_start, on_end: called with the 0-based index and the spec / the record.
    """
    logs_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for i, spec in enumerate(specs):
        if on_start is not None:
            on_start(i, spec)
        out, err = (logs_dir / f"{spec.run_name}.{s}" for s in ("stdout", "stderr"))
        started = time.perf_counter()
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(command(spec), stdout=stdout, stderr=stderr,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                code = proc.wait()
            except BaseException:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                raise
        record = run_record(spec, runs_dir / spec.run_name, code,
                            time.perf_counter() - started, err)
        records.append(record)
        if on_end is not None:
            on_end(i, record)
    return records


def _stats(values: list[float]) -> tuple[float, float, float] | tuple[None, None, None]:
    if not values:
        return None, None, None
    array = np.asarray(values, dtype=np.float64)
    return float(np.median(array)), float(array.min()), float(array.max())


def _diff(value: float | None, reference: float | None) -> float | None:
    return None if value is None or reference is None else value - reference


def summarise(records: Sequence[Mapping[str, Any]], tolerance: float
              ) -> list[dict[str, Any]]:
    """Per configuration, in first-seen order (the reference first): ``runs`` and
    ``finished`` (counts), the finished runs' test AUC median / min / max, log loss
    median / min / max, COPC median (clicks over predicted clicks: calibration) and
    examples/s median; ``auc_diff`` (median minus the reference's median) with
    ``auc_diff_min`` / ``auc_diff_max`` (min / max minus the reference's median),
    ``logloss_diff``; ``within_tolerance`` (``|auc_diff| <= tolerance``; None when a
    median is missing: every run of it, or of the reference, failed);
    ``global_batch_note`` (:func:`psfleet.rec.batch_note.global_batch_note` of its
    first finished run: its updates saw W times one process's batch, and what
    ``runner.lr_scaling`` did; None otherwise). Pure.

    Args:
        records: :func:`run_record` dicts (only ``configuration``, ``finished`` and
            ``metrics`` with ``test.auc``, ``test.logloss``, ``test.copc``,
            ``examples_per_s`` read).
        tolerance: the allowed |AUC difference|, >= 0.
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault(record["configuration"], []).append(record)
    rows: list[dict[str, Any]] = []
    for name, group in groups.items():
        done = [r["metrics"] for r in group if r["finished"]]
        auc = _stats([float(m["test"]["auc"]) for m in done])
        logloss = _stats([float(m["test"]["logloss"]) for m in done
                          if m["test"].get("logloss") is not None])
        copc = _stats([float(m["test"]["copc"]) for m in done
                       if m["test"].get("copc") is not None])
        speed = _stats([float(m["examples_per_s"]) for m in done
                        if m.get("examples_per_s") is not None])
        rows.append({"configuration": name, "runs": len(group), "finished": len(done),
                     "auc_median": auc[0], "auc_min": auc[1], "auc_max": auc[2],
                     "logloss_median": logloss[0], "logloss_min": logloss[1],
                     "logloss_max": logloss[2], "copc_median": copc[0],
                     "examples_per_s_median": speed[0],
                     "global_batch_note": global_batch_note(done[0]) if done else None})
    reference = next((r for r in rows if r["configuration"] == REFERENCE), None)
    ref_auc = reference["auc_median"] if reference else None
    ref_logloss = reference["logloss_median"] if reference else None
    for row in rows:
        row["auc_diff"] = _diff(row["auc_median"], ref_auc)
        row["auc_diff_min"] = _diff(row["auc_min"], ref_auc)
        row["auc_diff_max"] = _diff(row["auc_max"], ref_auc)
        row["logloss_diff"] = _diff(row["logloss_median"], ref_logloss)
        row["within_tolerance"] = (None if row["auc_diff"] is None
                                   else bool(abs(row["auc_diff"]) <= tolerance + 1e-12))
    return rows


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def format_table(rows: Sequence[Mapping[str, Any]], tolerance: float) -> str:
    """The summary as an aligned text table, one line per configuration (AUC and log
    loss to 4 decimals, as ``psfleet train`` prints them; differences signed; COPC to
    3)."""
    header = ["configuration", "runs", "test AUC median (min-max)", "AUC diff",
              "log loss median", "log loss diff", "COPC median", "examples/s",
              f"within {tolerance:g}"]
    lines = [header]
    for r in rows:
        runs = f"{r['finished']}" if r["finished"] == r["runs"] else \
            f"{r['finished']}/{r['runs']} ok"
        auc = (f"{r['auc_median']:.4f} ({r['auc_min']:.4f}-{r['auc_max']:.4f})"
               if r["auc_median"] is not None else "-")
        within = {True: "yes", False: "NO", None: "-"}[r["within_tolerance"]]
        lines.append([r["configuration"], runs, auc, _number(r["auc_diff"], "+.4f"),
                      _number(r["logloss_median"], ".4f"), _number(r["logloss_diff"], "+.4f"),
                      _number(r["copc_median"], ".3f"),
                      _number(r["examples_per_s_median"], ",.0f"), within])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
                     .rstrip() for line in lines)
