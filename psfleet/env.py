"""Every environment variable psfleet reads, declared in one place.

Each :class:`EnvVar` carries its default and meaning; :func:`markdown_table` renders
the table in README.md ("Environment variables"). Code elsewhere reads variables only
through :func:`read` so nothing is read that is not documented here.

Names follow the seeds (PaddlePaddle Fleet's ``PADDLE_*`` variables) so scripts and
cluster tooling written for them work unchanged; psfleet's own start with ``PSFLEET_``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from psfleet.errors import ConfigError

__all__ = ["EnvVar", "VARIABLES", "read", "markdown_table"]


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, default (None: unset) and meaning."""

    name: str
    default: str | None
    meaning: str


VARIABLES: tuple[EnvVar, ...] = (
    EnvVar("TRAINING_ROLE", None, "Role of this process: PSERVER (server) or TRAINER (worker)."),
    EnvVar("PADDLE_TRAINING_ROLE", None, "Same as TRAINING_ROLE (newer seeds' name)."),
    EnvVar(
        "PADDLE_PSERVERS_IP_PORT_LIST",
        None,
        "Comma-separated server endpoints host:port, in server-index order. Under mpirun "
        "it may be unset: MPIRoleMaker then exchanges it over MPI (mpi4py).",
    ),
    EnvVar(
        "PADDLE_PSERVER_IPS",
        None,
        "Older seeds' server list: comma-separated IPs, with PADDLE_PSERVER_PORT. If "
        "PADDLE_PSERVERS_IP_PORT_LIST is also set, both must name the same endpoints.",
    ),
    EnvVar(
        "PADDLE_PSERVER_PORT",
        None,
        "Port of the servers in PADDLE_PSERVER_IPS: one port for all, or a comma list with "
        "one port per IP. Collective (the seeds' NCCL2) mode: the rendezvous port of the "
        "first PADDLE_TRAINER_IPS entry, used at start-up to set up the process group (the "
        "seeds broadcast the NCCL ID through it); if PADDLE_PORT is also set, both must be "
        "equal. MASTER_ADDR:MASTER_PORT and PADDLE_TRAINER_ENDPOINTS take precedence.",
    ),
    EnvVar(
        "PADDLE_PSERVER_PORT_ARRAY",
        None,
        "The seeds' GPUBox name of PADDLE_PSERVER_PORT: the servers' ports, comma or space "
        "separated, optionally in parentheses as the seeds' scripts write a bash array "
        "(\"(29011 29012)\"). If both are set they must be equal.",
    ),
    EnvVar("PADDLE_TRAINERS_NUM", None, "Number of workers (worker_num)."),
    EnvVar(
        "PADDLE_TRAINERS",
        None,
        "Older seeds' worker count: an integer, or a comma list of worker IPs whose length "
        "is the count. Must agree with PADDLE_TRAINERS_NUM if both are set.",
    ),
    EnvVar("PADDLE_TRAINER_ID", None, "This worker's index, 0 .. worker_num-1."),
    EnvVar(
        "PADDLE_TRAINER_IPS",
        None,
        "Comma-separated worker IPs in worker-index order; must list one per worker (gives "
        "worker_num when no count is set).",
    ),
    EnvVar(
        "POD_IP",
        None,
        "IP address this process binds (servers) or reports. MPIRoleMaker's exchange: "
        "unset, a server offers this node's address that other nodes reach (the route's "
        "source address; 127.0.0.1 on a node with no other).",
    ),
    EnvVar("PADDLE_CURRENT_IP", None, "Same as POD_IP (newer seeds' name)."),
    EnvVar(
        "PADDLE_PORT",
        None,
        "Port a server binds; 0 asks the OS for a free port. MPIRoleMaker's exchange: "
        "unset or 0, each server rank takes a free port.",
    ),
    EnvVar(
        "PSFLEET_SERVER_NUM",
        None,
        "MPIRoleMaker / SlurmRoleMaker: how many ranks are servers (ranks 0 .. N-1), when "
        "server_num is not passed in code. fleet.init() in an mpirun job without it: half "
        "the ranks (rounded down) serve, as Paddle's MPISymetricRoleMaker; one rank trains "
        "alone.",
    ),
    EnvVar(
        "OMPI_COMM_WORLD_RANK",
        None,
        "Open MPI's rank of this process (MPIRoleMaker). Set and no TRAINING_ROLE / "
        "PADDLE_TRAINING_ROLE: fleet.init() uses MPIRoleMaker.",
    ),
    EnvVar("OMPI_COMM_WORLD_SIZE", None, "Open MPI's number of processes (MPIRoleMaker)."),
    EnvVar(
        "PMI_RANK",
        None,
        "MPICH / Intel MPI (PMI) rank of this process (MPIRoleMaker, when the OMPI_* "
        "variables are unset). Set and no TRAINING_ROLE / PADDLE_TRAINING_ROLE: "
        "fleet.init() uses MPIRoleMaker.",
    ),
    EnvVar("PMI_SIZE", None, "MPICH / Intel MPI (PMI) number of processes (MPIRoleMaker)."),
    EnvVar("SLURM_PROCID", None, "Slurm task rank of this process (SlurmRoleMaker)."),
    EnvVar("SLURM_NTASKS", None, "Slurm number of tasks in the job step (SlurmRoleMaker)."),
    EnvVar(
        "PSFLEET_SERVER_INDEX",
        None,
        "This server's index when its endpoint is not known in advance (fleetrun on one "
        "host binds port 0 and reports the port).",
    ),
    EnvVar(
        "PSFLEET_ENDPOINT_FILE",
        None,
        "File a server writes its bound host:port into once listening (set by fleetrun).",
    ),
    EnvVar(
        "PSFLEET_DONE_FILE",
        None,
        "File a worker writes once it passed the job's stop barrier (fleet.stop_worker: "
        "every worker's training is complete; set by fleetrun). fleetrun then restarts "
        "nothing, and a later failure of a worker other than 0 is a warning, not the "
        "job's failure.",
    ),
    EnvVar("PSFLEET_RPC_DEADLINE_S", "180", "Deadline of every remote call, seconds."),
    EnvVar(
        "PSFLEET_RPC_MAX_RETRIES",
        "5",
        "Retries of a remote call that failed with UNAVAILABLE (backoff 0.2 s doubling to 5 "
        "s), always within PSFLEET_RPC_DEADLINE_S. fleetrun --max_restarts N > 0 sets it to "
        "1000 (unless set) so that workers wait for a restarted server until the deadline; "
        "not with PSFLEET_REPLICATION > 1, where a call is failed over after 2 retries and "
        "this many calls again a server that is found alive.",
    ),
    EnvVar(
        "PSFLEET_SERVER_WAIT_TIMEOUT_S",
        "300",
        "How long a worker waits for all servers to become ready, seconds.",
    ),
    EnvVar(
        "PSFLEET_AUTH_TOKEN",
        None,
        "Shared secret every remote call to a server must carry (health checks excepted). "
        "fleetrun generates one per job when unset (children get it in their environment; "
        "LOG_DIR/.auth_token, mode 0600, while the job runs); a multi-node job needs the "
        "same value on every node. A server without one serves on a loopback address only. "
        "An mpirun job whose server list MPIRoleMaker exchanges gets one generated by rank "
        "0 when it is unset on every rank. See docs/security.md.",
    ),
    EnvVar(
        "PSFLEET_STORAGE_ROOTS",
        None,
        "Comma-separated folders or fsspec URL prefixes under which a server's Save and "
        "Load may write and read (after resolving .. and symbolic links); others are "
        "refused (PERMISSION_DENIED). Unset: the server's working folder; fleetrun sets "
        "its working folder and --log_dir when unset.",
    ),
    EnvVar(
        "PSFLEET_TLS_CERT",
        None,
        "Server: PEM certificate (chain) to serve TLS with, with PSFLEET_TLS_KEY. Set by "
        "fleetrun --tls self-signed.",
    ),
    EnvVar("PSFLEET_TLS_KEY", None, "Server: PEM private key of PSFLEET_TLS_CERT."),
    EnvVar(
        "PSFLEET_TLS_CA",
        None,
        "Client: PEM CA certificate(s) the servers' certificates are verified with; set, "
        "every channel to a server is TLS.",
    ),
    EnvVar(
        "PSFLEET_TLS_CLIENT_CERT",
        None,
        "Client: PEM certificate presented to servers (mutual TLS), with "
        "PSFLEET_TLS_CLIENT_KEY.",
    ),
    EnvVar("PSFLEET_TLS_CLIENT_KEY", None, "Client: PEM private key of PSFLEET_TLS_CLIENT_CERT."),
    EnvVar(
        "PSFLEET_TLS_CLIENT_CA",
        None,
        "Server: PEM CA certificate(s) of client certificates; set, a server refuses "
        "clients without a certificate it signed (mutual TLS).",
    ),
    EnvVar(
        "PSFLEET_TLS_SERVER_NAME",
        None,
        "Client: the name expected in the servers' certificates when it is not the host "
        "of PADDLE_PSERVERS_IP_PORT_LIST (e.g. a DNS name while the list has IPs).",
    ),
    EnvVar(
        "PSFLEET_METRICS_PORT",
        "0",
        "Port of each server's Prometheus /metrics HTTP endpoint, bound on the server's "
        "host: a port, 0 for a free one (written to the endpoint file and logged), or off "
        "(none). See docs/monitoring.md.",
    ),
    EnvVar(
        "PSFLEET_SERVER_LIMITS",
        None,
        "Raise (or lower) a server's request limits, comma-separated NAME=INTEGER of "
        "psfleet.ps.types.ServerLimits: max_dim, max_num_buckets, max_num_shards, "
        "max_worker_num, max_dense_size, max_pull_bytes, max_request_bytes, "
        "max_name_chars, max_hosts, max_shares, max_endpoint_chars, max_incarnation, "
        "max_map_entries (e.g. max_dim=8192).",
    ),
    EnvVar("RANK", None, "Collective mode (torchrun): this process's rank, 0 .. WORLD_SIZE-1."),
    EnvVar("WORLD_SIZE", None, "Collective mode (torchrun): number of ranks (world size)."),
    EnvVar("LOCAL_RANK", None, "Collective mode (torchrun): this process's rank on its node."),
    EnvVar(
        "MASTER_ADDR",
        None,
        "Collective mode: host of the rendezvous store every rank connects to (torchrun's).",
    ),
    EnvVar("MASTER_PORT", None, "Collective mode: port of the rendezvous store."),
    EnvVar(
        "TORCHELASTIC_USE_AGENT_STORE",
        None,
        "Collective mode: 'True' when the launcher (torchrun, fleetrun) hosts the rendezvous "
        "store at MASTER_ADDR:MASTER_PORT, so rank 0 connects to it instead of hosting it.",
    ),
    EnvVar(
        "TORCHELASTIC_RESTART_COUNT",
        "0",
        "Collective mode: the launcher's restart attempt; keys of a launcher-hosted store are "
        "prefixed with it, as torch does.",
    ),
    EnvVar(
        "PADDLE_TRAINER_ENDPOINTS",
        None,
        "Collective mode (seeds' name): every rank's host:port in rank order; the first is "
        "the rendezvous endpoint when MASTER_ADDR is not set.",
    ),
    EnvVar(
        "PADDLE_CURRENT_ENDPOINT",
        None,
        "Collective mode (seeds' name): this rank's host:port; must be its entry of "
        "PADDLE_TRAINER_ENDPOINTS.",
    ),
    EnvVar(
        "CUDA_VISIBLE_DEVICES",
        None,
        "GPUs a process may use; fleetrun --mode collective hands them out one per rank "
        "(--devices indexes into it).",
    ),
    EnvVar(
        "FLAGS_selected_gpus",
        None,
        "The seeds' GPUBox list of GPUs (comma separated indexes) a worker may use: pass "
        "mode's cache with pass_configs.device cuda lives on the first of them.",
    ),
    EnvVar(
        "PSFLEET_COLLECTIVE_BACKEND",
        "auto",
        "Collective mode: torch.distributed backend, gloo, nccl, or auto (nccl when this "
        "process sees a GPU, else gloo).",
    ),
    EnvVar(
        "PSFLEET_COLLECTIVE_CONNECT_TIMEOUT_S",
        "300",
        "Collective mode: how long a rank tries to reach MASTER_ADDR:MASTER_PORT and waits "
        "for every rank to join, seconds.",
    ),
    EnvVar(
        "PSFLEET_COLLECTIVE_TIMEOUT_S",
        "1800",
        "Collective mode: how long one collective operation (all-reduce, all-gather, barrier) "
        "may wait for the other ranks, seconds.",
    ),
    EnvVar(
        "PSFLEET_LOG_LEVEL",
        "INFO",
        "Logging level of psfleet's loggers: what each process of a job writes to its log "
        "file, and fleetrun's own messages. The console of psfleet train shows WARNING and "
        "up (-q: ERROR, -v: INFO or this level when lower).",
    ),
    EnvVar(
        "PSFLEET_RESTART_NUM",
        "0",
        "How many times fleetrun --max_restarts restarted this process (set by fleetrun). "
        "A restarted server re-creates its tables from the newest complete checkpoint; a "
        "restarted worker rejoins the running job from its cursor in that checkpoint.",
    ),
    EnvVar(
        "PSFLEET_LAUNCHER_PID",
        None,
        "Pid of the fleetrun process that started this one (set by fleetrun). The process "
        "exits, logging 'launcher <pid> died; exiting', when that launcher dies, also on "
        "SIGKILL (psfleet.launcher_guard).",
    ),
    EnvVar(
        "PSFLEET_HEALTH_TIMEOUT_S",
        "30",
        "fleetrun: a server of the job that answered its gRPC health check once and then "
        "answers none for this many seconds (or any child stopped, e.g. by SIGSTOP, this "
        "long) is treated as dead: SIGKILLed, then restarted per --max_restarts and "
        "--restart_policy, or the job fails naming it; in a replicated job a server is "
        "not killed while another server is down (it may hold a share's last copy). A "
        "number of seconds, > 0 and <= 3600 (a starved host may answer nothing for "
        "minutes), or off: no hang detection.",
    ),
    EnvVar(
        "PSFLEET_REPLICATION",
        "1",
        "Servers holding each share of the tables (YAML cluster.replication, fleetrun "
        "--replication). 2: every write is applied on two servers before it is "
        "acknowledged; when one dies the other serves its share and training goes on, "
        "and a restarted server rejoins or live servers take new copies of its shares "
        "(docs/fault-tolerance.md). At most the server count.",
    ),
    EnvVar(
        "PSFLEET_COPY_CHUNK_BYTES",
        "67108864",
        "A replicated job's share copy (a restarted server being filled, a refill, a drain; "
        "docs/fault-tolerance.md) travels in messages of at most this many bytes of file "
        "data (default 64 MiB), so a share of any size is copied within the gRPC message "
        "limit. An integer >= 1024, below 1 GiB.",
    ),
    EnvVar(
        "PSFLEET_SHARES",
        None,
        "Shares the tables are cut into (YAML cluster.shares, fleetrun --shares); unset: "
        "one per server. More shares than servers, with PSFLEET_REPLICATION >= 2, let a "
        "server added to the running job (psfleet grow) take its part of them: a job of "
        "2 servers with 6 shares gives a third server 2 shares to serve "
        "(docs/fault-tolerance.md, grow). Each share is one more call per step and table.",
    ),
    EnvVar(
        "PSFLEET_REFILL_DELAY_S",
        "10",
        "In a replicated job, how long after a server is declared dead the shares it held "
        "wait, with one copy fewer, for a restarted server to rejoin before a live server "
        "takes a new copy of each (docs/fault-tolerance.md, refill), seconds. An integer "
        ">= 0.",
    ),
    EnvVar(
        "PSFLEET_CHECKPOINT_DIR",
        None,
        "Checkpoint folder (path or fsspec URL) a restarted server recovers its tables from "
        "when the script does not pass checkpoint_dir to fleet.init_server(); fleetrun "
        "names it in the line of a gang restart.",
    ),
    EnvVar(
        "PSFLEET_SIMULATE_STALENESS",
        None,
        "Single-process training (cluster.server_num 0) only: apply every push STEPS "
        "steps late (STEPS, or STEPS:dense / STEPS:sparse for those pushes only), so one "
        "process measures what that much async staleness costs the model, "
        "deterministically (docs/modes.md). Unset or 0: off.",
    ),
    EnvVar(
        "PSFLEET_TABLE_BACKEND",
        "native",
        "Kernels of the sparse tables (psfleet/ps/table): native (the C++ core built at "
        "install, GIL released, shards in parallel) or numpy (the bit-exact reference). "
        "Read when a table is created.",
    ),
    EnvVar(
        "PSFLEET_TABLE_THREADS",
        "0",
        "Native backend: threads one table call spreads its internal shards over (the "
        "calling thread included). 0: min(CPU cores, shards).",
    ),
)

_BY_NAME = {v.name: v for v in VARIABLES}


def read(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Return the value of the declared variable ``name`` (or its default).

    Args:
        name: a name declared in :data:`VARIABLES`.
        environ: the environment to read; ``os.environ`` when None.

    Raises:
        KeyError: ``name`` is not declared here (a programming error).
    """
    var = _BY_NAME[name]
    env = os.environ if environ is None else environ
    value = env.get(name)
    if value is None or value == "":
        return var.default
    return value


def int_var(environ: Mapping[str, str] | None, name: str, minimum: int,
            maximum: int | None = None) -> int | None:
    """The integer in the declared variable ``name`` (None when unset).

    Raises:
        ConfigError: the value is not an integer or is outside ``minimum .. maximum``
            (names the variable and the value).
    """
    raw = read(name, environ)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}: {raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}: {value} must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name}: {value} must be <= {maximum}")
    return value


def list_var(environ: Mapping[str, str] | None, name: str) -> tuple[str, ...] | None:
    """The comma list in the declared variable ``name`` (blank entries dropped; None
    when unset)."""
    raw = read(name, environ)
    if raw is None:
        return None
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def markdown_table() -> str:
    """Render :data:`VARIABLES` as a Markdown table (for README.md)."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for v in VARIABLES:
        default = "" if v.default is None else f"`{v.default}`"
        rows.append(f"| `{v.name}` | {default} | {v.meaning} |")
    return "\n".join(rows)
