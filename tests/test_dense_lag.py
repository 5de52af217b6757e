"""Dense lag: an async worker's own dense steps on top of lagging server values
(``psfleet.fleet.dense_lag``, ``a_sync_configs.local_dense_update``), the dense rule's
momentum correction (``psfleet.fleet.async_momentum``), and the simulated staleness of
single-process training (``PSFLEET_SIMULATE_STALENESS``).

With one worker and SGD, the values each step computes on are one process's values,
whatever the lag of the servers' values; without the local update they are not.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from psfleet.errors import ConfigError
from psfleet.fleet import DistributedOptimizer, DistributedStrategy, Role, RoleInfo
from psfleet.fleet.async_momentum import async_dense_rule
from psfleet.fleet.dense_lag import LocalStep, OwnStepCompensation
from psfleet.fleet.runtime import ParameterServerHooks, RuntimeConfig, WorkerRuntime
from psfleet.fleet.step import StepCollector
from psfleet.ps import RemoteClient, RuleConfig, SparseTableConfig, TableService, start_server
from psfleet.ps.clients import LocalClient
from psfleet.ps.communicator import AsyncCommunicator, AsyncConfig, LocalCommunicator
from psfleet.ps.communicator.local_mode import simulated_staleness
from psfleet.ps.table.rules import make_rule
from psfleet.rpc import RpcConfig

pytestmark = pytest.mark.service

LR = 0.1
DENSE = 1
STEPS = 40
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=4)


def test_compensation_adds_the_own_steps_the_values_miss() -> None:
    own = OwnStepCompensation(2)
    values = np.zeros(2, np.float32)
    for step in range(1, 5):  # own step s moves the values by [s, 10 s]
        after = values + np.array([step, 10 * step], np.float32)
        own.record(values, after)
        values = after + 100  # an install between steps: other workers' pushes
    # servers' values holding own steps 1..2, lag 2: plus own steps 3 and 4, [7, 70];
    # the installs' jumps (+100 each) are not the worker's and are not added
    np.testing.assert_array_equal(own.compensate(np.array([2.5, 20], np.float32), 2),
                                  [9.5, 90])
    fresh = np.array([7, 7], np.float32)
    assert own.compensate(fresh, 0) is fresh  # every own step in them: as they are
    with pytest.raises(ValueError, match="lag 5 outside 0..4"):
        own.compensate(fresh, 5)
    own.reset()  # installed with every step in them
    own.record(np.zeros(2, np.float32), np.array([1, 2], np.float32))
    np.testing.assert_array_equal(own.compensate(np.zeros(2, np.float32), 1), [1, 2])
    assert len(own._free) + len(own._sums) <= 6  # buffers are reused, not piled up


def _values_each_step_computes_on(local_dense_update: bool) -> tuple[np.ndarray, np.ndarray]:
    """(async worker, one process): the dense values float32[STEPS, 15] each step of a
    linear regression computed its gradient on, same data, SGD."""
    rng = np.random.default_rng(4)
    xs = torch.from_numpy(rng.normal(size=(STEPS, 8, 4)).astype(np.float32))
    ys = torch.from_numpy(rng.normal(size=(STEPS, 8, 3)).astype(np.float32))
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 3)
    model = torch.nn.Linear(4, 3)
    model.load_state_dict(reference.state_dict())
    plain = torch.optim.SGD(reference.parameters(), lr=LR)
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR))
    _, server = start_server("127.0.0.1", 0, CONFIG, TableService())
    client = RemoteClient([server.endpoint], CONFIG, 0)
    # k_steps 3: values come back after every third send, so most steps lag
    communicator = AsyncCommunicator(client, AsyncConfig(
        k_steps=3, max_merge_var_num=1, local_dense_update=local_dense_update))
    seen, expected = [], []
    try:
        client.create_dense_table(DENSE, "dense", [tuple(p.shape) for p in model.parameters()],
                                  RuleConfig(name="sgd", learning_rate=LR),
                                  optimizer.flat_values())
        communicator.start()
        optimizer.bind(StepCollector(communicator, {}, DENSE))
        for x, y in zip(xs, ys, strict=True):
            for net, opt, log in ((model, optimizer, seen), (reference, plain, expected)):
                log.append(torch.cat([p.detach().reshape(-1) for p in net.parameters()]))
                opt.zero_grad()
                ((net(x) - y) ** 2).mean().backward()
                opt.step()
    finally:
        communicator.stop()
        client.close()
        server.stop(grace_s=0.5)
    assert communicator.staleness.max > 0  # installs did lag
    return torch.stack(seen).numpy(), torch.stack(expected).numpy()


def test_one_worker_computes_on_one_process_values_whatever_the_lag() -> None:
    seen, expected = _values_each_step_computes_on(local_dense_update=True)
    np.testing.assert_allclose(seen, expected, rtol=0, atol=1e-5)


def test_without_the_local_update_the_worker_computes_on_older_values() -> None:
    seen, expected = _values_each_step_computes_on(local_dense_update=False)
    assert np.abs(seen - expected).max() > 1e-2


def test_simulated_staleness_applies_each_push_that_many_steps_late() -> None:
    """Step s pushes gradient s (SGD, lr 0.1) to a dense and a sparse table; with a
    staleness of 2 the values after step s hold steps 1..s-2, and flush applies all."""
    client = LocalClient()
    sgd = RuleConfig(name="sgd", learning_rate=LR)
    client.create_dense_table(DENSE, "dense", [1], sgd, np.zeros(1, np.float32))
    client.create_sparse_table(0, SparseTableConfig(name="emb", dim=1, rule=sgd,
                                                    initial_range=0.0))
    key = np.array([9], np.uint64)
    communicator = LocalCommunicator(client, simulated_staleness("2"))
    dense, rows = [], []
    for step in range(1, 6):
        communicator.push_sparse(0, key, np.full((1, 1), step, np.float32))
        communicator.push_dense(DENSE, np.full(1, step, np.float32))
        communicator.end_step()
        dense.append(float(communicator.fresh_dense(DENSE)[0]))
        rows.append(float(client.pull_sparse(0, key)[0, 0]))
    applied = [-LR * sum(range(1, max(step - 1, 1))) for step in range(1, 6)]  # 1..s-2
    np.testing.assert_allclose(dense, applied, atol=1e-6)
    np.testing.assert_allclose(rows, applied, atol=1e-6)
    communicator.flush()
    np.testing.assert_allclose(client.pull_dense(DENSE), [-LR * 15], atol=1e-6)


def test_simulated_staleness_of_one_kind_and_bad_values() -> None:
    assert simulated_staleness("") == (0, "all")
    assert simulated_staleness("4:dense") == (4, "dense")
    assert simulated_staleness("3:sparse") == (3, "sparse")
    for bad in ("-1", "two", "2:both", "2:"):
        with pytest.raises(ConfigError, match="PSFLEET_SIMULATE_STALENESS: .* is not STEPS"):
            simulated_staleness(bad)


def test_async_dense_rule_lowers_adams_momentum_by_what_asynchrony_adds() -> None:
    adam = RuleConfig(name="adam", learning_rate=0.001, beta1=0.9)
    assert async_dense_rule(adam, 1) == adam
    assert async_dense_rule(adam, 2).beta1 == pytest.approx(0.4)
    assert async_dense_rule(adam, 4).beta1 == pytest.approx(0.15)
    assert async_dense_rule(adam, 16).beta1 == 0.0  # floored
    assert async_dense_rule(adam, 2).model_dump(exclude={"beta1"}) == adam.model_dump(
        exclude={"beta1"})
    sgd = RuleConfig(name="sgd", learning_rate=0.1)
    assert async_dense_rule(sgd, 4) == sgd  # no momentum to lower


def test_the_local_step_computes_the_tables_rule() -> None:
    for rule in (RuleConfig(name="adam", learning_rate=0.01, beta1=0.4, beta2=0.99,
                            epsilon=1e-6),
                 RuleConfig(name="adagrad", learning_rate=0.1, epsilon=1e-7,
                            initial_accumulator=0.1),
                 RuleConfig(name="sgd", learning_rate=0.1)):
        start = np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 6)
        param = torch.nn.Parameter(torch.from_numpy(start.copy()))
        optimizer = LocalStep([param], rule)
        table_rule = make_rule(rule)
        values, state = start.copy(), table_rule.init_state(1, 6)
        for step in range(3):
            grad = np.full((1, 6), 0.5 - step, np.float32)
            param.grad = torch.from_numpy(grad.copy())
            optimizer.step()
            table_rule.update(values, state, grad)
        np.testing.assert_allclose(param.detach().numpy(), values, rtol=0, atol=1e-6,
                                   err_msg=rule.name)


def _dense_rule_on_the_server(correction: bool) -> RuleConfig:
    """The dense table's rule a 2-worker async job creates on its server."""
    service = TableService()
    _, server = start_server("127.0.0.1", 0, CONFIG, service)
    strategy = DistributedStrategy(mode="async", a_sync_configs={
        "momentum_correction": correction})

    def worker(index: int) -> WorkerRuntime:
        model = torch.nn.Linear(3, 1)
        config = RuntimeConfig(RoleInfo(Role.WORKER, index, 2,
                                        server_endpoints=[server.endpoint]),
                               strategy, CONFIG, 20.0)
        optimizer = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01))
        return WorkerRuntime.connect(config, ParameterServerHooks(), optimizer, [])

    try:
        with ThreadPoolExecutor(2) as pool:  # both workers meet at the start barrier
            runtimes = list(pool.map(worker, (0, 1)))
        rules = {r.optimizer.dense_rule for r in runtimes}
        table = service.tables[runtimes[0].tables.dense_table_id]
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda r: r.stop(), runtimes))
    finally:
        server.stop(grace_s=0.5)
    assert rules == {table.config.rule}  # the workers' local steps use the table's rule
    return table.config.rule


def test_a_two_worker_async_job_creates_its_dense_table_with_corrected_momentum() -> None:
    assert _dense_rule_on_the_server(True).beta1 == pytest.approx(0.4)
    assert _dense_rule_on_the_server(False).beta1 == pytest.approx(0.9)


def test_an_unknown_rule_is_an_error_naming_it_not_sgd() -> None:
    """A rule the local step does not know once fell through to SGD silently."""
    rule = RuleConfig.model_construct(name="rmsprop", learning_rate=0.1)  # unvalidated
    with pytest.raises(ConfigError, match="rule.name: 'rmsprop' is not one of adagrad, adam, sgd"):
        LocalStep([torch.zeros(3)], rule)
