"""Join (and leave) the job's torch.distributed process group.

:func:`init_process_group` connects to the rendezvous store at
``MASTER_ADDR:MASTER_PORT`` (hosted by the launcher, or by rank 0 when the launcher
does not host one), waits until every rank has joined, then creates the default
process group on it. One rank of a world of one needs no store. Every wait is
bounded: reaching the store and the other ranks by ``PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S``
(default 300 s), each later collective operation by ``PSFLEET_COLLECTIVE_TIMEOUT_S``
(default 1800 s).
"""

from __future__ import annotations

import datetime
import logging
import time

import numpy as np
import torch
import torch.distributed as dist

from psfleet import env
from psfleet.collective.rendezvous import rendezvous_from_env
from psfleet.collective.types import BACKENDS, Backend, CollectiveContext, RendezvousSpec
from psfleet.errors import ConfigError, FatalError

__all__ = ["barrier", "broadcast_from_rank0", "choose_backend", "destroy_process_group",
           "init_process_group", "seconds_from_env"]

logger = logging.getLogger(__name__)

_JOINED_KEY = "psfleet/joined"
_POLL_S = 0.1
_REPORT_EVERY_S = 5.0


def seconds_from_env(name: str) -> float:
    """A declared environment variable holding seconds > 0.

    Raises:
        ConfigError: the value is not a number of seconds > 0 (names the variable).
    """
    raw = env.read(name) or ""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{name}: {raw!r} is not a number of seconds > 0")
    return value


def choose_backend(requested: str | None = None, local_rank: int = 0) -> tuple[Backend, str]:
    """The backend and device of this rank.

    Args:
        requested: ``auto``, ``gloo`` or ``nccl``; ``PSFLEET_COLLECTIVE_BACKEND``
            (default ``auto``) when None. ``auto`` is nccl when this process sees a GPU
            (torch.cuda), else gloo.
        local_rank: rank on this node; picks GPU ``local_rank % device_count``.

    Returns:
        (backend, device): ``("gloo", "cpu")`` or ``("nccl", "cuda:N")``.

    Raises:
        ConfigError: an unknown backend, or nccl without a GPU.
    """
    name = (requested or env.read("PSFLEET_COLLECTIVE_BACKEND") or "auto").strip().lower()
    if name not in BACKENDS:
        raise ConfigError(f"collective backend: {name!r} is not one of {', '.join(BACKENDS)} "
                          "(PSFLEET_COLLECTIVE_BACKEND)")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if name == "auto":
        name = "nccl" if gpus else "gloo"
    if name == "nccl":
        if not gpus:
            raise ConfigError("collective backend nccl needs a GPU but this process sees none "
                              "(check CUDA_VISIBLE_DEVICES); use gloo to train on CPU")
        return "nccl", f"cuda:{local_rank % gpus}"
    return "gloo", "cpu"


def _connect(spec: RendezvousSpec, timeout_s: float) -> dist.Store:
    """The rendezvous store: hosted here (rank 0, no launcher store) or reached."""
    if spec.master_addr is None:  # one rank alone: nothing to meet
        return dist.HashStore()
    hosting = spec.rank == 0 and not spec.agent_store
    try:
        store: dist.Store = dist.TCPStore(
            spec.master_addr, spec.master_port, spec.world_size, hosting,
            timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    except RuntimeError as exc:  # torch's DistNetworkError / DistStoreError
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if hosting:
            raise FatalError(
                f"rank 0 cannot host the rendezvous store on MASTER_ADDR:MASTER_PORT "
                f"{spec.master_endpoint}: {reason}. The port is taken or the address is not "
                "this host's; choose a free port (or let fleetrun --mode collective pick "
                "one)") from None
        raise FatalError(
            f"rank {spec.rank} could not reach the rendezvous store at MASTER_ADDR:MASTER_PORT "
            f"{spec.master_endpoint} within {timeout_s:g} s "
            f"(PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S): {reason}. Check that the address is "
            "right and reachable from this host and that rank 0 (or the launcher) is "
            "running") from None
    if spec.agent_store:  # the launcher's store: keys under its attempt, as torch does
        store = dist.PrefixStore(f"/worker/attempt_{spec.restart_count}", store)
    return store


def _wait_for_ranks(store: dist.Store, spec: RendezvousSpec, timeout_s: float) -> None:
    """Block until every rank registered in ``store``; FatalError naming the missing."""
    store.set(f"psfleet/rank/{spec.rank}", "1")
    store.add(_JOINED_KEY, 1)
    started = time.monotonic()
    next_report = started + _REPORT_EVERY_S
    while True:
        joined = store.add(_JOINED_KEY, 0)
        if joined >= spec.world_size:
            return
        now = time.monotonic()
        if now >= next_report or now - started >= timeout_s:
            missing = [r for r in range(spec.world_size)
                       if not store.check([f"psfleet/rank/{r}"])]
            if now - started >= timeout_s:
                raise FatalError(
                    f"only {joined} of {spec.world_size} ranks joined at "
                    f"{spec.master_endpoint} within {timeout_s:g} s "
                    f"(PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S); missing ranks: {missing}. "
                    "Start every rank (the world size is the same on all of them)")
            logger.info("waiting for ranks at %s: %d of %d joined, missing %s",
                        spec.master_endpoint, joined, spec.world_size, missing)
            next_report = now + _REPORT_EVERY_S
        time.sleep(_POLL_S)


def init_process_group(spec: RendezvousSpec | None = None, backend: str | None = None,
                       connect_timeout_s: float | None = None,
                       timeout_s: float | None = None) -> CollectiveContext:
    """Create the default torch.distributed process group of this rank. Blocks.

    Every rank of the job must call it (with the same world size and backend).

    Args:
        spec: where and as whom to join; :func:`rendezvous_from_env` when None.
        backend: see :func:`choose_backend`.
        connect_timeout_s: bound on reaching the store and on waiting for every rank,
            seconds; ``PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S`` (300) when None.
        timeout_s: bound on each later collective operation, seconds;
            ``PSFLEET_COLLECTIVE_TIMEOUT_S`` (1800) when None.

    Returns:
        This rank's :class:`CollectiveContext`.

    Raises:
        ConfigError: inconsistent variables (see :func:`rendezvous_from_env`), a bad
            backend or timeout, or a process group already exists.
        FatalError: the store cannot be reached (names MASTER_ADDR:MASTER_PORT) or hosted,
            or not every rank joined within the connect timeout.
    """
    if dist.is_initialized():
        raise ConfigError("a torch.distributed process group already exists in this process; "
                          "psfleet creates it (call fleet.init(is_collective=True) only)")
    spec = spec or rendezvous_from_env()
    chosen, device = choose_backend(backend, spec.local_rank)
    connect_s = connect_timeout_s or seconds_from_env("PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S")
    op_s = timeout_s or seconds_from_env("PSFLEET_COLLECTIVE_TIMEOUT_S")
    if chosen == "nccl":
        torch.cuda.set_device(torch.device(device))
    store = _connect(spec, connect_s)
    _wait_for_ranks(store, spec, connect_s)
    dist.init_process_group(chosen, store=store, rank=spec.rank, world_size=spec.world_size,
                            timeout=datetime.timedelta(seconds=op_s))
    logger.info("process group: rank %d of %d (local rank %d), backend %s on %s, rendezvous "
                "%s (from %s)", spec.rank, spec.world_size, spec.local_rank, chosen, device,
                spec.master_endpoint if spec.master_addr else "none (one rank)", spec.source)
    return CollectiveContext(spec.rank, spec.world_size, spec.local_rank, chosen, device)


def destroy_process_group() -> None:
    """Leave the process group (after a barrier the caller ran). Idempotent."""
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Block until every rank of the process group calls it."""
    dist.barrier()


def broadcast_from_rank0(values: np.ndarray, device: str = "cpu") -> np.ndarray:
    """Rank 0's ``values`` on every rank (e.g. initial dense parameters). Blocks.

    Args:
        values: a numeric array of the same shape and dtype on every rank.
        device: where the collective runs (``cpu`` for gloo, ``cuda:N`` for nccl).

    Returns:
        A new array equal to rank 0's ``values``.
    """
    tensor = torch.from_numpy(np.ascontiguousarray(values).copy()).to(device)
    dist.broadcast(tensor, src=0)
    return tensor.cpu().numpy()
