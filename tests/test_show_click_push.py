"""Show and click counts fed from the batch labels, end to end over gRPC.

A one-worker job against one in-process server on 127.0.0.1 trains a few steps of a
model whose SparseEmbedding has the ``ctr`` accessor, on real rows of the Criteo
sample, passing each batch's labels to ``optimizer.step(labels=...)``. Afterwards the
server's show and click per key (``SparseTable.stats_items``) equal a numpy
reference computed from the batches: show = the key's occurrences, click = the sum
of the labels of the examples it occurred in (Paddle's ``CollectLabelInfo``). In
sync, async and geo mode; the model's other table (no accessor) keeps no statistics.
Two sync workers, each training half of every batch, leave the counts of the whole
batches (a round sums the workers' counts).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import criteo_id_batches

from psfleet.errors import ConfigError
from psfleet.fleet import (
    DistributedOptimizer,
    DistributedStrategy,
    Fleet,
    Role,
    UserDefinedRoleMaker,
)
from psfleet.fleet.role_maker import RoleInfo
from psfleet.fleet.runtime import ParameterServerHooks, RuntimeConfig, WorkerRuntime
from psfleet.nn import SparseEmbedding
from psfleet.ps import TableService, start_server
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.rpc import RpcConfig

pytestmark = pytest.mark.service

DIM = 4
BATCH = 64
STEPS = 6
SLOTS = 26


def _batches(criteo_dir: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS batches of real Criteo rows: (ids Tensor[BATCH, 26] int64, labels [BATCH])."""
    return criteo_id_batches(criteo_dir, BATCH, STEPS)


def _reference(batches: list[tuple[torch.Tensor, torch.Tensor]]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys uint64[K] sorted, shows float64[K], clicks float64[K]) of the batches."""
    keys = np.concatenate([ids.numpy().reshape(-1) for ids, _ in batches]).view(np.uint64)
    labels = np.concatenate([np.repeat(lab.numpy().astype(np.float64), SLOTS)
                             for _, lab in batches])
    uniq, inverse = np.unique(keys, return_inverse=True)
    return (uniq, np.bincount(inverse, minlength=uniq.size),
            np.bincount(inverse, weights=labels, minlength=uniq.size))


class CtrModel(torch.nn.Module):
    def __init__(self, tag: str) -> None:
        super().__init__()
        self.ctr = SparseEmbedding(DIM, name=f"show_click_{tag}", accessor={"name": "ctr"})
        self.plain = SparseEmbedding(1, name=f"show_click_{tag}_plain")
        self.dense = torch.nn.Linear(SLOTS * DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [B, 26] -> logits [B]
        wide = self.plain(ids).sum(dim=(1, 2))
        return self.dense(self.ctr(ids).reshape(ids.shape[0], -1)).squeeze(1) + wide


def _train(mode: str, batches: list[tuple[torch.Tensor, torch.Tensor]],
           extra: dict[str, object]) -> tuple[TableService, CtrModel]:
    """Train the batches in ``mode`` against one in-process server; its service."""
    service = TableService()
    _, server = start_server("127.0.0.1", 0, RpcConfig(), service)
    try:
        model = CtrModel(mode)
        f = Fleet()
        f.init(UserDefinedRoleMaker(0, Role.WORKER, 1, [server.endpoint]))
        f.distributed_model(model)
        optimizer = f.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                            DistributedStrategy(mode=mode, **extra))
        f.init_worker()
        try:
            loss_fn = torch.nn.BCEWithLogitsLoss()
            first_ids, first_labels = batches[0]
            loss = loss_fn(model(first_ids), first_labels)
            optimizer.zero_grad()
            loss.backward()
            with pytest.raises(ConfigError, match=rf"'show_click_{mode}' .*ctr accessor.*"
                                                  r"optimizer.step\(labels="):
                optimizer.step()  # nothing pushed; the rows stay for the next call
            with pytest.raises(ConfigError, match="labels has 63 entries but the forward "
                                                  "read a batch of 64 examples"):
                optimizer.step(labels=first_labels[:-1])
            optimizer.step(labels=first_labels)
            for ids, labels in batches[1:]:
                loss = loss_fn(model(ids), labels)
                optimizer.zero_grad()
                optimizer.minimize(loss, labels=labels)
            f.flush()
        finally:
            f.stop_worker()
    finally:
        server.stop(grace_s=0.5)
    return service, model


@pytest.mark.parametrize(("mode", "extra"), [
    ("sync", {}),
    ("async", {"a_sync_configs": {"max_merge_var_num": 4, "send_wait_times": 2}}),
    ("geo", {"geo_step": 4}),
])
def test_server_shows_and_clicks_equal_the_batches_counts(
        criteo_dir: Path, mode: str, extra: dict[str, object]) -> None:
    batches = _batches(criteo_dir)
    keys, shows, clicks = _reference(batches)
    assert clicks.sum() > 0 and (shows > clicks).any()  # real labels: some 1, some 0
    service, model = _train(mode, batches, extra)
    table, plain = service.tables[model.ctr.table_id], service.tables[model.plain.table_id]
    assert isinstance(table, SparseTable) and isinstance(plain, SparseTable)
    got_keys, stats = table.stats_items()
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(stats[:, 0], shows)
    np.testing.assert_array_equal(stats[:, 1], clicks)
    assert stats[:, 0].sum() == BATCH * STEPS * SLOTS
    plain_keys, _ = plain.stats_items()
    assert plain_keys.size == 0  # no accessor: no statistics kept


def test_two_sync_workers_rounds_sum_their_counts(criteo_dir: Path) -> None:
    batches = _batches(criteo_dir)
    keys, shows, clicks = _reference(batches)
    service = TableService()
    _, server = start_server("127.0.0.1", 0, RpcConfig(), service)
    models = [CtrModel("sync2"), CtrModel("sync2")]  # the same tables on both workers

    def worker(index: int) -> None:
        model = models[index]
        optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
        config = RuntimeConfig(RoleInfo(Role.WORKER, index, 2, server_endpoints=(
            server.endpoint,)), DistributedStrategy(mode="sync"), RpcConfig(), 10.0)
        runtime = WorkerRuntime.connect(config, ParameterServerHooks(), optimizer,
                                        [model.ctr, model.plain])
        try:
            loss_fn = torch.nn.BCEWithLogitsLoss()
            for ids, labels in batches:
                half = slice(index * BATCH // 2, (index + 1) * BATCH // 2)
                loss = loss_fn(model(ids[half]), labels[half])
                optimizer.zero_grad()
                optimizer.minimize(loss, labels=labels[half])
        finally:
            runtime.stop()

    try:
        with ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(worker, i) for i in range(2)]:
                future.result(timeout=120)
    finally:
        server.stop(grace_s=0.5)
    table = service.tables[models[0].ctr.table_id]
    assert isinstance(table, SparseTable)
    got_keys, stats = table.stats_items()
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(stats[:, 0], shows)
    np.testing.assert_array_equal(stats[:, 1], clicks)
