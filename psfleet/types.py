"""Job-wide vocabulary: the words every layer uses (DESIGN.md "Words"), declared once.

A leaf module like ``errors.py`` and ``env.py``: it imports nothing from psfleet, so
the launcher, the fleet API, the runner and the parameter server all import from it
without pulling in one another (or torch).

- :class:`Role`: what a process of a job does (server or worker), with the seeds'
  ``TRAINING_ROLE`` spelling as its value and the DESIGN.md word for logs and files.
- :data:`Mode`: how a job trains (``sync``, ``async``, ``geo`` for the parameter
  server, ``gpubox`` for pass mode: a pass's rows cached on the worker; ``collective``
  for all-reduce without servers); :data:`MODES` lists them.
"""

from __future__ import annotations

import enum
from typing import Literal, get_args

__all__ = ["Role", "Mode", "MODES"]


class Role(enum.Enum):
    """What a process does in the job.

    The value is the seeds' spelling in ``TRAINING_ROLE`` / ``PADDLE_TRAINING_ROLE``
    (``Role("PSERVER")`` parses it); :attr:`word` is the DESIGN.md word used in logs,
    process descriptions and log-file names.
    """

    WORKER = "TRAINER"
    SERVER = "PSERVER"

    @property
    def paddle_name(self) -> str:
        """The value of ``TRAINING_ROLE`` for this role: ``PSERVER`` or ``TRAINER``."""
        return self.value

    @property
    def word(self) -> str:
        """The DESIGN.md word: ``server`` or ``worker``."""
        return self.name.lower()

    @property
    def log_prefix(self) -> str:
        """Prefix of this role's log files: ``serverlog`` or ``workerlog``."""
        return f"{self.word}log"


#: How a job trains (DistributedStrategy.mode, the YAML's runner.sync_mode).
Mode = Literal["sync", "async", "geo", "gpubox", "collective"]

#: Every :data:`Mode`, in declaration order.
MODES: tuple[str, ...] = get_args(Mode)
