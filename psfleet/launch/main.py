"""``fleetrun``: start a parameter-server training job on this host.

Usage::

    fleetrun [--server_num S] [--worker_num W] [--log_dir DIR]
             [--server_wait_timeout_s T] [--stop_grace_s G]
             train.py [script args ...]
    fleetrun [options] -m package.module [module args ...]

Also ``python -m psfleet.launch.main ...``; from Python, call
:func:`psfleet.launch.launch_local`. Everything after the script (or after the module
name) is passed to every child unchanged, so the script's own flags may share names
with fleetrun's. Each child runs ``sys.executable train.py args`` (or
``sys.executable -m package.module args``); the same script runs as server and as
worker and asks ``psfleet.fleet`` which role it has.

Options:
    --server_num S              servers to start, >= 0 (default 0: workers only, e.g.
                                a single-process or collective job).
    --worker_num W              workers to start, >= 1 (default 1).
    --log_dir DIR               where the logs go (default ./log), created if missing.
    --server_wait_timeout_s T   how long to wait for every server to report its
                                endpoint, seconds > 0 (default 300).
    --stop_grace_s G            how long processes get to exit by themselves, seconds
                                >= 0, before SIGTERM and again before SIGKILL (default 10).
    -m, --module                run the argument as a module, like ``python -m``.

Start-up:
    1. Stale endpoint files in ``DIR/.endpoints`` are removed.
    2. S servers start, each with::

        TRAINING_ROLE=PSERVER  PADDLE_TRAINING_ROLE=PSERVER
        POD_IP=127.0.0.1       PADDLE_CURRENT_IP=127.0.0.1
        PADDLE_PORT=0          PSFLEET_SERVER_INDEX=i
        PSFLEET_ENDPOINT_FILE=DIR/.endpoints/server.i
        PADDLE_TRAINERS_NUM=W

       ``PADDLE_PORT=0`` means the server binds a free port itself (no pick-then-bind
       race). Once listening it writes ``host:port\\n`` to ``PSFLEET_ENDPOINT_FILE``
       atomically (a temporary file, then ``os.replace``; see
       :mod:`psfleet.launch.endpoints`).
    3. fleetrun waits for all S endpoint files, listing the servers still missing every
       few seconds, at most ``--server_wait_timeout_s``.
    4. W workers start, each with::

        TRAINING_ROLE=TRAINER  PADDLE_TRAINING_ROLE=TRAINER
        POD_IP=127.0.0.1       PADDLE_CURRENT_IP=127.0.0.1
        PADDLE_PSERVERS_IP_PORT_LIST=host:port,...  (server-index order; unset if S=0)
        PADDLE_TRAINERS_NUM=W  PADDLE_TRAINER_ID=k

    Every child inherits fleetrun's environment, minus job variables inherited from an
    enclosing job (the ``PADDLE_*`` / ``PSFLEET_*`` role variables above and torchrun's
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``), plus ``PYTHONUNBUFFERED=1`` unless set. fleetrun itself reads
    ``PSFLEET_LOG_LEVEL`` (default INFO) for its own messages, which go to stderr.

Logs:
    Each child's stdout and stderr go to ``DIR/serverlog.i`` and ``DIR/workerlog.k``
    (overwritten by each run). Worker 0's output is also copied to fleetrun's stdout
    as it comes, so its progress bar shows in the terminal.

Processes:
    Each child runs in its own session and process group, so stopping a child stops
    its whole subtree (data loader workers, pipe commands). fleetrun signals only the
    groups of children it started, and no child outlives fleetrun, also when fleetrun
    itself fails.

Exit codes and failure modes:
    0    every worker exited 0. The servers then get ``--stop_grace_s`` to exit by
         themselves (workers normally stop them over RPC); the ones still running are
         sent SIGTERM, then SIGKILL after another ``--stop_grace_s``.
    1    a child exited non-zero or was killed by a signal. The first failure is the
         root cause: fleetrun prints its role, index, exit code (or signal name), its
         log path and the last 20 lines of its log, then stops the others (SIGTERM,
         ``--stop_grace_s``, SIGKILL). Also 1 when a server exits before writing its
         endpoint file (named at once, with its log), when a server does not report
         its endpoint within ``--server_wait_timeout_s`` (the missing servers are
         listed), and when fleetrun itself fails unexpectedly (after stopping all).
    2    a bad flag value, e.g. ``--worker_num 0``; the message names the flag and the
         allowed values. Nothing is started.
    128+N  fleetrun received signal N (SIGINT: 130, SIGTERM: 143). The signal is
         forwarded to every child's group, which gets ``--stop_grace_s`` before
         SIGKILL; a second signal skips the wait.

Examples::

    fleetrun --server_num 2 --worker_num 2 train.py --epochs 1
    fleetrun --server_num 1 --worker_num 4 -m psfleet.cli.main train -m config.yaml
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.launch.local import EXIT_FAILURE, run_job
from psfleet.launch.types import LaunchConfig

__all__ = ["main", "build_parser", "config_from_args"]

logger = logging.getLogger(__name__)

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The ``fleetrun`` argument parser (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="fleetrun",
        description="Start a parameter-server training job (servers and workers) on this host.",
        epilog="Run `python -m pydoc psfleet.launch.main` for the manual.",
    )
    parser.add_argument("--server_num", type=int, default=0, help="servers, >= 0 (default 0)")
    parser.add_argument("--worker_num", type=int, default=1, help="workers, >= 1 (default 1)")
    parser.add_argument(
        "--log_dir", type=Path, default=Path("log"), help="log directory (default ./log)"
    )
    parser.add_argument(
        "--server_wait_timeout_s",
        type=float,
        default=300.0,
        help="seconds to wait for every server's endpoint (default 300)",
    )
    parser.add_argument(
        "--stop_grace_s",
        type=float,
        default=10.0,
        help="seconds processes get to exit before SIGTERM / SIGKILL (default 10)",
    )
    parser.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="run training_script as a module, like python -m",
    )
    parser.add_argument("training_script", help="the script (or module with -m) every child runs")
    parser.add_argument(
        "training_script_args", nargs=argparse.REMAINDER, help="arguments of the script"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Turn parsed flags into a validated :class:`LaunchConfig`.

    Raises:
        ConfigError: a value is out of range or the script does not exist.
    """
    script: str = args.training_script
    prefix = ("-m",) if args.module else ()
    config = LaunchConfig(
        command=(*prefix, script, *args.training_script_args),
        server_num=args.server_num,
        worker_num=args.worker_num,
        log_dir=args.log_dir,
        server_wait_timeout_s=args.server_wait_timeout_s,
        stop_grace_s=args.stop_grace_s,
    )
    if not args.module and not Path(script).is_file():
        raise ConfigError(
            f"training_script: {script!r} is not a file; give the path of a Python "
            "script, or -m package.module to run a module"
        )
    return config


def _configure_logging() -> None:
    level_name = (env.read("PSFLEET_LOG_LEVEL") or "INFO").upper()
    level = logging.getLevelName(level_name)
    if not isinstance(level, int):
        level = logging.INFO
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="[fleetrun] %(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    if level_name != logging.getLevelName(level):
        logger.warning(
            "PSFLEET_LOG_LEVEL=%r is not a logging level (DEBUG, INFO, WARNING, ERROR); using INFO",
            level_name,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fleetrun``; returns the exit code (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging()
    try:
        config = config_from_args(args)
    except ConfigError as e:
        parser.error(str(e))  # exits with EXIT_USAGE
    try:
        return run_job(config)
    except ConfigError as e:
        print(f"fleetrun: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:
        logger.exception("fleetrun failed; every process it started has been stopped")
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
