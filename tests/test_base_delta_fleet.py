"""Base/delta saves through the fleet API and the serving export built from them, on
the in-process tables of a one-worker job (``server_num`` 0).

``fleet.save_persistables(dirname, mode="base")`` then, after more training,
``mode="delta"``: the manifests record the save mode; ``load_model`` of the base then
of the delta restores the table as it was at the delta (keys and rows with rule
state); ``psfleet.export.export_from_saves`` of base + delta writes the same sparse
rows as ``save_inference_model`` of the live tables, and the exported model scores a
batch as the live model does. A bad mode is a ConfigError naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from psfleet.errors import ConfigError
from psfleet.export import export_from_saves, load_inference_model
from psfleet.fleet import DistributedOptimizer, Fleet, Role, UserDefinedRoleMaker
from psfleet.nn import SparseEmbedding

pytestmark = pytest.mark.unit

DIM = 3
# Every pushed row gets show >= 1, so delta_score >= 0.1 passes the delta threshold;
# rows not pushed since the base are left out of the delta.
ACCESSOR = {"name": "ctr", "base_threshold": 0.0, "delta_threshold": 0.05,
            "delta_keep_days": 1e9}


class Model(torch.nn.Module):
    num_slots = 3
    num_dense = 2

    def __init__(self) -> None:
        super().__init__()
        self.emb = SparseEmbedding(DIM, name="base_delta_fleet_emb", accessor=ACCESSOR)
        self.dense = torch.nn.Linear(DIM + 2, 1)

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids).sum(dim=1)  # [B, DIM]
        return self.dense(torch.cat([h, dense], dim=1)).squeeze(1)  # [B]


def _train(f: Fleet, model: Model, optimizer: DistributedOptimizer,
           rng: np.random.Generator, low: int, high: int) -> None:
    with f.join():
        for _ in range(4):
            ids = torch.from_numpy(rng.integers(low, high, size=(8, 3)))
            loss = model(ids, torch.ones(8, 2)).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step(labels=torch.from_numpy(rng.integers(0, 2, size=8)).float())


def test_base_and_delta_through_the_fleet_and_the_export(tmp_path: Path) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(2)
    model = Model()
    f = Fleet()
    f.init(UserDefinedRoleMaker(0, Role.WORKER, 1, []))
    optimizer = f.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    f.init_worker()
    try:
        base, delta = tmp_path / "base", tmp_path / "delta"
        _train(f, model, optimizer, rng, 1, 50)
        f.save_persistables(str(base), mode="base")
        _train(f, model, optimizer, rng, 30, 90)
        f.save_persistables(str(delta), mode="delta")
        with pytest.raises(ConfigError, match="mode 'bogus'"):
            f.save_persistables(str(tmp_path / "bad"), mode="bogus")  # type: ignore[arg-type]
        for folder, mode in ((base, "base"), (delta, "delta")):
            assert json.loads((folder / "manifest.json").read_text())["save_mode"] == mode
        service = f.client.service  # type: ignore[attr-defined]
        table = service.tables[model.emb.table_id]
        live_keys, live_rows = table.items()
        assert live_keys.size > 50
        saved = np.load(delta / "server-0/table-0.stats")["keys"]
        assert 0 < saved.size < live_keys.size  # the rows pushed since the base only
        f.load_model(str(base))
        assert service.tables[model.emb.table_id].items()[0].size < live_keys.size
        f.load_model(str(delta))
        keys, rows = service.tables[model.emb.table_id].items()
        np.testing.assert_array_equal(keys, live_keys)
        np.testing.assert_array_equal(rows, live_rows)
        f.save_inference_model(str(tmp_path / "live_model"), model)
        export_from_saves(tmp_path / "chain_model", model, base, [delta])
        for name in ("table-0.keys.npy", "table-0.values.npy"):
            np.testing.assert_array_equal(np.load(tmp_path / "chain_model/sparse" / name),
                                          np.load(tmp_path / "live_model/sparse" / name))
        served = load_inference_model(tmp_path / "chain_model")
        ids = torch.from_numpy(rng.integers(1, 120, size=(5, 3)))
        with f.join(), torch.no_grad():
            want = model(ids, torch.ones(5, 2))
        torch.testing.assert_close(served(ids, torch.ones(5, 2)), want)
    finally:
        f.stop_worker()
