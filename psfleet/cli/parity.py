"""``psfleet parity``: a parity report of distributed vs single-process training.

Usage::

    psfleet parity -m config.yaml [-o KEY=VALUE ...] [--modes async,geo] [--workers 1,2]
                   [--servers 1] [--repeats 1] [--out DIR] [--tolerance 0.005] [--strict]

Trains the config in one process (the reference: ``cluster.server_num=0``,
``cluster.worker_num=1``, tables in process) and in every configuration of --modes x
--servers x --workers (``collective``: no servers, one configuration per worker
count), each --repeats times, one ``psfleet train`` after another, with the user's
``-o`` overrides on every run and the model export off. Each run has its own run
folder ``OUT/runs/<name>`` (``single-r1``, ``async-1x2-r1``, ...; its output in
``OUT/logs/<name>.stdout|.stderr``). Then it prints one table row per configuration
(test AUC median and range, its difference to the reference's median, log loss, its
difference, COPC, examples/s, and whether ``|AUC diff| <= --tolerance``) and writes
``OUT/parity.json`` (every run's record and metrics, the summary) and
``OUT/parity.png`` (the AUC differences with the tolerance band). docs/parity.md
explains how to read them.

``OUT`` defaults to ``<runner.model_save_path>/parity-<YYYYmmdd-HHMMSS>``.

Exit codes: 0 when every run finished, whatever the AUC; 1 when a run failed (each
failure is printed with the tail of its stderr; the others are still reported) or,
with ``--strict``, when a configuration is outside the tolerance; 2 for bad input,
before any run starts (a config without ``runner.test_data_dir``, an unknown mode,
counts that are not positive integers, a parameter-server mode with servers 0,
``--repeats`` < 1, an ``--out`` that cannot be created or already holds these runs,
an override or configuration the config loader rejects); 130 / 143 on SIGINT /
SIGTERM (the running run is stopped as on Ctrl-C; the finished ones are reported).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from psfleet.cli.commands import help_of
from psfleet.cli.console import received_signal, signals_interrupt
from psfleet.errors import ConfigError
from psfleet.rec import parity
from psfleet.rec.config_load import load_config
from psfleet.rec.json_file import write_json_atomic
from psfleet.rec.parity_plot import PARITY_PNG, plot_parity

__all__ = ["PARITY_JSON", "register"]

PARITY_JSON = "parity.json"


def _validate(args: argparse.Namespace) -> tuple[list[parity.RunSpec], Path, str]:
    """Every flag, the config and each configuration's overrides, before any run.

    Returns:
        The runs in order, OUT, and the configured ``runner.sync_mode``.

    Raises:
        ConfigError: naming the flag (or the config field) at fault.
    """
    if not math.isfinite(args.tolerance) or args.tolerance < 0:
        raise ConfigError(f"--tolerance: {args.tolerance} must be a number >= 0 (AUC)")
    modes = parity.parse_modes(args.modes)
    workers = parity.parse_counts("--workers", args.workers)
    servers = parity.parse_counts("--servers", args.servers, minimum=0)
    specs = parity.plan_runs(modes, servers, workers, args.repeats)
    config = load_config(args.config, args.override)
    if config.runner.test_data_dir is None:
        raise ConfigError(f"runner.test_data_dir: not set in {args.config}; parity compares "
                          "the test AUC of the runs: set it in the config or pass "
                          "-o runner.test_data_dir=FILE")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = (args.out if args.out is not None
           else config.runner.model_save_path / f"parity-{stamp}").absolute()
    runs_dir, mode = out / "runs", config.runner.sync_mode
    for spec in specs:
        if (runs_dir / spec.run_name / "metrics.json").exists():
            raise ConfigError(f"--out: {str(out)!r} already holds the run {spec.run_name} "
                              "(its metrics.json); choose another --out or leave it unset")
        if spec.repeat == 1:  # the other repeats differ only by name
            try:
                load_config(args.config, [*args.override,
                                          *parity.run_overrides(spec, runs_dir, mode)])
            except ConfigError as exc:
                raise ConfigError(f"--modes/--servers/--workers: the configuration "
                                  f"{spec.configuration!r} is invalid: {exc}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise PermissionError(f"{out} is not writable")
    except OSError as exc:
        raise ConfigError(f"--out: cannot create or write {str(out)!r}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    return specs, out, mode


def _report(args: argparse.Namespace, out: Path, records: list[dict[str, Any]],
            interrupted: bool) -> list[dict[str, Any]]:
    """Print the table and the failures, write parity.json and parity.png."""
    rows = parity.summarise(records, args.tolerance)
    print(parity.format_table(rows, args.tolerance), flush=True)
    for row in rows:
        if row["global_batch_note"]:
            print(f"psfleet parity: {row['configuration']}: {row['global_batch_note']}",
                  flush=True)
    for r in records:
        if not r["finished"]:
            print(f"psfleet parity: run {r['run_name']} ({r['configuration']}, repeat "
                  f"{r['repeat']}) failed: {r['error']}", file=sys.stderr, flush=True)
    report = {"config": str(Path(args.config).absolute()), "overrides": args.override,
              "modes": args.modes, "servers": args.servers, "workers": args.workers,
              "repeats": args.repeats, "tolerance": args.tolerance,
              "reference": parity.REFERENCE, "interrupted": interrupted,
              "runs": records, "summary": rows}
    write_json_atomic(out / PARITY_JSON, report)
    plot = ""
    try:
        plot_parity(out / PARITY_PNG, rows, args.tolerance,
                    f"test AUC vs one process: {Path(args.config).name}")
        plot = f", plot in {out / PARITY_PNG}"
    except Exception as exc:  # noqa: BLE001 - the report must not be lost to a plot
        print(f"psfleet parity: parity.png could not be drawn: {exc}", file=sys.stderr)
    within = sum(r["within_tolerance"] is True for r in rows)
    print(f"psfleet parity: {within} of {len(rows)} configurations within "
          f"±{args.tolerance:g} AUC of the single-process median; report in "
          f"{out / PARITY_JSON}{plot}", flush=True)
    return rows


def _run(args: argparse.Namespace) -> int:
    specs, out, mode = _validate(args)
    runs_dir = out / "runs"
    names = list(dict.fromkeys(s.configuration for s in specs))
    print(f"psfleet parity: {len(specs)} runs ({', '.join(names)}; {args.repeats} "
          f"repeat{'s' if args.repeats > 1 else ''}), one after another; run folders in "
          f"{runs_dir}", flush=True)
    records: list[dict[str, Any]] = []

    def started(i: int, spec: parity.RunSpec) -> None:
        print(f"psfleet parity: [{i + 1}/{len(specs)}] {spec.configuration} repeat "
              f"{spec.repeat}: started ({spec.run_name})", flush=True)

    def ended(i: int, record: dict[str, Any]) -> None:
        records.append(record)
        head = (f"psfleet parity: [{i + 1}/{len(specs)}] {record['configuration']} repeat "
                f"{record['repeat']}: ")
        if record["finished"]:
            test = record["metrics"]["test"]
            print(f"{head}test auc {test['auc']:.4f}, logloss {test['logloss']:.4f}, "
                  f"{record['wall_s']:.1f} s", flush=True)
        else:
            print(f"{head}FAILED ({record['error'].splitlines()[0]}) after "
                  f"{record['wall_s']:.1f} s", flush=True)

    def command(spec: parity.RunSpec) -> list[str]:
        return parity.train_command(args.config, [
            *args.override, *parity.run_overrides(spec, runs_dir, mode)])

    try:
        with signals_interrupt():
            parity.execute(specs, command, runs_dir, out / "logs", started, ended)
    except KeyboardInterrupt as exc:
        signum = received_signal(exc)
        print(f"psfleet parity: interrupted ({signal.Signals(signum).name}) after "
              f"{len(records)} of {len(specs)} runs", file=sys.stderr, flush=True)
        _report(args, out, records, interrupted=True)
        return 128 + signum
    rows = _report(args, out, records, interrupted=False)
    if not all(r["finished"] for r in records):
        return 1
    if args.strict and not all(r["within_tolerance"] for r in rows):
        print("psfleet parity: --strict: a configuration is outside the tolerance",
              file=sys.stderr, flush=True)
        return 1
    return 0


def register(commands: Any) -> None:
    """Add ``parity`` to ``commands`` (the subparsers action of ``psfleet``'s parser);
    it sets ``handler``, a function of the parsed arguments returning the exit code
    (raising ConfigError on a bad argument, before any run)."""
    p = commands.add_parser(
        "parity", help=help_of("parity"),
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--config", required=True, type=Path,
                   help="the YAML config (needs runner.test_data_dir)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value on every run, e.g. -o runner.epochs=2")
    p.add_argument("--modes", default="async,geo",
                   help="comma-separated runner.sync_mode values (default async,geo)")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts "
                   "(default 1,2)")
    p.add_argument("--servers", default="1", help="comma-separated server counts, >= 1 "
                   "for the parameter-server modes (default 1; collective has none)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of every configuration (default 1)")
    p.add_argument("--out", type=Path, help="the report's folder (default "
                   "<runner.model_save_path>/parity-<YYYYmmdd-HHMMSS>)")
    p.add_argument("--tolerance", type=float, default=0.005,
                   help="the allowed |test AUC difference| to one process (default 0.005)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 also when a configuration is outside the tolerance")
    p.set_defaults(handler=_run)
