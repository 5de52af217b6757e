"""Each training mode's traits are declared once (``psfleet.job.modes``, issue 40)."""

from __future__ import annotations

import pytest

from psfleet.errors import ConfigError
from psfleet.fleet.lr_scaling import SCALED_MODES, lr_factor
from psfleet.job import MODE_SPECS, mode_spec
from psfleet.types import MODES

pytestmark = pytest.mark.unit


def test_one_spec_per_declared_mode_in_order() -> None:
    assert tuple(MODE_SPECS) == MODES
    assert all(spec.name == name for name, spec in MODE_SPECS.items())


def test_the_traits_the_modules_ask_for() -> None:
    assert [m for m, s in MODE_SPECS.items() if not s.servers] == ["collective"]
    assert [m for m, s in MODE_SPECS.items() if s.restart_policy == "gang"] == ["sync"]
    assert [m for m, s in MODE_SPECS.items() if s.step_pushes] == ["async"]
    assert [m for m, s in MODE_SPECS.items() if s.passes] == ["gpubox"]
    assert SCALED_MODES == ("sync", "geo", "collective")
    assert lr_factor("auto", "geo", 4) == 2.0 and lr_factor("auto", "sync", 4) == 1.0
    assert lr_factor("auto", "async", 4, global_batch=True) == 2.0
    assert lr_factor("linear", "async", 4) == 1.0  # async applies each batch alone


def test_an_unknown_mode_is_an_error_listing_the_modes() -> None:
    with pytest.raises(ConfigError, match="mode: 'hybrid' is not one of sync, async, geo, "
                                          "gpubox, collective"):
        mode_spec("hybrid")
