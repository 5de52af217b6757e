"""The ``psfleet`` subcommands that live in modules of their own, and their one-line help.

``psfleet.cli.main`` imports such a module only when its subcommand is the one named on
the command line (or none is: ``psfleet --help`` lists them all from this table), so a
process pays for the subcommand it runs: ``status``, ``drain`` and ``grow`` import the
RPC client, ``k8s`` and ``slurm`` the cluster renderers, ``parity`` the runner's
config and plots, each a few tenths of a CPU-second that every server and worker once
paid at start (issue 40).
"""

from __future__ import annotations

__all__ = ["SUBCOMMANDS", "help_of"]

#: name -> (module whose ``register(commands)`` adds it, one-line help).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "status": ("psfleet.cli.status",
               "rows, memory and request rates of a running job's servers"),
    "drain": ("psfleet.cli.drain",
              "remove a server from a running replicated job, nothing lost"),
    "grow": ("psfleet.cli.grow",
             "add servers to a running replicated job; they take their part of the shares"),
    "init": ("psfleet.cli.starter",
             "write a commented starter config (and print how to get its data)"),
    "example": ("psfleet.cli.starter", "write a shipped example config; prints its path"),
    "parity": ("psfleet.cli.parity",
               "compare distributed training's test AUC with one process's"),
    "k8s": ("psfleet.cli.k8s", "run the job on Kubernetes (render or submit its manifests)"),
    "slurm": ("psfleet.cli.slurm", "run the job on Slurm (render its sbatch script)"),
}


def help_of(name: str) -> str:
    """The one-line help of subcommand ``name`` (a key of :data:`SUBCOMMANDS`)."""
    return SUBCOMMANDS[name][1]
