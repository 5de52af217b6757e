"""The message classes of ``psfleet.proto``, for layers that must not import grpc."""

from psfleet.rpc.psfleet_pb2 import (
    BarrierRequest,
    CreateTableRequest,
    CreateTableResponse,
    Empty,
    PullDenseRequest,
    PullDenseResponse,
    PullSparseRequest,
    PullSparseResponse,
    PushDenseRequest,
    PushSparseRequest,
    StatsRequest,
    StatsResponse,
    StopRequest,
    TableStats,
)

__all__ = [
    "BarrierRequest",
    "CreateTableRequest",
    "CreateTableResponse",
    "Empty",
    "PullDenseRequest",
    "PullDenseResponse",
    "PullSparseRequest",
    "PullSparseResponse",
    "PushDenseRequest",
    "PushSparseRequest",
    "StatsRequest",
    "StatsResponse",
    "StopRequest",
    "TableStats",
]
