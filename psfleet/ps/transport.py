"""How a worker's requests reach a table service: over gRPC, or by a direct call.

A :class:`Transport` issues one request message to one server and returns a pending
reply (``result()`` waits, and raises what the server raised). ``psfleet.rpc.RpcClient``
is the gRPC transport; :class:`InProcessTransport` calls a
:class:`~psfleet.ps.service.TableService` in this process (single-machine training,
``server_num: 0``). Everything above the transport (routing, dense blocks, push ids,
the service's rules) is the same for both.
"""

from __future__ import annotations

from typing import Any, Protocol

from psfleet.ps.service import TableService

__all__ = ["Pending", "Transport", "InProcessTransport"]


class Pending(Protocol):
    """A request in flight."""

    def result(self) -> Any:
        """Block for the response message; raise the request's error."""


class Transport(Protocol):
    """One server as a worker reaches it. Implementations are thread safe."""

    endpoint: str

    def start(self, method: str, request: Any) -> Pending:
        """Issue rpc ``method`` (a name of ``psfleet.proto``) without waiting."""

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


class InProcessTransport:
    """Calls ``service`` directly: the request is handled before :meth:`start` returns.

    Args:
        service: the tables of this process.
    """

    endpoint = "in-process"

    def __init__(self, service: TableService) -> None:
        self.service = service

    def start(self, method: str, request: Any) -> _Done:
        try:
            return _Done(getattr(self.service, method)(request))
        except Exception as exc:  # noqa: BLE001 - raised by result(), as a remote error is
            return _Done(error=exc)

    def close(self) -> None:
        """Nothing to release."""
