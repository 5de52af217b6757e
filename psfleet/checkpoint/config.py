"""CheckpointConfig: where checkpoints go, how many are kept, and how often they are taken.

Paddle's ``fluid.CheckpointConfig(checkpoint_dir, max_num_checkpoints, epoch_interval,
step_interval)``, with the same field names.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CheckpointConfig"]


class CheckpointConfig(BaseModel):
    """When and where a training job writes checkpoints.

    Attributes:
        checkpoint_dir: the folder of the checkpoints: a local path or an fsspec URL
            (``file://``, ``memory://``, ``s3://`` where s3fs is installed).
        max_num_checkpoints: how many complete checkpoints are kept (>= 1); older ones
            are removed after a new one is published.
        epoch_interval: a checkpoint after every this many epochs (0: none at epoch ends).
        step_interval: a checkpoint after every this many batches of an epoch (0: none
            inside an epoch). Counted per worker within the epoch; every worker takes
            part in each checkpoint.

    A checkpoint is also written when training ends.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint_dir: str = Field(min_length=1)
    max_num_checkpoints: int = Field(3, ge=1)
    epoch_interval: int = Field(1, ge=0)
    step_interval: int = Field(0, ge=0)

    def due_after_batch(self, batches_done: int, batches_in_epoch: int | None) -> bool:
        """Whether to checkpoint after ``batches_done`` (>= 1) batches of an epoch,
        not counting the epoch's last batch (see :meth:`due_after_epoch`) when the
        epoch's length is known (``batches_in_epoch`` None: a stream not read yet)."""
        last = batches_in_epoch is not None and batches_done >= batches_in_epoch
        return self.step_interval > 0 and not last and batches_done % self.step_interval == 0

    def due_after_epoch(self, epochs_done: int) -> bool:
        """Whether to checkpoint after ``epochs_done`` (>= 1) whole epochs."""
        return self.epoch_interval > 0 and epochs_done % self.epoch_interval == 0
