"""Pass mode (strategy mode ``gpubox``) against a real server on 127.0.0.1 over gRPC.

Oracles: one worker in pass mode computes what one process (``server_num: 0``)
computes, to 1e-5, with SGD and with Adam (whose per-row state makes the round trip
to the cache and back); two workers training the same batches leave the rows one
worker leaves (each delta is halved, as GEO's) and the counts of both. The device
path is the same code on every torch device: the CUDA case runs where a GPU is.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import criteo_id_batches

from psfleet.errors import ConfigError, FatalError, RpcError
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
from psfleet.ps import LocalClient, TableService, start_server
from psfleet.ps.communicator import LocalCommunicator, PassCommunicator, PassConfig
from psfleet.ps.communicator.pass_mode import selected_gpu
from psfleet.ps.pass_cache import split_pass
from psfleet.ps.table.rules import make_rule
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import RuleConfig, SparseTableConfig
from psfleet.rpc import RpcConfig
from psfleet.rpc.server import RunningServer

pytestmark = pytest.mark.service

DIM = 4
BATCH = 64
STEPS = 6
SLOTS = 26
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU in this process: the CUDA case of the "
                                          "same test runs where one is"))]


def _batches(criteo_dir: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS batches of real Criteo rows: (ids Tensor[BATCH, 26] int64, labels [BATCH])."""
    return criteo_id_batches(criteo_dir, BATCH, STEPS)


class Model(torch.nn.Module):
    """Two tables, one read by two forwards a step (their gradients summed), dense."""

    def __init__(self, tag: str, ctr: bool = False) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.wide = SparseEmbedding(1, name=f"pass_{tag}_wide")
        self.deep = SparseEmbedding(DIM, name=f"pass_{tag}_deep",
                                    accessor={"name": "ctr"} if ctr else None)
        self.dense = torch.nn.Linear(SLOTS * DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [B, 26] -> logits [B]
        wide = self.wide(ids).sum(dim=(1, 2)) + self.wide(ids[:, :3]).sum(dim=(1, 2))
        return self.dense(self.deep(ids).reshape(ids.shape[0], -1)).squeeze(1) + wide


@pytest.fixture
def server() -> Iterator[tuple[TableService, RunningServer]]:
    service = TableService()
    _, running = start_server("127.0.0.1", 0, RpcConfig(deadline_s=20.0), service)
    try:
        yield service, running
    finally:
        running.stop(grace_s=0.5)


def _rule(name: str) -> RuleConfig:
    return RuleConfig(name=name, learning_rate=0.05)


def _optimizer(model: Model, rule: str) -> DistributedOptimizer:
    return DistributedOptimizer(params=list(model.parameters()), rule=_rule(rule))


def _steps(model: Model, optimizer: DistributedOptimizer,
           batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for ids, labels in batches:
        optimizer.zero_grad()
        optimizer.minimize(loss_fn(model(ids), labels), labels=labels)


def _pass_ids(model: Model, batches: list[tuple[torch.Tensor, torch.Tensor]]
              ) -> dict[str, torch.Tensor]:
    ids = torch.cat([b for b, _ in batches])
    return {model.wide.name: ids, model.deep.name: ids}


def _rows(f: Fleet, model: Model, keys: np.ndarray) -> list[np.ndarray]:
    return [f.client.pull_sparse(m.table_id, keys, create=False) for m in (model.wide,
                                                                             model.deep)]


def _train(batches: list[tuple[torch.Tensor, torch.Tensor]], rule: str, tag: str,
           endpoints: list[str], strategy: DistributedStrategy | None,
           passes: int = 1) -> tuple[list[np.ndarray], torch.Tensor]:
    """Train on one worker; the rows of every key after training and the dense weight.
    ``strategy`` None: one process on in-process tables (no servers)."""
    model = Model(tag)
    f = Fleet()
    f.init(UserDefinedRoleMaker(0, Role.WORKER, 1, endpoints))
    f.distributed_model(model)
    optimizer = f.distributed_optimizer(params=list(model.parameters()), rule=_rule(rule),
                                        strategy=strategy)
    f.init_worker()
    try:
        size = len(batches) // passes
        for k in range(passes):
            part = batches[k * size:(k + 1) * size]
            if strategy is not None:
                assert f.begin_pass(_pass_ids(model, part)) > 0
            _steps(model, optimizer, part)
            if strategy is not None:
                assert f.end_pass() > 0
        f.flush()
        keys = np.unique(torch.cat([b for b, _ in batches]).numpy().view(np.uint64))
        return _rows(f, model, keys), model.dense.weight.detach().clone()
    finally:
        f.stop_worker()


def _pass_strategy(device: str = "cpu", dense_mode: str = "sync") -> DistributedStrategy:
    return DistributedStrategy(mode="gpubox", pass_configs={"dense_mode": dense_mode,
                                                            "device": device})


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam"])
def test_each_rule_computes_the_same_on_numpy_arrays_and_torch_tensors(name: str) -> None:
    rng = np.random.default_rng(0)
    rule = make_rule(RuleConfig(name=name, learning_rate=0.03))
    w = rng.normal(size=(50, 8)).astype(np.float32)
    state = rule.init_state(50, 8)
    w_t, state_t = torch.from_numpy(w.copy()), torch.from_numpy(state.copy())
    for _ in range(5):
        g = rng.normal(size=(50, 8)).astype(np.float32)
        rule.update(w, state, g)
        rule.update(w_t, state_t, torch.from_numpy(g))
    # The same float32 formula; torch's and numpy's kernels may round a quotient
    # differently in the last bit (measured: at most 1 ulp after 5 steps).
    np.testing.assert_allclose(w_t.numpy(), w, rtol=3e-7, atol=1e-7)
    np.testing.assert_allclose(state_t.numpy(), state, rtol=3e-7, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("rule", "dense_mode"), [("sgd", "sync"), ("adam", "sync"),
                                                  ("adam", "geo")])
def test_one_worker_in_pass_mode_equals_one_process(
        criteo_dir: Path, server: tuple[TableService, RunningServer], rule: str,
        dense_mode: str, device: str) -> None:
    """Dense sync: the servers step the dense rule; dense geo: the worker steps its own
    copy and sends the change at the pass's end (no dense RPC per step)."""
    batches = _batches(criteo_dir)
    ref_rows, ref_dense = _train(batches, rule, f"ref_{rule}", [], None)
    _, running = server
    rows, dense = _train(batches, rule, f"one_{rule}_{dense_mode}", [running.endpoint],
                         _pass_strategy(device, dense_mode), passes=2)
    start = Model("start")
    assert not torch.equal(ref_dense, start.dense.weight)  # it trained
    for got, want in zip(rows, ref_rows, strict=True):
        assert np.abs(want).max() > 0
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(dense, ref_dense, rtol=0, atol=1e-5)


def test_two_workers_on_equal_batches_leave_one_workers_rows_and_both_counts(
        criteo_dir: Path, server: tuple[TableService, RunningServer]) -> None:
    batches = _batches(criteo_dir)[:3]
    service, running = server
    one_rows, _ = _train(batches, "sgd", "two_ref", [], None)
    models = [Model("two", ctr=True), Model("two", ctr=True)]

    def worker(index: int) -> list[np.ndarray]:
        model = models[index]
        optimizer = _optimizer(model, "sgd")
        config = RuntimeConfig(RoleInfo(Role.WORKER, index, 2, server_endpoints=(
            running.endpoint,)), _pass_strategy(), RpcConfig(), 10.0)
        runtime = WorkerRuntime.connect(config, ParameterServerHooks(), optimizer,
                                        [model.wide, model.deep])
        try:
            runtime.begin_pass(_pass_ids(model, batches))
            _steps(model, optimizer, batches)
            runtime.end_pass()
            runtime.barrier("pass_done")
            keys = np.unique(torch.cat([b for b, _ in batches]).numpy().view(np.uint64))
            return [runtime.client.pull_sparse(m.table_id, keys, create=False)
                    for m in (model.wide, model.deep)]
        finally:
            runtime.stop()

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(worker, range(2)))
    for rows in results:  # both halves of the same delta: the one-worker rows
        for got, want in zip(rows, one_rows, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    table = service.tables[models[0].deep.table_id]
    assert isinstance(table, SparseTable)
    keys, stats = table.stats_items()
    all_ids = torch.cat([b for b, _ in batches]).numpy().view(np.uint64)
    want_keys, shows = np.unique(all_ids, return_counts=True)
    np.testing.assert_array_equal(keys, want_keys)
    np.testing.assert_array_equal(stats[:, 0], 2 * shows)  # both workers' shows
    clicks = sum(lab.sum().item() for _, lab in batches) * SLOTS * 2
    assert stats[:, 1].sum() == clicks


def test_pass_mode_errors_name_what_to_do(
        criteo_dir: Path, server: tuple[TableService, RunningServer]) -> None:
    batches = _batches(criteo_dir)[:2]
    _, running = server
    model = Model("errors")
    f = Fleet()
    f.init(UserDefinedRoleMaker(0, Role.WORKER, 1, [running.endpoint]))
    f.distributed_model(model)
    optimizer = f.distributed_optimizer(params=list(model.parameters()), rule=_rule("sgd"),
                                        strategy=_pass_strategy())
    f.init_worker()
    try:
        with pytest.raises(FatalError, match="outside a pass.*fleet.begin_pass"):
            _steps(model, optimizer, batches[:1])
        with pytest.raises(FatalError, match="end_pass: no pass is open"):
            f.end_pass()
        with pytest.raises(ConfigError, match=r"\['nope'\] are not tables of this worker"):
            f.begin_pass({"nope": batches[0][0]})
        f.begin_pass(_pass_ids(model, batches[:1]))
        with pytest.raises(FatalError, match="a pass is open"):
            f.begin_pass(_pass_ids(model, batches[:1]))
        with pytest.raises(FatalError, match=r"pass_errors_wide'.*were not given to "
                                             r"begin_pass.*pass_ids\(model, batches\)"):
            _steps(model, optimizer, batches[1:2])
        f.end_pass()
    finally:
        f.stop_worker()


def test_a_pass_above_the_cache_budget_is_refused_before_any_pull(
        server: tuple[TableService, RunningServer]) -> None:
    service, running = server
    tiny = DistributedStrategy(mode="gpubox", pass_configs={"cache_budget_bytes": 1 << 20})
    big = np.arange(1, 200_000, dtype=np.int64)
    model = Model("budget")
    f = Fleet()
    f.init(UserDefinedRoleMaker(0, Role.WORKER, 1, [running.endpoint]))
    f.distributed_model(model)
    f.distributed_optimizer(params=list(model.parameters()), rule=_rule("sgd"), strategy=tiny)
    f.init_worker()
    try:
        with pytest.raises(ConfigError, match="above pass_configs.cache_budget_bytes"):
            f.begin_pass({model.deep.name: big})
        assert len(service.tables[model.deep.table_id]) == 0  # nothing was pulled
    finally:
        f.stop_worker()
    with pytest.raises(ValueError, match=r"(?s)device.*must be cpu, cuda or cuda:N"):
        DistributedStrategy(mode="gpubox", pass_configs={"device": "tpu"})


def test_split_pass_cuts_where_the_distinct_rows_reach_the_budget() -> None:
    def keys(*values: int) -> np.ndarray:
        return np.array(values, dtype=np.uint64)

    batches = [{0: keys(1, 2, 2), 1: keys(7)},  # 2 rows of table 0, 1 of table 1
               {0: keys(2, 3)},                 # 1 new row
               {0: keys(4, 5, 6)},              # 3 new rows
               {1: keys(7, 8)}]                 # 1 new row
    row_bytes = {0: 10, 1: 50}
    # [0, 1]: 20 + 50 + 10 = 80 bytes (batch 2's 30 more: 110); [2]: 30 (batch 3 would
    # bring keys 7 and 8 anew, 100 more: 130); [3]: 100
    assert split_pass(batches, row_bytes, 100) == [range(0, 2), range(2, 3), range(3, 4)]
    assert split_pass(batches, row_bytes, 10_000) == [range(0, 4)]
    with pytest.raises(ConfigError, match="batch 0 alone needs 70 bytes"):
        split_pass(batches, row_bytes, 60)


def test_a_failed_end_pass_resends_only_what_the_servers_did_not_apply(
        monkeypatch: pytest.MonkeyPatch) -> None:
    client = LocalClient()
    configs = {t: SparseTableConfig(name=f"pass_retry_{t}", dim=2,
                                    rule=RuleConfig(name="sgd", learning_rate=0.5))
               for t in (0, 1)}
    comm = PassCommunicator(client, LocalCommunicator(client), PassConfig())
    for table_id, config in configs.items():
        client.create_sparse_table(table_id, config)
        comm.on_sparse_table(table_id, config)
    keys = np.arange(1, 6, dtype=np.uint64)
    before = {t: client.pull_sparse(t, keys) for t in configs}
    comm.begin_pass({t: keys for t in configs})
    for table_id in configs:
        comm.push_sparse(table_id, keys, torch.ones(5, 2))
    real, failed = client.start_push_sparse, []

    def flaky(table_id: int, *args: object, **kwargs: object) -> object:
        if table_id == 1 and not failed:
            failed.append(table_id)
            raise RpcError("server unavailable (injected)")
        return real(table_id, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(client, "start_push_sparse", flaky)
    with pytest.raises(RpcError, match="injected"):
        comm.end_pass()
    assert comm.in_pass and comm.end_pass() == 5  # table 1's rows only
    for table_id in configs:  # each row stepped once: w - 0.5 * 1
        np.testing.assert_allclose(client.pull_sparse(table_id, keys, create=False),
                                   before[table_id] - 0.5, rtol=0, atol=1e-6)


def test_selected_gpu_is_counted_among_the_visible_ones() -> None:
    assert selected_gpu({}) is None
    assert selected_gpu({"FLAGS_selected_gpus": "2,3"}) == 2
    # fleetrun sets both to the rank's GPU: torch numbers the visible GPUs from 0
    assert selected_gpu({"FLAGS_selected_gpus": "3", "CUDA_VISIBLE_DEVICES": "3"}) == 0
    assert selected_gpu({"FLAGS_selected_gpus": "5", "CUDA_VISIBLE_DEVICES": "4,5"}) == 1
    with pytest.raises(ConfigError, match="FLAGS_selected_gpus: 'gpu0'"):
        selected_gpu({"FLAGS_selected_gpus": "gpu0"})
