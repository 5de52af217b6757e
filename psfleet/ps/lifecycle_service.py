"""The table service's side of the row lifecycle (accessor ``ctr``, issue 17).

What ``psfleet.ps.service.TableService`` does with the table layer's lifecycle
(``SparseTable.push(shows=, clicks=)``, ``update_stats``, ``shrink``, ``age_one_day``,
``lifecycle_counts``), kept out of the service module: the per-table counts of
``Stats``, the checks of a push's show and click counts, and the Shrink and
AgeOneDay admin rpcs over a set of tables. Semantics as Paddle's fleet:
``fleet.shrink()`` decays show/click and deletes rows (CtrCommonAccessor::Shrink),
``fleet.set_date()`` starts a new day (every row's unseen_days += 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from psfleet.errors import InvalidRequestError, RemoteError
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.merge import merge_sparse
from psfleet.ps.table.lifecycle import LifecycleCounts
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.rpc import codec

__all__ = ["ShowClicks", "lifecycle_stats", "decode_counts", "check_show_clicks",
           "sync_mean_with_counts", "selected_tables", "shrink_tables", "age_tables"]

#: A push's per-key (shows float32[N], clicks float32[N]); None: the push has none.
ShowClicks = tuple[np.ndarray, np.ndarray] | None


def lifecycle_stats(table: SparseTable | DenseTable) -> dict[str, int]:
    """``TableStats`` fields of ``table``'s lifecycle: the ``LifecycleCounts`` (rows
    since it was created on this server), and ``disk_rows`` and ``disk_bytes`` of its
    disk tier; dense tables: zeros."""
    if isinstance(table, DenseTable):
        return {name: 0 for name in (*LifecycleCounts.__dataclass_fields__, "disk_rows",
                                     "disk_bytes")}
    return {**dataclasses.asdict(table.lifecycle_counts()), "disk_rows": table.disk_rows,
            "disk_bytes": table.disk_bytes}


def decode_counts(table_id: int, name: str, buf: bytes) -> np.ndarray | None:
    """A PushSparse's ``shows`` or ``clicks`` buffer as a read-only float32[N] view;
    None when empty (not sent).

    Raises:
        InvalidRequestError: the length is not a multiple of 4 (names the field).
    """
    if not buf:
        return None
    if len(buf) % 4:
        raise InvalidRequestError(f"push to table {table_id}: {name} buffer of {len(buf)} "
                                  "bytes is not float32 counts (a multiple of 4 bytes)")
    return codec.floats_from_bytes(buf)


def check_show_clicks(table_id: int, key_count: int, shows: np.ndarray | None,
                      clicks: np.ndarray | None) -> ShowClicks:
    """A push's counts, checked: both or neither, float32[N] each with N the keys',
    finite and >= 0.

    Args:
        table_id: for the message.
        key_count: N, the push's keys.
        shows, clicks (float32[N] or None): the counts sent (None or empty: none).

    Returns:
        ``(shows, clicks)``, or None when neither was sent.

    Raises:
        InvalidRequestError: only one given, a length other than N, NaN/Inf or a
            negative count (names the field).
    """
    no_shows = shows is None or (shows.size == 0 and key_count > 0)
    no_clicks = clicks is None or (clicks.size == 0 and key_count > 0)
    if no_shows and no_clicks:
        return None
    for name, counts, missing in (("shows", shows, no_shows), ("clicks", clicks, no_clicks)):
        if missing or counts is None:
            raise InvalidRequestError(
                f"push to table {table_id}: {name} missing while the other count is sent; "
                "send both shows and clicks (float32, one per key) or neither")
        if counts.shape != (key_count,):
            raise InvalidRequestError(
                f"push to table {table_id}: {name} has {counts.size} values for "
                f"{key_count} keys; send one float32 count per key")
        if not bool(np.isfinite(counts).all()) or bool((counts < 0).any()):
            raise InvalidRequestError(
                f"push to table {table_id}: {name} holds NaN, Inf or negative counts; "
                "counts must be finite and >= 0")
    assert shows is not None and clicks is not None  # checked above
    return shows, clicks


def sync_mean_with_counts(pushes: list[tuple[np.ndarray, np.ndarray, ShowClicks]]
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A SYNC round's update when some pushes carry show/click counts: the mean of the
    gradients (as without counts) and the sum of the counts, per distinct key.

    Args:
        pushes: each worker's (keys uint64[N_i], grads float32[N_i, dim], counts or
            None: zeros).

    Returns:
        (keys uint64[U], mean grads float32[U, dim], shows float32[U], clicks
        float32[U]): the mean divides by the number of pushes, as the round without
        counts does.
    """
    widened = []
    for keys, grads, counts in pushes:
        extra = (np.zeros((keys.size, 2), np.float32) if counts is None
                 else np.stack(counts, axis=1).astype(np.float32, copy=False))  # [N_i, 2]
        widened.append(np.hstack([grads, extra]))  # [N_i, dim + 2]
    merged_keys, summed = merge_sparse([k for k, _, _ in pushes], widened)
    dim = pushes[0][1].shape[1]
    mean = np.ascontiguousarray(summed[:, :dim]) / np.float32(len(pushes))
    return (merged_keys, mean, np.ascontiguousarray(summed[:, dim]),
            np.ascontiguousarray(summed[:, dim + 1]))


def selected_tables(tables: Mapping[int, SparseTable | DenseTable], all_tables: bool,
                    table_id: int, what: str) -> list[SparseTable]:
    """The sparse tables a Shrink/AgeOneDay request names: every one, or ``table_id``.

    Raises:
        RemoteError: ``table_id`` is not a sparse table of this server.
    """
    if all_tables:
        return [t for t in tables.values() if isinstance(t, SparseTable)]
    table = tables.get(table_id)
    if not isinstance(table, SparseTable):
        raise RemoteError(f"{what}: no sparse table {table_id} on this server (tables: "
                          f"{sorted(tables)}); name a sparse table or set all_tables")
    return [table]


def shrink_tables(tables: list[SparseTable]) -> int:
    """Shrink each table (``SparseTable.shrink``); the rows deleted in all. Blocks
    each shard in turn."""
    return sum(t.shrink() for t in tables)


def age_tables(tables: list[SparseTable]) -> None:
    """Age every row of each table by one day (``SparseTable.age_one_day``)."""
    for table in tables:
        table.age_one_day()
