"""Data parallelism for dense parameters: DistributedDataParallel weighted by examples.

Every rank holds the whole model. :func:`wrap_model` wraps it in torch's
DistributedDataParallel (bucketed all-reduce overlapping the backward pass) with a
communication hook that weights each rank's gradient by its example count: the rank
multiplies its bucket by ``n_r``, appends ``n_r``, and one all-reduce gives
``sum_r n_r * g_r`` and ``N = sum_r n_r``; the result is ``sum_r n_r * g_r / N``.
As each ``g_r`` is the mean gradient of rank r's batch, that is the mean gradient of
the union batch, also when batches differ in size (the seeds' FAQ: 32 examples on one
device and 16 on another give the gradient of the 48). DDP's own default divides by
the world size, which weights a 16-example batch like a 32-example one.

The example count comes from the model's forward: the leading dimension of its first
tensor argument (:class:`ExampleCounter`). A rank that ran out of data (joined, see
``torch.distributed.algorithms.Join`` and :class:`~psfleet.collective.join.JoinContext`)
runs the hook on zero buckets with count 0; there the hook also writes the averaged
gradient into the parameters' ``.grad`` (DDP discards it on a joined rank), so the
joined rank can apply the same update as the others and its tables stay identical.
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's annotations
# (GradBucket, Future[Tensor]) as objects, not strings.

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from psfleet.errors import ConfigError, FatalError

__all__ = ["ExampleCounter", "wrap_model", "weighted_allreduce_hook"]


class ExampleCounter:
    """Examples this rank trained on in the current step.

    The wrapped model's training forwards add their batch size; the step's end
    (:meth:`take`) reads and resets it. Not thread safe: one training loop per rank.
    """

    def __init__(self) -> None:
        self.value = 0
        self.attached = False
        #: True while this rank has joined (ran out of batches) and shadows the others.
        self.joined = False

    def add_from_inputs(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Add the leading dimension of the first tensor among ``args`` / ``kwargs``.

        Raises:
            ConfigError: no tensor with a leading (batch) dimension is passed.
        """
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.dim() >= 1:
                self.value += int(value.shape[0])
                return
        raise ConfigError("collective mode: the model's forward got no tensor with a batch "
                          "dimension, so the example count of this rank is unknown; pass the "
                          "batch as tensors whose first dimension is the batch size")

    def take(self) -> int:
        """This step's example count; the next step starts from 0.

        Raises:
            FatalError: no model was wrapped with ``fleet.distributed_model``.
        """
        if not self.attached:
            raise FatalError("collective mode: wrap the model with fleet.distributed_model("
                             "model) and run the forward through the model it returns, so "
                             "gradients are all-reduced across ranks")
        value, self.value = self.value, 0
        return value


class _HookState:
    """What the communication hook needs: the counter and the process group."""

    def __init__(self, counter: ExampleCounter, group: dist.ProcessGroup | None) -> None:
        self.counter = counter
        self.group = group


def weighted_allreduce_hook(state: _HookState, bucket: dist.GradBucket
                            ) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the example-weighted mean of every rank's bucket.

    Args:
        state: the counter (this rank's examples ``n_r``, 0 on a joined rank).
        bucket: the gradient bucket, a flat tensor [n] (float32 on CPU or GPU).

    Returns:
        A future of ``sum_r n_r * g_r / sum_r n_r`` [n] (zeros if every count is 0).
    """
    buffer = bucket.buffer()  # [n]
    joined = state.counter.joined
    count = 0.0 if joined else float(state.counter.value)
    params = bucket.parameters() if joined else []
    offsets = [g.storage_offset() - buffer.storage_offset() for g in bucket.gradients()
               ] if joined else []
    packed = torch.empty(buffer.numel() + 1, dtype=buffer.dtype, device=buffer.device)
    torch.mul(buffer, count, out=packed[:-1])
    packed[-1] = count
    work = dist.all_reduce(packed, group=state.group, async_op=True)

    def finish(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        total = fut.value()[0]  # [n + 1]
        examples = total[-1].clamp(min=1.0)
        mean = total[:-1].div_(examples)  # [n]
        for param, offset in zip(params, offsets, strict=True):  # joined: keep the result
            param.grad = mean[offset: offset + param.numel()].view_as(param).clone()
        return mean

    return work.get_future().then(finish)  # type: ignore[no-any-return]


def wrap_model(model: nn.Module, counter: ExampleCounter, device: str = "cpu",
               group: dist.ProcessGroup | None = None) -> nn.Module:
    """Wrap ``model`` for collective training (call on every rank, same model).

    Moves the model to ``device``; counts each training forward's examples into
    ``counter``; if the model has dense parameters, wraps it in DistributedDataParallel
    (which broadcasts rank 0's parameters and buffers to every rank now) with
    :func:`weighted_allreduce_hook`. A model with no dense parameter (only sparse
    embeddings) is returned unwrapped, with the counting hook.

    Args:
        model: the user's model.
        counter: this rank's example counter (shared with the sparse communicator).
        device: ``cpu`` or ``cuda:N`` (from :func:`~psfleet.collective.choose_backend`).
        group: the process group; the default group when None.

    Returns:
        The module to train with (its forward returns what ``model`` returns).

    Raises:
        FatalError: no process group exists (call fleet.init(is_collective=True)).
    """
    if not dist.is_initialized():
        raise FatalError("no process group: call fleet.init(is_collective=True) before "
                         "fleet.distributed_model(model)")
    model = model.to(device)
    wrapped: nn.Module = model
    if any(p.requires_grad for p in model.parameters()):
        device_ids = [torch.device(device).index] if device.startswith("cuda") else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, process_group=group)
        ddp.register_comm_hook(_HookState(counter, group), weighted_allreduce_hook)
        wrapped = ddp

    def count(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if _module.training and torch.is_grad_enabled():
            counter.add_from_inputs(args, kwargs)

    wrapped.register_forward_pre_hook(count, with_kwargs=True)
    counter.attached = True
    return wrapped
