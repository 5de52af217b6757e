"""The CTR accessor: per-row show/click statistics, the row score and shrink.

As Paddle's CtrCommonAccessor (paddle/fluid/distributed/ps/table/ctr_accessor.cc):
each row keeps show, click, unseen_days and delta_score; a push adds the batch's show
and click counts, sets unseen_days to 0 and adds the pushed counts' score to
delta_score; a row's score is ``(show - click) * nonclk_coeff + click * click_coeff``
(``ShowClickScore``); ``shrink`` first decays show and click by
``show_click_decay_rate``, then deletes rows whose score is below
``delete_threshold`` or whose unseen_days exceed ``delete_after_unseen_days``.

All arithmetic is float32, in the order written here, so a reference model doing the
same float32 operations agrees bit for bit.
"""

from __future__ import annotations

import numpy as np

from psfleet.ps.table.shard import CLICK, DELTA_SCORE, SHOW, UNSEEN_DAYS
from psfleet.ps.types import AccessorConfig

__all__ = ["CtrAccessor"]


class CtrAccessor:
    """Score, update and shrink rule of the ``ctr`` accessor. Stateless.

    Args:
        config: the table's accessor config (``name="ctr"``).
    """

    def __init__(self, config: AccessorConfig) -> None:
        self.config = config
        self._nonclk = np.float32(config.nonclk_coeff)
        self._click = np.float32(config.click_coeff)
        self._decay = np.float32(config.show_click_decay_rate)
        self._delete_threshold = np.float32(config.delete_threshold)
        self._unseen_limit = np.float32(config.delete_after_unseen_days)

    def score(self, show: np.ndarray, click: np.ndarray) -> np.ndarray:
        """float32[N]: ``(show - click) * nonclk_coeff + click * click_coeff``.

        Args:
            show, click (float32[N]): counts (decayed).
        """
        return (show - click) * self._nonclk + click * self._click

    def row_score(self, stats: np.ndarray) -> np.ndarray:
        """float32[N]: the score of rows with statistics ``stats`` (float32[N, 4])."""
        return self.score(stats[:, SHOW], stats[:, CLICK])

    def update(self, stats: np.ndarray, shows: np.ndarray, clicks: np.ndarray) -> None:
        """A push's statistics, in place.

        Args:
            stats (float32[N, 4]): the pushed rows' statistics (a gathered block).
            shows, clicks (float32[N]): the push's counts per row (duplicates summed).
        """
        stats[:, SHOW] += shows
        stats[:, CLICK] += clicks
        stats[:, UNSEEN_DAYS] = 0
        stats[:, DELTA_SCORE] += self.score(shows, clicks)

    def save_selection(self, stats: np.ndarray, delta: bool) -> np.ndarray:
        """bool[N]: the rows (statistics float32[N, 4]) a base save writes: score >=
        ``base_threshold`` and unseen_days <= ``delta_keep_days``; a delta save also
        needs delta_score >= ``delta_threshold`` (Paddle's CtrCommonAccessor::Save,
        params 2 and 1)."""
        c = self.config
        keep = (self.row_score(stats) >= np.float32(c.base_threshold)) & (
            stats[:, UNSEEN_DAYS] <= np.float32(c.delta_keep_days))
        if delta:
            keep &= stats[:, DELTA_SCORE] >= np.float32(c.delta_threshold)
        return keep

    def decay_and_select(self, stats: np.ndarray) -> np.ndarray:
        """Decay show and click of ``stats`` (float32[N, 4]) in place; bool[N]: the
        rows ``shrink`` deletes."""
        stats[:, SHOW] *= self._decay
        stats[:, CLICK] *= self._decay
        return (self.row_score(stats) < self._delete_threshold) | (
            stats[:, UNSEEN_DAYS] > self._unseen_limit)
