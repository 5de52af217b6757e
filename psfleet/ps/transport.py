"""How a worker's requests reach a table service: over gRPC, or by a direct call.

A :class:`Transport` issues requests to one server and returns pending replies
(``result()`` waits, and raises what the server raised). The hot path (sparse and
dense pulls and pushes) is typed, arrays in and out, so that only a transport that
crosses a process boundary encodes them: ``psfleet.ps.rpc_transport.RpcTransport``
over gRPC, or :class:`InProcessTransport`, which calls a
:class:`~psfleet.ps.service.TableService` in this process (single-machine training,
``server_num: 0``) without copying a byte. The other calls (create, save, load,
barrier, stats, stop) take the request messages of ``psfleet.proto``. Everything
above the transport (routing, dense blocks, push ids, the service's rules) is the
same for both.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from psfleet.ps.service import TableService
from psfleet.ps.types import PushMeta

__all__ = ["Pending", "Transport", "InProcessTransport"]


class Pending(Protocol):
    """A request in flight."""

    def result(self) -> Any:
        """Block for the reply; raise the request's error."""


class Transport(Protocol):
    """One server as a worker reaches it. Implementations are thread safe."""

    endpoint: str

    def start(self, method: str, request: Any) -> Pending:
        """Issue rpc ``method`` (a name of ``psfleet.proto``) without waiting; the
        reply is the response message."""

    def start_pull_sparse(self, table_id: int, keys: np.ndarray, create: bool,
                          dim: int, with_state: bool = False) -> Pending:
        """Pull rows of ``keys`` (uint64[N]); the reply is float32[N, dim], ``dim``
        the row width asked for (``with_state``: values and rule state)."""

    def start_push_sparse(self, push: PushMeta, keys: np.ndarray, values: np.ndarray,
                          shows: np.ndarray | None = None,
                          clicks: np.ndarray | None = None) -> Pending:
        """Push float32[N, dim] values of distinct keys uint64[N], with per-key show
        and click counts (float32[N] each, or None); the reply is None."""

    def start_pull_dense(self, table_id: int, worker_index: int) -> Pending:
        """Pull this server's dense blocks; the reply is float32[n]."""

    def start_push_dense(self, push: PushMeta, values: np.ndarray) -> Pending:
        """Push float32[n] values for this server's dense blocks; the reply is None."""

    def close(self) -> None:
        """Release the connection."""


class _Done:
    """A reply that is already there (or the error the call raised)."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


def _call(method: Any, *args: Any) -> _Done:
    try:
        return _Done(method(*args))
    except Exception as exc:  # noqa: BLE001 - raised by result(), as a remote error is
        return _Done(error=exc)


class InProcessTransport:
    """Calls ``service`` directly: a request is handled before its ``start_*`` returns.

    Arrays are passed as they are (the service copies what it keeps), so the
    single-process path pays no encoding.

    Args:
        service: the tables of this process.
    """

    endpoint = "in-process"

    def __init__(self, service: TableService) -> None:
        self.service = service

    def start(self, method: str, request: Any) -> _Done:
        return _call(getattr(self.service, method), request)

    def start_pull_sparse(self, table_id: int, keys: np.ndarray, create: bool,
                          dim: int, with_state: bool = False) -> _Done:
        return _call(self.service.pull_sparse, table_id, keys, create, with_state)

    def start_push_sparse(self, push: PushMeta, keys: np.ndarray, values: np.ndarray,
                          shows: np.ndarray | None = None,
                          clicks: np.ndarray | None = None) -> _Done:
        if shows is None and clicks is None:
            return _call(self.service.push_sparse, push, keys, values)
        return _call(self.service.push_sparse, push, keys, values, 0, shows, clicks)

    def start_pull_dense(self, table_id: int, worker_index: int) -> _Done:
        return _call(self.service.pull_dense, table_id, worker_index)

    def start_push_dense(self, push: PushMeta, values: np.ndarray) -> _Done:
        return _call(self.service.push_dense, push, values)

    def close(self) -> None:
        """Nothing to release."""
