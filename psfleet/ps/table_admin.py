"""The table service's admin requests: Save, Load, recovery, Shrink and AgeOneDay.

Requests that act on every table of a server at once, kept out of
``psfleet.ps.service`` (which delegates its rpcs of these names here): a save copies
the tables at one moment (pushes held back by the service's gate) and writes the copy
(``psfleet.ps.persist_delta``: full, base or delta); a load reads a save into new tables
and swaps them in all or nothing, or applies a delta on top; a restarted server
recovers from the newest checkpoint (``psfleet.ps.restore``); Shrink and AgeOneDay run
the row lifecycle (``psfleet.ps.lifecycle_service``). Save, Shrink and AgeOneDay run
once per request id: a retried request gets the first call's result.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np

from psfleet.errors import RemoteError, ResourceExhaustedError
from psfleet.ps.coordination import PushGate
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.lifecycle_service import age_tables, selected_tables, shrink_tables
from psfleet.ps.persist_delta import (
    apply_delta,
    check_save_mode,
    saved_mode,
    snapshot_mode,
    write_mode_snapshot,
)
from psfleet.ps.push_ledger import PushLedger
from psfleet.ps.restore import read_checkpoint, read_save
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import SaveMode
from psfleet.rpc import codec
from psfleet.rpc import messages as msg

__all__ = ["TableAdmin"]

logger = logging.getLogger(__name__)

_R = TypeVar("_R")


def _dense_index(entries: Iterable[msg.DenseIndex]) -> dict[int, np.ndarray]:
    """A request's dense flat indexes: table id -> int64[n]."""
    return {e.table_id: codec.int64s_from_bytes(e.index) for e in entries}


class TableAdmin:
    """Save, Load, recovery, Shrink and AgeOneDay over one server's tables.

    Args:
        tables: the service's tables (the same dict: loads update it in place).
        tables_lock: the service's lock of ``tables``.
        gate: the service's push gate (closed while a save copies or a load swaps).
    """

    def __init__(self, tables: dict[int, SparseTable | DenseTable],
                 tables_lock: threading.Lock, gate: PushGate) -> None:
        self.tables = tables
        self._tables_lock = tables_lock
        self._gate = gate
        # One ledger per method: a Shrink whose id equals a Save's is another request
        # (one ledger for all three returned the Save's reply to it, issue 44 finding 5).
        self._admin_ledgers = {method: PushLedger(window=256)
                               for method in ("Save", "Shrink", "AgeOneDay")}

    def _once(self, method: str, request_id: msg.PushId, call: Callable[[], _R]) -> _R:
        """``call()`` once per request id of ``method`` (a retry gets the first result)."""
        return self._admin_ledgers[method].call_once(request_id.client_id, request_id.seq,
                                                     call)[0]

    def save(self, request: msg.SaveRequest) -> msg.SaveResponse:
        """Copy every table at one moment (pushes held back), then write the copy.
        ``mode`` (``psfleet.ps.persist_delta``): full (empty), base or delta; once
        per ``request_id``. Raises ConfigError (INVALID_ARGUMENT) for an unknown mode
        or a delta of a table without the ctr accessor."""
        mode = check_save_mode(request.mode or "full", f"save to {request.dirname!r}")
        return self._once("Save", request.request_id, lambda: self._save(request, mode))

    def _save(self, request: msg.SaveRequest, mode: SaveMode) -> msg.SaveResponse:
        with self._tables_lock:
            tables = dict(self.tables)
        with self._gate.closed():
            snapshot = snapshot_mode(tables, mode)
        try:
            digests = write_mode_snapshot(snapshot, request.dirname, request.server_index,
                                          _dense_index(request.dense))
        except OSError as exc:
            lost = (" (this delta's rows and tombstones are lost for the next delta: "
                    "take a base save)" if mode == "delta" else "")
            raise RemoteError(f"save to {request.dirname!r} failed: {exc}{lost}") from None
        logger.info("saved %d tables (%s) to %s/server-%d", len(tables), mode,
                    request.dirname, request.server_index)
        return msg.SaveResponse(files=[msg.FileDigest(path=d.path, size=d.size,
                                                      sha256=d.sha256) for d in digests])

    def load(self, request: msg.LoadRequest) -> msg.Empty:
        """Replace every table by its saved state, all or nothing: the save is read into
        new tables of the same configs, which are swapped in together (no push in
        between) only when every table loaded; a damaged file or a MemoryError leaves
        the live tables as they were. A ``delta`` save is applied on top of the live
        tables instead (``psfleet.ps.persist_delta.apply_delta``: its files are read
        first, then applied with pushes held back)."""
        with self._tables_lock:
            live = dict(self.tables)
        dense = _dense_index(request.dense)
        try:
            if saved_mode(request.dirname) == "delta":
                with self._gate.closed():
                    loaded = apply_delta(live, request.dirname, request.server_index,
                                         request.server_num, dense)
                logger.info("applied delta %s: %s rows/elements per table", request.dirname,
                            loaded)
                return msg.Empty()
            staged, loaded = read_save({tid: t.config for tid, t in live.items()},
                                       request.dirname, request.server_index,
                                       request.server_num, dense)
        except MemoryError as exc:
            raise ResourceExhaustedError(
                f"Load of {request.dirname}: the server ran out of memory ({exc}) reading "
                "the save; its tables are unchanged. Give the server more memory or add "
                "servers") from None
        with self._gate.closed(), self._tables_lock:
            self.tables.update(staged)
        logger.info("loaded from %s: %s rows/elements per table", request.dirname, loaded)
        return msg.Empty()

    def recover(self, checkpoint_dir: str, server_index: int) -> bool:
        """Re-create this server's tables from the newest complete checkpoint (a server
        restarted by the launcher: the workers created its tables before it died).

        Returns:
            False when there is no complete checkpoint (tables stay empty).

        Raises:
            DataError: the checkpoint has no tables of this server index.
        """
        found = read_checkpoint(checkpoint_dir, server_index)
        if found is None:
            logger.warning("restart: no complete checkpoint in %s; this server starts empty",
                           checkpoint_dir)
            return False
        created, loaded, latest = found
        with self._tables_lock:
            self.tables.update(created)
        logger.info("restart: server %d of %d recovered %d tables from checkpoint %s "
                    "(step %d): %s rows/elements per table", server_index,
                    latest.manifest.server_num, len(created), latest.storage.url,
                    latest.manifest.step, loaded)
        return True

    def shrink(self, request: msg.ShrinkRequest) -> msg.ShrinkResponse:
        """Shrink the named sparse tables (``psfleet.ps.lifecycle_service``): decay
        show/click, delete rows by score or unseen days. Raises RemoteError when
        ``table_id`` is not a sparse table here. Once per ``request_id`` (a retry
        returns the first call's count)."""
        with self._tables_lock:
            tables = selected_tables(self.tables, request.all_tables, request.table_id,
                                     "Shrink")
        def shrink() -> int:
            with self._gate.write():
                return shrink_tables(tables)

        deleted = self._once("Shrink", request.request_id, shrink)
        logger.info("shrink of %d tables deleted %d rows", len(tables), deleted)
        return msg.ShrinkResponse(deleted=deleted)

    def age_one_day(self, request: msg.AgeOneDayRequest) -> msg.Empty:
        """unseen_days += 1 for every row of the named sparse tables. Raises
        RemoteError when ``table_id`` is not a sparse table here. Once per
        ``request_id``."""
        with self._tables_lock:
            tables = selected_tables(self.tables, request.all_tables, request.table_id,
                                     "AgeOneDay")
        def age() -> None:
            with self._gate.write():
                age_tables(tables)

        self._once("AgeOneDay", request.request_id, age)
        return msg.Empty()
