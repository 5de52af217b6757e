"""Global batch aggregation (GBA, ``a_sync_configs.global_batch_aggregation``) over
in-process servers on 127.0.0.1 with real gRPC.

- The servers apply one SGD step per global batch of ``worker_num`` batches, with
  their mean, whichever workers pushed them (one worker twice in a batch; a merged
  push counts its batches), and a flush applies the partial batch: checked against
  numpy, sparse rows and dense values, on two servers (every push reaches both).
- A push computed on values more than ``max_staleness`` global batches old is scaled
  by max_staleness / staleness.
- Two communicators in threads: every gradient is applied once (the counter row and
  the dense values move by exactly the number of global batches).
- The setting's errors name the field.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_modes import (
    DENSE,
    DENSE_TOTAL,
    DIM,
    LR,
    SGD,
    SPARSE,
    _dense_init,
    _initial_rows,
    servers,
    worker_client,
)

from psfleet.ps.communicator import (
    AsyncCommunicator,
    AsyncConfig,
    CommunicatorSettings,
    GlobalBatchCommunicator,
    make_communicator,
)
from psfleet.ps.global_batch import staleness_weight
from psfleet.ps.types import PushMode

pytestmark = pytest.mark.service

KEYS = np.arange(1, 11, dtype=np.uint64)


def _push(client, keys: np.ndarray, grads: np.ndarray, dense: np.ndarray,  # type: ignore[no-untyped-def]
          batches: int = 1, max_staleness: int = 0) -> None:
    options = {"mode": PushMode.AGGREGATE, "worker_num": 2, "batches": batches,
               "max_staleness": max_staleness}
    client.start_push_sparse(SPARSE, keys, grads, **options).result()
    client.start_push_dense(DENSE, dense, **options).result()


def test_a_global_batch_of_any_workers_pushes_is_applied_once_as_their_mean() -> None:
    rng = np.random.default_rng(5)

    def batch() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keys = np.unique(rng.choice(KEYS, size=5))
        return (keys, rng.normal(size=(keys.size, DIM)).astype(np.float32),
                rng.normal(size=DENSE_TOTAL).astype(np.float32))

    # (worker, batches in the push): worker 0 twice in the first global batch, a merged
    # push of 2 batches as the second, then one lone batch that only a flush applies
    plan = [(0, 1), (0, 1), (1, 2), (1, 1)]
    pushes = [(w, n, batch()) for w, n in plan]
    rows = _initial_rows(KEYS).astype(np.float64)
    dense = _dense_init().astype(np.float64)
    for group in ([0, 1], [2], [3]):  # the global batches, the last one partial
        batches = sum(pushes[i][1] for i in group)
        for i in group:
            keys, grads, dense_grads = pushes[i][2]
            rows[np.searchsorted(KEYS, keys)] -= LR * grads / batches
            dense -= LR * dense_grads / batches

    with servers(2) as endpoints, worker_client(endpoints, 0) as w0, \
            worker_client(endpoints, 1) as w1:
        clients = (w0, w1)
        w0.pull_sparse(SPARSE, KEYS)  # rows appear on first pull
        seen = []
        for worker, batches, (keys, grads, dense_grads) in pushes:
            _push(clients[worker], keys, grads, dense_grads, batches)
            seen.append(w0.pull_dense(DENSE))
        w1.start_apply_global_batches([SPARSE, DENSE], 2).result()
        got_rows = w0.pull_sparse(SPARSE, KEYS, create=False)
        got_dense = w0.pull_dense(DENSE)

    np.testing.assert_array_equal(seen[0], _dense_init())  # half a global batch: waits
    assert not np.array_equal(seen[1], _dense_init())
    np.testing.assert_array_equal(seen[2], seen[3])  # the lone batch waits for a flush
    np.testing.assert_allclose(got_rows, rows, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got_dense, dense, rtol=0, atol=1e-6)


def test_a_push_older_than_max_staleness_global_batches_is_decayed() -> None:
    ones = np.ones((KEYS.size, DIM), np.float32)
    dense_ones = np.ones(DENSE_TOTAL, np.float32)
    with servers(1) as endpoints, worker_client(endpoints, 0) as w0, \
            worker_client(endpoints, 1) as w1:
        w0.pull_sparse(SPARSE, KEYS)
        w1.pull_dense(DENSE)  # worker 1's token: version 0
        for _ in range(4):  # four global batches from worker 0 (2 batches each)
            _push(w0, KEYS, ones, dense_ones, batches=2)
        before = w0.pull_dense(DENSE)
        # worker 1's batch is 4 global batches old: with max_staleness 1 it counts 1/4
        _push(w1, KEYS, ones, dense_ones, batches=2, max_staleness=1)
        after = w0.pull_dense(DENSE)
        w1.pull_dense(DENSE)  # a new token: not stale any more
        _push(w1, KEYS, ones, dense_ones, batches=2, max_staleness=1)
        fresh = w0.pull_dense(DENSE)

    # a push of gradient 1 summing 2 batches: a mean of 0.5 per global batch
    np.testing.assert_allclose(before - after, LR * 0.5 * 0.25, rtol=0, atol=1e-6)
    np.testing.assert_allclose(after - fresh, LR * 0.5, rtol=0, atol=1e-6)
    assert staleness_weight(4, 1) == 0.25 and staleness_weight(4, 0) == 1.0
    assert staleness_weight(2, 2) == 1.0


def test_two_communicators_apply_every_gradient_once() -> None:
    """Worker 0 runs 7 steps and worker 1 runs 4, in turns while both run (11 batches:
    5 global batches, then one batch of worker 0 that worker 1's stop applies), each
    pushing gradient 1 on one counter key and on every dense value: every global batch
    moves both by LR, and nothing moves until a global batch is complete."""
    counter = np.array([100], np.uint64)
    config = AsyncConfig(global_batch_aggregation=True, max_merge_var_num=1)
    settings = CommunicatorSettings(async_config=config, worker_num=2)
    order = [0, 1] * 4 + [0, 0, 0]
    with servers(2) as endpoints, worker_client(endpoints, 0) as c0, \
            worker_client(endpoints, 1) as c1:
        comms = [make_communicator("async", c, settings) for c in (c0, c1)]
        for comm in comms:
            comm.on_sparse_table(SPARSE, None)  # type: ignore[arg-type]
            comm.on_dense_table(DENSE, None, _dense_init())  # type: ignore[arg-type]
            assert isinstance(comm, GlobalBatchCommunicator)
            comm.start()
        try:
            first = None
            for worker in order:
                comm = comms[worker]
                comm.pull_sparse(SPARSE, counter)
                comm.push_sparse(SPARSE, counter, np.ones((1, DIM), np.float32))
                comm.push_dense(DENSE, np.ones(DENSE_TOTAL, np.float32))
                comm.end_step()
                AsyncCommunicator.flush(comm)  # sent (no partial global batch applied)
                if first is None:
                    first = c0.pull_dense(DENSE)
            before_stop = c0.pull_dense(DENSE)
        finally:
            for comm in (comms[1], comms[0]):
                comm.stop()
        row = c0.pull_sparse(SPARSE, counter, create=False)[0]
        dense = c0.pull_dense(DENSE)

    np.testing.assert_array_equal(first, _dense_init())  # half a global batch: waits
    np.testing.assert_allclose(before_stop, _dense_init() - LR * 5, rtol=0, atol=1e-5)
    np.testing.assert_allclose(row, _initial_rows(counter)[0] - LR * 6, rtol=0, atol=1e-5)
    np.testing.assert_allclose(dense, _dense_init() - LR * 6, rtol=0, atol=1e-5)


def test_max_staleness_below_zero_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"strategy\.a_sync_configs\.max_staleness: -1"):
        AsyncConfig(global_batch_aggregation=True, max_staleness=-1)


def test_a_copy_snapshot_applies_the_partial_global_batch_first() -> None:
    """A rejoining server is filled from a snapshot that holds no partial global batch
    (the primary applies it first), so both copies gather the next one alike."""
    from psfleet.ps import LocalClient

    client = LocalClient()
    client.create_dense_table(DENSE, "dense", [DENSE_TOTAL], SGD, _dense_init())
    client.start_push_dense(DENSE, np.ones(DENSE_TOTAL, np.float32), PushMode.AGGREGATE,
                            worker_num=2).result()
    np.testing.assert_array_equal(client.pull_dense(DENSE), _dense_init())  # half: waits
    snapshot, _, _ = client.service.copy_snapshot()
    assert snapshot  # the tables' save files
    np.testing.assert_allclose(client.pull_dense(DENSE), _dense_init() - LR, atol=1e-6)
    after = client.pull_dense(DENSE)
    client.start_push_dense(DENSE, np.ones(DENSE_TOTAL, np.float32), PushMode.AGGREGATE,
                            worker_num=2).result()
    np.testing.assert_array_equal(client.pull_dense(DENSE), after)  # a new global batch
