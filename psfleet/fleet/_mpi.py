"""The server list of an ``mpirun`` job, exchanged over MPI (private to role_maker).

When no server list is set, every rank takes part in one ``allgather`` over
``MPI.COMM_WORLD`` (mpi4py): a server rank offers the ``host:port`` it will bind, a
worker offers no endpoint; afterwards every rank holds the list in server-rank order.
Paddle's MPIRoleMaker gathered its hosts the same way (``comm.allgather(local_ip)``,
``python/paddle/fluid/incubate/fleet/base/role_maker.py``). The exchange also carries:

- each rank's view of the job (rank, size, server count), so that ranks that see
  different variables, or an mpi4py loading another MPI library than the one whose
  ``mpirun`` started the job (every rank then sees a world of one), fail with one
  message instead of waiting for each other;
- whatever stopped a rank from making its offer (a malformed ``PADDLE_PORT``, say):
  that rank still takes part, so every rank raises the same ConfigError naming it;
- the job's auth token: rank 0 generates one when ``PSFLEET_AUTH_TOKEN`` is unset,
  as fleetrun does for a local job, because a server refuses to serve a non-loopback
  address without one (``psfleet.rpc.access.check_bind``).

MPI's life in the process: psfleet initializes MPI for the exchange and finalizes it
right after (when mpi4py's ``MPI`` module was not loaded before; else the script owns
MPI and its ``MPI_Finalize`` at exit). Leaving MPI initialized until exit would make
an ``mpirun`` job hang or fail: a rank that raises runs ``MPI_Finalize`` at exit,
which waits for every other rank to finalize too, while the servers wait for that
rank's ``stop_worker``; and a process that leaves with ``os._exit`` without
finalizing is reported by ``mpirun`` as failed even with exit code 0. Finalized,
each rank is an ordinary process to ``mpirun``: it exits when it is done, a non-zero
exit stops the job, and it may fork and start threads (gRPC) freely. The price: a
script cannot use mpi4py after ``fleet.init()`` unless it imported ``mpi4py.MPI``
before it; such a script owns MPI, and should run as ``python -m mpi4py script.py``
(mpi4py then aborts the job on an uncaught exception) so that a failing rank cannot
hang it. Measured here (Open MPI 4.1.4 and 5.0.11): a rank that raised while another
waited hung the job until it was killed when MPI was left to the exit; finalized after
the exchange, ``mpirun`` ended the job about a second after the failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import secrets
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from psfleet import env
from psfleet.env import int_var
from psfleet.errors import ConfigError

__all__ = ["Allgather", "Offer", "default_allgather", "exchange", "free_port", "mpi4py_allgather",
           "node_address"]

#: ``allgather(value)``: every rank's value, in rank order (``MPI.COMM_WORLD.allgather``).
Allgather = Callable[[Any], Sequence[Any]]

# A documentation address (TEST-NET-2, RFC 5737): connecting a UDP socket to it sends
# nothing; it only makes the kernel pick the route, and so the source address.
_ROUTE_PROBE = ("198.51.100.1", 9)
_INSTALL_HINT = (
    "pip install 'psfleet[mpi]' (mpi4py; its wheel uses the MPI library of the mpirun "
    "that starts the job, e.g. Debian's openmpi-bin), or set PADDLE_PSERVERS_IP_PORT_LIST "
    "to every server's host:port in server-rank order")


@dataclass(frozen=True)
class Offer:
    """What one rank contributes to the exchange.

    Attributes:
        rank: the rank its launcher variables give (``OMPI_COMM_WORLD_RANK``).
        size: the job size they give.
        server_num: how many ranks this rank thinks serve.
        endpoint: a server's ``host:port``; None for a worker.
        auth_token: rank 0's generated token (None elsewhere, or when
            ``PSFLEET_AUTH_TOKEN`` is set there). Never shown in the repr.
        has_env_token: whether ``PSFLEET_AUTH_TOKEN`` is set on this rank.
        problem: why this rank could not make its offer, or None.
    """

    rank: int
    size: int
    server_num: int
    endpoint: str | None = None
    auth_token: str | None = field(default=None, repr=False)
    has_env_token: bool = False
    problem: str | None = None


def node_address() -> str:
    """This node's IPv4 address that other nodes reach, as text.

    The source address of the route to outside this node (no packet is sent; Ray's
    ``get_node_ip_address`` does the same), else a non-loopback address the host name
    resolves to, else ``127.0.0.1`` (a node with loopback only: a one-node job).
    A loopback address is never taken while another exists (Debian maps the host name
    to 127.0.1.1). Set ``POD_IP`` where the route's interface is the wrong one.
    """
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(_ROUTE_PROBE)
        address = str(s.getsockname()[0])
        if not ipaddress.ip_address(address).is_loopback and address != "0.0.0.0":
            return address
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            address = str(info[4][0])
            if not ipaddress.ip_address(address).is_loopback:
                return address
    return "127.0.0.1"


def free_port(host: str) -> int:
    """A port the OS reports free on ``host`` now: bound to 0, read, closed.

    A tiny race window remains (another process may take the port before the server
    binds it), as for torchrun's free ``MASTER_PORT``; the server's bind then fails
    naming the port, and the job fails.

    Raises:
        ConfigError: ``host`` cannot be bound here (not an address of this node).
    """
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.bind(address)
            return int(s.getsockname()[1])
    except OSError as e:
        raise ConfigError(f"cannot bind {host!r} to find a free port ({e.strerror or e}): "
                          "set POD_IP to an address of this node") from None


def _endpoint(environ: Mapping[str, str]) -> str:
    """A server's ``host:port``: POD_IP / PADDLE_CURRENT_IP (else :func:`node_address`)
    and PADDLE_PORT (else, or when 0, :func:`free_port`)."""
    named = {name: ip for name in ("POD_IP", "PADDLE_CURRENT_IP")
             if (ip := env.read(name, environ)) is not None}
    if len(set(named.values())) > 1:
        raise ConfigError(f"POD_IP is {named['POD_IP']!r} but PADDLE_CURRENT_IP is "
                          f"{named['PADDLE_CURRENT_IP']!r}: set only one, or make them agree")
    host = next(iter(named.values()), None) or node_address()
    port = int_var(environ, "PADDLE_PORT", 0, 65535) or free_port(host)
    return f"{host}:{port}"


def _offer(rank: int, size: int, server_num: int, environ: Mapping[str, str],
           problem: str | None) -> Offer:
    has_env_token = env.read("PSFLEET_AUTH_TOKEN", environ) is not None
    token = secrets.token_urlsafe(32) if rank == 0 and not has_env_token else None
    endpoint = None
    if problem is None and rank < server_num:
        try:
            endpoint = _endpoint(environ)
        except ConfigError as e:
            problem = str(e)
    return Offer(rank, size, server_num, endpoint, token, has_env_token, problem)


def exchange(rank: int, size: int, server_num: int, environ: Mapping[str, str],
             allgather: Allgather, problem: str | None = None
             ) -> tuple[tuple[str, ...], str | None]:
    """Every server's endpoint, in server-rank order, and the job's generated token.

    Collective: blocks until every rank of the job has called it (one allgather).
    Every rank must call it, also one that found a ``problem`` in its own variables
    (it then offers the problem, and every rank raises it).

    Args:
        rank, size: this rank and the job size, from the launcher's variables.
        server_num: ranks ``0 .. server_num-1`` serve.
        environ: this rank's environment (POD_IP, PADDLE_PORT, PSFLEET_AUTH_TOKEN).
        allgather: the collective (:func:`default_allgather`; tests pass a fake).
        problem: why this rank cannot take its part (a ConfigError's message).

    Returns:
        ``(endpoints, auth_token)``: the token rank 0 generated, None when
        ``PSFLEET_AUTH_TOKEN`` is set.

    Raises:
        ConfigError: on every rank alike: the collective's world is not the launcher's
            (mpi4py built for another MPI), the ranks disagree on the server count or
            on whether PSFLEET_AUTH_TOKEN is set, a rank had a problem (names the rank
            and the problem), or two servers offered the same endpoint.
    """
    offers = list(allgather(_offer(rank, size, server_num, environ, problem)))
    if len(offers) != size or any(not isinstance(o, Offer) or o.rank != i
                                  for i, o in enumerate(offers)):
        ranks = [o.rank if isinstance(o, Offer) else o for o in offers]
        raise ConfigError(
            f"MPI's COMM_WORLD has {len(offers)} ranks (whose launcher ranks are {ranks}) "
            f"but the launcher started {size}: mpi4py loads another MPI library than the "
            "one whose mpirun started the job; use the mpirun of the MPI mpi4py loads "
            "(python -c 'from mpi4py import MPI; print(MPI.Get_library_version())'), or set "
            "PADDLE_PSERVERS_IP_PORT_LIST to every server's host:port")
    problems = [f"rank {o.rank}: {o.problem}" for o in offers if o.problem]
    if problems:
        raise ConfigError("the MPI ranks could not agree on the servers: " + "; ".join(problems))
    counts = sorted({o.server_num for o in offers})
    if len(counts) > 1:
        by_count = "; ".join(f"{[o.rank for o in offers if o.server_num == n]} say {n}"
                             for n in counts)
        raise ConfigError(f"the MPI ranks disagree on the server count (ranks {by_count}): "
                          "give every rank the same PSFLEET_SERVER_NUM "
                          "(mpirun -x PSFLEET_SERVER_NUM)")
    with_token = [o.rank for o in offers if o.has_env_token]
    if 0 < len(with_token) < len(offers):
        raise ConfigError(f"PSFLEET_AUTH_TOKEN is set on ranks {with_token} only: pass it to "
                          "every rank (mpirun -x PSFLEET_AUTH_TOKEN), or to none (psfleet then "
                          "shares a generated one)")
    endpoints = tuple(str(o.endpoint) for o in offers[:server_num])
    for i, endpoint in enumerate(endpoints):
        if endpoint in endpoints[:i]:
            first = endpoints.index(endpoint)
            raise ConfigError(
                f"servers {first} and {i} (ranks {first} and {i}) both offer {endpoint}: "
                "PADDLE_PORT is the same for every rank of a node; unset it (each server "
                "takes a free port) or give each server rank its own")
    return endpoints, offers[0].auth_token


def default_allgather() -> Allgather:
    """:func:`mpi4py_allgather`, when mpi4py is installed (not imported here).

    Raises:
        ConfigError: mpi4py is not installed (names both fixes).
    """
    if importlib.util.find_spec("mpi4py") is None:
        raise ConfigError("MPIRoleMaker: no server list is set and mpi4py, which would "
                          f"exchange one, is not installed: {_INSTALL_HINT}")
    return mpi4py_allgather


def mpi4py_allgather(value: Any) -> list[Any]:
    """``MPI.COMM_WORLD.allgather(value)``, initializing and finalizing MPI around it
    when this is the process's first use of mpi4py (module doc). Blocks until every
    rank calls it.

    Raises:
        ConfigError: mpi4py cannot load an MPI library, or MPI was finalized already.
    """
    first = "mpi4py.MPI" not in sys.modules
    import mpi4py

    if first:  # psfleet initializes and finalizes MPI itself, around the one call
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
    try:
        from mpi4py import MPI
    except (ImportError, OSError, RuntimeError) as e:
        raise ConfigError(f"mpi4py cannot load an MPI library ({e}): install the MPI of "
                          "your mpirun (Debian: apt-get install openmpi-bin)") from None
    if MPI.Is_finalized():
        raise ConfigError("MPIRoleMaker: MPI was finalized already in this process; the "
                          "server list is exchanged over MPI at fleet.init(): call it first")
    owned = first and not MPI.Is_initialized()
    if not MPI.Is_initialized():
        MPI.Init()
    try:
        return list(MPI.COMM_WORLD.allgather(value))
    finally:
        if owned:
            MPI.Finalize()
