"""What worker 0 reports of a run (psfleet.rec.reporting, psfleet.rec.curves), in
process: COPC against a hand computation, metrics.json written atomically, the
malformed lines of real passes, TensorBoard event files read back, and Ctrl-C in the
middle of the second epoch of a real one-process training on the Criteo sample (the
``interrupted`` entry, the finished epoch, the newest checkpoint).

The trainer's calls go to a fresh :class:`~psfleet.fleet.Fleet` (monkeypatched for the
module-level ``fleet``), so this process's own fleet stays uninitialised.
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_folder
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from psfleet.data import InMemoryDataset, Reader
from psfleet.errors import ConfigError, RpcError
from psfleet.fleet import Fleet
from psfleet.metrics import copc
from psfleet.rec import passes as passes_module
from psfleet.rec import readers as readers_module
from psfleet.rec import reporting as reporting_module
from psfleet.rec import resume as resume_module
from psfleet.rec import trainer as trainer_module
from psfleet.rec import validation as validation_module
from psfleet.rec.config_load import load_config
from psfleet.rec.curves import RunRecorder, server_scalars
from psfleet.rec.json_file import write_json_atomic
from psfleet.rec.reporting import MalformedTally, TrainingInterrupted
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "criteo_dnn" / "config.yaml"
#: The runner's modules that call the module-level ``fleet``: a test that trains in
#: process gives each a fresh Fleet.
RUNNER_MODULES_WITH_FLEET = (passes_module, readers_module, reporting_module, resume_module,
                             trainer_module, validation_module)


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``folder``: tag -> [(step, value)]."""
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def test_copc_is_clicks_over_predicted_clicks() -> None:
    labels = [1, 0, 1, 0, 0, 0]
    probs = [0.5, 0.2, 0.4, 0.1, 0.3, 0.0]
    # 2 clicks, 0.5 + 0.2 + 0.4 + 0.1 + 0.3 + 0.0 = 1.5 predicted clicks
    assert copc(labels, probs) == pytest.approx(2 / 1.5, rel=1e-12)
    assert copc(np.array([0, 0]), np.array([0.25, 0.25])) == 0.0  # no click
    assert math.isnan(copc([], []))
    assert math.isnan(copc([1, 0], [0.0, 0.0]))
    with pytest.raises(ConfigError, match=r"probs: must be in \[0, 1\]"):
        copc([1, 0], [2.0, -1.0])  # logits, not probabilities
    with pytest.raises(ConfigError, match="labels: must be 0 or 1"):
        copc([2, 0], [0.5, 0.5])


def test_metrics_json_is_replaced_atomically_and_nan_becomes_null(tmp_path: Path) -> None:
    path = tmp_path / "out" / "metrics.json"
    write_json_atomic(path, {"auc": float("nan"), "epochs": [{"loss": 0.5}]})
    assert json.loads(path.read_text()) == {"auc": None, "epochs": [{"loss": 0.5}]}
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})  # fails before the rename
    assert json.loads(path.read_text()) == {"auc": None, "epochs": [{"loss": 0.5}]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["metrics.json"]  # no temp


def test_malformed_lines_of_real_passes_are_counted_once_per_pass(
        data_slice: Callable[..., Path]) -> None:
    path = data_slice(300)
    with path.open("a", encoding="utf-8") as f:
        f.write("not a criteo line\n1\t2\n")  # lines 301 and 302
    dataset = InMemoryDataset(64, "criteo", max_malformed_fraction=0.05)
    dataset.set_filelist([path])
    dataset.load_into_memory()
    tally = MalformedTally()
    tally.observe("train", dataset)
    tally.observe("train", dataset)  # the same pass: counted once
    tally.observe("test", None)  # no reader: nothing
    summary = tally.summary()
    assert summary == {"train": {"malformed": 2, "lines": 302, "passes": 1,
                                 "first": summary["train"]["first"]}}
    assert f"{path.name}:301" in summary["train"]["first"]
    assert tally.describe() == "train 2 of 302 lines"


def test_each_recorder_writes_its_own_event_file_with_the_scalars(tmp_path: Path) -> None:
    folder = tmp_path / "tensorboard"
    for run in range(2):
        recorder = RunRecorder(folder)
        recorder.step(10, 0.5 + run, 0.7, 1000.0)
        recorder.epoch({"epoch": 1, "loss": 0.45, "auc": float("nan"),
                        "examples_per_s": 900.0})
        recorder.evaluation("valid", {"auc": 0.71, "logloss": 0.47, "copc": 1.02}, 1)
        recorder.close()
        recorder.close()  # idempotent
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2
    scalars = _scalars(folder)
    assert "epoch/train_auc" not in scalars  # NaN is not written
    assert scalars["train/loss"] == [(10, 0.5), (10, 1.5)]
    assert scalars["valid/copc"] == [(1, pytest.approx(1.02)), (1, pytest.approx(1.02))]
    assert set(scalars) == {"train/loss", "train/auc_running", "train/examples_per_s",
                            "epoch/train_loss", "epoch/examples_per_s", "valid/auc",
                            "valid/logloss", "valid/copc"}


def _stats(uptime_s: float, rows: int, pulls: int, pushes: int) -> msg.StatsResponse:
    return msg.StatsResponse(uptime_s=uptime_s, tables=[msg.TableStats(
        table_id=0, name="embedding", rows=rows, memory_bytes=rows * 40, pulls=pulls,
        pushes=pushes)])


def test_server_scalars_are_rates_between_samples_and_since_a_restart() -> None:
    first = server_scalars([_stats(10.0, 100, 50, 20)], None)  # since the start
    assert first == [{"server/embedding/rows": 100, "server/embedding/memory_bytes": 4000,
                      "server/embedding/pulls_per_s": 5.0, "server/embedding/pushes_per_s": 2.0}]
    later = server_scalars([_stats(14.0, 120, 70, 28)], [_stats(10.0, 100, 50, 20)])
    assert later[0]["server/embedding/pulls_per_s"] == 5.0  # 20 pulls in 4 s
    assert later[0]["server/embedding/pushes_per_s"] == 2.0
    restarted = server_scalars([_stats(2.0, 10, 4, 2)], [_stats(14.0, 120, 70, 28)])
    assert restarted[0]["server/embedding/pulls_per_s"] == 2.0  # 4 pulls in its 2 s


def test_the_recorder_writes_each_servers_scalars_to_its_own_run(tmp_path: Path) -> None:
    samples = iter([[_stats(10.0, 100, 50, 20), _stats(10.0, 80, 40, 10)],
                    RpcError("server 1 is restarting"),
                    [_stats(20.0, 150, 150, 40), _stats(20.0, 90, 60, 20)]])

    def source() -> list[msg.StatsResponse]:
        sample = next(samples)
        if isinstance(sample, Exception):
            raise sample
        return sample

    recorder = RunRecorder(tmp_path, source)
    for step in (5, 10, 15):
        recorder.step(step, 0.5, 0.7, 1000.0)
    recorder.close()
    zero, one = _scalars(tmp_path / "server_0"), _scalars(tmp_path / "server_1")
    assert zero["server/embedding/rows"] == [(5, 100), (15, 150)]  # step 10 failed
    assert zero["server/embedding/pulls_per_s"] == [(5, 5.0), (15, 10.0)]
    assert one["server/embedding/pushes_per_s"] == [(5, 1.0), (15, 1.0)]
    assert "server/embedding/rows" not in _scalars(tmp_path)


def test_training_interrupted_is_a_keyboard_interrupt_that_pickles() -> None:
    exc = TrainingInterrupted(2, 31, None, "/x/metrics.json")
    assert isinstance(exc, KeyboardInterrupt)
    back = pickle.loads(pickle.dumps(exc))
    assert (back.epoch, back.step, back.checkpoint, back.metrics_path) == (
        2, 31, None, "/x/metrics.json")
    assert str(back) == ("interrupted in epoch 2 at step 31; metrics of the finished epochs "
                         "in /x/metrics.json; no checkpoint to resume from (set "
                         "runner.checkpoint to have one)")


class _InterruptAfter:
    """A reader that raises KeyboardInterrupt (as Ctrl-C would) when asked for batch
    ``batches`` (0-based) of epoch ``epoch`` (0-based); otherwise the wrapped reader.
    The trainer reads one batch ahead (its row prefetch), so ``batches - 1`` batches
    of that epoch are trained."""

    def __init__(self, reader: Reader, epoch: int, batches: int) -> None:
        self.reader, self.epoch, self.batches = reader, epoch, batches
        self._current = 0

    def set_epoch(self, epoch: int) -> None:
        self._current = epoch
        self.reader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        for k, batch in enumerate(self.reader):
            if self._current == self.epoch and k == self.batches:
                raise KeyboardInterrupt
            yield batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


@pytest.mark.slow
def test_ctrl_c_in_epoch_2_writes_the_finished_epoch_and_the_newest_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        data_slice: Callable[..., Path]) -> None:
    train, dev = data_slice(1000), data_slice(300, source="dev.csv")
    out = tmp_path / "out"
    config = load_config(EXAMPLE, [
        f"runner.train_data_dir={train}", f"runner.test_data_dir={dev}",
        f"runner.valid_data_dir={dev}", f"runner.model_save_path={out}",
        "runner.epochs=3", "runner.batch_size=100", "runner.print_interval=2",
        "runner.shuffle=false", "hyper_parameters.fc_sizes=[16]",
        f"runner.checkpoint={{checkpoint_dir: {tmp_path / 'ck'}, epoch_interval: 1}}",
        "cluster.server_num=0", "cluster.worker_num=1"])
    # The run folder of an unnamed run (load_config names none): "run". It holds an
    # older, interrupted run's metrics.json (so it is continued, not refused), which the
    # new one replaces.
    run = out / "run"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(
        '{"an": "older run", "interrupted": {"epoch": 1, "step": 1, "batch": 1, '
        '"checkpoint": null}}\n')
    fresh = Fleet()
    for module in RUNNER_MODULES_WITH_FLEET:
        monkeypatch.setattr(module, "fleet", fresh)
    build = trainer_module.build_train_reader
    monkeypatch.setattr(trainer_module, "build_train_reader",
                        lambda *a, **k: _InterruptAfter(build(*a, **k), epoch=1, batches=4))
    try:
        with pytest.raises(TrainingInterrupted) as caught:
            trainer_module.train(config)
    finally:
        fresh.stop_worker()

    assert run_folder(out) == run.resolve()  # latest points at it
    metrics = json.loads((run / "metrics.json").read_text())
    assert sorted(p.name for p in run.iterdir()) == [
        "config.yaml", "metrics.json", "tensorboard"]  # no temporary file
    assert sorted(p.name for p in out.iterdir()) == ["latest", "run"]
    checkpoint = metrics["interrupted"]["checkpoint"]
    # 10 batches of epoch 1, then 3 of epoch 2; the newest checkpoint: after epoch 1
    assert metrics["interrupted"] == {"epoch": 2, "step": 13, "batch": 3,
                                      "checkpoint": checkpoint}
    assert Path(checkpoint).name == "ckpt-000002-step10"
    assert (Path(checkpoint) / "manifest.json").is_file()
    assert [e["epoch"] for e in metrics["epochs"]] == [1]
    assert metrics["epochs"][0]["examples"] == 1000
    assert [v["epoch"] for v in metrics["valid"]] == [1]  # validated after epoch 1
    assert 0.0 <= metrics["valid"][0]["auc"] <= 1.0
    assert metrics["valid"][0]["examples"] == 300
    assert metrics["test"] is None and metrics["curves"] is None
    assert metrics["malformed_lines"]["train"] == {"malformed": 0, "lines": 1000,
                                                   "passes": 1, "first": None}
    exc = caught.value
    assert (exc.epoch, exc.step, exc.checkpoint) == (2, 13, checkpoint)
    assert exc.metrics_path == str(run / "metrics.json")
    assert isinstance(exc.__cause__, KeyboardInterrupt)
    scalars = _scalars(run / "tensorboard")  # closed: everything flushed
    assert [s for s, _ in scalars["train/loss"]] == [2, 4, 6, 8, 10, 12]
    assert scalars["epoch/train_loss"] == [(1, pytest.approx(metrics["epochs"][0]["loss"]))]
    assert scalars["valid/auc"] == [(1, pytest.approx(metrics["valid"][0]["auc"]))]
