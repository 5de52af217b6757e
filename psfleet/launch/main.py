"""``fleetrun``: start a parameter-server or collective training job, on one host or more.

Usage::

    fleetrun [--server_num S] [--worker_num W] [--start_port P] [options]
             train.py [script args ...]
    fleetrun --servers IP:PORT,IP:PORT,... --workers IP[:PORT],IP[:PORT],...
             [--node_ip IP] [options] train.py [script args ...]
    fleetrun [...] -m package.module [module args ...]

The first form runs a whole job on this host. The second runs one node's part of a
multi-node job: give the *same* lists on every node, and each node starts the servers
and workers whose IP is one of its addresses. Also ``python -m psfleet.launch.main
...``; from Python, call :func:`psfleet.launch.launch_local` (one host) or build a
:class:`~psfleet.launch.types.LaunchConfig` and call :func:`psfleet.launch.run_job`.
Everything after the script (or after the module name) is passed to every child
unchanged, so the script's own flags may share names with fleetrun's. Each child runs
``sys.executable train.py args`` (or ``sys.executable -m package.module args``); the
same script runs as server and as worker and asks ``psfleet.fleet`` which role it has.

Options:
    --server_num S              servers to start on this host, >= 0 (default 0: workers
                                only, e.g. a single-process or collective job).
    --worker_num W              workers to start on this host, >= 1 (default 1).
    --start_port P              with --server_num: server i binds port P+i (default: each
                                server binds a free port and reports it, see Start-up).
    --servers IP:PORT,...       every server of a multi-node job, in server-index order;
                                server i binds its IP:PORT (ports 1..65535, no duplicates).
    --workers IP[:PORT],...     every worker of a multi-node job, in worker-index order;
                                an IP may repeat (several workers on a node). The ports
                                are informational, as in Paddle: workers bind nothing.
    --node_ip IP                this node's IP as it appears in the lists (default: every
                                address of this host: /proc/net/fib_trie and
                                /proc/net/if_inet6 on Linux, else the host name's
                                addresses and loopback; 127.0.0.1 always matches).
    --log_dir DIR               where the logs go (default ./log), created if missing.
    --server_wait_timeout_s T   how long to wait for the servers, seconds > 0 (default
                                PSFLEET_SERVER_WAIT_TIMEOUT_S, else 300): fleetrun
                                waits for endpoint files this long; with
                                fixed ports the workers wait (PSFLEET_SERVER_WAIT_TIMEOUT_S,
                                unless already set).
    --stop_grace_s G            how long processes get to exit by themselves, seconds
                                >= 0, before SIGTERM and again before SIGKILL (default 10).
    --max_restarts N            restart a server or worker that fails, up to N times
                                each, or the whole job up to N times (gang) (default 0:
                                the first failure ends the job). See "Restarts" below.
    --replication R             servers holding each share of the tables (default:
                                PSFLEET_REPLICATION, else 1). With 2, a server that dies
                                is failed over: the other copy of each of its shares
                                serves it and the job goes on; with --max_restarts it is
                                restarted and rejoins, filled with copies of its shares
                                while training goes on; without, live servers take new
                                copies of its shares after PSFLEET_REFILL_DELAY_S. A
                                server is removed with psfleet drain
                                (docs/fault-tolerance.md).
    --shares S                  shares the tables are cut into (default: PSFLEET_SHARES,
                                else one per server), at least the server count. More
                                shares than servers, with --replication 2, let psfleet
                                grow add a server to the running job: it takes its part
                                of the shares (2 servers, 6 shares: a third server ends
                                serving 2).
    --restart_policy P          what a failure restarts: process (default; the failed
                                child, for async and GEO jobs) or gang (every server and
                                worker of the node, from the newest complete
                                checkpoint; for sync jobs). See "Restarts" below.
    --tls self-signed           every gRPC channel of the job is TLS, with a key (mode
                                0600) and certificate for 127.0.0.1/localhost made in
                                ``DIR/tls/`` (one-host jobs). Without it the children
                                inherit ``PSFLEET_TLS_*``. See Security.
    -m, --module                run the argument as a module, like ``python -m``.
    -q, --quiet                 fleetrun's own messages: errors only (the output of the
                                first worker is still copied; see Logs).
    -v, --verbose               fleetrun's own messages down to DEBUG (e.g. each child's
                                command line).
    --version                   print ``psfleet VERSION`` and exit.

    --servers and --workers go together, and exclude --server_num, --worker_num and
    --start_port; --node_ip needs them.

Start-up, one host (--server_num / --worker_num):
    1. Stale endpoint files in ``DIR/.endpoints`` are removed.
    2. S servers start, each with::

        TRAINING_ROLE=PSERVER  PADDLE_TRAINING_ROLE=PSERVER
        POD_IP=127.0.0.1       PADDLE_CURRENT_IP=127.0.0.1
        PADDLE_PORT=0          PSFLEET_SERVER_INDEX=i
        PSFLEET_ENDPOINT_FILE=DIR/.endpoints/server.i
        PADDLE_TRAINERS_NUM=W  PADDLE_TRAINER_IPS=127.0.0.1,... (W times)

       ``PADDLE_PORT=0`` means the server binds a free port itself (no pick-then-bind
       race). Once listening it writes ``host:port\\n`` to ``PSFLEET_ENDPOINT_FILE``
       atomically (a temporary file, then ``os.replace``; see
       :mod:`psfleet.launch.endpoints`).
    3. fleetrun waits for all S endpoint files, listing the servers still missing every
       few seconds, at most ``--server_wait_timeout_s``.
    4. W workers start, each with::

        TRAINING_ROLE=TRAINER  PADDLE_TRAINING_ROLE=TRAINER
        POD_IP=127.0.0.1       PADDLE_CURRENT_IP=127.0.0.1
        PADDLE_PSERVERS_IP_PORT_LIST=host:port,...  (server-index order; unset if S=0)
        PADDLE_TRAINERS_NUM=W  PADDLE_TRAINER_ID=k
        PADDLE_TRAINER_IPS=127.0.0.1,... (W times)

    With ``--start_port P`` server i gets ``PADDLE_PORT=P+i`` and
    ``PADDLE_PSERVERS_IP_PORT_LIST`` instead of an endpoint file, and the workers start
    right after the servers, as on a multi-node job.
    5. While the workers run, ``psfleet grow DIR`` (a request file in
       ``DIR/.control``) has fleetrun start one more server, index S (then S+1, ...),
       as in 2. plus ``PADDLE_PSERVERS_IP_PORT_LIST`` of the first S servers; with
       ``--replication 2`` it joins them and takes its part of the shares (``--shares``).

Start-up, multi-node (--servers / --workers, run on every node):
    This node's part is every entry whose IP is one of its addresses (--node_ip, else
    detected); indices are the entries' positions in the lists, the same on every node.
    A node none of whose addresses is in the lists is an error (exit 2, naming the
    addresses and the lists). The node's servers start first, each with::

        TRAINING_ROLE=PSERVER  PADDLE_TRAINING_ROLE=PSERVER
        POD_IP=IP              PADDLE_CURRENT_IP=IP           (its entry's IP)
        PADDLE_PORT=PORT       PSFLEET_SERVER_INDEX=i         (its entry's port, index)
        PADDLE_PSERVERS_IP_PORT_LIST=<--servers>
        PADDLE_TRAINERS_NUM=len(--workers)   PADDLE_TRAINER_IPS=<--workers' IPs>

    A server binds its IP:PORT or fails at once naming it (exit non-zero: see below).
    Then the node's workers start, each with::

        TRAINING_ROLE=TRAINER  PADDLE_TRAINING_ROLE=TRAINER
        POD_IP=IP              PADDLE_CURRENT_IP=IP           (its entry's IP)
        PADDLE_PSERVERS_IP_PORT_LIST=<--servers>
        PADDLE_TRAINERS_NUM=len(--workers)   PADDLE_TRAINER_ID=k (global index)
        PADDLE_TRAINER_IPS=<--workers' IPs>
        PSFLEET_SERVER_WAIT_TIMEOUT_S=T      (unless set)

    fleetrun does not wait for the servers (some are on other nodes): each worker waits
    until every server answers, retrying visibly, at most T seconds. Example, servers
    and workers on two nodes 10.0.0.1 and 10.0.0.2 (run both lines, one per node)::

        fleetrun --servers=10.0.0.1:6170,10.0.0.2:6170 --workers=10.0.0.1,10.0.0.2 train.py
        fleetrun --servers=10.0.0.1:6170,10.0.0.2:6170 --workers=10.0.0.1,10.0.0.2 train.py

    Node 10.0.0.1 runs server 0 and worker 0, node 10.0.0.2 server 1 and worker 1.

    Every child inherits fleetrun's environment, minus job variables inherited from an
    enclosing job (the ``PADDLE_*`` / ``PSFLEET_*`` role variables above and torchrun's
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``), plus ``PYTHONUNBUFFERED=1`` unless set. fleetrun itself reads
    ``PSFLEET_LOG_LEVEL`` (default INFO; -q: ERROR, -v: DEBUG) for its own messages,
    which go to stderr.

Logs:
    Each child's stdout and stderr go to ``DIR/serverlog.i`` and ``DIR/workerlog.k``
    (global indices; overwritten by each run). The output of this node's first worker
    (worker 0 on one host) is also copied to fleetrun's stdout as it comes, so its
    progress bar shows in the terminal.

Processes:
    Each child runs in its own session and process group, so stopping a child stops
    its whole subtree (data loader workers, pipe commands). fleetrun signals only the
    groups of children it started, and no child outlives fleetrun, also when fleetrun
    itself fails.

Lifecycle of a node:
    With workers: fleetrun ends when its workers are done (below). Without workers
    (servers only): the servers run until the job's workers, on other nodes, stop them
    over RPC (worker 0's ``fleet.stop_worker()``) and they exit 0 by themselves; then
    fleetrun exits 0. A failure or a signal ends it earlier. fleetrun does not talk to
    the other nodes: when a process fails on one node, the others learn it through
    their own workers' failing calls (``PSFLEET_RPC_DEADLINE_S``).

Exit codes and failure modes:
    0    every worker of this node exited 0. The node's servers then get
         ``--stop_grace_s`` to exit by themselves (workers normally stop them over
         RPC); the ones still running are sent SIGTERM, then SIGKILL after another
         ``--stop_grace_s``. A node with servers only: every server exited 0.
    1    a child exited non-zero or was killed by a signal, e.g. a server whose port is
         taken (its log's last lines, shown, name the endpoint). The first failure is
         the root cause: fleetrun prints its role, index, exit code (or signal name),
         its log path and the last 20 lines of its log, then stops the others (SIGTERM,
         ``--stop_grace_s``, SIGKILL). Also 1 when a server exits before writing its
         endpoint file (named at once, with its log), when a server does not report
         its endpoint within ``--server_wait_timeout_s`` (the missing servers are
         listed), and when fleetrun itself fails unexpectedly (after stopping all).
    2    a bad flag value, e.g. ``--worker_num 0``, a malformed or duplicate endpoint
         in ``--servers``, ``--servers`` with ``--server_num``, or a node that is in
         neither list; the message names the flag and the allowed values. Nothing is
         started.
    128+N  fleetrun received signal N (SIGINT: 130, SIGTERM: 143). The signal is
         forwarded to every child's group, which gets ``--stop_grace_s`` before
         SIGKILL; a second signal skips the wait.
    (none) fleetrun itself SIGKILLed (or crashed): every child gets SIGHUP from the
         kernel (parent-death signal) or notices within 0.25 s that its parent changed,
         writes ``launcher <pid> died; exiting`` to its log and SIGKILLs its process
         group (:mod:`psfleet.launcher_guard`; ``PSFLEET_LAUNCHER_PID``).

Security (docs/security.md; ``psfleet.launch.security``):
    Every call to a server needs the job's token. fleetrun passes
    ``PSFLEET_AUTH_TOKEN`` on to its children, or, when it is unset, generates one for
    the job (``secrets.token_urlsafe(32)``) and gives it to every child in its
    environment, never on a command line or in a log; while the job runs it is also in
    ``DIR/.auth_token`` (mode 0600) for tools such as ``psfleet status``. A multi-node
    job needs the same token on every node: without ``PSFLEET_AUTH_TOKEN`` (and with
    processes on other nodes) fleetrun exits 2 before starting anything, saying how to
    make one. The servers' Save and Load may use only folders under
    ``PSFLEET_STORAGE_ROOTS`` (comma-separated; default: fleetrun's working folder and
    DIR); others are refused (PERMISSION_DENIED). ``--tls self-signed`` or the
    ``PSFLEET_TLS_*`` variables make every channel TLS. Collective mode has no psfleet
    server: its torch.distributed traffic is neither authenticated nor encrypted.

Restarts (--max_restarts N > 0, --restart_policy process):
    A child that exits non-zero or is killed (or hangs: see "Hang detection") is
    restarted with the environment it had plus ``PSFLEET_RESTART_NUM=n`` (its n-th
    restart); a server binds the port it had before, so the workers' endpoint list
    stays valid. Each restart is logged as a
    warning with the cause (exit code or signal) and the last lines of the failed
    process's log, which is kept as ``<log>.failed<n>``. Every child also gets
    ``PSFLEET_RPC_MAX_RETRIES=1000`` (unless set): workers retry calls to a server that
    is being restarted until ``PSFLEET_RPC_DEADLINE_S``. With the fleet API, a
    restarted server re-creates its tables from the newest complete checkpoint (the
    ``checkpoint_dir`` given to ``fleet.init_server`` or ``PSFLEET_CHECKPOINT_DIR``)
    and a restarted worker rejoins the running job from its cursor in that checkpoint
    (``fleet.load_checkpoint``). A child that fails once more than N times ends the
    job as usual (exit 1 with the failure summary). Nothing is restarted once every
    worker has finished, nor once training is complete: each worker writes
    ``DIR/.done/worker.k`` (``PSFLEET_DONE_FILE``) when it passed the job's stop
    barrier (``fleet.stop_worker``), and a worker other than 0 that fails after that
    (worker 0 still evaluating and exporting) is a warning, not the job's failure.

Whole-job restarts (--max_restarts N > 0, --restart_policy gang; sync jobs):
    In sync mode every worker takes part in every round, so a worker restarted alone
    cannot rejoin the round the others wait in. With ``gang`` (as torchrun's elastic
    agent does) a failure of any child stops every server and worker of the node
    (SIGKILL: the job goes on from a checkpoint, nothing in memory is needed) and
    starts them all again, servers first, with ``PSFLEET_RESTART_NUM=k`` (the job's
    k-th restart, at most N). The servers re-create their tables from the newest
    complete checkpoint and every worker resumes from its cursor in it, so a sync job
    with SGD ends with the same parameters as an undisturbed run of the same seed;
    without a checkpoint the job starts from scratch. fleetrun logs one warning::

        fleetrun: worker 1 (pid 4242) failed with signal SIGKILL (9); restarting the
        whole job (--restart_policy gang): every server and worker stops and starts
        again from checkpoint /ck/ckpt-000003-step40 (restart 1 of --max_restarts 1)

    naming the checkpoint folder it finds in ``PSFLEET_CHECKPOINT_DIR`` (``psfleet
    train`` passes ``runner.checkpoint.checkpoint_dir``). The failed child's log is kept
    as ``<log>.failed<k>``, the others' as ``<log>.stopped<k>``. A failure after N
    restarts, or once a worker has exited 0 (in sync mode it passed the job's last
    barrier: training is over), ends the job with the failure summary. One node's
    fleetrun restarts only its own children: a multi-node sync job needs a restart of
    every node.

Hang detection (``PSFLEET_HEALTH_TIMEOUT_S``, default 30, at most 3600 seconds; ``off``
turns it off):
    fleetrun has a helper process (``psfleet.launch.health_probe``; fleetrun itself
    never calls gRPC, as it forks children) ask each of its servers' gRPC health
    service every timeout/3 seconds (at most 5; each check waits up to timeout/3, at most
    10 s, for its answer), from the server's first answer on. A
    server whose checks all go unanswered for the timeout (it accepted the connection
    but answers nothing: SIGSTOP, every handler thread stuck), or any child found
    stopped (process state T, e.g. SIGSTOP) that long, is treated as dead: fleetrun
    SIGKILLs its process group and restarts it per --max_restarts and
    --restart_policy, or ends the job (exit 1) with the summary::

        fleetrun: server 0 (pid 4242, 127.0.0.1:6170) did not answer health checks for
        30 s (PSFLEET_HEALTH_TIMEOUT_S=30); fleetrun killed it (SIGKILL); this is the
        first failure (the root cause).

    A quick NOT_SERVING or a refused connection (a server stopping or restarting) is
    not a hang; a server that sends no HTTP/2 greeting (not gRPC) is not checked. No
    check runs once every worker has finished. In a replicated job (--replication 2) a
    server is not killed while another server of the job is down: it may hold the last
    live copy of that server's shares (fleetrun warns once and leaves it to the
    workers' deadlines). On a host so starved that a live server cannot answer within
    30 s, raise the timeout (e.g. 300) or turn it off. Workers have no endpoint to ask: a
    worker that hangs without being stopped is found by the servers' and the other
    workers' deadlines (PSFLEET_RPC_DEADLINE_S).

Collective mode (--mode collective; also chosen by --nproc_per_node, --ips or --devices):
    No servers: every rank holds the whole model and gradients are all-reduced over
    torch.distributed (gloo on CPU, nccl with GPUs; see ``psfleet.collective``)::

        fleetrun --mode collective --nproc_per_node N [--devices 0,1,...] train.py
        fleetrun --mode collective --ips IP0,IP1,... --nproc_per_node N
                 [--node_ip IP] [--start_port P] train.py      (on every node)

    --nproc_per_node N   ranks on each node (default: one per --devices entry, else one
                         per visible GPU, else 1).
    --ips IP0,IP1,...    every node's IP, the same list on every node; node n (the entry
                         that is one of this host's addresses, or --node_ip) runs ranks
                         n*N .. n*N+N-1. Without --ips: ranks 0..N-1 on this host.
    --devices / --gpus   GPU ids of this node's ranks, one per rank (an error when the
                         node has no GPU); without it each rank gets one visible GPU in
                         turn, or the CPU when there is none. Sets CUDA_VISIBLE_DEVICES
                         (and FLAGS_selected_gpus) of each rank.
    --start_port P       the rendezvous port (default: a free port on one host; 6070
                         across nodes).

    The launcher of node 0 hosts the rendezvous store (torch's TCPStore) on IP0 (one
    host: 127.0.0.1) and the port, before any rank starts. Each rank gets::

        RANK  LOCAL_RANK  WORLD_SIZE  LOCAL_WORLD_SIZE  GROUP_RANK  MASTER_ADDR
        MASTER_PORT  TORCHELASTIC_USE_AGENT_STORE=True  TORCHELASTIC_RESTART_COUNT=0
        PADDLE_TRAINER_ID  PADDLE_TRAINERS_NUM  PADDLE_TRAINER_ENDPOINTS
        PADDLE_CURRENT_ENDPOINT  PADDLE_TRAINER_IPS  PADDLE_CURRENT_IP  POD_IP
        TRAINING_ROLE=TRAINER  PADDLE_TRAINING_ROLE=TRAINER

    so ``fleet.init(is_collective=True)`` and a plain torch
    ``init_process_group("gloo")`` both find the job. Logs (``DIR/workerlog.RANK``), the
    copy of the first rank's output, process groups, the failure summary and the exit
    codes are those of the parameter-server form. Ranks on other nodes wait for the
    store up to PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S (300 s) and then fail naming it.
    --max_restarts is not available: a restarted rank cannot rejoin a running
    process group.

Examples::

    fleetrun --mode collective --nproc_per_node 2 train.py
    fleetrun --server_num 2 --worker_num 2 train.py --epochs 1
    fleetrun --server_num 2 --worker_num 2 --start_port 6170 train.py
    fleetrun --server_num 1 --worker_num 4 -m psfleet.cli.main train -m config.yaml
    fleetrun --servers=10.0.0.1:6170,10.0.0.2:6170 --workers=10.0.0.1,10.0.0.1,10.0.0.2 \\
        --node_ip 10.0.0.1 train.py
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.fleet.server_wait import server_wait_timeout_s
from psfleet.launch.collective import CollectiveOptions, run_collective
from psfleet.launch.console import version_text
from psfleet.launch.hosts import split_list
from psfleet.launch.local import EXIT_FAILURE, run_job
from psfleet.launch.restarts import RESTART_POLICIES, check_max_restarts
from psfleet.launch.types import LaunchConfig

__all__ = ["main", "build_parser", "config_from_args"]

logger = logging.getLogger(__name__)

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The ``fleetrun`` argument parser (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="fleetrun",
        description="Start a parameter-server training job (servers and workers) on this host, "
        "or this node's part of a multi-node job (--servers / --workers).",
        epilog="Run `python -m pydoc psfleet.launch.main` for the manual.",
    )
    parser.add_argument(
        "--server_num", type=int, default=None, help="servers on this host, >= 0 (default 0)"
    )
    parser.add_argument(
        "--worker_num", type=int, default=None, help="workers on this host, >= 1 (default 1)"
    )
    parser.add_argument(
        "--start_port", type=int, default=None, help="with --server_num: server i binds P+i"
    )
    parser.add_argument(
        "--servers", default=None, help="multi-node: every server's IP:PORT, comma-separated"
    )
    parser.add_argument(
        "--workers", default=None, help="multi-node: every worker's IP[:PORT], comma-separated"
    )
    parser.add_argument(
        "--node_ip", default=None, help="multi-node: this node's IP (default: detected)"
    )
    parser.add_argument(
        "--mode",
        choices=["ps", "collective"],
        default=None,
        help="ps (servers and workers) or collective (all-reduce ranks); default ps, or "
        "collective when --nproc_per_node, --ips or --devices is given",
    )
    parser.add_argument(
        "--nproc_per_node", type=int, default=None, help="collective: ranks on each node"
    )
    parser.add_argument(
        "--ips", default=None, help="collective: every node's IP, comma-separated, node order"
    )
    parser.add_argument(
        "--devices",
        "--gpus",
        dest="devices",
        default=None,
        help="collective: GPU ids of this node's ranks, comma-separated",
    )
    parser.add_argument(
        "--log_dir", type=Path, default=Path("log"), help="log directory (default ./log)"
    )
    parser.add_argument(
        "--server_wait_timeout_s",
        type=float,
        default=None,
        help="seconds to wait for every server's endpoint (default "
             "PSFLEET_SERVER_WAIT_TIMEOUT_S, else 300)",
    )
    parser.add_argument(
        "--stop_grace_s",
        type=float,
        default=10.0,
        help="seconds processes get to exit before SIGTERM / SIGKILL (default 10)",
    )
    parser.add_argument(
        "--max_restarts",
        type=int,
        default=0,
        help="restart a failed server or worker up to N times each (default 0)",
    )
    parser.add_argument(
        "--replication",
        type=int,
        default=None,
        help="servers holding each share of the tables (default PSFLEET_REPLICATION, else 1)",
    )
    parser.add_argument(
        "--shares",
        type=int,
        default=None,
        help="shares the tables are cut into, at least --server_num; more, with "
             "--replication 2, let psfleet grow add a server to the running job "
             "(default PSFLEET_SHARES, else one per server)",
    )
    parser.add_argument(
        "--restart_policy",
        choices=list(RESTART_POLICIES),
        default=RESTART_POLICIES[0],
        help="what a failure restarts: process (the failed child; async, geo) or gang "
        "(every server and worker, from the newest checkpoint; sync) (default process)",
    )
    parser.add_argument(
        "--tls",
        choices=["self-signed"],
        default=None,
        help="self-signed: TLS on every channel, with a pair made in LOG_DIR/tls (one host)",
    )
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument(
        "-q", "--quiet", action="store_true", help="fleetrun's own messages: errors only"
    )
    verbosity.add_argument(
        "-v", "--verbose", action="store_true", help="fleetrun's own messages: DEBUG details"
    )
    parser.add_argument("--version", action="version", version=version_text())
    parser.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="run training_script as a module, like python -m",
    )
    parser.add_argument("training_script", help="the script (or module with -m) every child runs")
    parser.add_argument(
        "training_script_args", nargs=argparse.REMAINDER, help="arguments of the script"
    )
    return parser


_COLLECTIVE_FLAGS = ("nproc_per_node", "ips", "devices")
_PS_FLAGS = ("server_num", "worker_num", "servers", "workers", "tls")


def collective_from_args(args: argparse.Namespace) -> CollectiveOptions | None:
    """The collective options, or None for a parameter-server job (see ``--mode``).

    Raises:
        ConfigError: a flag of the other mode is given, or a collective value is out
            of range (names the flag).
    """
    given = [f for f in _COLLECTIVE_FLAGS if getattr(args, f, None) is not None]
    mode = getattr(args, "mode", None) or ("collective" if given else "ps")
    if mode == "ps":
        if given:
            raise ConfigError(f"--{given[0]}: only in collective mode (--mode collective)")
        return None
    for flag in _PS_FLAGS:
        if getattr(args, flag, None) is not None:
            raise ConfigError(f"--{flag}: not in collective mode, which has no servers; use "
                              "--nproc_per_node (and --ips across nodes)")
    if getattr(args, "max_restarts", 0):
        raise ConfigError("--max_restarts: not in collective mode; a restarted rank cannot "
                          "rejoin a running process group")
    return CollectiveOptions(
        nproc_per_node=args.nproc_per_node,
        ips=split_list(args.ips) if args.ips is not None else (),
        node_ips=split_list(args.node_ip) if args.node_ip is not None else (),
        start_port=args.start_port,
        devices=split_list(args.devices) if args.devices is not None else None,
    )


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """Turn parsed flags into a validated :class:`LaunchConfig`.

    In collective mode (:func:`collective_from_args`) ``--node_ip`` and
    ``--start_port`` belong to the collective options and are left out here.

    Raises:
        ConfigError: a value is out of range or the script does not exist.
    """
    collective = collective_from_args(args) is not None
    script: str = args.training_script
    prefix = ("-m",) if args.module else ()
    for listed, counted in (("servers", "server_num"), ("workers", "worker_num")):
        if getattr(args, listed) is not None and getattr(args, counted) is not None:
            raise ConfigError(
                f"--{counted}: not with --{listed}; --{listed} lists every {listed[:-1]} "
                f"of the job, so give one of --{listed} and --{counted}"
            )
    config = LaunchConfig(
        command=(*prefix, script, *args.training_script_args),
        server_num=0 if args.server_num is None else args.server_num,
        worker_num=1 if args.worker_num is None else args.worker_num,
        log_dir=args.log_dir,
        server_wait_timeout_s=server_wait_timeout_s(args.server_wait_timeout_s),
        stop_grace_s=args.stop_grace_s,
        servers=split_list(args.servers) if args.servers is not None else (),
        workers=split_list(args.workers) if args.workers is not None else (),
        node_ips=split_list(args.node_ip) if args.node_ip is not None and not collective else (),
        start_port=None if collective else args.start_port,
        replication=args.replication,
        shares=args.shares,
    )
    if not args.module and not Path(script).is_file():
        raise ConfigError(
            f"training_script: {script!r} is not a file; give the path of a Python "
            "script, or -m package.module to run a module"
        )
    return config


def _configure_logging(quiet: bool = False, verbose: bool = False) -> None:
    """fleetrun's messages to stderr at PSFLEET_LOG_LEVEL, ERROR with -q, DEBUG with -v."""
    level_name = (env.read("PSFLEET_LOG_LEVEL") or "INFO").upper()
    level = logging.getLevelName(level_name)
    if not isinstance(level, int):
        level = logging.INFO
    logging.basicConfig(
        level=logging.ERROR if quiet else logging.DEBUG if verbose else level,
        stream=sys.stderr,
        format="[fleetrun] %(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    if level_name != logging.getLevelName(level) and not quiet:
        logger.warning(
            "PSFLEET_LOG_LEVEL=%r is not a logging level (DEBUG, INFO, WARNING, ERROR); using INFO",
            level_name,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fleetrun``; returns the exit code (see the module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.quiet, args.verbose)
    try:
        config = config_from_args(args)
        collective = collective_from_args(args)
    except ConfigError as e:
        parser.error(str(e))  # exits with EXIT_USAGE
    try:
        if collective is not None:
            return run_collective(config, collective)
        return run_job(config, max_restarts=check_max_restarts(args.max_restarts),
                       tls=args.tls, restart_policy=args.restart_policy)
    except ConfigError as e:
        print(f"fleetrun: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:
        logger.exception("fleetrun failed; every process it started has been stopped")
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
