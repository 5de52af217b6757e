"""SparseEmbedding.prefetch: rows of the next batch pulled ahead, in async mode only.

The prefetch returns a handle that the forward over that batch consumes explicitly
(``prefetched=`` or ``use_prefetched``); the ids are matched by value, so a copy of
the batch (``ids.clone()``) still uses the prefetched rows. Pulls are counted on a
real client (a RemoteClient subclass that counts its calls).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from psfleet.errors import ConfigError
from psfleet.fleet.step import StepCollector
from psfleet.nn import SparseEmbedding, use_prefetched
from psfleet.ps import LocalClient, SparseTableConfig, start_server
from psfleet.ps.clients import RemoteClient
from psfleet.ps.communicator import AsyncCommunicator, LocalCommunicator, SyncCommunicator
from psfleet.rpc import RpcConfig

pytestmark = pytest.mark.service

DIM = 3


class CountingClient(RemoteClient):
    """A RemoteClient that counts the sparse pulls it sends."""

    pulls = 0

    def pull_sparse(self, table_id: int, keys: np.ndarray, create: bool = True) -> np.ndarray:
        self.pulls += 1
        return super().pull_sparse(table_id, keys, create)

    def start_pull_sparse(self, table_id: int, keys: np.ndarray,
                          create: bool = True, with_state: bool = False) -> object:
        self.pulls += 1
        return super().start_pull_sparse(  # type: ignore[no-any-return]
            table_id, keys, create, with_state)


@pytest.fixture
def remote() -> Iterator[CountingClient]:
    _, server = start_server("127.0.0.1", 0, RpcConfig())
    client = CountingClient([server.endpoint], RpcConfig())
    try:
        client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM))
        yield client
    finally:
        client.close()
        server.stop()


def _embedding(name: str, client: object, make: object = AsyncCommunicator
               ) -> tuple[SparseEmbedding, StepCollector]:
    embedding = SparseEmbedding(DIM, name=name)
    gc.collect()
    step = StepCollector(make(client), {0: DIM}, None)  # type: ignore[operator]
    embedding.bind(step, 0)
    return embedding, step


def test_prefetched_rows_equal_pulled_rows_and_are_used_once(remote: CountingClient) -> None:
    embedding, _ = _embedding("prefetch_equal", remote)
    first = torch.tensor([[5, 6], [6, 7]], dtype=torch.int64)
    second = torch.tensor([[7, 8], [9, 5]], dtype=torch.int64)
    h1, h2 = embedding.prefetch(first), embedding.prefetch(second)
    assert h1 is not None and h2 is not None and remote.pulls == 2
    out_first = embedding(first, prefetched=h1)
    out_second = embedding(second, prefetched=h2)
    assert remote.pulls == 2  # both forwards used their prefetched rows
    expected = remote.pull_sparse(0, np.arange(5, 10, dtype=np.uint64), create=False)
    assert torch.equal(out_first[0, 0], torch.from_numpy(expected[0]))  # key 5
    assert torch.equal(out_second.reshape(-1, DIM),
                       torch.from_numpy(expected[[2, 3, 4, 0]]))  # keys 7, 8, 9, 5
    # An input that was not prefetched is pulled as usual (same values).
    pulls = remote.pulls
    again = embedding(second.clone())
    assert remote.pulls == pulls + 1
    assert torch.equal(again, out_second.detach())


def test_a_copy_of_the_ids_uses_the_prefetched_rows(remote: CountingClient) -> None:
    embedding, step = _embedding("prefetch_clone", remote)
    ids = torch.tensor([[11, 12, 11], [13, 12, 14]], dtype=torch.int64)
    handle = embedding.prefetch(ids)
    assert handle is not None and remote.pulls == 1
    out = embedding(ids.clone(), prefetched=handle)
    assert remote.pulls == 1  # no second pull for an equal copy of the batch
    # Through a model that calls the embedding itself: use_prefetched.
    model = torch.nn.Sequential(embedding)
    handle = embedding.prefetch(ids)
    with use_prefetched([handle, None]):
        out_model = model(ids.clone())
    assert remote.pulls == 2
    assert torch.equal(out.detach(), out_model.detach())
    rows = remote.pull_sparse(0, ids.reshape(-1).numpy().view(np.uint64), create=False)
    assert np.array_equal(out.detach().numpy().reshape(-1, DIM), rows)
    assert step.pending_rows == 8  # both training forwards' rows (4 distinct keys each)


def test_an_unconsumed_prefetch_is_harmless(remote: CountingClient) -> None:
    embedding, step = _embedding("prefetch_unused", remote)
    never = torch.tensor([[21, 22]], dtype=torch.int64)
    used = torch.tensor([[23, 24]], dtype=torch.int64)
    handle = embedding.prefetch(never)
    with use_prefetched([handle]):  # armed, but the forward reads other ids
        out = embedding(used)
    assert remote.pulls == 2  # the prefetch and the forward's own pull
    del handle
    gc.collect()
    again = embedding(used)  # nothing armed any more: an ordinary pull, same rows
    assert torch.equal(again.detach(), out.detach())
    (out.sum() + again.sum()).backward()
    step.communicator.start()
    try:
        assert step.push_sparse_grads() == 2  # only the rows the forwards read
        step.communicator.end_step()
        step.communicator.flush()
    finally:
        step.communicator.stop()
    updated = remote.pull_sparse(0, np.array([23, 24], np.uint64), create=False)
    assert not np.array_equal(updated, out.detach().numpy().reshape(-1, DIM))
    never_rows = remote.pull_sparse(0, np.array([21, 22], np.uint64), create=False)
    assert np.array_equal(never_rows, embedding(never).detach().numpy().reshape(-1, DIM))


def test_a_handle_of_other_ids_is_an_error(remote: CountingClient) -> None:
    embedding, _ = _embedding("prefetch_wrong", remote)
    other, _ = _embedding("prefetch_other", remote)
    handle = embedding.prefetch(torch.tensor([[1, 2]], dtype=torch.int64))
    assert handle is not None
    with pytest.raises(ConfigError, match="prefetch_wrong.*not for these ids"):
        embedding(torch.tensor([[1, 3]], dtype=torch.int64), prefetched=handle)
    with pytest.raises(ConfigError, match="belongs to 'prefetch_wrong'"), other.use(handle):
        pass


@pytest.mark.parametrize("make", [
    lambda c: LocalCommunicator(c), lambda c: SyncCommunicator(c, worker_num=1)])
def test_no_prefetch_outside_async_mode(make: object) -> None:
    client = LocalClient()
    client.create_sparse_table(0, SparseTableConfig(name="emb", dim=DIM))
    embedding, _ = _embedding(f"prefetch_off_{id(make)}", client, make)
    assert embedding.prefetch(torch.tensor([[1, 2]], dtype=torch.int64)) is None
    assert len(client.service.tables[0]) == 0  # nothing was pulled (no rows created)


def test_no_prefetch_in_eval_mode(remote: CountingClient) -> None:
    embedding, _ = _embedding("prefetch_eval", remote)
    embedding.eval()
    assert embedding.prefetch(torch.tensor([[1, 2]], dtype=torch.int64)) is None
    assert remote.pulls == 0


def test_the_runners_loop_pulls_each_batch_once(remote: CountingClient) -> None:
    from types import SimpleNamespace

    from psfleet.rec.trainer import _with_prefetch

    embedding, step = _embedding("prefetch_runner", remote)
    model = torch.nn.Sequential(embedding)
    batches = [SimpleNamespace(sparse=torch.tensor([[i, i + 1]], dtype=torch.int64))
               for i in range(0, 10, 2)]
    outputs = []
    for batch, handles in _with_prefetch(batches, [embedding]):  # type: ignore[arg-type]
        with use_prefetched(handles):
            outputs.append(model(batch.sparse))
    assert remote.pulls == len(batches)  # the first batch pulled, the others prefetched
    keys = torch.cat([b.sparse for b in batches]).reshape(-1).numpy().view(np.uint64)
    rows = remote.pull_sparse(0, keys, create=False)
    assert np.array_equal(torch.cat(outputs).detach().numpy().reshape(-1, DIM), rows)
    assert step.pending_rows == 10
