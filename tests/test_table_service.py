"""The one table service: in process and over gRPC alike, and at-most-once pushes.

- ``LocalClient`` (``server_num: 0``) and ``RemoteClient`` to one server run the same
  service code: with SGD, DC-ASGD and sliced dense blocks they end with identical
  values (the in-process path used to skip DC-ASGD and slicing).
- A push whose response is lost after the server applied it (the connection drops)
  is retried by the client and applied once: a TCP proxy between client and server
  cuts the connection right after the server applied the first push.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from psfleet.errors import RemoteError
from psfleet.ps import (
    LocalClient,
    RemoteClient,
    RuleConfig,
    SparseTableConfig,
    TableService,
    start_server,
)
from psfleet.ps.client import TableClient
from psfleet.ps.push_ledger import PushLedger
from psfleet.ps.transport import InProcessTransport
from psfleet.ps.types import SlicingConfig
from psfleet.rpc import RpcConfig, RunningServer
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
CONFIG = RpcConfig(deadline_s=20.0, max_retries=4, backoff_initial_s=0.05, server_threads=8)
SGD = RuleConfig(name="sgd", learning_rate=0.1)
DIM = 4
SHAPES = [(6, 5), (5,), (5, 1), (1,)]  # a small MLP's weights and biases


def _train(client: TableClient, steps: int = 20, seed: int = 0) -> tuple[np.ndarray, ...]:
    """20 steps of a linear model on random sparse ids with a stale dense view.

    The worker pulls dense values only every third step, so DC-ASGD's compensation
    (``w_now - w_seen``) is non-zero on the steps between.
    """
    rng = np.random.default_rng(seed)
    total = sum(int(np.prod(s)) for s in SHAPES)
    client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD,
                                                    initial_range=0.2, seed=3))
    client.create_dense_table(1, "dense", SHAPES, SGD,
                              rng.normal(size=total).astype(np.float32),
                              SlicingConfig(slice_var_up=True, min_block_size=4),
                              dc_asgd_lambda=0.5)
    dense = client.pull_dense(1)
    for step in range(steps):
        ids = np.unique(rng.integers(0, 50, size=16).astype(np.uint64))
        rows = client.pull_sparse(0, ids)
        target = rng.normal(size=(ids.size, DIM)).astype(np.float32)
        client.push_sparse(0, ids, (rows - target) * np.float32(0.5))
        client.push_dense(1, (dense * np.float32(0.1)
                              + rng.normal(size=total).astype(np.float32) * np.float32(0.01)))
        if step % 3 == 2:
            dense = client.pull_dense(1)
    keys = np.arange(50, dtype=np.uint64)
    return client.pull_sparse(0, keys, create=False), client.pull_dense(1)


@contextlib.contextmanager
def _server(service: TableService | None = None) -> Iterator[RunningServer]:
    _, server = start_server(HOST, 0, CONFIG, service or TableService(barrier_timeout_s=20.0))
    try:
        yield server
    finally:
        server.stop(grace_s=0.5)


def test_in_process_equals_one_server_with_dc_asgd_and_slicing() -> None:
    local = LocalClient()
    rows_local, dense_local = _train(local)
    with _server() as server:
        remote = RemoteClient([server.endpoint], CONFIG)
        try:
            rows_remote, dense_remote = _train(remote)
        finally:
            remote.close()
    np.testing.assert_allclose(rows_local, rows_remote, rtol=0, atol=1e-6)
    np.testing.assert_allclose(dense_local, dense_remote, rtol=0, atol=1e-6)
    # The in-process dense table compensates delays like a server's (it did not).
    table = local.service.tables[1]
    assert table.config.dc_asgd_lambda == 0.5
    plain = LocalClient()
    plain_rows, plain_dense = _train(_NoDcAsgd(plain))
    assert np.abs(plain_dense - dense_local).max() > 1e-4  # compensation changed values
    np.testing.assert_allclose(plain_rows, rows_local, rtol=0, atol=1e-6)  # sparse: no DC


class _NoDcAsgd(TableClient):
    """A client identical to ``inner`` but creating dense tables without DC-ASGD."""

    def __init__(self, inner: LocalClient) -> None:
        super().__init__(inner._servers)

    def create_dense_table(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        kwargs["dc_asgd_lambda"] = 0.0
        super().create_dense_table(*args, **kwargs)  # type: ignore[arg-type]


class _CuttingProxy:
    """A TCP proxy that drops the connection once ``armed`` is set and the server sends
    anything more: the client never sees that response and retries on UNAVAILABLE."""

    def __init__(self, target_port: int) -> None:
        self.armed = threading.Event()
        self.cuts = 0
        self._target = (HOST, target_port)
        self._listener = socket.create_server((HOST, 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._spawn(self._accept)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream, False)
            self._spawn(self._pump, upstream, client, True)

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_server and self.armed.is_set():
                    self.armed.clear()
                    self.cuts += 1
                    break  # the response (or what follows the applied push) is lost
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(timeout=5)


class _ArmingService(TableService):
    """Arms the proxy's cut right after the first arrival of each push was handled."""

    def __init__(self, proxy_armed: list[threading.Event]) -> None:
        super().__init__(barrier_timeout_s=20.0)
        self.proxy_armed = proxy_armed
        self.push_calls = 0
        self._seen: set[int] = set()

    def PushSparse(self, request: msg.PushSparseRequest) -> msg.Empty:  # noqa: N802
        reply = super().PushSparse(request)
        self._arm(request.push_id.seq)
        return reply

    def PushDense(self, request: msg.PushDenseRequest) -> msg.Empty:  # noqa: N802
        reply = super().PushDense(request)
        self._arm(request.push_id.seq)
        return reply

    def _arm(self, seq: int) -> None:
        self.push_calls += 1
        if seq not in self._seen:
            self._seen.add(seq)
            self.proxy_armed[0].set()


def _push_once_through_a_cut(with_ids: bool) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Push once (sparse, then dense) through a proxy that loses the first response.

    Returns the row and dense values after the pushes, the proxy's cuts and the
    service's push calls.
    """
    armed: list[threading.Event] = []
    service = _ArmingService(armed)
    keys = np.array([7, 11], np.uint64)
    grads = np.ones((2, DIM), np.float32)
    with _server(service) as server:
        proxy = _CuttingProxy(server.port)
        armed.append(proxy.armed)
        client = RemoteClient([f"{HOST}:{proxy.port}"], CONFIG)
        if not with_ids:
            client._client_id = 0  # what a client without push ids sends
        try:
            client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD,
                                                            initializer="zeros"))
            client.create_dense_table(1, "dense", [3], SGD, np.zeros(3, np.float32))
            client.pull_sparse(0, keys)
            client.push_sparse(0, keys, grads)  # the response is lost; the client retries
            client.push_dense(1, np.ones(3, np.float32))  # lost again, retried
            rows, dense = client.pull_sparse(0, keys), client.pull_dense(1)
        finally:
            client.close()
            proxy.close()
    return rows, dense, proxy.cuts, service.push_calls


@pytest.mark.slow  # the client's reconnect after the cut takes about 5 s
def test_a_retried_push_is_applied_once() -> None:
    rows, dense, cuts, calls = _push_once_through_a_cut(with_ids=True)
    assert cuts == 2 and calls == 4  # two responses lost, two pushes arrived twice
    np.testing.assert_allclose(rows, -0.1 * np.ones((2, DIM)), rtol=0, atol=1e-7)
    np.testing.assert_allclose(dense, -0.1 * np.ones(3), rtol=0, atol=1e-7)


@pytest.mark.slow
def test_without_push_ids_a_retried_push_is_applied_twice() -> None:
    # The control: the same cut applies a push twice when pushes carry no id.
    rows, dense, cuts, calls = _push_once_through_a_cut(with_ids=False)
    assert cuts == 2 and calls == 4
    np.testing.assert_allclose(rows, -0.2 * np.ones((2, DIM)), rtol=0, atol=1e-7)
    np.testing.assert_allclose(dense, -0.2 * np.ones(3), rtol=0, atol=1e-7)


def test_ledger_duplicate_waits_for_the_first_and_failed_pushes_can_be_retried() -> None:
    ledger = PushLedger(window=4)
    applied: list[int] = []
    release = threading.Event()

    def slow_apply() -> None:
        release.wait(5)
        applied.append(1)

    first = threading.Thread(target=ledger.run_once, args=(5, 1, slow_apply))
    first.start()
    results: list[bool] = []
    second = threading.Thread(target=lambda: results.append(
        ledger.run_once(5, 1, lambda: applied.append(2))))
    second.start()
    second.join(0.2)
    assert second.is_alive() and applied == []  # the duplicate waits for the first
    release.set()
    first.join(5)
    second.join(5)
    assert applied == [1] and results == [False]

    def failing() -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        ledger.run_once(5, 2, failing)
    assert ledger.run_once(5, 2, lambda: applied.append(3))  # a retry applies it
    assert not ledger.run_once(5, 2, lambda: applied.append(4))
    assert ledger.run_once(6, 2, lambda: applied.append(5))  # another client's seq 2
    assert ledger.run_once(0, 2, lambda: applied.append(6))  # no id: always applied
    assert ledger.run_once(0, 2, lambda: applied.append(7))
    for seq in range(3, 9):  # the window forgets the oldest ids
        ledger.run_once(5, seq, lambda: None)
    assert ledger.run_once(5, 1, lambda: applied.append(8))
    assert applied == [1, 3, 5, 6, 7, 8]


def test_keys_are_hashed_once_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # Worker: a step's pull and push share one routing. Server: one mix64 per request
    # gives both the shard and the hash-index slot.
    import psfleet.ps.routing as routing
    import psfleet.ps.table.hash_index as hash_index
    import psfleet.ps.table.sparse_table as sparse_table

    calls = {"route": 0, "table": 0, "index": 0}

    def counting(name: str, real):  # type: ignore[no-untyped-def]
        def wrapped(keys: np.ndarray) -> np.ndarray:
            calls[name] += 1
            return real(keys)
        return wrapped

    monkeypatch.setattr(routing, "mix64", counting("route", routing.mix64))
    monkeypatch.setattr(sparse_table, "mix64", counting("table", sparse_table.mix64))
    monkeypatch.setattr(hash_index, "mix64", counting("index", hash_index.mix64))
    services = [TableService(barrier_timeout_s=5.0) for _ in range(2)]
    client = TableClient([InProcessTransport(s) for s in services])
    client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD))
    keys = np.arange(100, dtype=np.uint64)
    handle = client.start_pull_sparse(0, keys)
    rows = handle.result()
    client.push_sparse(0, handle.keys, np.ones_like(rows))
    # numpy: 2 servers x (pull + push). native: the kernels hash in C++ (once per
    # request too); only the pull's new keys go through the numpy path that creates them.
    from psfleet.ps.table.backend import backend_name
    table_calls = 4 if backend_name() == "numpy" else 2
    assert calls == {"route": 1, "table": table_calls, "index": 0}
    np.testing.assert_allclose(client.pull_sparse(0, handle.keys), rows - 0.1, atol=1e-7)
    assert calls["route"] == 1


def test_pushes_return_handles_that_wait_for_every_server() -> None:
    with _server() as first, _server() as second:
        client = RemoteClient([first.endpoint, second.endpoint], CONFIG)
        try:
            client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD,
                                                            initializer="zeros"))
            client.create_dense_table(1, "dense", [(4, 3)], SGD, np.zeros(12, np.float32),
                                      SlicingConfig(min_block_size=4))
            keys = np.arange(64, dtype=np.uint64)  # spread over both servers
            pushes = [client.start_push_sparse(0, keys, np.ones((64, DIM), np.float32)),
                      client.start_push_dense(1, np.ones(12, np.float32))]
            assert all(push.result() is None for push in pushes)
            np.testing.assert_allclose(client.pull_sparse(0, keys), -0.1, atol=1e-7)
            np.testing.assert_allclose(client.pull_dense(1), -0.1, atol=1e-7)
            reserved = np.array([2**64 - 1], np.uint64)  # refused by the server it goes to
            failing = client.start_push_sparse(0, reserved, np.ones((1, DIM), np.float32))
            with pytest.raises(RemoteError, match="reserved"):
                failing.result()
        finally:
            client.close()
