"""Where a worker of the YAML runner starts, and what its checkpoints came to.

:func:`resume_cursor` finds the cursor of the newest complete checkpoint (the tables
are loaded into the servers by :meth:`psfleet.fleet.Fleet.load_checkpoint`);
:func:`agreed_share` gives a restarted worker the examples per worker the job agreed
on; :class:`CheckpointTally` counts the checkpoints taken for worker 0's last lines.
"""

from __future__ import annotations

import logging

from psfleet import fleet
from psfleet.checkpoint import CheckpointConfig, CheckpointStore, Cursor
from psfleet.data import Reader
from psfleet.fleet.role_info import restart_num

__all__ = ["CheckpointTally", "agreed_share", "resume_cursor"]

logger = logging.getLogger(__name__)


def agreed_share(checkpoint: CheckpointConfig | None) -> int | None:
    """The examples per worker the job agreed on (stored in its checkpoints), for a
    restarted worker that cannot count again with the others; None if unknown."""
    latest = CheckpointStore(checkpoint.checkpoint_dir).latest() if checkpoint else None
    agreed = latest.manifest.extra.get("examples_per_worker") if latest else None
    if agreed is None:
        logger.warning("restarted worker: no checkpoint gives the examples per worker; "
                       "training on this worker's whole share (its step count may differ "
                       "from the others')")
        return None
    logger.info("restarted worker: %d examples per worker per epoch, as the job agreed",
                agreed)
    return int(agreed)


class CheckpointTally:
    """What the job's checkpoints came to, for the last lines of worker 0's log."""

    def __init__(self, checkpoint: CheckpointConfig | None) -> None:
        self.checkpoint = checkpoint
        self.attempted = 0
        self.written = 0
        self.damaged_at_resume = 0  # checkpoints found at resume, none usable

    def save(self, cursor: Cursor, extra: dict[str, object]) -> None:
        """Take a checkpoint (every worker); worker 0 counts the published ones."""
        if self.checkpoint is None:
            return
        self.attempted += 1
        if fleet.save_checkpoint(self.checkpoint, cursor, extra) is not None:
            self.written += 1

    def summarize(self) -> None:
        """Log (worker 0) how many checkpoints were written; warn when none were, or
        when the resume found no usable checkpoint."""
        if self.checkpoint is None:
            return
        where = self.checkpoint.checkpoint_dir
        if self.damaged_at_resume:
            logger.warning("resumed from no checkpoint: the %d checkpoint(s) in %s were all "
                           "damaged, so this run trained from scratch", self.damaged_at_resume,
                           where)
        if self.attempted and not self.written:
            logger.warning("no checkpoint was written: all %d failed (see the errors above); "
                           "%s holds nothing of this run to resume from", self.attempted, where)
        elif self.written < self.attempted:
            logger.warning("checkpoints: %d written, %d FAILED (see the errors above), in %s",
                           self.written, self.attempted - self.written, where)
        elif self.attempted:
            logger.info("checkpoints: %d written to %s", self.written, where)


def resume_cursor(checkpoint: CheckpointConfig | None, reader: Reader,
                  extra: dict[str, object], tally: CheckpointTally,
                  roll_over: bool = True) -> Cursor:
    """Where this worker starts: the cursor of the newest complete checkpoint (tables
    loaded into the servers by :meth:`Fleet.load_checkpoint`), or the beginning.

    With checkpoints on and none written yet, a first checkpoint is taken at once
    (holding ``extra``, e.g. the agreed examples per worker), so a server that fails
    before the first interval can be restarted from it.

    With ``roll_over``, a cursor at the end of an epoch (``batch`` = the reader's
    batches) becomes the next epoch's start; without it (online passes: the pass's
    end-of-pass actions may not have run yet) it is returned as it is.
    """
    start = Cursor(epoch=0, batch=0, step=0)
    if checkpoint is None:
        return start
    resumed = fleet.load_checkpoint(checkpoint)
    if resumed is None:
        if restart_num() == 0:
            tally.damaged_at_resume = len(CheckpointStore(checkpoint.checkpoint_dir).names())
            tally.save(start, extra)
        return start
    if (roll_over and reader.num_batches is not None
            and resumed.batch >= reader.num_batches):  # epoch done
        resumed = Cursor(epoch=resumed.epoch + 1, batch=0, step=resumed.step)
    logger.info("resuming at epoch %d, batch %d (step %d) from %s", resumed.epoch + 1,
                resumed.batch, resumed.step, checkpoint.checkpoint_dir)
    return resumed
