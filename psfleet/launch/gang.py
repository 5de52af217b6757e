"""The words of a whole-job restart (``--restart_policy gang``): which checkpoint the
job resumes from, and the one line that says so.

The launcher does not read the checkpoint itself (the servers and workers do, each
picking the newest complete one: ``psfleet.fleet``); it names the folder they will
pick, so the line in fleetrun's log says where the job goes on from. The folder is the
one ``psfleet train`` passes (``runner.checkpoint.checkpoint_dir``) or
``PSFLEET_CHECKPOINT_DIR``; when neither is known the line says so.
"""

from __future__ import annotations

import logging

from psfleet.checkpoint import CheckpointStore

__all__ = ["newest_checkpoint", "job_restart_message"]

logger = logging.getLogger(__name__)


def newest_checkpoint(checkpoint_dir: str | None) -> str | None:
    """URL of the newest complete checkpoint in ``checkpoint_dir`` whose files verify
    (what a restarted server and worker will resume from), or None when there is none
    or the folder cannot be read (logged at DEBUG)."""
    if checkpoint_dir is None:
        return None
    try:
        latest = CheckpointStore(checkpoint_dir).latest()
    except Exception as exc:  # noqa: BLE001 - naming it is best effort; the children decide
        logger.debug("cannot list checkpoints in %s: %s", checkpoint_dir, exc)
        return None
    return None if latest is None else latest.storage.url


def job_restart_message(who: str, cause: str, *, checkpoint_dir: str | None,
                        checkpoint: str | None, restart: int, max_restarts: int) -> str:
    """The line fleetrun logs when it restarts the whole job.

    Args:
        who: the failed child, ``worker 1 (pid 123)``.
        cause: ``failed with signal SIGKILL (9)``, ``did not answer health checks ...``.
        checkpoint_dir: the job's checkpoint folder, None when fleetrun was not told.
        checkpoint: the newest complete checkpoint there (:func:`newest_checkpoint`).
        restart: k, this restart of the job (1-based).
        max_restarts: N, ``--max_restarts``.
    """
    if checkpoint is not None:
        origin = f"from checkpoint {checkpoint}"
    elif checkpoint_dir is not None:
        origin = f"from scratch (no complete checkpoint in {checkpoint_dir} yet)"
    else:
        origin = ("from the newest complete checkpoint of the job, if any (fleetrun was "
                  "not told the checkpoint folder: PSFLEET_CHECKPOINT_DIR)")
    return (f"fleetrun: {who} {cause}; restarting the whole job (--restart_policy gang): "
            f"every server and worker stops and starts again {origin} (restart {restart} "
            f"of --max_restarts {max_restarts})")
