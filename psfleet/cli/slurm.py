"""``psfleet slurm``: run a parameter-server job on a Slurm allocation.

Usage::

    psfleet slurm render -m CONFIG.yaml [-o KEY=VALUE ...] [--name NAME] [--workdir DIR]
        [--port P] [--out FILE] [--partition P] [--time LIMIT] [--nodes N]
        [--account A] [--setup LINE ...] [--sbatch=OPTION ...]

``render`` writes an sbatch script (:mod:`psfleet.cluster.slurm`) to ``--out`` (made
executable) or stdout: one job step of ``server_num + worker_num`` tasks, task
``SLURM_PROCID`` < ``server_num`` a server, the others workers; server ``i`` listens on
its node's address at port ``P + i``. Submit it with ``sbatch FILE``.

``--workdir`` (default: the config's folder) is where the job puts ``config.yaml`` and
runs; the config's relative paths are relative to it. It, the data and
``runner.model_save_path`` must be on a file system every node sees. A different
``config.yaml`` already in ``--workdir`` is an error (the job would replace it).

Exit codes: 0 written; 2 a bad config or argument (named): a missing ``-m``, a config
with no servers, an unknown config key, a malformed ``--time``, ``--nodes`` outside
1..tasks, an ``--sbatch`` option a flag or the config sets.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from psfleet.cli.cluster_args import add_job_arguments, job_from_args
from psfleet.cli.commands import help_of
from psfleet.cluster.sbatch_options import SlurmOptions
from psfleet.cluster.slurm import render_script, workdir_conflict
from psfleet.errors import ConfigError

__all__ = ["register", "render"]


def render(args: argparse.Namespace) -> str:
    """The sbatch script the arguments describe.

    Raises:
        ConfigError: a bad config or argument (names it).
    """
    workdir = args.workdir or str(args.config.absolute().parent)
    args = argparse.Namespace(**{**vars(args), "workdir": os.path.abspath(workdir)})
    job = job_from_args(args, "psfleet slurm render")
    options = SlurmOptions(partition=args.partition, time=args.time, nodes=args.nodes,
                           account=args.account, setup=tuple(args.setup),
                           sbatch=tuple(args.sbatch))
    script = render_script(job, options, source=str(args.config))
    conflict = workdir_conflict(job, args.config)
    if conflict is not None:
        raise ConfigError(
            f"--workdir: {conflict} exists and holds another config; the job writes its "
            "config there: choose another --workdir (a folder every node sees), or delete "
            "that file if an earlier job wrote it")
    return script


def _render(args: argparse.Namespace) -> int:
    script = render(args)
    if args.out is None:
        sys.stdout.write(script)
        return 0
    try:
        args.out.write_text(script)
        args.out.chmod(0o755)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write {str(args.out)!r}: "
                          f"{exc.strerror or exc}") from None
    print(f"psfleet: wrote {args.out}; submit it with: sbatch {args.out}", file=sys.stderr)
    return 0


def register(commands: Any) -> None:
    """Add ``slurm`` (``render``) to ``commands`` (the subparsers action of ``psfleet``'s
    parser); ``render`` sets ``handler``, a function of the parsed arguments returning
    the exit code (raising ConfigError on a bad argument)."""
    slurm = commands.add_parser("slurm", help=help_of("slurm"),
                                description=__doc__.split("\n\n")[0])
    actions = slurm.add_subparsers(dest="action", required=True)
    parser = actions.add_parser(
        "render", help="write the job's sbatch script",
        description="\n\n".join(__doc__.split("\n\n")[3:6]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_arguments(parser, None, "the config's folder")
    parser.add_argument("--out", type=Path, help="the script to write (default stdout)")
    parser.add_argument("--partition", help="#SBATCH --partition (default: the cluster's)")
    parser.add_argument("--time", metavar="LIMIT", help="#SBATCH --time: HH:MM:SS, "
                        "minutes, D-HH:MM:SS, ... (default: the partition's)")
    parser.add_argument("--nodes", type=int, help="#SBATCH --nodes, 1..tasks (default: as "
                        "Slurm chooses)")
    parser.add_argument("--account", help="#SBATCH --account (default: yours)")
    parser.add_argument("--setup", action="append", default=[], metavar="LINE",
                        help="a shell line run before the step, e.g. 'source "
                        "~/venv/bin/activate' (psfleet must be on the PATH); repeatable")
    parser.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                        help="one more sbatch option, e.g. --sbatch=--qos=high; repeatable")
    parser.set_defaults(handler=_render)
