"""SparseEmbedding.prefetch: rows of the next batch pulled ahead, in async mode only."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from psfleet.nn import SparseEmbedding
from psfleet.ps import LocalClient, SparseTableConfig, start_server
from psfleet.ps.client import RemoteClient
from psfleet.ps.communicator import AsyncCommunicator, LocalCommunicator, SyncCommunicator
from psfleet.rpc import RpcConfig

pytestmark = pytest.mark.service


@pytest.fixture
def remote() -> Iterator[RemoteClient]:
    _, server = start_server("127.0.0.1", 0, RpcConfig())
    client = RemoteClient([server.endpoint], RpcConfig())
    try:
        client.create_sparse_table(0, SparseTableConfig(name="emb", dim=3))
        yield client
    finally:
        client.close()
        server.stop()


def _embedding(name: str) -> SparseEmbedding:
    embedding = SparseEmbedding(3, name=name)
    gc.collect()
    return embedding


def test_prefetched_rows_equal_pulled_rows_and_are_used_once(remote: RemoteClient) -> None:
    communicator = AsyncCommunicator(remote)
    embedding = _embedding("prefetch_equal")
    embedding.bind(communicator, 0)
    first = torch.tensor([[5, 6], [6, 7]], dtype=torch.int64)
    second = torch.tensor([[7, 8], [9, 5]], dtype=torch.int64)
    assert embedding.prefetch(first) and embedding.prefetch(second)
    out_first = embedding(first)
    out_second = embedding(second)
    expected = remote.pull_sparse(0, np.arange(5, 10, dtype=np.uint64), create=False)
    assert torch.equal(out_first[0, 0], torch.from_numpy(expected[0]))  # key 5
    assert torch.equal(out_second.reshape(-1, 3),
                       torch.from_numpy(expected[[2, 3, 4, 0]]))  # keys 7, 8, 9, 5
    assert embedding._prefetched == []  # noqa: SLF001 - both consumed
    # An input that was not prefetched is pulled as usual (same values).
    again = embedding(second.clone())
    assert torch.equal(again, out_second.detach())


@pytest.mark.parametrize("make", [
    lambda c: LocalCommunicator(c), lambda c: SyncCommunicator(c, worker_num=1)])
def test_no_prefetch_outside_async_mode(make: object) -> None:
    client = LocalClient()
    client.create_sparse_table(0, SparseTableConfig(name="emb", dim=3))
    embedding = _embedding(f"prefetch_off_{id(make)}")
    embedding.bind(make(client), 0)  # type: ignore[operator]
    assert not embedding.prefetch(torch.tensor([[1, 2]], dtype=torch.int64))
    assert len(client.sparse[0]) == 0  # nothing was pulled (no rows created)


def test_no_prefetch_in_eval_mode(remote: RemoteClient) -> None:
    embedding = _embedding("prefetch_eval")
    embedding.bind(AsyncCommunicator(remote), 0)
    embedding.eval()
    assert not embedding.prefetch(torch.tensor([[1, 2]], dtype=torch.int64))
