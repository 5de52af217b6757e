"""Checks of a request against one server's limits, done before anything is allocated.

Used by :class:`~psfleet.ps.service.TableService` on every call, so that no single
request (a fuzzer's, a bug's, an attacker's) can make a server allocate without bound,
poison a table with NaN, or fail with an INTERNAL error. Every check raises
:class:`~psfleet.errors.InvalidRequestError` (gRPC INVALID_ARGUMENT) naming the field,
the value, the limit and how to change it.

Policies (documented here, applied by the service):

- **Worker counts.** A job has one ``worker_num``. The server fixes it from its
  ``job_worker_num`` setting (a server launched by fleetrun, slurm or k8s: its
  ``PADDLE_TRAINERS_NUM``), or else from the first call that carries one (a Barrier
  or a SYNC push); a later call with another worker_num is rejected naming both. It
  is capped by ``ServerLimits.max_worker_num``. A ``worker_index`` must be below it.
- **Table sizes.** A sparse table's dim, num_buckets and num_shards, and a dense
  table's size, must not exceed :class:`~psfleet.ps.types.ServerLimits`.
- **Echoed text.** A message quotes a request's names (a table's, a barrier's) at most
  :data:`MAX_ECHO_CHARS` characters long (:func:`clip_text`): gRPC sends the message
  as a header, and a header above the client's soft limit (8 KiB) replaces the
  status with RESOURCE_EXHAUSTED "Stream removed", losing the reason.
- **Names and the control plane.** A table's or barrier's name is at most
  ``max_name_chars`` long. A replicated job's layout (``SetReplicas``: endpoints,
  shares) and every share map on the wire (``MergeMap``, ``Failover``, ...) are
  checked for their counts, the lengths of the lists that go in pairs, and every host,
  incarnation, share and endpoint, before the server takes its lock
  (:func:`check_endpoints`, :func:`check_map_message`, :func:`check_member`).
- **Non-finite values.** A push (gradients or GEO deltas, sparse or dense) or a dense
  table's initial values containing NaN or +-Inf is rejected whole, nothing applied;
  the table's ``rejected_non_finite`` count in Stats grows by one. One NaN would
  otherwise poison its rows (and with Adam, their optimizer state) for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel

from psfleet.errors import MAX_ECHO_CHARS, InvalidRequestError, clip_text
from psfleet.ps.types import DenseTableConfig, ServerLimits, SparseTableConfig

__all__ = ["JobWorkers", "check_table_config", "count_non_finite", "check_pull_size",
           "clip_text", "config_difference", "MAX_ECHO_CHARS", "check_name",
           "check_endpoints", "check_endpoint", "check_member", "check_map_message",
           "check_share", "check_placement"]

_HOW_TO_RAISE = ("this server's limit (psfleet.ps.types.ServerLimits.{field}); a model that "
                 "needs more starts its servers with PSFLEET_SERVER_LIMITS={field}=... in "
                 "their environment (or TableService(limits=ServerLimits({field}=...)))")


def _flat(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict of dotted keys: ``{"rule": {"lr": 1}}`` -> ``{"rule.lr": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_difference(here: BaseModel, sent: BaseModel) -> str:
    """The fields in which two table configs differ, as text:
    ``dim: 8 here, 16 sent; rule.learning_rate: 0.001 here, 0.5 sent`` (values clipped
    with :func:`~psfleet.errors.clip_text`), or the two types when they differ."""
    if type(here) is not type(sent):
        return f"a {type(here).__name__} here, a {type(sent).__name__} sent"
    a, b = _flat(here.model_dump()), _flat(sent.model_dump())
    return "; ".join(f"{key}: {clip_text(repr(a.get(key)))} here, "
                     f"{clip_text(repr(b.get(key)))} sent"
                     for key in sorted(a.keys() | b.keys()) if a.get(key) != b.get(key))


def _over(what: str, value: int, field: str, limit: int) -> InvalidRequestError:
    return InvalidRequestError(f"{what} {value} is above {limit}, "
                               + _HOW_TO_RAISE.format(field=field))


def check_table_config(table_id: int, config: SparseTableConfig | DenseTableConfig,
                       limits: ServerLimits) -> None:
    """Reject a table whose size is above the server's limits.

    Raises:
        InvalidRequestError: names the field, its value and the limit.
    """
    what = f"table {table_id} ({clip_text(repr(config.name))}):"
    if isinstance(config, SparseTableConfig):
        for field, value, limit in (("max_dim", config.dim, limits.max_dim),
                                    ("max_num_buckets", config.num_buckets,
                                     limits.max_num_buckets),
                                    ("max_num_shards", config.num_shards,
                                     limits.max_num_shards)):
            if value > limit:
                raise _over(f"{what} {field.removeprefix('max_')}", value, field, limit)
    elif config.size > limits.max_dense_size:
        raise _over(f"{what} size", config.size, "max_dense_size", limits.max_dense_size)


def check_pull_size(table_id: int, keys: int, dim: int, limits: ServerLimits) -> None:
    """Reject a pull whose response (keys x dim float32) would exceed the limit.

    Raises:
        InvalidRequestError: names the table, the sizes and what to do.
    """
    nbytes = keys * dim * 4
    if nbytes > limits.max_pull_bytes:
        raise InvalidRequestError(
            f"table {table_id}: a pull of {keys} keys x dim {dim} is {nbytes} bytes, above "
            f"{limits.max_pull_bytes} ({_HOW_TO_RAISE.format(field='max_pull_bytes')}); "
            "pull fewer keys per call")


def count_non_finite(values: np.ndarray) -> int:
    """How many of ``values`` (float32, any shape) are NaN or +-Inf.

    Vectorised: one ``np.isfinite`` pass (about 0.1 ms for 10^5 x 9); the count is
    only computed when some value is not finite.
    """
    finite = np.isfinite(values)
    return 0 if finite.all() else int(values.size - np.count_nonzero(finite))


class JobWorkers:
    """The job's worker count as this server knows it. Thread safe.

    Args:
        limits: the server's limits (``max_worker_num``).
        worker_num: the job's worker count when the server is told it; None: fixed
            by the first call that carries one.
    """

    def __init__(self, limits: ServerLimits, worker_num: int | None = None) -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self.worker_num = worker_num
        self._progress: dict[int, float] = {}  # worker index -> its last push or pull

    def note_progress(self, worker_index: int) -> None:
        """Record that worker ``worker_index`` (checked) pushed or pulled just now: it
        is training, so a barrier waiting for it is not waiting on a dead worker."""
        with self._lock:
            self._progress[worker_index] = time.monotonic()

    def last_progress_s(self, besides: Collection[int], worker_num: int) -> float | None:
        """The ``time.monotonic()`` of the latest push or pull of a worker below
        ``worker_num`` and not in ``besides`` (None: none yet). O(workers seen)."""
        with self._lock:
            times = [t for w, t in self._progress.items() if w < worker_num and w not in besides]
        return max(times, default=None)

    def check(self, what: str, worker_index: int, worker_num: int) -> None:
        """Check a call carrying the job's worker count (a Barrier, a SYNC push);
        the first such call fixes it.

        Raises:
            InvalidRequestError: worker_num is 0, above the limit or differs from the
                job's (names both), or worker_index >= worker_num.
        """
        what = clip_text(what)
        if not 1 <= worker_num <= self._limits.max_worker_num:
            raise InvalidRequestError(
                f"{what}: worker_num {worker_num} is not in 1..{self._limits.max_worker_num}"
                f" ({_HOW_TO_RAISE.format(field='max_worker_num')})")
        with self._lock:
            if self.worker_num is None:
                self.worker_num = worker_num
            job = self.worker_num
        if worker_num != job:
            raise InvalidRequestError(
                f"{what}: worker_num {worker_num} differs from this job's worker_num {job} "
                "(fixed by the server's setting or the first barrier or sync push); every "
                "worker must be started with the same worker count")
        if worker_index >= worker_num:
            raise InvalidRequestError(
                f"{what}: worker_index {worker_index} >= worker_num {worker_num}")

    def check_index(self, what: str, worker_index: int) -> None:
        """Check the worker_index of a call without a worker count (an async push, a
        dense pull): below the job's worker_num once known, else below the limit.

        Raises:
            InvalidRequestError: worker_index is out of range (names the bound).
        """
        what = clip_text(what)
        bound = self.worker_num or self._limits.max_worker_num
        if worker_index >= bound:
            raise InvalidRequestError(
                f"{what}: worker_index {worker_index} >= worker_num {bound}")


def check_name(what: str, name: str, limits: ServerLimits) -> None:
    """Reject a table's or barrier's name above ``limits.max_name_chars``.

    Raises:
        InvalidRequestError: names ``what``, the length and the limit.
    """
    if len(name) > limits.max_name_chars:
        raise InvalidRequestError(
            f"{clip_text(what)}: a name of {len(name)} characters ({clip_text(repr(name))}) "
            f"is above {limits.max_name_chars}; use a shorter name, or raise "
            + _HOW_TO_RAISE.format(field="max_name_chars"))


def _check_count(what: str, count: int, field: str, limit: int) -> None:
    if count > limit:
        raise _over(what, count, field, limit)


def check_endpoints(what: str, endpoints: Sequence[str], limits: ServerLimits) -> None:
    """Reject a list of server endpoints that is empty, longer than
    ``limits.max_hosts``, or holds an empty endpoint or one longer than
    ``limits.max_endpoint_chars``; checked before any work per endpoint.

    Raises:
        InvalidRequestError: names ``what``, the entry at fault and the limit.
    """
    if not endpoints:
        raise InvalidRequestError(f"{what}: no endpoints; give every server's host:port "
                                  "(PADDLE_PSERVERS_IP_PORT_LIST)")
    _check_count(f"{what}: endpoints", len(endpoints), "max_hosts", limits.max_hosts)
    for i, endpoint in enumerate(endpoints):
        check_endpoint(f"{what}: endpoints[{i}]", endpoint, limits)


def check_endpoint(what: str, endpoint: str, limits: ServerLimits) -> None:
    """Reject an empty endpoint or one above ``limits.max_endpoint_chars``.

    Raises:
        InvalidRequestError: names ``what``, the endpoint (clipped) and the limit.
    """
    if not endpoint or len(endpoint) > limits.max_endpoint_chars:
        raise InvalidRequestError(
            f"{what}: {clip_text(repr(endpoint))} ({len(endpoint)} characters) is not an "
            f"endpoint host:port of 1..{limits.max_endpoint_chars} characters")


def check_member(what: str, host: int, incarnation: int, limits: ServerLimits,
                 host_num: int | None = None) -> None:
    """Reject a member ``(host, incarnation)`` with a host at or above ``host_num``
    (None: ``limits.max_hosts``) or an incarnation above ``limits.max_incarnation``.

    Raises:
        InvalidRequestError: names ``what``, the value and the bound.
    """
    bound = limits.max_hosts if host_num is None else host_num
    if host >= bound:
        raise InvalidRequestError(f"{what}: host {host} is not a host of this job (0.."
                                  f"{bound - 1})")
    if incarnation > limits.max_incarnation:
        raise _over(f"{what}: incarnation", incarnation, "max_incarnation",
                    limits.max_incarnation)


def check_map_message(what: str, message: Any, limits: ServerLimits) -> None:
    """Check a ``ShareMapMessage`` before it is read: every list at most
    ``limits.max_map_entries`` long, the lists that go in pairs (``dead_hosts`` and
    ``dead_incarnations``, ...) of equal length, every host below ``limits.max_hosts``,
    every incarnation and copy number at most ``limits.max_incarnation``, every share
    below ``limits.max_shares`` and every endpoint a short one. O(entries), no lock.

    Raises:
        InvalidRequestError: names the list (``map.dead_hosts``) and the entry at fault.
    """
    groups = {"dead": ("dead_hosts", "dead_incarnations"),
              "leaving": ("leaving_hosts", "leaving_incarnations"),
              "added": ("added_hosts", "added_incarnations", "added_endpoints")}
    for names in groups.values():
        lengths = {name: len(getattr(message, name)) for name in names}
        for name, length in lengths.items():
            _check_count(f"{what}: map.{name} of", length, "max_map_entries",
                         limits.max_map_entries)
        if len(set(lengths.values())) > 1:
            raise InvalidRequestError(
                f"{what}: map lists that go in pairs differ in length: "
                + ", ".join(f"{name} {length}" for name, length in lengths.items())
                + "; entry i of each describes one member")
        hosts, incarnations = getattr(message, names[0]), getattr(message, names[1])
        for i, (host, incarnation) in enumerate(zip(hosts, incarnations, strict=True)):
            check_member(f"{what}: map.{names[0]}[{i}]", host, incarnation, limits)
    for i, endpoint in enumerate(message.added_endpoints):
        check_endpoint(f"{what}: map.added_endpoints[{i}]", endpoint, limits)
    for name in ("joined", "released", "promoted"):
        copies = getattr(message, name)
        _check_count(f"{what}: map.{name} of", len(copies), "max_map_entries",
                     limits.max_map_entries)
        for i, copy in enumerate(copies):
            where = f"{what}: map.{name}[{i}]"
            check_member(where, copy.host, copy.incarnation, limits)
            check_share(where, copy.share, limits)
            if copy.copy > limits.max_incarnation:
                raise _over(f"{where}: copy", copy.copy, "max_incarnation",
                            limits.max_incarnation)


def check_share(what: str, share: int, limits: ServerLimits, share_num: int | None = None
                ) -> None:
    """Reject a share at or above ``share_num`` (None: ``limits.max_shares``).

    Raises:
        InvalidRequestError: names ``what``, the share and the shares there are.
    """
    bound = limits.max_shares if share_num is None else share_num
    if share >= bound:
        raise InvalidRequestError(f"{what}: share {share} is not a share of this job "
                                  f"(0..{bound - 1})")


def check_placement(what: str, server_index: int, server_num: int, limits: ServerLimits
                    ) -> None:
    """Reject a server count of 0 or above ``limits.max_hosts``, or a server index at
    or above it (a ``CreateTable``'s place of the receiving server).

    Raises:
        InvalidRequestError: names ``what`` and both numbers.
    """
    if not 1 <= server_num <= limits.max_hosts or server_index >= server_num:
        raise InvalidRequestError(
            f"{what}: server_index {server_index} of server_num {server_num}; server_num "
            f"must be the job's servers (1..{limits.max_hosts}) and server_index below it")
