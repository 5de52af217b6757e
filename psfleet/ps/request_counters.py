"""Per-table request counters of one server: pulls and pushes, requests and rows.

:class:`RequestCounters` is what a :class:`~psfleet.ps.service.TableService` adds to per
request (one locked add of two integers); the metrics exporter
(``psfleet.ps.metrics_exporter``) reads :meth:`RequestCounters.snapshot` only when it
is scraped.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["RequestCounts", "RequestCounters"]


@dataclass(frozen=True)
class RequestCounts:
    """One table's requests served since the server started.

    Attributes:
        pulls: pull requests answered.
        pulled_rows: rows answered (sparse: keys pulled, repeats included; dense: floats).
        pushes: push requests applied (a SYNC push: once its round was applied).
        pushed_rows: rows pushed (sparse: keys, repeats included; dense: floats).
    """

    pulls: int = 0
    pulled_rows: int = 0
    pushes: int = 0
    pushed_rows: int = 0


class RequestCounters:
    """Counts of pulls and pushes per table id. Thread safe; counts only grow."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pulls: dict[int, list[int]] = {}  # table id -> [requests, rows]
        self._pushes: dict[int, list[int]] = {}

    @staticmethod
    def _add(counts: dict[int, list[int]], table_id: int, rows: int) -> None:
        pair = counts.get(table_id)
        if pair is None:
            counts[table_id] = [1, rows]
        else:
            pair[0] += 1
            pair[1] += rows

    def count_pull(self, table_id: int, rows: int) -> None:
        """Count one pull of ``rows`` rows (or floats) from table ``table_id``."""
        with self._lock:
            self._add(self._pulls, table_id, rows)

    def count_push(self, table_id: int, rows: int) -> None:
        """Count one push of ``rows`` rows (or floats) to table ``table_id``."""
        with self._lock:
            self._add(self._pushes, table_id, rows)

    def snapshot(self) -> dict[int, RequestCounts]:
        """Every table's counts at this moment (tables never pulled nor pushed are absent)."""
        with self._lock:
            pulls = {t: tuple(p) for t, p in self._pulls.items()}
            pushes = {t: tuple(p) for t, p in self._pushes.items()}
        return {t: RequestCounts(*pulls.get(t, (0, 0)), *pushes.get(t, (0, 0)))
                for t in pulls.keys() | pushes.keys()}
