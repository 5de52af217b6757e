"""A server's shares behind one endpoint: its own, and the copies it keeps of others'.

:class:`ReplicaHost` is what a server process serves over gRPC. With replication 1
(or before a worker said otherwise) it holds only its own share, a
:class:`~psfleet.ps.service.TableService`, and passes every call to it. With
replication R > 1 (``SetReplicas``, sent by every worker when it connects) it also
holds a copy of each share ``psfleet.replication.hosts_of`` puts on it, and:

- **writes are forwarded before they are acknowledged.** A write to a share this host
  is primary of goes to every backup before the worker is answered. Pushes that apply
  at once (APPLY, DELTA, ROW_DELTA) and admin writes (CreateTable, Load, Shrink,
  AgeOneDay) are applied here and forwarded under the share's order lock, so every
  copy applies them in the same order and holds the same bytes. Sync-mode pushes and
  barrier arrivals are forwarded *first*: a worker is told a round is applied (or a
  barrier crossed) only once every copy holds its contribution, so after a fail-over
  the new primary completes what the old one started. A retried push is applied once
  on every copy (push ids, ``psfleet.ps.push_ledger``).
- **reads go to the primary only** (pulls, Save, Stats).
- **fail-over.** A host that cannot reach a backup, or a worker that cannot reach a
  primary (``Failover``), makes the host that handles the report decide: it probes the
  host's health, and if it does not answer, adds it to the dead set and sends the set
  to every live host (``MarkDead``) before answering. A backup that becomes primary
  starts serving its share at once (its waits, sync rounds and barriers, enabled).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from psfleet.errors import InvalidRequestError, RemoteError, RpcError
from psfleet.ps.service import TableService
from psfleet.ps.wait_budget import WaitBudget
from psfleet.replication import hosts_of
from psfleet.rpc import RpcClient, RpcConfig, call_share
from psfleet.rpc import messages as msg

__all__ = ["ReplicaHost"]

logger = logging.getLogger(__name__)


class ReplicaHost:
    """Every share one server holds, behind its endpoint. Thread safe.

    One method per rpc of ``psfleet.proto``. A call is for the share its
    ``psfleet-share`` metadata names (``psfleet.rpc.call_share``), else for the host's
    own.

    Args:
        own: this server's own share (its tables when nothing is replicated).
        config: how this host calls the others (token, TLS, deadline, retries).
        probe_timeout_s: how long a host reported dead gets to answer a health check
            before it is declared dead, seconds.
    """

    def __init__(self, own: TableService, config: RpcConfig,
                 probe_timeout_s: float = 2.0) -> None:
        self.own = own
        self.stop_requested = own.stop_requested
        self._config = config
        self._probe_timeout_s = probe_timeout_s
        self._wait_slots = own.wait_budget.slots
        self._lock = threading.Lock()  # the layout, the dead set and the peers
        self._decide = threading.Lock()  # one fail-over decision at a time
        self._index: int | None = None
        self._endpoints: list[str] = []
        self._replication = 1
        self._dead: set[int] = set()
        self._shares: dict[int, TableService] = {}
        self._order: dict[int, threading.Lock] = {}
        self._peers: dict[tuple[int, int | None], RpcClient] = {}

    # -- layout and fail-over ------------------------------------------------------------
    def SetReplicas(self, request: msg.ReplicasRequest) -> msg.DeadHosts:  # noqa: N802
        """Take the job's layout (the first call) or check it (later ones), and merge
        the caller's dead hosts. Returns every host this host knows dead.

        Raises:
            InvalidRequestError: a replication outside ``[1, hosts]``, a host index
                outside the list, or a layout other than the one set first.
        """
        endpoints, index, replication = list(request.endpoints), request.host_index, \
            request.replication
        if not 1 <= replication <= len(endpoints) or index >= len(endpoints):
            raise InvalidRequestError(
                f"SetReplicas: replication {replication} with {len(endpoints)} hosts and "
                f"host index {index}; replication must be in [1, hosts] (PSFLEET_REPLICATION)")
        with self._lock:
            if self._index is None:
                self._index, self._endpoints, self._replication = index, endpoints, replication
                for share in range(len(endpoints)):
                    if share == index:
                        self._shares[share] = self.own
                    elif index in hosts_of(share, len(endpoints), replication):
                        self._shares[share] = self._copy_service()
                    else:
                        continue
                    self._order[share] = threading.Lock()
                logger.info("host %d of %d, replication %d: holds shares %s", index,
                            len(endpoints), replication, sorted(self._shares))
            elif (self._index, self._endpoints, self._replication) != (index, endpoints,
                                                                        replication):
                raise InvalidRequestError(
                    f"SetReplicas: host {index} of {endpoints} with replication "
                    f"{replication}, but this server is host {self._index} of "
                    f"{self._endpoints} with replication {self._replication}; every worker "
                    "must have the same PADDLE_PSERVERS_IP_PORT_LIST and PSFLEET_REPLICATION")
            self._merge_dead(request.dead)
            return msg.DeadHosts(hosts=sorted(self._dead))

    def Failover(self, request: msg.FailoverRequest) -> msg.DeadHosts:  # noqa: N802
        """Declare ``request.host`` dead if it does not answer a health check, and tell
        every live host; returns the dead hosts (without it when it answered)."""
        with self._lock:
            self._merge_dead(request.dead)
        return msg.DeadHosts(hosts=sorted(self.declare_dead(request.host)))

    def MarkDead(self, request: msg.DeadHosts) -> msg.Empty:  # noqa: N802
        """Merge another host's decision (a union: the dead set only grows)."""
        with self._lock:
            self._merge_dead(request.hosts)
        return msg.Empty()

    def declare_dead(self, host: int) -> set[int]:
        """Decide whether ``host`` is dead: when it answers no health check within
        ``probe_timeout_s``, add it to the dead set and send the set to every live
        host (one that does not answer is left to its own callers). Returns the dead
        set (a copy)."""
        with self._decide:
            with self._lock:
                if host in self._dead or self._index is None or host == self._index:
                    return set(self._dead)
            if self._peer(host, None).is_serving(timeout_s=self._probe_timeout_s):
                logger.warning("host %d was reported unreachable but answers its health "
                               "check; not failing it over", host)
                with self._lock:
                    return set(self._dead)
            with self._lock:
                self._merge_dead([host])
                dead = set(self._dead)
                others = [h for h in range(len(self._endpoints))
                          if h not in dead and h != self._index]
            for other in others:
                try:
                    self._peer(other, None).call("MarkDead", msg.DeadHosts(hosts=sorted(dead)))
                except Exception as exc:  # noqa: BLE001 - its callers will report it
                    logger.warning("could not tell host %d that host %d is dead: %s",
                                   other, host, exc)
            return dead

    def _merge_dead(self, hosts: Iterable[int]) -> None:
        """Add ``hosts`` to the dead set and promote the copies this host now serves
        (the caller holds ``_lock``)."""
        new = set(hosts) - self._dead
        if not new or self._index is None:
            self._dead |= new
            return
        self._dead |= new
        num = len(self._endpoints)
        for share, service in self._shares.items():
            live = hosts_of(share, num, self._replication, self._dead)
            if live and live[0] == self._index and service.wait_budget.slots == 0:
                service.wait_budget.slots = self._wait_slots
                logger.warning("hosts %s dead: this host (%d) now serves share %d", sorted(new),
                               self._index, share)
        lost = [s for s in range(num) if not hosts_of(s, num, self._replication, self._dead)]
        logger.warning("dead hosts %s (replication %d)%s", sorted(self._dead),
                       self._replication, f"; shares {lost} have no copy left" if lost else "")

    def _copy_service(self) -> TableService:
        """An empty service for a copy of another share: it never waits (forwarded sync
        pushes and barrier arrivals answer at once) until it becomes primary."""
        own = self.own
        return TableService(own.barrier_timeout_s, own.preload_dir, own.limits,
                            wait_budget=WaitBudget(0, own.wait_budget.max_wait_s))

    def _peer(self, host: int, share: int | None) -> RpcClient:
        """A connection to ``host`` for calls about ``share`` (None: the host's own)."""
        key = (host, None if share == host else share)
        with self._lock:
            client = self._peers.get(key)
            if client is None:
                client = self._peers[key] = RpcClient(self._endpoints[host], self._config,
                                                      key[1])
            return client

    # -- dispatch ------------------------------------------------------------------------
    def _target(self) -> tuple[int | None, TableService]:
        """The share a call is for and its service."""
        share = call_share()
        if share is None or share == self._index:
            return self._index, self.own
        service = self._shares.get(share)
        if service is None:
            raise RemoteError(f"this server (host {self._index}) holds no copy of share "
                              f"{share}; the caller's map is wrong (PSFLEET_REPLICATION and "
                              "the server list must be the same on every process)")
        return share, service

    def _backups(self, share: int | None) -> list[int]:
        """The hosts a write to ``share`` is forwarded to: its backups when this host is
        its primary, else none."""
        if share is None:
            return []
        with self._lock:
            live = hosts_of(share, len(self._endpoints), self._replication, self._dead)
        return live[1:] if live and live[0] == self._index else []

    def _write(self, name: str, request: Any, forward_first: bool = False) -> Any:
        """Run write ``name`` on its share and forward it to the share's backups:
        after applying it, under the share's order lock; or ``forward_first``, before
        it (calls that wait for other workers: sync pushes, barrier arrivals)."""
        share, service = self._target()
        backups = self._backups(share)
        method = getattr(service, name)
        if not backups:
            return method(request)
        assert share is not None
        if forward_first:
            self._forward(share, backups, name, request)
            return method(request)
        with self._order[share]:
            reply = method(request)
            self._forward(share, backups, name, request)
        return reply

    def _forward(self, share: int, backups: list[int], name: str, request: Any) -> None:
        """Send write ``name`` to each backup of ``share``; a backup that cannot be
        reached is declared dead (then skipped) or, when it answers health checks, the
        write fails with its error."""
        for host in backups:
            try:
                self._peer(host, share).call(name, request)
            except RpcError as exc:
                if host not in self.declare_dead(host):
                    raise RemoteError(f"{name} of share {share}: its backup, host {host}, "
                                      f"failed: {exc}") from None
                logger.warning("%s of share %d: backup host %d is dead; share %d goes on "
                               "with fewer copies", name, share, host, share)

    def _read(self, name: str, request: Any) -> Any:
        return getattr(self._target()[1], name)(request)

    # -- the rpcs of psfleet.proto ----------------------------------------------------
    def CreateTable(self, request: msg.CreateTableRequest) -> Any:  # noqa: N802
        return self._write("CreateTable", request)

    def PullSparse(self, request: msg.PullSparseRequest) -> Any:  # noqa: N802
        return self._read("PullSparse", request)

    def PushSparse(self, request: msg.PushSparseRequest) -> Any:  # noqa: N802
        if request.poll:
            return self._read("PushSparse", request)
        return self._write("PushSparse", request, forward_first=request.mode == msg.SYNC)

    def PullDense(self, request: msg.PullDenseRequest) -> Any:  # noqa: N802
        return self._read("PullDense", request)

    def PushDense(self, request: msg.PushDenseRequest) -> Any:  # noqa: N802
        if request.poll:
            return self._read("PushDense", request)
        return self._write("PushDense", request, forward_first=request.mode == msg.SYNC)

    def Barrier(self, request: msg.BarrierRequest) -> Any:  # noqa: N802
        return self._write("Barrier", request, forward_first=True)

    def Save(self, request: msg.SaveRequest) -> Any:  # noqa: N802
        return self._read("Save", request)

    def Load(self, request: msg.LoadRequest) -> Any:  # noqa: N802
        return self._write("Load", request)

    def Stats(self, request: msg.StatsRequest) -> Any:  # noqa: N802
        return self._read("Stats", request)

    def Shrink(self, request: msg.ShrinkRequest) -> Any:  # noqa: N802
        return self._write("Shrink", request)

    def AgeOneDay(self, request: msg.AgeOneDayRequest) -> Any:  # noqa: N802
        return self._write("AgeOneDay", request)

    def Stop(self, request: msg.StopRequest) -> msg.Empty:  # noqa: N802
        return self.own.Stop(request)

    def close(self) -> None:
        """Fail every call waiting in any share (the server is stopping); close the
        connections to the other hosts."""
        for service in {id(s): s for s in [self.own, *self._shares.values()]}.values():
            service.close()
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for client in peers:
            client.close()
