from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PushMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPLY: _ClassVar[PushMode]
    SYNC: _ClassVar[PushMode]
    DELTA: _ClassVar[PushMode]
    ROW_DELTA: _ClassVar[PushMode]
    AGGREGATE: _ClassVar[PushMode]

class Parking(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KEEP_PARKING: _ClassVar[Parking]
    PARK: _ClassVar[Parking]
    RESUME: _ClassVar[Parking]
APPLY: PushMode
SYNC: PushMode
DELTA: PushMode
ROW_DELTA: PushMode
AGGREGATE: PushMode
KEEP_PARKING: Parking
PARK: Parking
RESUME: Parking

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CreateTableRequest(_message.Message):
    __slots__ = ("table_id", "config_json", "init_values", "server_index", "server_num", "dense_index")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    INIT_VALUES_FIELD_NUMBER: _ClassVar[int]
    SERVER_INDEX_FIELD_NUMBER: _ClassVar[int]
    SERVER_NUM_FIELD_NUMBER: _ClassVar[int]
    DENSE_INDEX_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    config_json: str
    init_values: bytes
    server_index: int
    server_num: int
    dense_index: bytes
    def __init__(self, table_id: _Optional[int] = ..., config_json: _Optional[str] = ..., init_values: _Optional[bytes] = ..., server_index: _Optional[int] = ..., server_num: _Optional[int] = ..., dense_index: _Optional[bytes] = ...) -> None: ...

class CreateTableResponse(_message.Message):
    __slots__ = ("created",)
    CREATED_FIELD_NUMBER: _ClassVar[int]
    created: bool
    def __init__(self, created: _Optional[bool] = ...) -> None: ...

class PullSparseRequest(_message.Message):
    __slots__ = ("table_id", "keys", "create", "with_state")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    WITH_STATE_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    keys: bytes
    create: bool
    with_state: bool
    def __init__(self, table_id: _Optional[int] = ..., keys: _Optional[bytes] = ..., create: _Optional[bool] = ..., with_state: _Optional[bool] = ...) -> None: ...

class PullSparseResponse(_message.Message):
    __slots__ = ("values", "dim")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    values: bytes
    dim: int
    def __init__(self, values: _Optional[bytes] = ..., dim: _Optional[int] = ...) -> None: ...

class PushId(_message.Message):
    __slots__ = ("client_id", "seq")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    seq: int
    def __init__(self, client_id: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class PushSparseRequest(_message.Message):
    __slots__ = ("table_id", "keys", "grads", "worker_index", "step", "mode", "worker_num", "push_id", "poll", "incarnation", "shows", "clicks", "batches", "max_staleness")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    WORKER_NUM_FIELD_NUMBER: _ClassVar[int]
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SHOWS_FIELD_NUMBER: _ClassVar[int]
    CLICKS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    keys: bytes
    grads: bytes
    worker_index: int
    step: int
    mode: PushMode
    worker_num: int
    push_id: PushId
    poll: bool
    incarnation: int
    shows: bytes
    clicks: bytes
    batches: int
    max_staleness: int
    def __init__(self, table_id: _Optional[int] = ..., keys: _Optional[bytes] = ..., grads: _Optional[bytes] = ..., worker_index: _Optional[int] = ..., step: _Optional[int] = ..., mode: _Optional[_Union[PushMode, str]] = ..., worker_num: _Optional[int] = ..., push_id: _Optional[_Union[PushId, _Mapping]] = ..., poll: _Optional[bool] = ..., incarnation: _Optional[int] = ..., shows: _Optional[bytes] = ..., clicks: _Optional[bytes] = ..., batches: _Optional[int] = ..., max_staleness: _Optional[int] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("done",)
    DONE_FIELD_NUMBER: _ClassVar[int]
    done: bool
    def __init__(self, done: _Optional[bool] = ...) -> None: ...

class PullDenseRequest(_message.Message):
    __slots__ = ("table_id", "worker_index")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    worker_index: int
    def __init__(self, table_id: _Optional[int] = ..., worker_index: _Optional[int] = ...) -> None: ...

class PullDenseResponse(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: bytes
    def __init__(self, values: _Optional[bytes] = ...) -> None: ...

class PushDenseRequest(_message.Message):
    __slots__ = ("table_id", "grads", "worker_index", "step", "mode", "worker_num", "push_id", "poll", "incarnation", "batches", "max_staleness")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    WORKER_NUM_FIELD_NUMBER: _ClassVar[int]
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    POLL_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    grads: bytes
    worker_index: int
    step: int
    mode: PushMode
    worker_num: int
    push_id: PushId
    poll: bool
    incarnation: int
    batches: int
    max_staleness: int
    def __init__(self, table_id: _Optional[int] = ..., grads: _Optional[bytes] = ..., worker_index: _Optional[int] = ..., step: _Optional[int] = ..., mode: _Optional[_Union[PushMode, str]] = ..., worker_num: _Optional[int] = ..., push_id: _Optional[_Union[PushId, _Mapping]] = ..., poll: _Optional[bool] = ..., incarnation: _Optional[int] = ..., batches: _Optional[int] = ..., max_staleness: _Optional[int] = ...) -> None: ...

class BarrierRequest(_message.Message):
    __slots__ = ("name", "worker_index", "worker_num", "incarnation", "seq")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    WORKER_NUM_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    name: str
    worker_index: int
    worker_num: int
    incarnation: int
    seq: int
    def __init__(self, name: _Optional[str] = ..., worker_index: _Optional[int] = ..., worker_num: _Optional[int] = ..., incarnation: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class BarrierResponse(_message.Message):
    __slots__ = ("done",)
    DONE_FIELD_NUMBER: _ClassVar[int]
    done: bool
    def __init__(self, done: _Optional[bool] = ...) -> None: ...

class ClockRequest(_message.Message):
    __slots__ = ("worker_index", "worker_num", "incarnation", "steps", "parking", "need")
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    WORKER_NUM_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PARKING_FIELD_NUMBER: _ClassVar[int]
    NEED_FIELD_NUMBER: _ClassVar[int]
    worker_index: int
    worker_num: int
    incarnation: int
    steps: int
    parking: Parking
    need: int
    def __init__(self, worker_index: _Optional[int] = ..., worker_num: _Optional[int] = ..., incarnation: _Optional[int] = ..., steps: _Optional[int] = ..., parking: _Optional[_Union[Parking, str]] = ..., need: _Optional[int] = ...) -> None: ...

class ClockResponse(_message.Message):
    __slots__ = ("done", "slowest")
    DONE_FIELD_NUMBER: _ClassVar[int]
    SLOWEST_FIELD_NUMBER: _ClassVar[int]
    done: bool
    slowest: int
    def __init__(self, done: _Optional[bool] = ..., slowest: _Optional[int] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("worker_index",)
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    worker_index: int
    def __init__(self, worker_index: _Optional[int] = ...) -> None: ...

class SaveRequest(_message.Message):
    __slots__ = ("dirname", "server_index", "dense", "mode", "request_id")
    DIRNAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_INDEX_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    dirname: str
    server_index: int
    dense: _containers.RepeatedCompositeFieldContainer[DenseIndex]
    mode: str
    request_id: PushId
    def __init__(self, dirname: _Optional[str] = ..., server_index: _Optional[int] = ..., dense: _Optional[_Iterable[_Union[DenseIndex, _Mapping]]] = ..., mode: _Optional[str] = ..., request_id: _Optional[_Union[PushId, _Mapping]] = ...) -> None: ...

class DenseIndex(_message.Message):
    __slots__ = ("table_id", "index")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    index: bytes
    def __init__(self, table_id: _Optional[int] = ..., index: _Optional[bytes] = ...) -> None: ...

class FileDigest(_message.Message):
    __slots__ = ("path", "size", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class SaveResponse(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileDigest]
    def __init__(self, files: _Optional[_Iterable[_Union[FileDigest, _Mapping]]] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("dirname", "server_index", "server_num", "dense")
    DIRNAME_FIELD_NUMBER: _ClassVar[int]
    SERVER_INDEX_FIELD_NUMBER: _ClassVar[int]
    SERVER_NUM_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    dirname: str
    server_index: int
    server_num: int
    dense: _containers.RepeatedCompositeFieldContainer[DenseIndex]
    def __init__(self, dirname: _Optional[str] = ..., server_index: _Optional[int] = ..., server_num: _Optional[int] = ..., dense: _Optional[_Iterable[_Union[DenseIndex, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("host_view",)
    HOST_VIEW_FIELD_NUMBER: _ClassVar[int]
    host_view: bool
    def __init__(self, host_view: _Optional[bool] = ...) -> None: ...

class TableStats(_message.Message):
    __slots__ = ("table_id", "name", "rows", "memory_bytes", "rejected_non_finite", "pulls", "pulled_rows", "pushes", "pushed_rows", "admitted", "rejected", "evicted", "deleted", "spilled", "promoted", "disk_rows", "disk_bytes")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_NON_FINITE_FIELD_NUMBER: _ClassVar[int]
    PULLS_FIELD_NUMBER: _ClassVar[int]
    PULLED_ROWS_FIELD_NUMBER: _ClassVar[int]
    PUSHES_FIELD_NUMBER: _ClassVar[int]
    PUSHED_ROWS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    SPILLED_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    DISK_ROWS_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    table_id: int
    name: str
    rows: int
    memory_bytes: int
    rejected_non_finite: int
    pulls: int
    pulled_rows: int
    pushes: int
    pushed_rows: int
    admitted: int
    rejected: int
    evicted: int
    deleted: int
    spilled: int
    promoted: int
    disk_rows: int
    disk_bytes: int
    def __init__(self, table_id: _Optional[int] = ..., name: _Optional[str] = ..., rows: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., rejected_non_finite: _Optional[int] = ..., pulls: _Optional[int] = ..., pulled_rows: _Optional[int] = ..., pushes: _Optional[int] = ..., pushed_rows: _Optional[int] = ..., admitted: _Optional[int] = ..., rejected: _Optional[int] = ..., evicted: _Optional[int] = ..., deleted: _Optional[int] = ..., spilled: _Optional[int] = ..., promoted: _Optional[int] = ..., disk_rows: _Optional[int] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("tables", "uptime_s", "shares_held", "shares_served", "departed_hosts", "share_num", "replication")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    SHARES_HELD_FIELD_NUMBER: _ClassVar[int]
    SHARES_SERVED_FIELD_NUMBER: _ClassVar[int]
    DEPARTED_HOSTS_FIELD_NUMBER: _ClassVar[int]
    SHARE_NUM_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableStats]
    uptime_s: float
    shares_held: _containers.RepeatedScalarFieldContainer[int]
    shares_served: _containers.RepeatedScalarFieldContainer[int]
    departed_hosts: _containers.RepeatedScalarFieldContainer[int]
    share_num: int
    replication: int
    def __init__(self, tables: _Optional[_Iterable[_Union[TableStats, _Mapping]]] = ..., uptime_s: _Optional[float] = ..., shares_held: _Optional[_Iterable[int]] = ..., shares_served: _Optional[_Iterable[int]] = ..., departed_hosts: _Optional[_Iterable[int]] = ..., share_num: _Optional[int] = ..., replication: _Optional[int] = ...) -> None: ...

class ShrinkRequest(_message.Message):
    __slots__ = ("all_tables", "table_id", "request_id")
    ALL_TABLES_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    all_tables: bool
    table_id: int
    request_id: PushId
    def __init__(self, all_tables: _Optional[bool] = ..., table_id: _Optional[int] = ..., request_id: _Optional[_Union[PushId, _Mapping]] = ...) -> None: ...

class ShrinkResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class AgeOneDayRequest(_message.Message):
    __slots__ = ("all_tables", "table_id", "request_id")
    ALL_TABLES_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    all_tables: bool
    table_id: int
    request_id: PushId
    def __init__(self, all_tables: _Optional[bool] = ..., table_id: _Optional[int] = ..., request_id: _Optional[_Union[PushId, _Mapping]] = ...) -> None: ...

class ShareMapMessage(_message.Message):
    __slots__ = ("dead_hosts", "dead_incarnations", "leaving_hosts", "leaving_incarnations", "joined", "released", "promoted", "added_hosts", "added_endpoints", "added_incarnations")
    DEAD_HOSTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_INCARNATIONS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_HOSTS_FIELD_NUMBER: _ClassVar[int]
    LEAVING_INCARNATIONS_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    ADDED_HOSTS_FIELD_NUMBER: _ClassVar[int]
    ADDED_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    ADDED_INCARNATIONS_FIELD_NUMBER: _ClassVar[int]
    dead_hosts: _containers.RepeatedScalarFieldContainer[int]
    dead_incarnations: _containers.RepeatedScalarFieldContainer[int]
    leaving_hosts: _containers.RepeatedScalarFieldContainer[int]
    leaving_incarnations: _containers.RepeatedScalarFieldContainer[int]
    joined: _containers.RepeatedCompositeFieldContainer[ShareCopy]
    released: _containers.RepeatedCompositeFieldContainer[ShareCopy]
    promoted: _containers.RepeatedCompositeFieldContainer[ShareCopy]
    added_hosts: _containers.RepeatedScalarFieldContainer[int]
    added_endpoints: _containers.RepeatedScalarFieldContainer[str]
    added_incarnations: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, dead_hosts: _Optional[_Iterable[int]] = ..., dead_incarnations: _Optional[_Iterable[int]] = ..., leaving_hosts: _Optional[_Iterable[int]] = ..., leaving_incarnations: _Optional[_Iterable[int]] = ..., joined: _Optional[_Iterable[_Union[ShareCopy, _Mapping]]] = ..., released: _Optional[_Iterable[_Union[ShareCopy, _Mapping]]] = ..., promoted: _Optional[_Iterable[_Union[ShareCopy, _Mapping]]] = ..., added_hosts: _Optional[_Iterable[int]] = ..., added_endpoints: _Optional[_Iterable[str]] = ..., added_incarnations: _Optional[_Iterable[int]] = ...) -> None: ...

class ShareCopy(_message.Message):
    __slots__ = ("share", "host", "incarnation", "copy")
    SHARE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    share: int
    host: int
    incarnation: int
    copy: int
    def __init__(self, share: _Optional[int] = ..., host: _Optional[int] = ..., incarnation: _Optional[int] = ..., copy: _Optional[int] = ...) -> None: ...

class ReplicasRequest(_message.Message):
    __slots__ = ("endpoints", "host_index", "replication", "map", "shares")
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    HOST_INDEX_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedScalarFieldContainer[str]
    host_index: int
    replication: int
    map: ShareMapMessage
    shares: int
    def __init__(self, endpoints: _Optional[_Iterable[str]] = ..., host_index: _Optional[int] = ..., replication: _Optional[int] = ..., map: _Optional[_Union[ShareMapMessage, _Mapping]] = ..., shares: _Optional[int] = ...) -> None: ...

class FailoverRequest(_message.Message):
    __slots__ = ("host", "map")
    HOST_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    host: int
    map: ShareMapMessage
    def __init__(self, host: _Optional[int] = ..., map: _Optional[_Union[ShareMapMessage, _Mapping]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("timeout_s",)
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    def __init__(self, timeout_s: _Optional[float] = ...) -> None: ...

class RejoinRequest(_message.Message):
    __slots__ = ("host", "incarnation")
    HOST_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    host: int
    incarnation: int
    def __init__(self, host: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class CopyShareRequest(_message.Message):
    __slots__ = ("share", "host", "incarnation", "move", "replaced_host", "replaced_incarnation", "promote")
    SHARE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    MOVE_FIELD_NUMBER: _ClassVar[int]
    REPLACED_HOST_FIELD_NUMBER: _ClassVar[int]
    REPLACED_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PROMOTE_FIELD_NUMBER: _ClassVar[int]
    share: int
    host: int
    incarnation: int
    move: bool
    replaced_host: int
    replaced_incarnation: int
    promote: bool
    def __init__(self, share: _Optional[int] = ..., host: _Optional[int] = ..., incarnation: _Optional[int] = ..., move: _Optional[bool] = ..., replaced_host: _Optional[int] = ..., replaced_incarnation: _Optional[int] = ..., promote: _Optional[bool] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("host", "endpoint", "incarnation")
    HOST_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    host: int
    endpoint: str
    incarnation: int
    def __init__(self, host: _Optional[int] = ..., endpoint: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class SharedFile(_message.Message):
    __slots__ = ("path", "data")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    path: str
    data: bytes
    def __init__(self, path: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReceiveShareRequest(_message.Message):
    __slots__ = ("share", "incarnation", "files", "applied", "more", "part", "copy", "coordination")
    SHARE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    COORDINATION_FIELD_NUMBER: _ClassVar[int]
    share: int
    incarnation: int
    files: _containers.RepeatedCompositeFieldContainer[SharedFile]
    applied: _containers.RepeatedCompositeFieldContainer[PushId]
    more: bool
    part: int
    copy: int
    coordination: str
    def __init__(self, share: _Optional[int] = ..., incarnation: _Optional[int] = ..., files: _Optional[_Iterable[_Union[SharedFile, _Mapping]]] = ..., applied: _Optional[_Iterable[_Union[PushId, _Mapping]]] = ..., more: _Optional[bool] = ..., part: _Optional[int] = ..., copy: _Optional[int] = ..., coordination: _Optional[str] = ...) -> None: ...
