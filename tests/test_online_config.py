"""The online-training keys of the runner config and the per-pass arithmetic, in process.

The YAML keys (``runner.train_passes``, ``runner.after_pass``,
``hyper_parameters.sparse_accessor``, ``tables[i].accessor``) load into the configs the
model is built with, and every bad value names its key path; the pass plan numbers
epochs across passes; a pass entry counts each lifecycle counter's growth during the
pass from the servers' Stats (summed over servers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from psfleet.errors import ConfigError
from psfleet.ps.types import AccessorConfig
from psfleet.rec.config_load import config_from_mapping, dump_config, load_config
from psfleet.rec.features import table_specs
from psfleet.rec.passes import PassBook, PassPlan, table_totals
from psfleet.rpc.messages import StatsResponse, TableStats

pytestmark = pytest.mark.unit

CTR = {"name": "ctr", "max_rows": 100, "eviction": "lowest_score"}


def _load(runner: dict[str, Any], **hp: Any) -> Any:
    raw = {"runner": {"train_passes": ["day-1", "day-2"], **runner},
           "hyper_parameters": hp, "cluster": {"server_num": 1, "worker_num": 1}}
    return config_from_mapping(raw, Path("/data"))


def test_passes_are_the_training_data_in_order_and_round_trip(tmp_path: Path) -> None:
    config = _load({"after_pass": {"shrink": True, "save": "delta"}}, sparse_accessor=CTR)
    runner = config.runner
    assert runner.train_passes == [Path("/data/day-1"), Path("/data/day-2")]
    assert runner.train_data_dir == runner.train_passes  # every pass, for the preflight
    assert (runner.after_pass.shrink, runner.after_pass.set_date, runner.after_pass.save,
            runner.after_pass.validates) == (True, False, "delta", True)
    (spec,) = table_specs(config.hyper_parameters, _schema(config))
    assert spec.accessor == AccessorConfig(**CTR)
    # a run folder's config.yaml reads back to the same config
    (tmp_path / "c.yaml").write_text(dump_config(config))
    assert load_config(tmp_path / "c.yaml") == config


def _schema(config: Any) -> Any:
    from psfleet.rec.config import parser_schema

    return parser_schema(config.runner)


def test_a_table_accessor_replaces_the_job_one() -> None:
    c = [f"C{i}" for i in range(1, 27)]
    config = _load({}, sparse_accessor=CTR, tables=[
        {"name": "ads", "features": c[:13], "accessor": {"name": "ctr", "max_rows": 7}},
        {"name": "users", "features": c[13:]}])
    specs = table_specs(config.hyper_parameters, _schema(config))
    assert [(s.name, s.accessor.max_rows) for s in specs] == [("ads", 7), ("users", 100)]
    assert specs[0].accessor.eviction == "lru"  # its own config, not merged with the job's


@pytest.mark.parametrize(("runner", "hp", "named"), [
    ({}, {"sparse_accessor": {"name": "ctr", "show_click_decay_rate": 1.5}},
     "hyper_parameters.sparse_accessor.show_click_decay_rate: 1.5"),
    ({}, {"sparse_accessor": {"name": "ctr", "nonclk_coeff": float("nan")}},
     "hyper_parameters.sparse_accessor.nonclk_coeff"),
    ({}, {"sparse_accessor": {"name": "ctr", "eviction": "lfu"}},
     "hyper_parameters.sparse_accessor.eviction: 'lfu' is not one of"),
    ({}, {"sparse_accessor": {"nmae": "ctr"}},
     "hyper_parameters.sparse_accessor.nmae: unknown key; did you mean 'name'?"),
    ({"after_pass": {"sve": "delta"}}, {},
     "runner.after_pass.sve: unknown key; did you mean 'save'?"),
    ({"after_pass": {"save": "partial"}}, {}, "runner.after_pass.save: 'partial' is not one of"),
    ({"after_pass": {"set_date": True}}, {}, "runner.after_pass.set_date: no table has the ctr"),
    ({"after_pass": {"validate": True}}, {}, "runner.after_pass.validate: true needs "
     "runner.valid_data_dir"),
    ({"early_stopping": {"patience": 2}, "valid_data_dir": "dev"}, {},
     "runner.early_stopping: not used with runner.train_passes"),
    ({"train_passes": []}, {}, "runner.train_passes: []"),
    ({"train_data_dir": "other"}, {}, "runner.train_data_dir: give either"),
    ({"sync_mode": "collective"}, {"sparse_accessor": {"name": "ctr"}},
     "sync_mode: collective"),
])
def test_bad_online_keys_name_their_path(runner: dict[str, Any], hp: dict[str, Any],
                                         named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(runner, **hp)
    assert named in str(caught.value)


def test_after_pass_needs_passes(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"runner": {"train_data_dir": "x",
                                               "after_pass": {"save": "full"}}}))
    with pytest.raises(ConfigError, match=r"runner.after_pass: needs runner.train_passes"):
        load_config(path)


def test_plan_numbers_epochs_across_passes() -> None:
    plan = PassPlan((Path("a"), Path("b"), Path("c")), epochs=2)
    assert plan.total_epochs == 6
    assert [plan.pass_of(e) for e in range(7)] == [0, 0, 1, 1, 2, 2, 2]  # 6: the end
    assert [e for e in range(6) if plan.ends_pass(e)] == [1, 3, 5]
    single = PassPlan(None, epochs=3)
    assert (single.count, single.total_epochs, single.ends_pass(2)) == (1, 3, False)


def _stats(*servers: dict[str, int]) -> list[StatsResponse]:
    return [StatsResponse(tables=[
        TableStats(name="embedding", rows=s["rows"], memory_bytes=s["bytes"],
                   admitted=s["admitted"], evicted=s["evicted"], deleted=s["deleted"],
                   spilled=s.get("spilled", 0), disk_rows=s.get("disk_rows", 0)),
        TableStats(name="dense", rows=10, memory_bytes=40)]) for s in servers]


def test_pass_entries_count_growth_summed_over_servers() -> None:
    a1 = {"rows": 5, "bytes": 50, "admitted": 9, "evicted": 3, "deleted": 1, "spilled": 4,
          "disk_rows": 2}
    b1 = {"rows": 4, "bytes": 40, "admitted": 6, "evicted": 2, "deleted": 0}
    totals = table_totals(_stats(a1, b1), ["embedding"])
    assert totals == {"embedding": {"rows": 9, "bytes": 90, "disk_rows": 2, "disk_bytes": 0,
                                    "admitted": 15, "rejected": 0, "evicted": 5,
                                    "deleted": 1, "spilled": 4, "promoted": 0}}
    book = PassBook([], None)
    book.record(0, 1, Path("d1"), totals, 1, None)
    a2 = {"rows": 6, "bytes": 60, "admitted": 12, "evicted": 4, "deleted": 3, "spilled": 9,
          "disk_rows": 3}
    b2 = {"rows": 7, "bytes": 70, "admitted": 10, "evicted": 2, "deleted": 1}
    second = book.record(1, 2, Path("d2"), table_totals(_stats(a2, b2), ["embedding"]),
                         3, "saves/pass-2")
    # disk_rows is the state after the pass; spilled, like admitted, its growth
    assert second["tables"]["embedding"] == {"rows": 13, "bytes": 130, "disk_rows": 3,
                                             "disk_bytes": 0, "admitted": 7, "rejected": 0,
                                             "evicted": 1, "deleted": 3, "spilled": 5,
                                             "promoted": 0}
    # a restarted server counts from 0 again: its total is the pass's count
    fresh = {"rows": 2, "bytes": 20, "admitted": 2, "evicted": 0, "deleted": 0}
    third = book.record(2, 3, Path("d3"), table_totals(_stats(fresh), ["embedding"]),
                        None, None)
    assert third["tables"]["embedding"]["admitted"] == 2
    assert [e["pass"] for e in book.entries] == [1, 2, 3]


def test_online_example_config_loads(repo_root: Path) -> None:
    folder = repo_root / "examples" / "criteo_dnn"
    config = load_config(folder / "config_online.yaml")
    runner, hp = config.runner, config.hyper_parameters
    assert runner.train_passes == [folder / "output_days" / f"day-{k}" for k in (1, 2, 3)]
    assert runner.after_pass is not None and runner.after_pass.save == "delta"
    assert runner.after_pass.shrink and runner.after_pass.set_date
    assert hp.sparse_accessor is not None and hp.sparse_accessor.name == "ctr"
    assert hp.accessors == [hp.sparse_accessor]
