"""The runner's online-training keys: training data as an ordered list of passes, and
what happens after each pass.

``runner.train_passes`` lists the passes (a file or a folder each, e.g. one folder per
day, PaddleRec's online ``day/pass`` folders) trained in that order, each
``runner.epochs`` times (1 for a stream of days: every example once). ``runner.after_pass``
says what the job does at the end of every pass (:class:`AfterPassConfig`). The table
lifecycle itself (statistics, admission, shrink thresholds, a row cap) is the accessor
of each table: ``hyper_parameters.sparse_accessor`` for every table, or
``hyper_parameters.tables[i].accessor`` for one (:class:`psfleet.ps.types.AccessorConfig`,
Paddle's ``CtrCommonAccessor`` settings under their Paddle names).

The rules between these keys and the rest of the config are
:func:`check_online_keys` (called by the config's validators).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from psfleet.errors import ConfigError
from psfleet.job.modes import mode_spec
from psfleet.ps.types import AccessorConfig

__all__ = ["AfterPassConfig", "SaveAfterPass", "check_online_keys", "table_accessors"]

#: ``runner.after_pass.save``: ``none``; ``delta`` (pass 1 a base save, every later pass
#: a delta with tombstones); ``base`` (a base save every pass); ``full`` (a full save,
#: values and optimizer state of every row, every pass).
SaveAfterPass = Literal["none", "delta", "base", "full"]


class AfterPassConfig(BaseModel):
    """``runner.after_pass``: what every worker of the job does after each pass of
    ``runner.train_passes``, in this order (PaddleRec's online loop: shrink and
    ``set_date`` at a day's end, then the day's save).

    Attributes:
        shrink: ``fleet.shrink()``: show and click decay by each ctr table's
            ``show_click_decay_rate``, then rows scoring below ``delete_threshold`` or
            unseen for more than ``delete_after_unseen_days`` days are deleted. Needs
            a table with ``accessor.name: ctr``.
        set_date: ``fleet.set_date()``: every row of every sparse table ages one day
            (a pass is a day). Needs a table with ``accessor.name: ctr``.
        save: ``none``, ``delta`` (pass 1 a base, later passes deltas), ``base`` or
            ``full`` (:data:`SaveAfterPass`), written by worker 0 to
            ``<run folder>/saves/pass-<k>`` (k from 1) with
            ``fleet.save_persistables(dirname, mode=...)``.
        validate: evaluate ``runner.valid_data_dir`` on the tables as they are after
            the pass (and its shrink); the figures go into the pass's entry of
            metrics.json. Unset: when ``runner.valid_data_dir`` is given; true needs
            it; false: no validation between passes (one at the end).
    """

    # ``validate`` would shadow BaseModel.validate: the field is validate_, spelt validate.
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    shrink: bool = False
    set_date: bool = False
    save: SaveAfterPass = "none"
    validate_: bool | None = Field(None, alias="validate")

    @property
    def validates(self) -> bool:
        """Whether the pass ends with a validation (when there is validation data):
        ``validate`` unset or true."""
        return self.validate_ is not False


def table_accessors(default: AccessorConfig | None,
                    own: Sequence[AccessorConfig | None]) -> list[AccessorConfig | None]:
    """Each table's accessor: its own (``hyper_parameters.tables[i].accessor``) or
    else the job's (``hyper_parameters.sparse_accessor``); None: the plain table."""
    return [a if a is not None else default for a in own]


def check_online_keys(*, passes: Sequence[Path] | None, after: AfterPassConfig | None,
                      early_stopping: bool, valid_data: bool, mode: str,
                      accessors: Sequence[AccessorConfig | None]) -> None:
    """The rules between the online keys and the rest of the config.

    Args:
        passes: ``runner.train_passes`` (None: not online).
        after: ``runner.after_pass``.
        early_stopping: ``runner.early_stopping`` is set.
        valid_data: ``runner.valid_data_dir`` is set.
        mode: ``runner.sync_mode``.
        accessors: every table's accessor (:func:`table_accessors`).

    Raises:
        ConfigError: names the key at fault and what to do: ``after_pass`` without
            passes, early stopping with passes, shrink / set_date with no ctr table,
            ``validate: true`` without validation data, a ctr table in collective mode
            (its shows and clicks are not pushed there).
    """
    ctr = any(a is not None and a.name == "ctr" for a in accessors)
    if not mode_spec(mode).servers and ctr:
        raise ConfigError("hyper_parameters.sparse_accessor: name 'ctr' is not supported "
                          "with runner.sync_mode: collective (the ranks push no show/click "
                          "counts, so every row would score 0); use a parameter-server "
                          "mode (sync, async, geo) or accessor name 'none'")
    if passes is None:
        if after is not None:
            raise ConfigError("runner.after_pass: needs runner.train_passes (the passes "
                              "it acts after); list the pass folders there, or remove it")
        return
    if early_stopping:
        raise ConfigError("runner.early_stopping: not used with runner.train_passes (an "
                          "online job trains every pass it is given); remove one of them")
    if after is None:
        return
    for key in ("shrink", "set_date"):
        if getattr(after, key) and not ctr:
            raise ConfigError(f"runner.after_pass.{key}: no table has the ctr accessor, so "
                              "there is nothing to age or delete; set "
                              "hyper_parameters.sparse_accessor: {name: ctr} (or a table's "
                              f"accessor), or {key}: false")
    if after.validate_ is True and not valid_data:
        raise ConfigError("runner.after_pass.validate: true needs runner.valid_data_dir "
                          "(the data evaluated after each pass)")
