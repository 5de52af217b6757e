"""SparseEmbeddingBag and FeatureEmbeddings through one real table server on 127.0.0.1.

The same oracles as ``test_embedding_bag`` (torch.nn.EmbeddingBag or the hand-written
pooling formula: output, the pushed gradient, the rows after one SGD step) with the
rows pulled from and pushed to a server over gRPC, in sync mode (the step's push is
applied before the next pull) and async mode (after a flush).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from test_embedding_bag import (
    ATOL,
    SCHEMA,
    bind,
    check_against_reference,
    expected_table,
    random_batch,
    table_modules,
    two_tables,
)

from psfleet.nn import FeatureEmbeddings, Pooling, SparseEmbeddingBag
from psfleet.ps import start_server
from psfleet.rpc import RpcConfig, RunningServer

pytestmark = pytest.mark.service

DIM = 5


@pytest.fixture
def server() -> Iterator[RunningServer]:
    _, running = start_server("127.0.0.1", 0, RpcConfig(deadline_s=20.0))
    try:
        yield running
    finally:
        running.stop(grace_s=0.5)


@pytest.mark.parametrize(("pooling", "weighted", "mode"), [
    ("sum", True, "sync"), ("mean", False, "sync"), ("sqrtn", True, "async")])
def test_bag_through_a_server_equals_torch_embedding_bag(
        pooling: Pooling, weighted: bool, mode: str, server: RunningServer) -> None:
    bag = SparseEmbeddingBag(DIM, name=f"srv_bag_{pooling}", pooling=pooling,
                             initial_range=0.5)
    bound = bind([bag], servers=[server.endpoint], mode=mode)
    try:
        check_against_reference(bound, bag, pooling, weighted, seed=11)
    finally:
        bound.runtime.stop()


def test_feature_embeddings_through_a_server(server: RunningServer) -> None:
    features = FeatureEmbeddings(SCHEMA, two_tables(pooling="mean"))
    bound = bind([features], servers=[server.endpoint], mode="sync")
    try:
        sparse, jagged = random_batch(np.random.default_rng(5), 12, weighted=True)
        parts = features(sparse, jagged)
        for part, spec, module in zip(parts, features.tables, table_modules(features),
                                      strict=True):
            want = expected_table(bound, module.table_id, sparse, jagged, spec, None)
            np.testing.assert_allclose(part.detach().numpy(), want.numpy(), rtol=0,
                                       atol=ATOL)
        before = [p.detach().clone() for p in parts]
        features.flatten(parts).sum().backward()
        bound.step()
        assert sorted(t for t, _, _ in bound.pushes) == [0, 1]
        after = features(sparse, jagged)
        for old, new in zip(before, after, strict=True):
            assert not torch.equal(old, new.detach())  # the server applied the step
    finally:
        bound.runtime.stop()
