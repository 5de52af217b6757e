"""``hyper_parameters.dropout`` (issue 45, item 1): it changes training, not evaluation.

- The config checks the rates: in [0, 1), one value or one per ``fc_sizes`` entry; an
  error names the key.
- Each built-in model's dense tower keeps its modules and parameter names (a
  checkpoint or export of a model trained with dropout loads as one without), gives
  the same output as without dropout in ``eval()``, and other outputs in ``train()``:
  the same masks for the same seed, other masks for another worker's seed.
- Trained alone (``server_num: 0``) on the Criteo sample, a run with dropout ends
  with other weights than one without; its test figures are those of the exported
  model scoring the same file (so neither the evaluation nor the export drops units).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import psfleet
from psfleet import fleet
from psfleet.errors import ConfigError
from psfleet.rec.config_load import load_config
from psfleet.rec.dropout import dropout_seed
from psfleet.rec.features import build_runner_model
from psfleet.rec.models.mlp import MLPTower, mlp_tower

pytestmark = [pytest.mark.unit, pytest.mark.slow]

MODELS = ["dnn", "wide_deep", "deepfm", "dcn_v2"]


def _config_file(repo_root: Path) -> Path:
    return repo_root / "examples" / "criteo_dnn" / "config.yaml"


@pytest.mark.parametrize(("value", "message"), [
    ("1.0", "hyper_parameters.dropout: 1.0 is not in [0, 1)"),
    ("-0.1", "hyper_parameters.dropout: -0.1 is not in [0, 1)"),
    ("[0.1, 0.2]", "hyper_parameters.dropout: [0.1, 0.2] has 2 rates but the tower has 4 "
                   "hidden layers"),
])
def test_bad_dropout_names_the_key(repo_root: Path, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(_config_file(repo_root), [f"hyper_parameters.dropout={value}"])
    assert message in str(caught.value)


def test_tower_drops_only_while_training() -> None:
    def tower(dropout: float | list[float], seed: int | None) -> torch.nn.Sequential:
        return mlp_tower([6, 8, 4, 1], torch.Generator().manual_seed(3), dropout, seed)

    plain, dropping = tower(0.0, None), tower([0.5, 0.25], 7)
    assert isinstance(dropping, MLPTower) and not isinstance(plain, MLPTower)
    assert plain.state_dict().keys() == dropping.state_dict().keys()
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(dropping.state_dict()[key], value, rtol=0, atol=0)
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(1))
    plain.eval()
    dropping.eval()
    torch.testing.assert_close(dropping(x), plain(x), rtol=0, atol=0)
    dropping.train()
    trained = dropping(x)
    assert not torch.equal(trained, plain(x))
    torch.testing.assert_close(tower([0.5, 0.25], 7)(x), trained, rtol=0, atol=0)
    assert not torch.equal(tower([0.5, 0.25], 8)(x), trained)


@pytest.mark.parametrize("model", MODELS)
def test_every_model_drops_in_its_tower(repo_root: Path, model: str) -> None:
    overrides = [f"runner.model={model}", "hyper_parameters.fc_sizes=[16, 8]"]
    torch.manual_seed(0)
    plain = build_runner_model(load_config(_config_file(repo_root), overrides))
    torch.manual_seed(0)
    config = load_config(_config_file(repo_root), [*overrides, "hyper_parameters.dropout=0.5"])
    dropping, other = build_runner_model(config, 0), build_runner_model(config, 1)
    assert plain.state_dict().keys() == dropping.state_dict().keys()
    towers = [m for m in dropping.modules() if isinstance(m, MLPTower)]
    assert len(towers) == 1 and towers[0].dropout == (0.5, 0.5)
    assert not any(isinstance(m, MLPTower) for m in plain.modules())
    (mine,), (theirs,) = ([m for m in built.modules() if isinstance(m, MLPTower)]
                          for built in (dropping, other))
    assert mine.dropout_generator is not None and theirs.dropout_generator is not None
    assert (mine.dropout_generator.initial_seed(), theirs.dropout_generator.initial_seed()) == (
        dropout_seed(2026, 0), dropout_seed(2026, 1))
    assert dropout_seed(2026, 0) != dropout_seed(2026, 1)


def _train(repo_root: Path, tmp_path: Path, name: str, dropout: float) -> psfleet.TrainResult:
    try:
        return psfleet.train(
            _config_file(repo_root),
            [f"hyper_parameters.dropout={dropout}", "hyper_parameters.fc_sizes=[64, 32]"],
            runner={"epochs": 2, "model_save_path": str(tmp_path / name)},
            cluster={"server_num": 0, "worker_num": 1})
    finally:
        fleet.reset()  # train leaves this process's fleet as a job's process does


def test_dropout_changes_training_not_evaluation(repo_root: Path, tmp_path: Path,
                                                 criteo_dir: Path) -> None:
    plain = _train(repo_root, tmp_path, "plain", 0.0)
    dropping = _train(repo_root, tmp_path, "dropout", 0.5)
    losses = [[epoch["loss"] for epoch in run.metrics["epochs"]] for run in (plain, dropping)]
    assert losses[0][0] != losses[1][0] and losses[0][1] != losses[1][1]
    assert plain.metrics["test"]["auc"] != dropping.metrics["test"]["auc"]
    # the evaluation and the export keep every unit: predict on the export scores the
    # test files exactly as the in-training evaluation did
    scored = psfleet.predict(dropping.run_dir, [criteo_dir / "dev.csv", criteo_dir / "test.csv"])
    assert scored["examples"] == dropping.metrics["test"]["examples"]
    assert abs(scored["auc"] - dropping.metrics["test"]["auc"]) <= 1e-9
    assert abs(scored["logloss"] - dropping.metrics["test"]["logloss"]) <= 1e-6
