"""Every setting declared once, every rule checked on load (issue 13, item 3).

In process, on real files: the vocabulary (modes, rule and optimizer names,
initializers, roles) has one declaration that every user agrees with; the runner's
cross-field rules fail ``load_config`` naming the field path; the data checks of
``check_before_start`` name the field and the file; the server wait timeout has one
resolver. The CLI side (exit 2, no process started) is in test_bad_input.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import numpy as np
import pytest
import yaml

from psfleet.errors import ConfigError, DataError
from psfleet.ps.types import (
    INITIALIZERS,
    OPTIMIZER_CLASSES,
    RULE_NAMES,
    RuleConfig,
    SlicingConfig,
    SparseTableConfig,
)
from psfleet.rec.config import TrainConfig
from psfleet.rec.config_load import load_config
from psfleet.rec.preflight import check_before_start, check_data_files
from psfleet.types import MODES, Mode, Role

pytestmark = pytest.mark.unit

GOOD_LINE = "0\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["68fd1e64"] * 26) + "\n"


def _write_config(tmp_path: Path, **sections: dict[str, object]) -> Path:
    """A YAML config in tmp_path training on one good line, with ``sections`` merged in."""
    data = tmp_path / "train.txt"
    if not data.exists():
        data.write_text(GOOD_LINE * 4)
    raw: dict[str, dict[str, object]] = {"runner": {"train_data_dir": str(data)},
                                         "cluster": {"server_num": 0, "worker_num": 1}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# -- vocabulary: one declaration, every user agrees ---------------------------------------


def test_modes_are_the_communicator_registry_modes() -> None:
    from psfleet.ps.communicator.registry import COMMUNICATORS as REGISTRY

    assert MODES == ("sync", "async", "geo", "gpubox", "collective")
    assert set(MODES) <= set(REGISTRY)  # every mode has a communicator ("local" besides)


def test_mode_fields_take_the_one_declaration() -> None:
    from psfleet.fleet.strategy import DistributedStrategy
    from psfleet.rec.config import RunnerConfig

    assert DistributedStrategy.model_fields["mode"].annotation == Mode
    assert RunnerConfig.model_fields["sync_mode"].annotation == Mode


def test_rule_names_are_the_rules_registry() -> None:
    from psfleet.ps.table.rules import RULES

    assert set(RULE_NAMES) == set(RULES)
    for name in RULE_NAMES:
        assert RuleConfig(name=name).name == name  # type: ignore[arg-type]


def test_optimizer_classes_map_onto_rules() -> None:
    import torch

    from psfleet.fleet.optimizer import rule_from_optimizer, rule_of_class

    param = [torch.nn.Parameter(torch.zeros(2))]
    rules = {name: rule_from_optimizer(getattr(torch.optim, name)(param, lr=0.1))
             for name in OPTIMIZER_CLASSES}
    assert {rule.name for rule in rules.values()} == set(RULE_NAMES)
    # The runner's rules (from the class's defaults, no optimizer built) are the same.
    assert {name: rule_of_class(name, 0.1) for name in OPTIMIZER_CLASSES} == rules
    assert rules["Adagrad"].epsilon == 1e-10  # torch's default, not RuleConfig's
    with pytest.raises(ConfigError, match="'RMSprop' has no table rule; use one of"):
        rule_of_class("RMSprop", 0.1)


def test_a_distributed_optimizer_takes_an_optimizer_or_params_and_a_rule() -> None:
    import torch

    from psfleet.fleet import DistributedOptimizer
    from psfleet.ps.types import RuleConfig

    param = torch.nn.Parameter(torch.ones(2))
    by_rule = DistributedOptimizer(params=[param], rule=RuleConfig(name="sgd", learning_rate=1))
    assert by_rule.params == [param] and by_rule.rule.name == "sgd"
    param.grad = torch.ones(2)
    by_rule.zero_grad(set_to_none=False)
    assert param.grad is not None and param.grad.tolist() == [0.0, 0.0]
    by_rule.zero_grad()
    assert param.grad is None
    sgd = torch.optim.SGD([param], lr=1)
    for bad in ({}, {"params": [param]}, {"optimizer": sgd, "rule": by_rule.rule}):
        with pytest.raises(ConfigError, match="give a torch optimizer, or params and rule"):
            DistributedOptimizer(**bad)  # type: ignore[arg-type]


def test_every_initializer_makes_rows() -> None:
    from psfleet.ps.hashing import init_rows

    keys = np.arange(1, 65, dtype=np.uint64)
    rows = {kind: init_rows(keys, 4, kind, 0.1, 0) for kind in INITIALIZERS}
    assert set(rows) == {"uniform", "normal", "zeros"}
    assert not rows["zeros"].any()
    assert np.abs(rows["uniform"]).max() <= 0.1
    assert rows["normal"].std() > 0.05
    for kind in INITIALIZERS:
        assert SparseTableConfig(name="t", dim=4, initializer=kind).initializer == kind  # type: ignore[arg-type]


def test_runner_parsers_are_registered_parsers() -> None:
    from psfleet.data.parsers import parser_names
    from psfleet.rec.config import RunnerConfig

    assert set(get_args(RunnerConfig.model_fields["parser"].annotation)) <= set(parser_names())


def test_transpiler_config_takes_the_slicing_declaration() -> None:
    from psfleet.fleet.transpiler_config import DistributeTranspilerConfig, SplitMethod
    from psfleet.ps.types import SplitMethod as Declared

    config = DistributeTranspilerConfig()
    assert SplitMethod is Declared
    assert (config.slice_var_up, config.split_method, config.min_block_size) == tuple(
        SlicingConfig().model_dump().values())


def test_one_role_for_fleet_and_launcher() -> None:
    from psfleet.fleet.role_maker import Role as FleetRole
    from psfleet.launch import Role as LaunchRole

    assert FleetRole is Role and LaunchRole is Role
    assert Role("PSERVER") is Role.SERVER and Role("TRAINER") is Role.WORKER
    assert (Role.SERVER.paddle_name, Role.WORKER.paddle_name) == ("PSERVER", "TRAINER")
    assert (Role.SERVER.word, Role.WORKER.word) == ("server", "worker")
    assert (Role.SERVER.log_prefix, Role.WORKER.log_prefix) == ("serverlog", "workerlog")


def test_strategy_slicing_fields_are_slicing_configs() -> None:
    from psfleet.fleet.strategy import DistributedStrategy

    for name, field in SlicingConfig.model_fields.items():
        mine = DistributedStrategy.model_fields[name]
        assert (mine.default, mine.metadata) == (field.default, field.metadata), name
    assert DistributedStrategy().slicing() == SlicingConfig()
    strategy = DistributedStrategy(slice_var_up=False, split_method="HashName",
                                   min_block_size=512)
    assert strategy.slicing() == SlicingConfig(slice_var_up=False, split_method="HashName",
                                               min_block_size=512)
    for bad in ({"min_block_size": 0}, {"split_method": "Random"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DistributedStrategy(**bad)  # type: ignore[arg-type]


# -- cross-field rules: load_config names the fields ------------------------------------


@pytest.mark.parametrize(("sections", "expected"), [
    ({"runner": {"use_gpu": True}},
     ["runner.use_gpu", "trains on CPU", "use_gpu: false"]),
    ({"runner": {"use_gpu": True, "sync_mode": "collective"}},
     ["runner.use_gpu", "trains on CPU", "use_gpu: false"]),
    ({"runner": {"sync_mode": "collective"}, "cluster": {"server_num": 1}},
     ["cluster.server_num: 1", "collective", "server_num: 0"]),
    ({"cluster": {"worker_num": 2}}, ["cluster.worker_num: 2", "server_num >= 1"]),
    ({"runner": {"global_shuffle": True}},
     ["runner.global_shuffle", "InMemoryDataset", "DataLoader"]),
    ({"runner": {"parser": "csv"}}, ["runner.columns", "required", "csv"]),
    ({"runner": {"columns": {"label": "y", "dense": [], "sparse": ["a"]}}},
     ["runner.columns", "not used by runner.parser: criteo"]),
    ({"runner": {"sync_mode": "sync", "reader_type": "QueueDataset",
                 "pipe_command": "cat"}, "cluster": {"server_num": 1, "worker_num": 2}},
     ["runner.reader_type: QueueDataset", "runner.pipe_command", "runner.sync_mode: sync"]),
    ({"runner": {"sync_mode": "asyc"}}, ["runner.sync_mode", "'asyc'", "'collective'"]),
    ({"hyper_parameters": {"embedding_initializer": "ones"}},
     ["hyper_parameters.embedding_initializer", "'ones'", "'zeros'"]),
    ({"runner": {"sync_mode": "collective"}, "cluster": {"worker_num": 2, "tls": "self-signed"}},
     ["cluster.tls", "collective has no gRPC channels", "remove cluster.tls"]),
    ({"cluster": {"server_num": 1, "tls": "yes"}}, ["cluster.tls", "'self-signed'"]),
    ({"runner": {"lr_scaling": "sqrt"}},
     ["runner.lr_scaling 'sqrt'", "sync, geo, collective", "mode 'async'",
      "set lr_scaling to 'none'"]),
], ids=["use_gpu_ps_mode", "use_gpu_collective", "collective_with_servers",
        "workers_without_servers", "global_shuffle_reader", "csv_without_columns",
        "columns_unused", "queue_pipe_sync", "bad_mode", "bad_initializer",
        "tls_collective", "tls_unknown", "lr_scaling_async"])
def test_cross_field_rules_fail_on_load(tmp_path: Path, sections: dict[str, dict[str, object]],
                                        expected: list[str]) -> None:
    path = _write_config(tmp_path, **sections)

    with pytest.raises(ConfigError) as info:
        load_config(path)

    message = str(info.value)
    assert message.startswith(str(path)), message
    for text in expected:
        assert text in message, message
    assert "Value error" not in message


def test_rules_hold_for_configs_made_in_code(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="runner.use_gpu"):
        TrainConfig.model_validate({"runner": {"train_data_dir": str(tmp_path),
                                               "use_gpu": True}})


def test_a_good_config_loads_and_passes_the_checks(tmp_path: Path) -> None:
    config = load_config(_write_config(tmp_path, runner={"sync_mode": "sync"}))

    check_before_start(config)
    assert config.runner.needs_equal_steps
    assert config.cluster.server_wait_timeout_s is None  # unset: resolved at run time


# -- data checks ------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "what"), [
    ("", "0 bytes"), ("\n\n   \n\t\n", "only blank lines")], ids=["zero_bytes", "blank"])
def test_an_empty_data_file_is_named(tmp_path: Path, content: str, what: str) -> None:
    good, empty = tmp_path / "part-0.txt", tmp_path / "part-1.txt"
    good.write_text(GOOD_LINE)
    empty.write_text(content)

    with pytest.raises(DataError) as info:
        check_data_files("runner.test_data_dir", [good, empty])
    message = str(info.value)

    assert message.startswith("runner.test_data_dir: ")
    assert repr(str(empty)) in message
    assert f"is empty ({what})" in message
    assert "remove it" in message


def test_an_empty_file_in_a_data_folder_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "a.txt").write_text(GOOD_LINE)
    (folder / "b.txt").write_text("")
    config = load_config(_write_config(tmp_path, runner={"train_data_dir": str(folder)}))

    with pytest.raises(DataError, match=r"runner.train_data_dir: .*b\.txt.* is empty"):
        check_before_start(config)


def test_a_folder_without_files_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "nothing"
    (folder / "sub").mkdir(parents=True)
    (folder / ".hidden").write_text(GOOD_LINE)
    config = load_config(_write_config(tmp_path, runner={"train_data_dir": str(folder)}))

    with pytest.raises(DataError) as info:
        check_before_start(config)
    message = str(info.value)

    assert message.startswith("runner.train_data_dir: ")
    assert str(folder) in message and "holds no data files" in message


def test_data_that_starts_past_the_first_block_is_data(tmp_path: Path) -> None:
    late = tmp_path / "late.txt"
    late.write_text("\n" * 200_000 + GOOD_LINE)

    assert check_data_files("runner.train_data_dir", late) == [late]


def test_too_few_whole_files_for_the_workers(tmp_path: Path) -> None:
    config = load_config(_write_config(tmp_path, runner={"split_file_list": False},
                                       cluster={"server_num": 1, "worker_num": 2}))

    with pytest.raises(ConfigError, match=r"runner\.split_file_list: False .* 1 files for "
                                          r"2 workers"):
        check_before_start(config)


def test_an_unknown_model_lists_the_known_ones(tmp_path: Path) -> None:
    config = load_config(_write_config(tmp_path, runner={"model": "dnnn"}))

    with pytest.raises(ConfigError, match=r"runner\.model: 'dnnn' is not one of .*dnn"):
        check_before_start(config)


def test_a_bad_simulated_staleness_fails_before_start(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(_write_config(tmp_path))
    monkeypatch.setenv("PSFLEET_SIMULATE_STALENESS", "2:both")

    with pytest.raises(ConfigError, match=r"PSFLEET_SIMULATE_STALENESS: '2:both' is not"):
        check_before_start(config)
    monkeypatch.setenv("PSFLEET_SIMULATE_STALENESS", "2:dense")
    check_before_start(config)  # a valid value passes


def test_a_memory_tier_too_small_for_one_request_fails_before_start(tmp_path: Path) -> None:
    path = _write_config(tmp_path, cluster={"server_num": 1, "worker_num": 2},
                         runner={"batch_size": 16, "sync_mode": "sync"})
    with pytest.raises(ConfigError, match=r"hyper_parameters\.sparse_accessor: a memory tier "
                                          r"of 1,000 rows .*\(up to 16 examples x 26 features "
                                          r"x 2 workers = 832 ids .* at least 1,664 rows"):
        check_before_start(load_config(path, ["hyper_parameters.sparse_accessor.memory_rows="
                                              "1000"]))
    check_before_start(load_config(path, ["hyper_parameters.sparse_accessor.memory_rows=1664"]))


# -- the server wait timeout: one resolver ----------------------------------------------


def test_server_wait_timeout_first_set_wins() -> None:
    from psfleet.fleet.server_wait import server_wait_timeout_s

    env = {"PSFLEET_SERVER_WAIT_TIMEOUT_S": "7.5"}
    assert server_wait_timeout_s(12.0, 30.0, environ=env) == 12.0  # runner config
    assert server_wait_timeout_s(None, 30.0, environ=env) == 30.0  # strategy
    assert server_wait_timeout_s(None, None, environ=env) == 7.5  # environment
    assert server_wait_timeout_s(None, environ={}) == 300.0  # declared default


@pytest.mark.parametrize("raw", ["soon", "0", "-3", "inf"])
def test_server_wait_timeout_bad_environment(raw: str) -> None:
    from psfleet.fleet.server_wait import server_wait_timeout_s

    with pytest.raises(ConfigError, match=f"PSFLEET_SERVER_WAIT_TIMEOUT_S: '{raw}'"):
        server_wait_timeout_s(None, environ={"PSFLEET_SERVER_WAIT_TIMEOUT_S": raw})


def test_mode_literal_is_the_tuple() -> None:
    assert get_args(Mode) == MODES


def test_runner_a_sync_configs_reach_the_strategy(tmp_path: Path) -> None:
    from psfleet.rec.config import strategy_of

    path = _write_config(tmp_path, runner={"a_sync_configs": {"send_queue_size": 2}})
    config = load_config(path, ["runner.a_sync_configs.k_steps=3"])
    strategy = strategy_of(config)
    assert (strategy.a_sync_configs.k_steps, strategy.a_sync_configs.send_queue_size,
            strategy.a_sync_configs.max_merge_var_num) == (3, 2, 16)
    assert strategy_of(load_config(path)).a_sync_configs.k_steps == 1
    # The YAML key is named as the YAML spells it, once (not the Python API's name).
    with pytest.raises(ConfigError, match=r"yaml: runner\.a_sync_configs\.max_merge: unknown "
                                          r"setting; the settings are k_steps"):
        load_config(path, ["runner.a_sync_configs.max_merge=1"])
    with pytest.raises(ConfigError, match=r"yaml: runner\.a_sync_configs\.send_queue_size: 0 "
                                          r"must be an integer >= 1$"):
        load_config(path, ["runner.a_sync_configs.send_queue_size=0"])


def test_lr_scaling_reaches_the_strategy_and_scales_the_averaging_modes(tmp_path: Path) -> None:
    from psfleet.fleet.strategy import DistributedStrategy
    from psfleet.rec.config import strategy_of

    path = _write_config(tmp_path, runner={"sync_mode": "sync", "lr_scaling": "sqrt"})
    strategy = strategy_of(load_config(path))
    assert strategy.lr_scaling == "sqrt"
    assert strategy.lr_factor(4) == 2.0 and strategy.lr_factor(1) == 1.0
    assert DistributedStrategy(mode="geo", lr_scaling="linear").lr_factor(3) == 3.0
    assert DistributedStrategy(mode="collective", lr_scaling="sqrt").lr_factor(2) == 2 ** 0.5
    # The default, auto: sqrt in geo, none in every other mode.
    assert DistributedStrategy(mode="geo").lr_factor(4) == 2.0
    for mode in ("sync", "async", "collective", "gpubox"):
        assert DistributedStrategy(mode=mode).lr_factor(8) == 1.0, mode
    for mode in ("async", "gpubox"):
        with pytest.raises(ValueError, match=rf"lr_scaling 'linear'.*mode {mode!r}"):
            DistributedStrategy(mode=mode, lr_scaling="linear")


def test_global_batch_aggregation_is_scaled_as_sync_and_read_from_the_runner(
        tmp_path: Path) -> None:
    from psfleet.fleet.strategy import DistributedStrategy
    from psfleet.rec.config import strategy_of

    gba = {"global_batch_aggregation": True}
    path = _write_config(tmp_path, runner={"sync_mode": "async", "a_sync_configs": gba})
    strategy = strategy_of(load_config(path))
    assert strategy.a_sync_configs.global_batch_aggregation
    # auto: sqrt(W), as GEO; linear and none as asked
    assert strategy.lr_factor(4) == 2.0 and strategy.lr_factor(1) == 1.0
    assert DistributedStrategy(a_sync_configs=gba, lr_scaling="linear").lr_factor(3) == 3.0
    assert DistributedStrategy(a_sync_configs=gba, lr_scaling="none").lr_factor(4) == 1.0
    with pytest.raises(ConfigError, match=r"runner\.a_sync_configs\.max_staleness.*-2"):
        load_config(path, ["runner.a_sync_configs.max_staleness=-2"])
    # another mode would ignore it: refused, naming the setting
    with pytest.raises(ConfigError, match=r"runner\.a_sync_configs\.global_batch_aggregation"
                                          r".*mode is 'geo'"):
        load_config(path, ["runner.sync_mode=geo"])
    with pytest.raises(ValueError, match="mode is 'sync'"):
        DistributedStrategy(mode="sync", a_sync_configs=gba)
