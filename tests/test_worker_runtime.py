"""The worker runtime over in-process tables: table ids, the step's sparse push, and
the async settings declared once.

A :class:`WorkerRuntime` is built as ``fleet.init_worker`` builds it (local role, no
servers), without the process-wide fleet.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from psfleet.errors import ConfigError, FatalError
from psfleet.fleet import DistributedOptimizer, DistributedStrategy, Role, RoleInfo
from psfleet.fleet.runtime import ParameterServerHooks, RuntimeConfig, WorkerRuntime
from psfleet.fleet.tables import TableRegistry
from psfleet.nn import SparseEmbedding
from psfleet.ps import RuleConfig
from psfleet.ps.communicator import AsyncCommunicator, AsyncConfig
from psfleet.ps.routing import RoutedKeys, keys_of
from psfleet.rpc import RpcConfig

pytestmark = pytest.mark.unit

SGD = RuleConfig(name="sgd", learning_rate=0.1)


class Model(torch.nn.Module):
    """Two embeddings, created in the order given, and a dense layer."""

    def __init__(self, names: tuple[str, str]) -> None:
        super().__init__()
        self.first = SparseEmbedding(4, name=names[0], initial_range=0.5)
        self.second = SparseEmbedding(2, name=names[1], initial_range=0.5)
        self.dense = torch.nn.Linear(6, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        a = self.first(ids).sum(dim=1)  # [B, 4]
        b = self.second(ids).sum(dim=1)  # [B, 2]
        again = self.first(ids[:, :1]).sum(dim=1)  # a second forward of one table
        return self.dense(torch.cat([a + again, b], dim=1)).squeeze(1)


def _runtime(model: Model) -> WorkerRuntime:
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    config = RuntimeConfig(RoleInfo(Role.WORKER, 0, 1), DistributedStrategy(), RpcConfig(),
                           5.0)
    embeddings = [m for m in model.modules() if isinstance(m, SparseEmbedding)]
    return WorkerRuntime.connect(config, ParameterServerHooks(), optimizer, embeddings)


def test_table_ids_agree_whatever_the_construction_order() -> None:
    forward = Model(("rt_users", "rt_items"))
    backward = Model(("rt_items", "rt_users"))  # same names, created the other way round
    try:
        ids_a = TableRegistry.of([forward.first, forward.second], SGD).sparse_ids()
        ids_b = TableRegistry.of([backward.first, backward.second], SGD).sparse_ids()
        ids_c = TableRegistry.of([backward.second, backward.first], SGD).sparse_ids()
        assert ids_a == ids_b == ids_c == {"rt_items": 0, "rt_users": 1}
        assert TableRegistry.of([forward.first, forward.second], SGD).dense_table_id == 2
    finally:
        del forward, backward
        gc.collect()


def test_duplicate_names_in_one_model_are_a_config_error() -> None:
    model = Model(("rt_same", "rt_same"))
    with pytest.raises(ConfigError, match="rt_same"):
        TableRegistry.of([model.first, model.second], SGD)


def test_the_runtime_pushes_each_tables_gradients_once_per_step() -> None:
    torch.manual_seed(0)
    model = Model(("rt_push_a", "rt_push_b"))
    runtime = _runtime(model)
    pushes: list[tuple[int, np.ndarray]] = []
    routed: list[bool] = []
    real_push = runtime.communicator.push_sparse

    def record(table_id: int, keys: np.ndarray | RoutedKeys, grads: np.ndarray) -> None:
        pushes.append((table_id, keys_of(keys).copy()))
        routed.append(isinstance(keys, RoutedKeys))
        real_push(table_id, keys, grads)

    runtime.communicator.push_sparse = record  # type: ignore[method-assign]
    try:
        assert runtime.mode == "local" and runtime.tables.sparse_ids() == {
            "rt_push_a": 0, "rt_push_b": 1}
        ids = torch.tensor([[1, 2, 2], [3, 1, 5]], dtype=torch.int64)
        for step in range(3):
            loss = model(ids).sum()
            runtime.optimizer.zero_grad()
            loss.backward()
            runtime.optimizer.step()
            assert [t for t, _ in pushes[2 * step:]] == [0, 1]  # one push per table
            assert runtime.step.pending_rows == 0
        assert runtime.step.sparse_pushes == 6
        assert all(keys.tolist() == [1, 2, 3, 5] for _, keys in pushes)
        # A table read by one forward is pushed with that pull's routing (hashed once);
        # the first table, read twice, is merged and routed anew.
        assert routed == [False, True] * 3
        runtime.optimizer.step()  # a step with no forward: an empty push per table
        assert [(t, k.size) for t, k in pushes[6:]] == [(0, 0), (1, 0)]
        assert runtime.optimizer.steps == 4
    finally:
        runtime.stop()


def test_async_settings_are_one_model_for_strategy_and_communicator() -> None:
    strategy = DistributedStrategy(a_sync_configs={"k_steps": 3, "send_queue_size": 2})
    assert type(strategy.a_sync_configs) is AsyncConfig
    settings = strategy.communicator_settings(worker_num=2)
    assert settings.async_config is strategy.a_sync_configs
    communicator = AsyncCommunicator(None, settings.async_config)  # type: ignore[arg-type]
    assert communicator.config.k_steps == 3
    with pytest.raises(ValueError, match=r"strategy\.a_sync_configs\.k_steps: 0 must be"):
        DistributedStrategy(a_sync_configs={"k_steps": 0})
    with pytest.raises(ValueError, match=r"strategy\.a_sync_configs\.send_wait_times: -1"):
        AsyncConfig(send_wait_times=-1)
    with pytest.raises(ValueError, match=r"strategy\.a_sync_configs\.k_step: unknown"):
        AsyncConfig(k_step=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="frozen"):
        strategy.a_sync_configs.k_steps = 5  # type: ignore[misc]


def test_fleet_is_a_shell_over_the_runtime(tmp_path: Path) -> None:
    from psfleet.fleet import Fleet, UserDefinedRoleMaker

    stray = SparseEmbedding(3, name="rt_shell_stray")  # alive, but not in the model
    model = Model(("rt_shell_b", "rt_shell_a"))
    f = Fleet()
    f.init(UserDefinedRoleMaker(0, Role.WORKER, 1, []))
    with pytest.raises(FatalError, match="init_worker"):
        f.save_persistables(str(tmp_path / "early"))
    assert f.distributed_model(model) is model and not f.is_collective()
    optimizer = f.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    f.init_worker()
    try:
        ids = torch.tensor([[4, 5, 4]], dtype=torch.int64)
        before = f.client.pull_sparse(1, np.array([4, 5], np.uint64), create=False)
        with f.join():
            loss = model(ids).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        after = f.client.pull_sparse(1, np.array([4, 5], np.uint64), create=False)
        assert not np.array_equal(before, after)  # table 1 is rt_shell_b, the first embedding
        assert model.first.table_id == 1 and model.second.table_id == 0
        assert stray.table_id == -1  # only the model's embeddings got tables
        f.save_persistables(str(tmp_path / "save"))
        manifest = json.loads((tmp_path / "save" / "manifest.json").read_text())
        assert manifest["sparse_tables"] == {"rt_shell_a": 0, "rt_shell_b": 1}
    finally:
        f.stop_worker()
