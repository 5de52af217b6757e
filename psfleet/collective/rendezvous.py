"""Read where and as whom this rank joins the process group from the environment.

Two sets of variables say it (all declared in :mod:`psfleet.env`):

- torchrun's: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``
  (and ``TORCHELASTIC_USE_AGENT_STORE`` / ``TORCHELASTIC_RESTART_COUNT`` when the
  launcher hosts the store, as torchrun and ``fleetrun --mode collective`` do);
- the seeds' (PaddlePaddle's collective mode): ``PADDLE_TRAINER_ID``,
  ``PADDLE_TRAINERS_NUM``, ``PADDLE_TRAINER_ENDPOINTS`` (every rank's ``host:port``;
  the first is the rendezvous endpoint) with ``PADDLE_CURRENT_ENDPOINT``, or
  ``PADDLE_TRAINER_IPS`` (every rank's IP) with ``PADDLE_PSERVER_PORT`` (the seeds'
  NCCL2 name: "used at the initial stage to broadcast the NCCL ID") or ``PADDLE_PORT``
  (the first IP's port; when both are set they must be equal) and ``PADDLE_CURRENT_IP``.

Either set alone is enough; when both are given they must agree (a rank or world
size given twice with two values is an error naming both). The rendezvous endpoint
is, first found: ``MASTER_ADDR:MASTER_PORT``; the first entry of
``PADDLE_TRAINER_ENDPOINTS``; the first ``PADDLE_TRAINER_IPS`` entry with the port of
``PADDLE_PSERVER_PORT`` / ``PADDLE_PORT``. With no variable at all the process is rank
0 of a world of 1 (no store needed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from psfleet import env
from psfleet.collective.types import RendezvousSpec
from psfleet.errors import ConfigError
from psfleet.rpc import parse_endpoint

__all__ = ["rendezvous_from_env"]


def _list(environ: Mapping[str, str], name: str) -> tuple[str, ...] | None:
    items = env.list_var(environ, name)
    if items == ():
        raise ConfigError(f"{name}: {env.read(name, environ)!r} lists nothing; list one "
                          "entry per rank")
    return items


def _agree(values: list[tuple[str, int]], what: str) -> int | None:
    """The one value several variables give for ``what``; ConfigError naming both if not."""
    for name, value in values[1:]:
        if value != values[0][1]:
            raise ConfigError(f"{what} mismatch: {values[0][0]} is {values[0][1]} but {name} "
                              f"is {value}; set only one of them, or make them agree")
    return values[0][1] if values else None


def _pair(environ: Mapping[str, str], first: str, second: str) -> bool:
    has_first = env.read(first, environ) is not None
    has_second = env.read(second, environ) is not None
    if has_first != has_second:
        present, missing = (first, second) if has_first else (second, first)
        raise ConfigError(f"{present} is set but {missing} is not: set both (torchrun sets "
                          "both), or neither")
    return has_first


def _host(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def rendezvous_from_env(environ: Mapping[str, str] | None = None) -> RendezvousSpec:
    """This rank's :class:`RendezvousSpec` from the environment (see the module doc).

    Args:
        environ: the environment to read; ``os.environ`` when None.

    Raises:
        ConfigError: a variable is malformed; RANK without WORLD_SIZE (or MASTER_ADDR
            without MASTER_PORT); two variables give different ranks or world sizes
            (names both and their values); the rank is not below the world size; more
            than one rank and no rendezvous endpoint; PADDLE_CURRENT_ENDPOINT is not
            this rank's entry of PADDLE_TRAINER_ENDPOINTS; PADDLE_PSERVER_PORT and
            PADDLE_PORT name different rendezvous ports (names both).
    """
    e = dict(os.environ if environ is None else environ)
    ranks: list[tuple[str, int]] = []
    sizes: list[tuple[str, int]] = []
    if _pair(e, "RANK", "WORLD_SIZE"):
        ranks.append(("RANK", env.int_var(e, "RANK", 0) or 0))
        sizes.append(("WORLD_SIZE", env.int_var(e, "WORLD_SIZE", 1) or 1))
    if (trainer_id := env.int_var(e, "PADDLE_TRAINER_ID", 0)) is not None:
        ranks.append(("PADDLE_TRAINER_ID", trainer_id))
    if (trainers := env.int_var(e, "PADDLE_TRAINERS_NUM", 1)) is not None:
        sizes.append(("PADDLE_TRAINERS_NUM", trainers))
    endpoints = _list(e, "PADDLE_TRAINER_ENDPOINTS")
    if endpoints is not None:
        for endpoint in endpoints:
            parse_endpoint(endpoint, "PADDLE_TRAINER_ENDPOINTS")
        sizes.append(("PADDLE_TRAINER_ENDPOINTS (entries)", len(endpoints)))
    ips = _list(e, "PADDLE_TRAINER_IPS")
    if ips is not None:
        sizes.append(("PADDLE_TRAINER_IPS (entries)", len(ips)))
    world_size = _agree(sizes, "world size") or 1
    rank = _agree(ranks, "rank")
    if rank is None:
        if world_size > 1:
            raise ConfigError(f"{sizes[0][0]} is {world_size} but no rank is set: set RANK "
                              "(or PADDLE_TRAINER_ID) to this process's rank")
        rank = 0
    if rank >= world_size:
        raise ConfigError(f"{(ranks or [('rank', rank)])[0][0]}: {rank} must be < the world "
                          f"size {world_size} ({sizes[0][0]}); ranks are 0..{world_size - 1}")
    _check_current(e, rank, endpoints, ips)
    master = _master(e, endpoints, ips)
    if master is None and world_size > 1:
        raise ConfigError(f"world size {world_size} but no rendezvous endpoint: set "
                          "MASTER_ADDR and MASTER_PORT (or PADDLE_TRAINER_ENDPOINTS), or "
                          "start the job with fleetrun --mode collective or torchrun")
    local_rank = env.int_var(e, "LOCAL_RANK", 0)
    agent_store = (env.read("TORCHELASTIC_USE_AGENT_STORE", e) or "").strip().lower() == "true"
    source = " / ".join(name for name, _ in (ranks or sizes)) or "defaults"
    return RendezvousSpec(
        rank=rank, world_size=world_size, local_rank=local_rank if local_rank is not None else 0,
        master_addr=master[0] if master else None, master_port=master[1] if master else 0,
        agent_store=agent_store and master is not None,
        restart_count=env.int_var(e, "TORCHELASTIC_RESTART_COUNT", 0) or 0, source=source)


def _check_current(environ: Mapping[str, str], rank: int, endpoints: tuple[str, ...] | None,
                   ips: tuple[str, ...] | None) -> None:
    current = env.read("PADDLE_CURRENT_ENDPOINT", environ)
    if current is not None and endpoints is not None and current.strip() != endpoints[rank]:
        raise ConfigError(f"PADDLE_CURRENT_ENDPOINT is {current!r} but entry {rank} (this "
                          f"rank) of PADDLE_TRAINER_ENDPOINTS is {endpoints[rank]!r}: make "
                          "them agree")
    ip = env.read("PADDLE_CURRENT_IP", environ)
    if ip is not None and ips is not None and ip.strip() != ips[rank]:
        raise ConfigError(f"PADDLE_CURRENT_IP is {ip!r} but entry {rank} (this rank) of "
                          f"PADDLE_TRAINER_IPS is {ips[rank]!r}: make them agree")


def _master(environ: Mapping[str, str], endpoints: tuple[str, ...] | None,
            ips: tuple[str, ...] | None) -> tuple[str, int] | None:
    """The rendezvous (host, port): MASTER_ADDR:MASTER_PORT, else the seeds' first rank."""
    if _pair(environ, "MASTER_ADDR", "MASTER_PORT"):
        host = (env.read("MASTER_ADDR", environ) or "").strip()
        port = env.int_var(environ, "MASTER_PORT", 1)
        if port is None or port > 65535:
            raise ConfigError(f"MASTER_PORT: {port} is not a port (1..65535)")
        return _host(host), port
    if endpoints is not None:
        host, port = parse_endpoint(endpoints[0], "PADDLE_TRAINER_ENDPOINTS")
        if port == 0:
            raise ConfigError(f"PADDLE_TRAINER_ENDPOINTS: {endpoints[0]!r} (rank 0, the "
                              "rendezvous endpoint) has port 0; give it a fixed port")
        return _host(host), port
    if ips is not None:
        port = _rendezvous_port(environ)
        if port is not None:
            return _host(ips[0]), port
    return None


#: Variables naming the rendezvous port that goes with PADDLE_TRAINER_IPS: the seeds'
#: NCCL2 name first, then the one fleetrun and earlier psfleet used.
_PORT_VARS = ("PADDLE_PSERVER_PORT", "PADDLE_PORT")


def _rendezvous_port(environ: Mapping[str, str]) -> int | None:
    """The port of the first PADDLE_TRAINER_IPS entry (None when neither variable is set).

    Raises:
        ConfigError: a value is not one port in 1..65535 (a comma list of ports is the
            parameter-server meaning of PADDLE_PSERVER_PORT), or both variables are set
            to different ports (names both).
    """
    ports: list[tuple[str, int]] = []
    for name in _PORT_VARS:
        raw = env.read(name, environ)
        if raw is None:
            continue
        if "," in raw:
            raise ConfigError(f"{name}: {raw!r} lists several ports; in collective mode it "
                              "is the one rendezvous port of the first PADDLE_TRAINER_IPS entry")
        if (port := env.int_var(environ, name, 1, 65535)) is not None:
            ports.append((name, port))
    return _agree(ports, "rendezvous port")
