"""Vocabulary of the launcher: the launch configuration and one child's spec.

:class:`LaunchConfig` is what ``fleetrun`` parses from its flags and what
:func:`psfleet.launch.launch_local` builds from its arguments; it is validated when
created, so a bad value fails before any process starts. :class:`ProcessSpec` is
everything needed to start one child: its role, index, argv, environment and log file.
:class:`~psfleet.types.Role` (the job-wide one) is re-exported here.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from psfleet.errors import ConfigError
from psfleet.fleet.server_wait import server_wait_timeout_s
from psfleet.launch.hosts import normalize_host, parse_server_list, parse_worker_list, split_list
from psfleet.replication import (
    check_replication,
    check_shares,
    replication_from_env,
    shares_from_env,
)
from psfleet.types import Role

__all__ = ["LOCAL_HOST", "Role", "LaunchConfig", "ProcessSpec"]

#: The address every child binds and reports on a one-host job.
LOCAL_HOST = "127.0.0.1"


def _check_count(flag: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{flag}: got {value!r}; allowed: an integer >= {minimum}")


def _check_seconds(flag: str, value: object, *, allow_zero: bool) -> None:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= 0 if allow_zero else value > 0)
    )
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{flag}: got {value!r}; allowed: a finite number of seconds {bound}")


@dataclass(frozen=True)
class LaunchConfig:
    """How to run one job (or this node's part of it): what, how many of each role, where.

    Two shapes: a one-host job (``server_num`` / ``worker_num``, every child on
    127.0.0.1) or a multi-node job (``servers`` / ``workers`` list the whole job; this
    node runs the entries whose host is one of its addresses, see
    :mod:`psfleet.launch.cluster`).

    Attributes:
        command: the argv after the interpreter, the same for every child, e.g.
            ``("train.py", "--epochs", "2")`` or ``("-m", "psfleet.cli.main", "train")``.
        server_num: number of servers (``--server_num``), >= 0; 0 runs workers only. With
            ``servers`` it must be 0 or ``len(servers)`` and becomes ``len(servers)``.
        worker_num: number of workers (``--worker_num``), >= 1. With ``workers`` it must
            be 1 or ``len(workers)`` and becomes ``len(workers)``.
        log_dir: directory of ``serverlog.N`` / ``workerlog.N`` (``--log_dir``); created
            if missing. Endpoint files go to ``log_dir/.endpoints``.
        server_wait_timeout_s: how long to wait for every server to report its endpoint
            (``--server_wait_timeout_s``), > 0.
        stop_grace_s: how long processes get to exit after the workers are done or after
            SIGTERM before they are killed (``--stop_grace_s``), >= 0.
        python_executable: the interpreter every child runs (``sys.executable``).
        tee_worker_0: also copy the output of this node's first worker (worker 0 on one
            host) to the launcher's stdout.
        servers: every server's ``host:port`` of a multi-node job, in server-index order
            (``--servers``; a comma-separated string is split). Empty: one-host job.
        workers: every worker's host of a multi-node job, in worker-index order
            (``--workers``; ``host`` or ``host:port``, ports are dropped).
        node_ips: this node's addresses (``--node_ip``); empty: detected.
        start_port: one-host job only: servers bind ``start_port + i`` instead of a free
            port reported through an endpoint file (``--start_port``).
        replication: servers holding each share of the tables (``--replication``), from
            1 to the server count; None: ``PSFLEET_REPLICATION`` (default 1). Every
            child gets it as ``PSFLEET_REPLICATION``. Above 1 a server that
            dies is failed over: its shares are served by their other copies and the
            job goes on while every share has one; with restarts left (``process``
            policy) it is restarted and rejoins (docs/fault-tolerance.md).
        shares: shares the tables are cut into (``--shares``); None:
            ``PSFLEET_SHARES`` (default: one per server). More than the servers needs
            replication >= 2; a server added to the running job (``psfleet grow``) then
            takes its part of them. Every child gets it as ``PSFLEET_SHARES``.

    Raises:
        ConfigError: a value is out of range; the message names the flag and the
            allowed values.
    """

    command: tuple[str, ...]
    server_num: int = 0
    worker_num: int = 1
    log_dir: Path = field(default_factory=lambda: Path("log"))
    server_wait_timeout_s: float = field(default_factory=server_wait_timeout_s)
    stop_grace_s: float = 10.0
    python_executable: str = field(default_factory=lambda: sys.executable)
    tee_worker_0: bool = True
    servers: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()
    node_ips: tuple[str, ...] = ()
    start_port: int | None = None
    replication: int | None = None
    shares: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.command, str) or not all(isinstance(a, str) for a in self.command):
            raise ConfigError(
                f"command: got {self.command!r}; allowed: a sequence of strings "
                "(the argv after the interpreter, e.g. ['train.py', '--epochs', '2'])"
            )
        object.__setattr__(self, "command", tuple(self.command))
        if not self.command:
            raise ConfigError(
                "command: got an empty command; give the training script "
                "(fleetrun [options] train.py [args]) or a module (-m package.module)"
            )
        if self.command[0] == "-m" and len(self.command) < 2:
            raise ConfigError("command: '-m' needs a module name, e.g. -m package.module")
        _check_count("--server_num", self.server_num, 0)
        _check_count("--worker_num", self.worker_num, 1)
        self._check_lists()
        servers = len(self.servers) or self.server_num
        object.__setattr__(self, "replication", replication_from_env(servers)
                           if self.replication is None else
                           check_replication(self.replication, max(servers, 1),
                                             "--replication"))
        assert self.replication is not None
        object.__setattr__(self, "shares", shares_from_env(servers, self.replication)
                           if self.shares is None else
                           check_shares(self.shares, servers, self.replication, "--shares"))
        _check_seconds("--server_wait_timeout_s", self.server_wait_timeout_s, allow_zero=False)
        _check_seconds("--stop_grace_s", self.stop_grace_s, allow_zero=True)
        if not isinstance(self.log_dir, (str, Path)) or str(self.log_dir) == "":
            raise ConfigError(f"--log_dir: got {self.log_dir!r}; allowed: a directory path")
        object.__setattr__(self, "log_dir", Path(self.log_dir))
        if not self.python_executable:
            raise ConfigError("python_executable: empty; give the interpreter to run")

    def _check_lists(self) -> None:
        """Validate and normalise ``servers``, ``workers``, ``node_ips``, ``start_port``."""
        if self.servers or self.workers:
            if not self.servers:
                raise ConfigError("--servers: required with --workers; list every server's "
                                  "IP:PORT (the same lists on every node)")
            if not self.workers:
                raise ConfigError("--workers: required with --servers; list every worker's IP "
                                  "(or IP:PORT; the same lists on every node)")
            servers = parse_server_list(self.servers)
            workers = parse_worker_list(self.workers)
            if self.server_num not in (0, len(servers)):
                raise ConfigError(f"--server_num: got {self.server_num} but --servers lists "
                                  f"{len(servers)} server(s); give one of the two flags")
            if self.worker_num not in (1, len(workers)):
                raise ConfigError(f"--worker_num: got {self.worker_num} but --workers lists "
                                  f"{len(workers)} worker(s); give one of the two flags")
            if self.start_port is not None:
                raise ConfigError("--start_port: not with --servers (the ports are in the "
                                  "list); it numbers the ports of --server_num servers")
            object.__setattr__(self, "servers", servers)
            object.__setattr__(self, "workers", workers)
            object.__setattr__(self, "server_num", len(servers))
            object.__setattr__(self, "worker_num", len(workers))
        node_ips = tuple(normalize_host(ip) for ip in split_list(self.node_ips) if ip)
        if self.node_ips and not node_ips:
            raise ConfigError("--node_ip: empty; give this node's IP as it appears in the lists")
        if node_ips and not self.servers:
            raise ConfigError("--node_ip: only with --servers and --workers (it picks this "
                              "node's entries); a one-host job runs everything on 127.0.0.1")
        object.__setattr__(self, "node_ips", node_ips)
        if self.start_port is not None:
            top = 65535 - max(self.server_num, 1) + 1
            if (isinstance(self.start_port, bool) or not isinstance(self.start_port, int)
                    or not 1 <= self.start_port <= top):
                raise ConfigError(f"--start_port: got {self.start_port!r}; allowed: an integer "
                                  f"in 1..{top} (servers bind start_port .. "
                                  "start_port+server_num-1)")

    @property
    def is_multi_node(self) -> bool:
        """Whether the job is given as ``servers`` / ``workers`` lists (one node's part)."""
        return bool(self.servers)

    @property
    def endpoint_dir(self) -> Path:
        """Directory of the servers' endpoint files: ``log_dir/.endpoints``."""
        return self.log_dir / ".endpoints"

    @property
    def done_dir(self) -> Path:
        """Directory of the workers' done files (``PSFLEET_DONE_FILE``): ``log_dir/.done``."""
        return self.log_dir / ".done"

    def done_file(self, worker_index: int) -> Path:
        """The file worker ``worker_index`` writes once it passed the stop barrier."""
        return self.done_dir / f"worker.{worker_index}"

    def endpoint_file(self, server_index: int) -> Path:
        """The file server ``server_index`` writes its ``host:port`` into."""
        return self.endpoint_dir / f"server.{server_index}"

    def log_file(self, role: Role, index: int) -> Path:
        """The log file of child ``index`` of ``role``: ``log_dir/workerlog.N`` etc."""
        return self.log_dir / f"{role.log_prefix}.{index}"


@dataclass(frozen=True)
class ProcessSpec:
    """Everything needed to start one child process.

    Attributes:
        role: server or worker.
        index: server index or worker index (``PADDLE_TRAINER_ID``).
        argv: the full argv, interpreter first.
        env: the complete environment of the child (not in the repr: it holds the
            job's token).
        log_path: where its stdout and stderr go.
        tee: also copy its output to the launcher's stdout.
    """

    role: Role
    index: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    log_path: Path
    tee: bool = False

    @property
    def name(self) -> str:
        """Human name used in logs and errors: ``server 0``, ``worker 1``."""
        return f"{self.role.word} {self.index}"
