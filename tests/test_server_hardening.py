"""One request must not kill, poison or confuse a server (issue 15, findings 1, 2, 8, 9, 11).

Each test sends the offending request over real gRPC to an in-process server on
127.0.0.1 port 0, asserts the status the client sees (as psfleet's error type), then
that the server still serves and that rows written before are unchanged.

- 1: worker_num 2^32-1 in a Barrier or SYNC push, a table of dim 65536 or 10^12
  buckets: INVALID_ARGUMENT naming the value and the limit (no allocation).
- 2: the auth token is compared with ``hmac.compare_digest``.
- 8: NaN/Inf gradients are rejected naming the table and the count, counted in Stats.
- 9: a key twice in one push gets the sum of its gradients (none dropped).
- 11: undecodable requests are INVALID_ARGUMENT; a MemoryError is RESOURCE_EXHAUSTED
  naming the table, which is left unchanged.
"""

from __future__ import annotations

import contextlib
import hmac
import resource
from collections.abc import Iterator

import numpy as np
import pytest

from psfleet.errors import (
    ConfigError,
    InvalidRequestError,
    RemoteError,
    ResourceExhaustedError,
)
from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig, TableService, start_server
from psfleet.ps.coordination import describe_missing
from psfleet.ps.types import ServerLimits
from psfleet.rpc import RpcClient, RpcConfig, RunningServer, codec
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
# memory:// is a storage root so an undecodable Save reaches the decoding (docs/security.md).
CONFIG = RpcConfig(deadline_s=20.0, max_retries=1, backoff_initial_s=0.05, server_threads=8,
                   storage_roots=("memory://",))
SGD = RuleConfig(name="sgd", learning_rate=0.5)
DIM = 4
KNOWN = np.arange(100, 110, dtype=np.uint64)


@contextlib.contextmanager
def _server(service: TableService | None = None
            ) -> Iterator[tuple[RunningServer, RemoteClient, RpcClient]]:
    """A server with sparse table 0 (dim 4, SGD) holding rows KNOWN, a RemoteClient
    (worker 0) and a raw RpcClient to it; all closed on exit."""
    _, server = start_server(HOST, 0, CONFIG, service or TableService(barrier_timeout_s=0.5))
    client = RemoteClient([server.endpoint], CONFIG)
    rpc = RpcClient(server.endpoint, CONFIG)
    try:
        client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM, rule=SGD,
                                                        num_shards=2, seed=1))
        client.create_dense_table(1, "dense", [6], SGD, np.arange(6, dtype=np.float32))
        client.pull_sparse(0, KNOWN)
        yield server, client, rpc
    finally:
        rpc.close()
        client.close()
        server.stop(grace_s=0.5)


def _still_serving(client: RemoteClient, known_rows: np.ndarray) -> None:
    """The server answers and the rows of KNOWN and the dense table are unchanged."""
    assert np.array_equal(client.pull_sparse(0, KNOWN, create=False), known_rows)
    assert np.array_equal(client.pull_dense(1), np.arange(6, dtype=np.float32))
    assert client.stats()[0].tables[0].rows == KNOWN.size


def _push(keys: np.ndarray, grads: np.ndarray, **fields: object) -> msg.PushSparseRequest:
    return msg.PushSparseRequest(table_id=0, keys=codec.keys_to_bytes(keys),
                                 grads=codec.floats_to_bytes(grads), **fields)  # type: ignore[arg-type]


# -- finding 1: one request kills a server -----------------------------------------------

def test_huge_worker_num_and_table_sizes_are_rejected_before_any_allocation() -> None:
    with _server() as (_, client, rpc):
        known = client.pull_sparse(0, KNOWN, create=False)
        huge = 2**32 - 1
        # Barrier and SYNC push with worker_num 2^32-1: rejected at once, no wait.
        with pytest.raises(InvalidRequestError, match=rf"worker_num {huge} is not in 1\.\.4096"):
            rpc.call("Barrier", msg.BarrierRequest(name="b", worker_index=0, worker_num=huge))
        with pytest.raises(InvalidRequestError, match=rf"worker_num {huge} is not in"):
            rpc.call("PushSparse", _push(KNOWN[:1], np.ones((1, DIM), np.float32),
                                         mode=msg.SYNC, worker_num=huge, step=1))
        # The first barrier fixes the job's worker_num (2); another is named with it.
        with pytest.raises(RemoteError, match=r"barrier .b.*workers \[1\] did not arrive"):
            client.barrier("b", 0, 2)
        with pytest.raises(InvalidRequestError,
                           match=r"worker_num 3 differs from this job's worker_num 2"):
            client.barrier("b", 0, 3)
        with pytest.raises(InvalidRequestError, match=r"worker_index 7 >= worker_num 2"):
            rpc.call("PullDense", msg.PullDenseRequest(table_id=1, worker_index=7))
        # A dim or bucket count above the server's limit, naming how to raise it.
        wide = SparseTableConfig(name="wide", dim=65536)
        with pytest.raises(InvalidRequestError,
                           match=r"table 2 \('wide'\): dim 65536 is above 4096.*max_dim=\.\.\."):
            client.create_sparse_table(2, wide)
        many = SparseTableConfig(name="many", dim=4, num_buckets=10**12)
        with pytest.raises(InvalidRequestError, match=r"num_buckets 1000000000000 is above"):
            client.create_sparse_table(3, many)
        assert [t.table_id for t in client.stats()[0].tables] == [0, 1]
        _still_serving(client, known)
    # A server whose limit is raised takes the wide table.
    with _server(TableService(limits=ServerLimits(max_dim=65536))) as (_, client, _rpc):
        client.create_sparse_table(2, SparseTableConfig(name="wide", dim=65536))
        assert client.pull_sparse(2, KNOWN[:2]).shape == (2, 65536)


def test_missing_workers_are_described_without_building_the_range() -> None:
    assert describe_missing({0, 2}, 4) == "[1, 3]"
    assert describe_missing({1}, 2**32 - 1, limit=3) == f"[0, 2, 3] and {2**32 - 5} more"
    assert describe_missing(set(), 0) == "[]"


# -- finding 2 (part): constant-time token comparison --------------------------------------

def test_auth_token_is_compared_with_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:  # records, then compares for real
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    secured = RpcConfig(deadline_s=10.0, max_retries=0, auth_token="s3cret")
    _, server = start_server(HOST, 0, secured, TableService())
    try:
        for token, ok in (("s3cret", True), ("s3creT", False)):
            rpc = RpcClient(server.endpoint, RpcConfig(deadline_s=10.0, max_retries=0,
                                                       auth_token=token))
            try:
                if ok:
                    rpc.call("Stats", msg.StatsRequest())
                else:
                    with pytest.raises(ConfigError, match="PSFLEET_AUTH_TOKEN"):
                        rpc.call("Stats", msg.StatsRequest())
            finally:
                rpc.close()
    finally:
        server.stop(grace_s=0.5)
    assert compared == [(b"s3cret", b"s3cret"), (b"s3creT", b"s3cret")]


# -- finding 8: NaN/Inf gradients -------------------------------------------------------------

def test_non_finite_pushes_are_rejected_named_and_counted() -> None:
    with _server() as (_, client, _rpc):
        known = client.pull_sparse(0, KNOWN, create=False)
        grads = np.ones((KNOWN.size, DIM), np.float32)
        grads[3, 1] = np.nan
        grads[5, 0] = np.inf
        with pytest.raises(InvalidRequestError,
                           match=r"push to table 0 \('emb'\): 2 of 40 values are NaN or Inf"):
            client.push_sparse(0, KNOWN, grads)
        dense = np.zeros(6, np.float32)
        dense[2] = -np.inf
        with pytest.raises(InvalidRequestError, match=r"table 1 \('dense'\): 1 of 6 values"):
            client.push_dense(1, dense)
        stats = {t.table_id: t.rejected_non_finite for t in client.stats()[0].tables}
        assert stats == {0: 1, 1: 1}
        _still_serving(client, known)


# -- finding 9: duplicate keys in one push ---------------------------------------------------

def test_duplicate_keys_in_one_push_sum_their_gradients() -> None:
    with _server() as (_, client, rpc):
        known = client.pull_sparse(0, KNOWN, create=False)
        keys = np.array([KNOWN[0], KNOWN[1], KNOWN[0], KNOWN[0]], np.uint64)
        grads = np.arange(16, dtype=np.float32).reshape(4, DIM)
        rpc.call("PushSparse", _push(keys, grads))
        after = client.pull_sparse(0, KNOWN[:3], create=False)
        lr = np.float32(SGD.learning_rate)
        assert np.array_equal(after[0], known[0] - lr * (grads[0] + grads[2] + grads[3]))
        assert np.array_equal(after[1], known[1] - lr * grads[1])
        assert np.array_equal(after[2], known[2])
        # GEO deltas too: both deltas of a repeated key are added.
        rpc.call("PushSparse", _push(keys[:3], np.ones((3, DIM), np.float32), mode=msg.DELTA))
        assert np.array_equal(client.pull_sparse(0, KNOWN[:1], create=False)[0],
                              after[0] + np.float32(2))


# -- finding 11: undecodable requests, out of memory ---------------------------------------

def test_undecodable_requests_are_invalid_argument() -> None:
    with _server() as (_, client, rpc):
        known = client.pull_sparse(0, KNOWN, create=False)
        bad = {
            "keys of 12 bytes": ("PullSparse", msg.PullSparseRequest(
                table_id=0, keys=b"\x00" * 12)),
            "grads not a multiple of dim": ("PushSparse", msg.PushSparseRequest(
                table_id=0, keys=codec.keys_to_bytes(KNOWN[:2]), grads=b"\x00" * 20)),
            "dense grads of 5 bytes": ("PushDense", msg.PushDenseRequest(
                table_id=1, grads=b"\x00" * 5)),
            "unknown push mode": ("PushSparse", _push(KNOWN[:1], np.ones((1, DIM), np.float32),
                                                      mode=7)),  # type: ignore[arg-type]
            "bad config JSON": ("CreateTable", msg.CreateTableRequest(
                table_id=4, config_json='{"kind": "sparse", "dim": ')),
            "dense index of 7 bytes": ("CreateTable", msg.CreateTableRequest(
                table_id=5, config_json='{"kind": "dense", "name": "d", "size": 1}',
                init_values=codec.floats_to_bytes(np.zeros(1, np.float32)),
                dense_index=b"\x00" * 7)),
            "save with a dense index of 3 bytes": ("Save", msg.SaveRequest(
                dirname="memory://x", dense=[msg.DenseIndex(table_id=1, index=b"abc")])),
        }
        for what, (method, request) in bad.items():
            with pytest.raises(InvalidRequestError, match=rf"{method} on server .* rejected"):
                rpc.call(method, request)
            assert rpc.is_serving(), what
        _still_serving(client, known)


@contextlib.contextmanager
def _address_space_limit(extra_bytes: int) -> Iterator[None]:
    """Cap this process's address space at its current size + ``extra_bytes``, so an
    allocation beyond fails with MemoryError whatever the kernel's overcommit policy."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (current + extra_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_out_of_memory_is_resource_exhausted_naming_the_table() -> None:
    # The pull-size limit lifted, so the server really allocates: 10^7 keys x dim 4096.
    service = TableService(barrier_timeout_s=0.5, limits=ServerLimits(max_pull_bytes=1 << 62))
    with _server(service) as (_, client, rpc):
        client.create_sparse_table(2, SparseTableConfig(name="wide", dim=4096, rule=SGD))
        client.pull_sparse(2, KNOWN)
        known = client.pull_sparse(0, KNOWN, create=False)
        wide = client.pull_sparse(2, KNOWN, create=False)
        request = msg.PullSparseRequest(table_id=2, create=True, keys=codec.keys_to_bytes(
            np.arange(10**7, dtype=np.uint64)))  # 80 MB asking for 164 GB
        with _address_space_limit(8 << 30), pytest.raises(
                ResourceExhaustedError,
                match=r"(?s)pull on table 2 \('wide', 10 rows, \d+ bytes\): the server ran "
                      r"out of memory.*rows and index are whole.*smaller batches"):
            rpc.call("PullSparse", request)
        assert np.array_equal(client.pull_sparse(2, KNOWN, create=False), wide)
        assert {t.table_id: t.rows for t in client.stats()[0].tables}[2] == KNOWN.size
        _still_serving(client, known)
    # Creating rows runs out of memory: the shard's rows and index are as before.
    with _server() as (_, client, rpc):
        client.create_sparse_table(3, SparseTableConfig(
            name="adam", dim=1024, rule=RuleConfig(name="adam"), num_shards=1))
        client.pull_sparse(3, KNOWN)
        adam = client.pull_sparse(3, KNOWN, create=False)
        fresh = np.arange(10**6, 10**6 + 10**5, dtype=np.uint64)  # 400 MB values, 1.2 GB rows
        with _address_space_limit(1 << 30), pytest.raises(
                ResourceExhaustedError, match=r"pull on table 3 \('adam', 10 rows"):
            rpc.call("PullSparse", msg.PullSparseRequest(
                table_id=3, create=True, keys=codec.keys_to_bytes(fresh)))
        assert {t.table_id: t.rows for t in client.stats()[0].tables}[3] == KNOWN.size
        assert np.array_equal(client.pull_sparse(3, KNOWN, create=False), adam)
        assert client.pull_sparse(3, fresh[:1000]).shape == (1000, 1024)  # still grows
        assert {t.table_id: t.rows for t in client.stats()[0].tables}[3] == KNOWN.size + 1000
    # Without the lifted limit the same pull is refused before any allocation.
    with _server() as (_, client, rpc):
        client.create_sparse_table(2, SparseTableConfig(name="wide", dim=4096, rule=SGD))
        with pytest.raises(InvalidRequestError, match=r"max_pull_bytes.*pull fewer keys"):
            rpc.call("PullSparse", request)


def test_server_limits_are_raised_from_the_environment() -> None:
    # A model wider than the default max_dim has a way through: PSFLEET_SERVER_LIMITS,
    # read by run_server; its errors name the entry and the known limits.
    limits = ServerLimits.parse("max_dim=8192, max_pull_bytes=4294967296")
    assert limits.max_dim == 8192 and limits.max_pull_bytes == 1 << 32
    assert limits.max_num_buckets == ServerLimits().max_num_buckets
    assert ServerLimits.parse("") == ServerLimits()
    with pytest.raises(ConfigError, match="unknown limit 'max_dims'.*max_dim, max_num_buckets"):
        ServerLimits.parse("max_dims=8192")
    with pytest.raises(ConfigError, match="integer >= 1"):
        ServerLimits.parse("max_dim=wide")
    service = TableService(limits=limits)
    wide = SparseTableConfig(name="wide", dim=6000)
    service.CreateTable(msg.CreateTableRequest(table_id=0, config_json=wide.model_dump_json(),
                                               server_num=1))
    assert service.tables[0].config.dim == 6000
    with pytest.raises(ConfigError, match="PSFLEET_SERVER_LIMITS=max_dim"):
        TableService().CreateTable(msg.CreateTableRequest(
            table_id=0, config_json=wide.model_dump_json()))
