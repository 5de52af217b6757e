"""``psfleet``: the command line of the YAML runner.

Usage::

    psfleet train -m CONFIG.yaml [-o section.key=value ...] [-q | -v]
    psfleet datagen criteo --rows N --seed S --out FILE [--test_rows M --test_out FILE2]
    psfleet datagen multihot --rows N --seed S --out FILE.csv [--test_rows M --test_out FILE2]
    psfleet predict --model RUN_FOLDER --data FILE|DIR [--out SCORES.tsv]
    psfleet predict -m CONFIG.yaml --model MODEL_DIR --data FILE|DIR [--out SCORES.tsv]
    psfleet status RUN_FOLDER | LOG_DIR | ENDPOINT[,ENDPOINT...]
    psfleet drain RUN_FOLDER | LOG_DIR | ENDPOINT[,ENDPOINT...] --server N
    psfleet grow RUN_FOLDER | LOG_DIR [--servers K]
    psfleet init [--model dnn|wide_deep|deepfm|dcn_v2] [--data criteo|multihot] [--force] DIR
    psfleet example NAME [--out DIR] [--force] | psfleet example --list
    psfleet k8s render|submit -m CONFIG.yaml --image IMAGE [--volume CLAIM:PATH ...] [--out FILE]
    psfleet slurm render -m CONFIG.yaml [--workdir DIR] [--out FILE] [--partition P] [--time T]
    psfleet --version

``train`` reads a PaddleRec-style YAML (see README.md "The YAML runner"). With
``cluster.server_num`` >= 1 it starts the whole local job itself (servers and
workers, through the same launcher as ``fleetrun``, logs in
``<run folder>/log``); with ``runner.sync_mode: collective`` and
``cluster.worker_num`` > 1 it starts a local collective job of that many ranks
(``fleetrun --mode collective``; also runs under ``torchrun``, which sets WORLD_SIZE);
with ``server_num: 0`` it trains in this process against
in-process tables (the single-machine reference). Inside a job (the launcher set
TRAINING_ROLE, or ``mpirun`` started more than one rank: ranks ``0 ..
cluster.server_num-1`` serve, the rest train) it runs this process's role.

What ``train`` shows: one start line (model, mode, servers x workers, data files, log
folder), the progress bar of worker 0, warnings and errors, and the final line (test
AUC, examples/s, where metrics.json is). ``-v`` adds every INFO log line (the role and
strategy of each process, endpoints, epochs, checkpoints); ``-q`` shows errors and the
final line only. A local job's log files (``<run folder>/log``) always keep the
INFO lines (``PSFLEET_LOG_LEVEL``): the console filters worker 0's copied output
(:class:`psfleet.launch.console.ConsoleFilter`). Ctrl-C (SIGINT) or SIGTERM stops
training in every process and ends with one line: the epoch and step reached, where
the metrics so far are, and the newest checkpoint with the command that resumes from
it (or that there is none); no traceback (:mod:`psfleet.cli.console`).

``predict`` scores data offline (no server) with a model ``train`` exported (into the
run folder by default, :mod:`psfleet.rec.run_folder`) or ``fleet.save_inference_model``
wrote, prints AUC, log loss, the example count and the files read, and with ``--out``
writes ``label<TAB>probability`` per example. Files without the label column (``csv``
with a header, ``parquet``) are scored with no AUC or log loss and the label left empty
(``<TAB>probability``). Given a run folder (or the
``model_save_path`` holding ``latest``) it reads the run's ``config.yaml`` and
``model/``; given a model folder, ``-m`` names the config it was trained with.

``k8s`` and ``slurm`` render a job for a cluster manager (:mod:`psfleet.cli.k8s`,
:mod:`psfleet.cli.slurm`, docs/cluster.md).

``status`` prints, per server and table of a running job, rows, memory and pull/push
rates (docs/monitoring.md). ``drain`` removes a server from a running replicated job:
its shares are copied to the other servers first, so nothing is lost
(:mod:`psfleet.cli.drain`, docs/fault-tolerance.md). ``grow`` adds servers to one:
each takes its part of the shares (:mod:`psfleet.cli.grow`).

``datagen criteo`` writes synthetic raw Criteo TSV from a hidden model with a known
optimum (:mod:`psfleet.data.synthetic`), prints the optimum AUC and positive rate of
each file and writes them to ``FILE.json``. ``--test_out`` gets rows of the same
hidden model from an independent stream. ``datagen multihot`` does the same for a CSV
with a header, 4 numeric, 6 single-valued and 3 multi-valued (``|``-joined,
variable-length) columns, ``label,n1..n4,c1..c6,hist,tags,genres``, whose hidden model
pools the multi-valued ids by their mean (:mod:`psfleet.data.synthetic_multihot`).

Exit codes: 0 success; 1 the job failed (the first failure is printed with its log);
2 a bad config, argument or data file (the message names it); 130 interrupted by
SIGINT (Ctrl-C); 143 stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

from psfleet import env, logs
from psfleet.cli.commands import SUBCOMMANDS
from psfleet.cli.console import (
    close_progress_bars,
    exit_now,
    quiet_stderr,
    received_signal,
    report_interrupt,
    set_console_level,
    signals_interrupt,
    start_summary,
    stdout_buffer,
)
from psfleet.errors import ConfigError, DataError, PsfleetError
from psfleet.launch.console import plural, version_text

__all__ = ["main"]


def _in_job() -> bool:
    """Whether a launcher started this process as part of a job: fleetrun (its role
    variables), torchrun (``WORLD_SIZE``) or ``mpirun`` with more than one rank."""
    from psfleet.fleet.role_maker import mpi_world_size

    return any(env.read(name) is not None
               for name in ("TRAINING_ROLE", "PADDLE_TRAINING_ROLE", "WORLD_SIZE")
               ) or mpi_world_size() > 1


def _train(args: argparse.Namespace) -> int:
    from psfleet.api import job_launcher, prepare
    from psfleet.launch.console import ConsoleFilter, console_level
    from psfleet.rec.config_load import load_config

    started = time.time()
    in_job = _in_job()
    # A job's processes write details to their logs (PSFLEET_LOG_LEVEL) unless told
    # -q / -v themselves; the console of the command the user ran shows the level asked.
    if not in_job or args.quiet or args.verbose:
        detail = logging.getLogger("psfleet").getEffectiveLevel()
        set_console_level(console_level(args.quiet, args.verbose, detail))
    level = console_level(args.quiet, args.verbose)
    if in_job:  # the command that started the job checked the config and named the run
        config = load_config(args.config, args.override)
    else:
        # Every check runs here, before any process starts: the config's own rules on
        # load, then its data files, model name and run folder.
        config = prepare(args.config, args.override)
    overrides = list(args.override)
    if config.runner.run_name is not None and not any(
            o.startswith("runner.run_name=") for o in overrides):
        overrides.append(f"runner.run_name={config.runner.run_name}")  # resumes this run
    run_dir = config.runner.run_dir
    console = ConsoleFilter(stdout_buffer(), level)
    launch = None if in_job else job_launcher(config, cast(BinaryIO, console))
    if launch is not None:
        logs.set_role("launcher")
        if not args.quiet:
            print(f"{start_summary(config, launch[1])}; run folder {run_dir}", flush=True)
        code = launch[0]()
        if code - 128 in (signal.SIGINT, signal.SIGTERM):
            console.end_line()
            return report_interrupt(config, args.config, overrides, code - 128, started)
        return code
    from psfleet.rec.roles import run

    if not in_job and not args.quiet:
        print(f"{start_summary(config, 'in this process (cluster.server_num 0)')}; run "
              f"folder {run_dir}", flush=True)
    try:
        with quiet_stderr(args.quiet and not in_job):
            metrics = run(config)
    except KeyboardInterrupt as exc:
        signum = received_signal(exc)
        if in_job:  # the launcher reports it; this process's log says why it stopped
            logging.getLogger("psfleet.cli").info("stopped by %s", signal.Signals(signum).name)
            exit_now(128 + signum)
        close_progress_bars()
        return report_interrupt(config, args.config, overrides, signum, started, exc)
    if metrics is not None:
        from psfleet.rec.batch_note import global_batch_note

        test = metrics["test"]
        summary = (f"test auc {test['auc']:.4f}, logloss {test['logloss']:.4f} on "
                   f"{test['examples']} examples; " if test else "")
        skipped = "".join(
            f"; skipped {n['malformed']:,} malformed of {n['lines']:,} {name} lines"
            for name, n in (metrics.get("malformed_lines") or {}).items() if n["malformed"])
        curves = f", curves in {metrics['curves']}" if metrics.get("curves") else ""
        model = f", model in {metrics['export']}" if metrics.get("export") else ""
        stopped = metrics.get("early_stopped")
        early = (f"; stopped early after epoch {stopped['epoch']} (best valid "
                 f"{stopped['metric']} {stopped['best']:.4f} at epoch {stopped['best_epoch']})"
                 if stopped else "")
        note = global_batch_note(metrics)
        batch = f"; {note}" if note else ""
        print(f"psfleet: {summary}{metrics['examples_per_s']:,.0f} examples/s, "
              f"train wall time {metrics['train_wall_s']:.1f} s{skipped}; metrics in "
              f"{run_dir / 'metrics.json'}{curves}{model}{early}{batch}", flush=True)
    return 0


def _predict(args: argparse.Namespace) -> int:
    from psfleet.api import predict

    result = predict(args.model, args.data, args.config, args.out, args.override)
    written = f"; scores in {args.out}" if args.out is not None else ""
    files = result["files"]
    read = files[0] if len(files) == 1 else f"{plural(len(files), 'file')} of {args.data}"
    if result["labelled"]:
        scored = f"auc {result['auc']:.6f}, logloss {result['logloss']:.6f} on"
    else:
        scored = "scored (no label column: no auc or logloss)"
    print(f"psfleet: predict {scored} {result['examples']} examples of {read} with the model "
          f"in {result['model_dir']}{written}", flush=True)
    return 0


def _datagen(args: argparse.Namespace) -> int:
    from psfleet.data.synthetic import generate_criteo
    from psfleet.data.synthetic_multihot import generate_multihot

    generate = generate_multihot if args.generator == "multihot" else generate_criteo

    if args.rows < 1:
        raise ConfigError(f"--rows: {args.rows} must be >= 1")
    if args.seed < 0:
        raise ConfigError(f"--seed: {args.seed} must be >= 0")
    if (args.test_rows is None) != (args.test_out is None):
        raise ConfigError("--test_rows and --test_out go together; give both or neither")
    outputs = [("--out", args.out, args.rows, "train")]
    if args.test_out is not None:
        if args.test_rows < 1:
            raise ConfigError(f"--test_rows: {args.test_rows} must be >= 1")
        if args.test_out.resolve() == args.out.resolve():
            raise ConfigError(f"--test_out: {str(args.test_out)!r} is also --out")
        outputs.append(("--test_out", args.test_out, args.test_rows, "test"))
    for flag, path, _, _ in outputs:  # every folder before any file: nothing half done
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{flag}: cannot create the folder {str(path.parent)!r}: "
                              f"{exc.strerror or exc}") from None
    for flag, path, rows, split in outputs:
        try:
            result = generate(rows, args.seed, path, split=split)
        except DataError as exc:
            raise DataError(f"{flag}: {exc}") from exc
        print(f"psfleet: wrote {result.rows} {split} rows to {result.path} (seed {result.seed}):"
              f" optimum auc {result.optimum_auc:.6f}, positive rate "
              f"{result.positive_rate:.6f}; metadata in {result.path}.json", flush=True)
    return 0


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``psfleet`` argument parser for ``argv`` (default ``sys.argv[1:]``): every
    subcommand, the one ``argv`` names with all its arguments."""
    parser = argparse.ArgumentParser(prog="psfleet", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_text())
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train the model a YAML config describes")
    train.add_argument("-m", "--config", required=True, type=Path, help="the YAML config")
    train.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. -o cluster.server_num=0")
    verbosity = train.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true",
                           help="errors only (and the final result line)")
    verbosity.add_argument("-v", "--verbose", action="store_true",
                           help="details: every INFO log line (also in the job's logs)")
    datagen = commands.add_parser("datagen", help="write synthetic data sets")
    generators = datagen.add_subparsers(dest="generator", required=True)
    for name, kind, text, layout in (
            ("criteo", "TSV", "raw Criteo TSV from a hidden model with a known optimum AUC",
             "label, I1..I13, C1..C26 (psfleet.data.synthetic)"),
            ("multihot", "CSV", "CSV with multi-valued (|-joined) columns from a hidden "
                                "model with a known optimum AUC",
             "a header, then label,n1..n4,c1..c6,hist,tags,genres: 4 numeric columns "
             "(4 decimals), 6 single-valued ids, 3 variable-length bags of ids joined by "
             "'|' (an empty cell is an empty bag) (psfleet.data.synthetic_multihot)")):
        generator = generators.add_parser(
            name, help=text, description=f"{text[0].upper()}{text[1:]}. Columns: {layout}. "
            "Prints the optimum AUC and positive rate of each file and writes them to "
            "FILE.json.")
        generator.add_argument("--rows", required=True, type=int, help="rows of --out, >= 1")
        generator.add_argument("--seed", required=True, type=int,
                               help="seed of the hidden model and the rows, >= 0")
        generator.add_argument("--out", required=True, type=Path,
                               help=f"the {kind} to write (metadata in OUT.json)")
        generator.add_argument("--test_rows", type=int, help="rows of --test_out, >= 1")
        generator.add_argument("--test_out", type=Path,
                               help=f"a test {kind}: same hidden model, independent rows")
    predict = commands.add_parser(
        "predict", help="score a data file with an exported model, no server")
    predict.add_argument("-m", "--config", type=Path,
                         help="the YAML config the model was trained with (default: the "
                              "run folder's config.yaml)")
    predict.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                         help="override a config value")
    predict.add_argument("--model", required=True,
                         help="a run folder (or model_save_path: its latest run), or an "
                              "inference model directory (path or fsspec URL) with -m")
    predict.add_argument("--data", required=True, type=Path, help="a data file or directory")
    predict.add_argument("--out", type=Path, help="write label<TAB>probability per example "
                         "(the label empty for rows without one)")
    _add_subcommands(commands, _named_command(sys.argv[1:] if argv is None else argv))
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def _add_subcommands(commands: Any, named: str | None) -> None:
    """Add :data:`~psfleet.cli.commands.SUBCOMMANDS` to ``commands``: the one ``named``
    in full, importing its module; the others by their help line only (``psfleet
    --help`` lists them; naming one builds its parser)."""
    if named in SUBCOMMANDS:
        importlib.import_module(SUBCOMMANDS[named][0]).register(commands)
    for name, (_, text) in SUBCOMMANDS.items():
        if name not in commands.choices:
            commands.add_parser(name, help=text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``psfleet`` command; returns the exit code."""
    args = build_parser(argv).parse_args(argv)
    logs.setup_logging()
    try:
        if args.command == "train":
            # A server keeps the default handlers (SIGTERM ends it: nothing to save); a
            # worker or the command the user ran stops training as on Ctrl-C.
            from psfleet.fleet.role_maker import env_role
            from psfleet.types import Role

            server = env_role()[0] is Role.SERVER
            with (contextlib.nullcontext() if server else signals_interrupt()):
                return _train(args)
        if args.command == "datagen":
            return _datagen(args)
        if args.command == "predict":
            set_console_level(logging.WARNING)  # the result line, warnings and errors
            return _predict(args)
        if hasattr(args, "handler"):  # the SUBCOMMANDS (cli.commands)
            return int(args.handler(args))
    except (ConfigError, DataError) as exc:
        print(f"psfleet: error: {exc}", file=sys.stderr)
        return 2
    except PsfleetError as exc:
        print(f"psfleet: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # before training started, or not training
        signum = received_signal(exc)
        print(f"psfleet: interrupted ({signal.Signals(signum).name}) before training "
              "started", file=sys.stderr)
        return 128 + signum
    return 2


if __name__ == "__main__":
    sys.exit(main())
