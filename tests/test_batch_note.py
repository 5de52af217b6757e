"""The note that a run's updates saw another batch than one process's (issue 45,
item 7): W workers in a mode whose updates average their batches (sync, geo,
collective, async with global batch aggregation: ``ModeSpec`` traits) step with a
global batch W times ``batch_size``; the result line and ``psfleet parity``'s report
say so and name ``runner.lr_scaling``. Pure: metrics.json dicts as the runner writes
them (tests/test_batch_note_job.py checks the runner writes them so).
"""

from __future__ import annotations

import pytest

from psfleet.fleet.lr_scaling import averages_batches, lr_factor
from psfleet.rec import parity
from psfleet.rec.batch_note import global_batch_note
from psfleet.types import MODES

pytestmark = pytest.mark.unit


def _metrics(mode: str, workers: int, scaling: str = "auto", batch: int = 128,
             aggregated: bool = False) -> dict[str, object]:
    return {"sync_mode": mode, "worker_num": workers, "batch_size": batch,
            "batch_averaged": averages_batches(mode, aggregated), "lr_scaling": scaling,
            "lr_factor": lr_factor(scaling, mode, workers, aggregated),  # type: ignore[arg-type]
            "test": {"auc": 0.7, "logloss": 0.5}, "examples_per_s": 1000.0}


def test_the_note_names_the_global_batch_and_lr_scaling() -> None:
    note = global_batch_note(_metrics("sync", 2))
    assert note == ("global batch 256 (2 workers x 128, averaged per update; one process "
                    "steps with 128) at the same learning rate (runner.lr_scaling: auto): "
                    "set runner.lr_scaling: sqrt or linear to raise it with the workers, or "
                    "runner.batch_size: 64 to keep one process's global batch")
    assert global_batch_note(_metrics("collective", 4, "linear")) == (
        "global batch 512 (4 workers x 128, averaged per update; one process steps with "
        "128): learning rate x4 by runner.lr_scaling: linear")
    assert "x1.41 by runner.lr_scaling: auto" in str(global_batch_note(_metrics("geo", 2)))
    assert "runner.lr_scaling" in str(global_batch_note(_metrics("async", 2, aggregated=True)))


@pytest.mark.parametrize("mode", MODES)
def test_no_note_where_updates_see_one_process_batch(mode: str) -> None:
    assert global_batch_note(_metrics(mode, 1)) is None
    if mode in ("async", "gpubox"):  # each worker's batch is its own update
        assert global_batch_note(_metrics(mode, 2)) is None
    else:
        assert global_batch_note(_metrics(mode, 2)) is not None
    assert global_batch_note({"worker_num": 2, "batch_size": 128}) is None  # older file


def test_parity_rows_carry_the_note() -> None:
    records = [{"configuration": name, "finished": True, "metrics": metrics}
               for name, metrics in (("single", _metrics("async", 1)),
                                     ("async 1x2", _metrics("async", 2)),
                                     ("sync 1x2", _metrics("sync", 2)))]
    rows = parity.summarise(records, tolerance=0.01)
    assert [r["global_batch_note"] for r in rows[:2]] == [None, None]
    assert rows[2]["global_batch_note"] == global_batch_note(_metrics("sync", 2))
