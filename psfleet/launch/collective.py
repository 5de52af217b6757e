"""Start a collective (all-reduce) job: ``nproc_per_node`` ranks on this node.

``fleetrun --mode collective --nproc_per_node N train.py`` runs ranks ``0..N-1`` on
this host; with ``--ips IP0,IP1,...`` (the same list on every node) node ``n`` (the
entry that is one of this host's addresses, or ``--node_ip``) runs ranks
``n*N .. n*N+N-1``. The rendezvous store the ranks meet at is hosted by the launcher
of node 0: on one host at ``127.0.0.1`` on a free port the OS gives it (no
pick-then-bind race), across nodes at ``IP0:--start_port`` (default 6070, Paddle's).
Every rank gets torchrun's and the seeds' variables (see :func:`rank_environment`),
so ``psfleet.fleet`` and a plain ``torch.distributed.init_process_group("gloo")``
both work. Logs, supervision, the failure summary and exit codes are the parameter
server's (:func:`psfleet.launch.local.run_workers`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.launch.cluster import JobLayout, WorkerSlot
from psfleet.launch.hosts import bind_error, host_matches, local_addresses, normalize_host
from psfleet.launch.local import run_workers
from psfleet.launch.specs import JOB_VARIABLES
from psfleet.launch.types import LOCAL_HOST, LaunchConfig, ProcessSpec, Role

__all__ = ["DEFAULT_MULTI_NODE_PORT", "CollectiveOptions", "CollectivePlan", "plan_collective",
           "assign_devices", "rank_environment", "run_collective", "launch_collective"]

logger = logging.getLogger(__name__)

#: The rendezvous port of a multi-node job without --start_port (Paddle's start port).
DEFAULT_MULTI_NODE_PORT = 6070


def _split(value: str | Sequence[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(i).strip() for i in items if str(i).strip())


@dataclass(frozen=True)
class CollectiveOptions:
    """The collective flags of fleetrun, validated when made.

    Attributes:
        nproc_per_node: ranks on each node (``--nproc_per_node``); None: one per
            device of ``devices``, else one per visible GPU, else 1.
        ips: every node's IP in node order (``--ips``); empty: this host only.
        node_ips: this node's IP as listed in ``ips`` (``--node_ip``); empty: detected.
        start_port: the rendezvous port (``--start_port``); None: a free port on one
            host, :data:`DEFAULT_MULTI_NODE_PORT` across nodes.
        devices: GPU ids of this node's ranks, one per local rank (``--devices`` /
            ``--gpus``); None: every visible GPU in turn, or CPU when there is none.

    Raises:
        ConfigError: a value is out of range (names the flag and the allowed values).
    """

    nproc_per_node: int | None = None
    ips: tuple[str, ...] = ()
    node_ips: tuple[str, ...] = ()
    start_port: int | None = None
    devices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ips", tuple(normalize_host(i) for i in _split(self.ips)))
        object.__setattr__(self, "node_ips",
                           tuple(normalize_host(i) for i in _split(self.node_ips)))
        n = self.nproc_per_node
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"--nproc_per_node: got {n!r}; allowed: an integer >= 1")
        for ip in self.ips:
            if ":" in ip.strip("[]") and ip.count(":") == 1:
                raise ConfigError(f"--ips: {ip!r} has a port; list bare IPs (the port is "
                                  "--start_port)")
        if len(set(self.ips)) != len(self.ips):
            raise ConfigError(f"--ips: {','.join(self.ips)} lists a node twice; list each "
                              "node once (--nproc_per_node sets the ranks per node)")
        if self.node_ips and not self.ips:
            raise ConfigError("--node_ip: only with --ips (it picks this node's entry)")
        port = self.start_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 1 <= port <= 65535):
            raise ConfigError(f"--start_port: got {port!r}; allowed: a port in 1..65535")
        if self.devices is not None:
            devices = _split(self.devices)
            if not devices or not all(d.isdigit() for d in devices):
                raise ConfigError(f"--devices: {','.join(self.devices)!r} is not a comma list of "
                                  "GPU ids, e.g. 0,1")
            if n is not None and len(devices) != n:
                raise ConfigError(f"--devices lists {len(devices)} GPU(s) but --nproc_per_node "
                                  f"is {n}: give one GPU per rank")
            object.__setattr__(self, "devices", devices)


@dataclass(frozen=True)
class CollectivePlan:
    """The ranks of the job and this node's share.

    Attributes:
        world_size: ranks in the job.
        nproc_per_node: ranks per node.
        node_rank: this node's position in ``--ips`` (0 on one host).
        hosts: every rank's host, in rank order.
        master_host: where the rendezvous store listens (node 0).
        master_port: its port; 0 on one host without --start_port (the OS picks).
        node_addresses: the addresses that identified this node.
    """

    world_size: int
    nproc_per_node: int
    node_rank: int
    hosts: tuple[str, ...]
    master_host: str
    master_port: int
    node_addresses: tuple[str, ...]

    @property
    def local_ranks(self) -> tuple[int, ...]:
        """This node's global ranks, ascending."""
        first = self.node_rank * self.nproc_per_node
        return tuple(range(first, first + self.nproc_per_node))

    def layout(self) -> JobLayout:
        """The ranks as the launcher's workers (global index = rank)."""
        workers = tuple(WorkerSlot(r, h) for r, h in enumerate(self.hosts))
        return JobLayout((), workers, (), self.local_ranks, self.node_addresses)


def visible_gpus(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The GPU ids this launcher may hand out: its CUDA_VISIBLE_DEVICES entries (or
    0..count-1), as seen by torch.cuda; empty when there is no GPU."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = _split(env.read("CUDA_VISIBLE_DEVICES", environ) or "")
    return tuple(listed[:count]) if listed else tuple(str(i) for i in range(count))


def assign_devices(options: CollectiveOptions, nproc: int,
                   gpus: Sequence[str]) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each local rank (None: CPU, the variable is not set).

    Args:
        options: the flags (``devices`` are indices into ``gpus``).
        nproc: ranks on this node.
        gpus: the GPUs this launcher sees (:func:`visible_gpus`).

    Raises:
        ConfigError: --devices without a GPU, or naming a GPU that is not visible.
    """
    if options.devices is None:
        return [gpus[i % len(gpus)] if gpus else None for i in range(nproc)]
    if not gpus:
        raise ConfigError(f"--devices {','.join(options.devices)}: this node has no GPU "
                          "(torch.cuda sees none); drop --devices to train on CPU")
    for device in options.devices:
        if int(device) >= len(gpus):
            raise ConfigError(f"--devices: GPU {device} is not visible; this node has "
                              f"{len(gpus)} GPU(s): 0..{len(gpus) - 1}")
    return [gpus[int(d)] for d in options.devices]


def plan_collective(options: CollectiveOptions, nproc: int,
                    node_addresses: Collection[str] | None = None) -> CollectivePlan:
    """The job's ranks and this node's part.

    Args:
        options: the flags.
        nproc: ranks per node (resolved ``--nproc_per_node``).
        node_addresses: this node's addresses; ``options.node_ips`` or the detected
            ones when None. Ignored on one host.

    Raises:
        ConfigError: none of the node's addresses is in ``--ips``.
    """
    if not options.ips:
        return CollectivePlan(nproc, nproc, 0, (LOCAL_HOST,) * nproc, LOCAL_HOST,
                              options.start_port or 0, (LOCAL_HOST,))
    if node_addresses is None:
        node_addresses = options.node_ips or sorted(local_addresses())
    addresses = tuple(node_addresses)
    matches = [n for n, ip in enumerate(options.ips) if host_matches(ip, addresses)]
    if not matches:
        raise ConfigError(f"this node is not in --ips: its addresses are "
                          f"{', '.join(addresses) or '(none found)'} and --ips is "
                          f"{','.join(options.ips)}; run fleetrun on each node listed, or "
                          "give --node_ip with this node's IP as listed")
    hosts = tuple(ip for ip in options.ips for _ in range(nproc))
    return CollectivePlan(len(options.ips) * nproc, nproc, matches[0], hosts, options.ips[0],
                          options.start_port or DEFAULT_MULTI_NODE_PORT, addresses)


def rank_environment(plan: CollectivePlan, rank: int, master_port: int,
                     device: str | None, environ: Mapping[str, str] | None = None
                     ) -> dict[str, str]:
    """The environment of rank ``rank``: inherited, minus job variables, plus::

        RANK  LOCAL_RANK  WORLD_SIZE  LOCAL_WORLD_SIZE  GROUP_RANK (node rank)
        MASTER_ADDR  MASTER_PORT  TORCHELASTIC_USE_AGENT_STORE=True
        TORCHELASTIC_RESTART_COUNT=0
        PADDLE_TRAINER_ID  PADDLE_TRAINERS_NUM  PADDLE_TRAINER_ENDPOINTS
        PADDLE_CURRENT_ENDPOINT  PADDLE_TRAINER_IPS  PADDLE_CURRENT_IP  POD_IP
        TRAINING_ROLE=TRAINER  PADDLE_TRAINING_ROLE=TRAINER
        CUDA_VISIBLE_DEVICES  FLAGS_selected_gpus   (with a GPU only)

    ``PADDLE_TRAINER_ENDPOINTS`` lists ``host:MASTER_PORT+local_rank`` per rank (rank
    0's is the rendezvous endpoint; the others are informational).
    """
    source = os.environ if environ is None else environ
    child = {k: v for k, v in source.items()
             if k not in JOB_VARIABLES and not k.startswith("TORCHELASTIC_")
             and k not in ("CUDA_VISIBLE_DEVICES", "FLAGS_selected_gpus", "GROUP_RANK")}
    child.setdefault("PYTHONUNBUFFERED", "1")
    endpoints = [f"{h}:{master_port + r % plan.nproc_per_node}"
                 for r, h in enumerate(plan.hosts)]
    host = plan.hosts[rank]
    child.update(
        RANK=str(rank), LOCAL_RANK=str(rank % plan.nproc_per_node),
        WORLD_SIZE=str(plan.world_size), LOCAL_WORLD_SIZE=str(plan.nproc_per_node),
        GROUP_RANK=str(plan.node_rank), MASTER_ADDR=plan.master_host,
        MASTER_PORT=str(master_port), TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="0", PADDLE_TRAINER_ID=str(rank),
        PADDLE_TRAINERS_NUM=str(plan.world_size),
        PADDLE_TRAINER_ENDPOINTS=",".join(endpoints), PADDLE_CURRENT_ENDPOINT=endpoints[rank],
        PADDLE_TRAINER_IPS=",".join(plan.hosts), PADDLE_CURRENT_IP=host, POD_IP=host,
        TRAINING_ROLE=Role.WORKER.paddle_name, PADDLE_TRAINING_ROLE=Role.WORKER.paddle_name)
    if device is not None:
        child.update(CUDA_VISIBLE_DEVICES=device, FLAGS_selected_gpus=device)
    return child


def _host_store(plan: CollectivePlan) -> tuple[Any, int]:
    """Node 0 hosts the rendezvous store: (store, its port)."""
    import datetime

    import torch.distributed as dist

    if plan.master_port:
        error = bind_error(plan.master_host, plan.master_port)
        if error is not None:
            raise ConfigError(f"--start_port: cannot host the rendezvous store on "
                              f"{plan.master_host}:{plan.master_port} ({error}); free the port "
                              "or choose another --start_port")
    store = dist.TCPStore(plan.master_host.strip("[]"), plan.master_port, None, True,
                          timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    return store, int(store.port)


def run_collective(config: LaunchConfig, options: CollectiveOptions,
                   tee_stream: BinaryIO | None = None) -> int:
    """Run this node's ranks of a collective job; return the exit code.

    Args:
        config: command, log_dir, stop_grace_s, python_executable, tee_worker_0 (its
            server and worker counts are ignored).
        options: the collective flags.
        tee_stream: where this node's first rank's output is copied; stdout when None.

    Returns:
        0 when every rank of this node exited 0; 1 when one failed (the first failure
        is summarised with its log); 128 + signum after SIGINT / SIGTERM.

    Raises:
        ConfigError: bad flags, no GPU for --devices, the rendezvous port is taken, or
            the log directory cannot be created.
    """
    gpus = visible_gpus()
    nproc = options.nproc_per_node or (len(options.devices) if options.devices else
                                       max(len(gpus), 1))
    devices = assign_devices(options, nproc, gpus)
    plan = plan_collective(options, nproc)
    log_dir = config.log_dir.resolve()
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--log_dir: cannot create {str(log_dir)!r} ({e}); give a writable "
                          "directory") from e
    config = dataclasses.replace(config, log_dir=log_dir, worker_num=nproc, server_num=0)
    store = None
    master_port = plan.master_port
    if plan.node_rank == 0:
        store, master_port = _host_store(plan)
    logger.info("collective job: %d rank(s) on %d node(s); this node (%s) runs ranks %s; "
                "rendezvous store %s:%d%s; devices %s; logs %s/workerlog.RANK",
                plan.world_size, plan.world_size // nproc, ",".join(plan.node_addresses),
                ",".join(map(str, plan.local_ranks)), plan.master_host, master_port,
                " (hosted here)" if store is not None else "",
                ",".join(d or "cpu" for d in devices), log_dir)

    def make_spec(rank: int, tee: bool) -> ProcessSpec:
        device = devices[rank - plan.local_ranks[0]]
        return ProcessSpec(Role.WORKER, rank, (config.python_executable, *config.command),
                           rank_environment(plan, rank, master_port, device),
                           config.log_file(Role.WORKER, rank), tee)

    try:
        return run_workers(config, plan.layout(), make_spec, tee_stream)
    finally:
        del store  # stop hosting only after every rank is gone


def launch_collective(command: Sequence[str], nproc_per_node: int, log_dir: Path, *,
                      stop_grace_s: float = 10.0, python_executable: str | None = None,
                      tee_worker_0: bool = True) -> int:
    """Run a one-host collective job of ``nproc_per_node`` ranks; return the exit code.

    The Python form of ``fleetrun --mode collective --nproc_per_node N``; the YAML
    runner calls it. Arguments as :func:`psfleet.launch.launch_local`.
    """
    config = LaunchConfig(command=tuple(command), worker_num=nproc_per_node,
                          log_dir=Path(log_dir), stop_grace_s=stop_grace_s,
                          tee_worker_0=tee_worker_0,
                          python_executable=python_executable or sys.executable)
    return run_collective(config, CollectiveOptions(nproc_per_node=nproc_per_node))
