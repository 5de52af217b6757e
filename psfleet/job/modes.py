"""What each training mode is, declared once (issue 40).

Every module that behaves differently by mode asks :func:`mode_spec` for a trait
(``mode_spec(runner.sync_mode).servers``) instead of comparing the mode's name, so a
mode is one entry here and a new one (hybrid, issue 43) one more, not an edit of every
``if mode == ...`` in the runner, the fleet, the launcher and the communicators.

The modes (``runner.sync_mode``, ``DistributedStrategy.mode``; DESIGN.md "Words"):
``sync`` (servers merge every worker's push of a step), ``async`` (pushes applied as
they come), ``geo`` (workers train local copies and push deltas every ``geo_step``),
``gpubox`` (pass mode: a pass's rows cached on the worker between passes) and
``collective`` (no servers: ranks all-reduce, every rank holds the tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from psfleet.errors import ConfigError
from psfleet.types import MODES, Mode

__all__ = ["MODE_SPECS", "ModeSpec", "mode_spec"]


@dataclass(frozen=True)
class ModeSpec:
    """The traits of one training mode.

    Attributes:
        name: the mode, as the config and the strategy spell it.
        servers: a parameter-server mode: tables on servers, gRPC, server roles (False:
            collective, whose ranks all-reduce and hold the tables themselves).
        rounds: the servers apply a step once every worker pushed it (sync rounds):
            every worker runs the same steps, a failed worker restarts the whole worker
            group (``gang``), the servers merge pushes, and one request holds every
            worker's keys.
        averages: an update averages the workers' batches, so the learning rate may
            follow the worker count (``runner.lr_scaling``, ``psfleet.fleet.lr_scaling``).
        auto_lr_scaling: what ``lr_scaling: auto`` means in this mode.
        step_pushes: each worker sends its pushes step by step and the servers apply
            them as they come (async): the settings that shape that stream (global batch
            aggregation, bounded staleness, DC-ASGD) need it.
        passes: training runs in passes whose rows the worker caches (pass mode): an
            in-memory reader, checkpoints at pass boundaries, the dense part in a mode
            of its own (``pass_configs.dense_mode``).
    """

    name: Mode
    servers: bool
    rounds: bool
    averages: bool
    auto_lr_scaling: Literal["none", "sqrt"]
    step_pushes: bool
    passes: bool

    @property
    def restart_policy(self) -> Literal["gang", "process"]:
        """How a local job restarts a failed process (``psfleet.launch.restarts``): the
        whole worker group in a mode with rounds, else the process alone."""
        return "gang" if self.rounds else "process"


#: Every mode's traits, by name (the keys are :data:`psfleet.types.MODES`).
MODE_SPECS: dict[str, ModeSpec] = {spec.name: spec for spec in (
    ModeSpec("sync", servers=True, rounds=True, averages=True, auto_lr_scaling="none",
             step_pushes=False, passes=False),
    ModeSpec("async", servers=True, rounds=False, averages=False, auto_lr_scaling="none",
             step_pushes=True, passes=False),
    ModeSpec("geo", servers=True, rounds=False, averages=True, auto_lr_scaling="sqrt",
             step_pushes=False, passes=False),
    ModeSpec("gpubox", servers=True, rounds=False, averages=False, auto_lr_scaling="none",
             step_pushes=False, passes=True),
    ModeSpec("collective", servers=False, rounds=False, averages=True,
             auto_lr_scaling="none", step_pushes=False, passes=False),
)}


def mode_spec(name: str) -> ModeSpec:
    """The traits of mode ``name``.

    Raises:
        ConfigError: ``name`` is not a mode (lists the modes).
    """
    try:
        return MODE_SPECS[name]
    except KeyError:
        raise ConfigError(f"mode: {name!r} is not one of {', '.join(MODES)}") from None
