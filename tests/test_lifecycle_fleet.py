"""``fleet.shrink()`` and ``fleet.set_date()`` on the in-process tables of a one-worker
job (``server_num`` 0): set_date ages every row of a ctr table by a day, shrink deletes
the rows unseen longer than ``delete_after_unseen_days`` (a reference set) and returns
how many; the model's own tables (no ctr accessor) keep every row. Before init_worker
both are a FatalError.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from psfleet.errors import FatalError
from psfleet.fleet import Fleet, Role, UserDefinedRoleMaker
from psfleet.nn import SparseEmbedding
from psfleet.ps import RuleConfig, SparseTableConfig

pytestmark = pytest.mark.unit

DIM = 3
CTR_TABLE = 40  # a table id the model's embeddings do not take


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = SparseEmbedding(DIM, name="lifecycle_fleet_emb")
        self.dense = torch.nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dense(self.emb(ids).sum(dim=1)).sum()  # [B, S, DIM] -> scalar


def test_set_date_and_shrink_through_the_fleet() -> None:
    model = Model()
    f = Fleet()
    f.init(UserDefinedRoleMaker(0, Role.WORKER, 1, []))
    # This model's tables only: embeddings other tests left alive in this process
    # (not yet collected) would otherwise be created too, and their names may clash.
    f.distributed_model(model)
    with pytest.raises(FatalError, match="init_worker"):
        f.shrink()
    optimizer = f.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    f.init_worker()
    try:
        client = f.client
        client.create_sparse_table(CTR_TABLE, SparseTableConfig(
            name="ctr", dim=DIM, rule=RuleConfig(name="sgd", learning_rate=0.1),
            accessor={"name": "ctr", "delete_after_unseen_days": 1,
                      "delete_threshold": 0.0, "show_click_decay_rate": 1.0}))
        keys = np.arange(1, 41, dtype=np.uint64)
        grads = np.zeros((keys.size, DIM), np.float32)
        client.pull_sparse(CTR_TABLE, keys)
        client.push_sparse(CTR_TABLE, keys, grads, shows=np.ones(keys.size, np.float32),
                           clicks=np.zeros(keys.size, np.float32))
        with f.join():  # the model's table gets rows too
            loss = model(torch.tensor([[1, 2, 3]]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        f.set_date(day_id="20261124")
        seen = keys[::4]
        client.push_sparse(CTR_TABLE, seen, grads[: seen.size],
                           shows=np.full(seen.size, 2, np.float32),
                           clicks=np.ones(seen.size, np.float32))
        f.set_date(CTR_TABLE, "20261125")
        assert f.shrink(threshold=0.5) == keys.size - seen.size
        service = client.service  # type: ignore[attr-defined]
        np.testing.assert_array_equal(service.tables[CTR_TABLE].items()[0], seen)
        model_table = service.tables[model.emb.table_id]
        assert len(model_table) == 3  # ids 1, 2, 3: no ctr accessor, nothing deleted
        stats = {t.table_id: t for t in f.server_stats()[0].tables}
        assert stats[CTR_TABLE].deleted == keys.size - seen.size
        assert f.shrink() == 0
    finally:
        f.stop_worker()
