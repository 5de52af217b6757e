"""DistributeTranspilerConfig: the seeds' transpiler settings (Fluid's, field by field).

Assigned as in Fluid (``config.slice_var_up = False``); every assignment is checked,
and an unknown field or a bad value is a ConfigError naming the field and the allowed
values. :class:`psfleet.fleet.DistributeTranspiler` maps the settings onto a
:class:`psfleet.fleet.DistributedStrategy`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from psfleet.errors import ConfigError
from psfleet.ps.types import SlicingConfig, SplitMethod

__all__ = ["DistributeTranspilerConfig", "SplitMethod", "TranspilerMode"]

TranspilerMode = Literal["pserver", "nccl2"]
_CHOICES: dict[str, tuple[str, ...]] = {"split_method": get_args(SplitMethod),
                                         "mode": get_args(TranspilerMode)}
_HINTS = {"sync_mode": "pass sync_mode to transpile()",
          "geo_sgd_mode": "GEO is not part of the transpiler: use fleet.init(strategy="
                          "fleet.StrategyFactory.create_geo_strategy(geo_step))"}


@dataclass(init=False)
class DistributeTranspilerConfig:
    """The seeds' transpiler settings; every assignment is validated.

    Attributes:
        slice_var_up: cut each dense parameter into blocks spread over the servers.
        split_method: how blocks are placed on servers: ``RoundRobin`` or ``HashName``.
        min_block_size: smallest block when slicing, elements (8192).
        enable_dc_asgd: delay-compensated async SGD on the servers (Zheng et al.
            2017); only with ``sync_mode=False``.
        mode: ``pserver`` (parameter servers) or ``nccl2`` (collective all-reduce).
        print_log: log the transpiled plan at INFO (else DEBUG).

    Raises:
        ConfigError: an unknown field or a bad value (names the field and the
            allowed values), at construction or assignment.
    """

    slice_var_up: bool
    split_method: SplitMethod
    min_block_size: int
    enable_dc_asgd: bool
    mode: TranspilerMode
    print_log: bool

    def __init__(self, **settings: Any) -> None:
        defaults = {**SlicingConfig().model_dump(),  # slicing defaults declared once
                    "enable_dc_asgd": False, "mode": "pserver", "print_log": False}
        for name, value in {**defaults, **settings}.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        kind = {f.name: f.type for f in fields(self)}.get(name)
        where = f"DistributeTranspilerConfig.{name}"
        if kind is None:
            hint = f" ({_HINTS[name]})" if name in _HINTS else ""
            raise ConfigError(f"{where}: unknown field{hint}; the fields are "
                              f"{', '.join(f.name for f in fields(self))}")
        if name in _CHOICES and value not in _CHOICES[name]:
            raise ConfigError(f"{where}: {value!r} is not one of {', '.join(_CHOICES[name])}")
        if kind == "bool" and not isinstance(value, bool):
            raise ConfigError(f"{where}: {value!r} is not True or False")
        if kind == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}: {value!r} must be an integer >= 1")
        super().__setattr__(name, value)
