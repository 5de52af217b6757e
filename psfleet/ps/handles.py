"""Handles of requests in flight: a pull's rows and a push's completion (futures).

``psfleet.ps.client.TableClient`` returns them from ``start_pull_sparse`` and
``start_push_sparse`` / ``start_push_dense``; the communicators and the embeddings hold
them to overlap RPC with compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from psfleet.ps.routing import RoutedKeys
from psfleet.ps.transport import Pending
from psfleet.ps.wait_budget import poll_until_done

if TYPE_CHECKING:
    import torch

__all__ = ["PullHandle", "PushHandle", "wait_all"]

#: A pull's rows: float32[N, dim] on the host, or a tensor on pass mode's cache device.
Rows = Union[np.ndarray, "torch.Tensor"]


class PullHandle:
    """Rows being pulled (a future; ``TableClient.start_pull_sparse``).

    :meth:`result` blocks until every server answered and returns float32[N, dim]
    in the order of the keys asked for; later calls return the same array. Dropping
    a handle whose result was never asked for is harmless. ``keys`` are the keys
    pulled, routed where the client routed them, to push the step's gradients with
    (so a key is hashed once per step).
    """

    def __init__(self, keys: np.ndarray | RoutedKeys,
                 collect: Callable[[], Rows]) -> None:
        self.keys = keys
        self._collect = collect
        self._rows: Rows | None = None

    @classmethod
    def ready(cls, keys: np.ndarray | RoutedKeys, rows: Rows) -> PullHandle:
        """A handle whose rows float32[N, dim] (an array, or a tensor on pass mode's
        cache device) are already here."""
        handle = cls(keys, lambda: rows)
        handle._rows = rows
        return handle

    def result(self) -> Rows:
        """The rows, float32[N, dim]: an array (a tensor from pass mode's cache).
        Raises the pull's RpcError / RemoteError."""
        if self._rows is None:
            self._rows = self._collect()
        return self._rows


def wait_all(pending: Sequence[Pending]) -> list[Any]:
    """Every reply of ``pending``, in order. Every call has ended when this returns or
    raises (the first error, after the others finished), so a caller cleaning up after
    a failure (e.g. removing a half-written checkpoint) races no server."""
    replies: list[Any] = []
    first_error: BaseException | None = None
    for call in pending:
        try:
            replies.append(call.result())
        except Exception as exc:  # noqa: BLE001 - re-raised below
            first_error = first_error or exc
    if first_error is not None:
        raise first_error
    return replies


class PushHandle:
    """A push in flight (``TableClient.start_push_sparse`` / ``start_push_dense``).

    :meth:`result` blocks until every server the push went to has applied it, and
    raises the first server's error after all of them answered. A SYNC push is a long
    poll (``psfleet.ps.sync_rounds``): a server whose reply says "not done" is polled
    (``polls``, one per pending call) until its round is applied.
    """

    def __init__(self, pending: Sequence[Pending],
                 polls: Sequence[Callable[[], bool]] | None = None) -> None:
        self._pending = list(pending)
        self._polls = None if polls is None else list(polls)

    def result(self) -> None:
        """Wait for the push. Raises RpcError / RemoteError / ConfigError as a server did."""
        replies = wait_all(self._pending)
        if self._polls is None:
            return
        for reply, poll in zip(replies, self._polls, strict=True):
            if not reply.done:
                poll_until_done(poll)
