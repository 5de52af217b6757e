"""The gRPC transport: the typed hot path encoded into ``psfleet.proto`` messages.

Keys travel as raw little-endian uint64 buffers and values as float32 buffers
(``psfleet.rpc.codec``); the replies are decoded back into arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from psfleet.ps.types import PushMeta
from psfleet.rpc import PendingCall, RpcClient, codec
from psfleet.rpc import messages as msg

__all__ = ["RpcTransport"]


class _Decoded:
    """A call in flight whose reply is decoded by ``decode`` when asked for."""

    def __init__(self, call: PendingCall, decode: Callable[[Any], Any]) -> None:
        self._call = call
        self._decode = decode

    def result(self) -> Any:
        return self._decode(self._call.result())


def _no_reply(reply: Any) -> None:
    return None


class RpcTransport:
    """One server reached over gRPC (deadlines, retries, auth: ``RpcClient``).

    Args:
        client: the connection to the server.
    """

    def __init__(self, client: RpcClient) -> None:
        self.client = client
        self.endpoint = client.endpoint

    def start(self, method: str, request: Any) -> PendingCall:
        return self.client.start(method, request)

    def start_pull_sparse(self, table_id: int, keys: np.ndarray, create: bool,
                          dim: int, with_state: bool = False) -> _Decoded:
        call = self.client.start("PullSparse", msg.PullSparseRequest(
            table_id=table_id, keys=codec.keys_to_bytes(keys), create=create,
            with_state=with_state))
        return _Decoded(call, lambda reply: codec.floats_from_bytes(reply.values, dim))

    def start_push_sparse(self, push: PushMeta, keys: np.ndarray, values: np.ndarray,
                          shows: np.ndarray | None = None,
                          clicks: np.ndarray | None = None) -> _Decoded:
        request = msg.PushSparseRequest(
            table_id=push.table_id, keys=codec.keys_to_bytes(keys),
            grads=codec.floats_to_bytes(values), **_push_fields(push))
        if shows is not None:
            request.shows = codec.floats_to_bytes(shows)
        if clicks is not None:
            request.clicks = codec.floats_to_bytes(clicks)
        return _Decoded(self.client.start("PushSparse", request), _no_reply)

    def start_pull_dense(self, table_id: int, worker_index: int) -> _Decoded:
        call = self.client.start("PullDense", msg.PullDenseRequest(
            table_id=table_id, worker_index=worker_index))
        return _Decoded(call, lambda reply: codec.floats_from_bytes(reply.values))

    def start_push_dense(self, push: PushMeta, values: np.ndarray) -> _Decoded:
        return _Decoded(self.client.start("PushDense", msg.PushDenseRequest(
            table_id=push.table_id, grads=codec.floats_to_bytes(values),
            **_push_fields(push))), _no_reply)

    def close(self) -> None:
        self.client.close()


def _push_fields(push: PushMeta) -> dict[str, Any]:
    client_id, seq = push.push_id
    return {"worker_index": push.worker_index, "step": push.step, "mode": push.mode.name,
            "worker_num": push.worker_num, "push_id": msg.PushId(client_id=client_id, seq=seq),
            "batches": push.batches, "max_staleness": push.max_staleness}
