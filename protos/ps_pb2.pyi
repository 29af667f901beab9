from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PushKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUSH_VALUES: _ClassVar[PushKind]
    PUSH_REPORT: _ClassVar[PushKind]
    PUSH_SNAPSHOT: _ClassVar[PushKind]

class StoreOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STORE_OP_UNSPECIFIED: _ClassVar[StoreOp]
    STORE_SET: _ClassVar[StoreOp]
    STORE_GET: _ClassVar[StoreOp]
    STORE_ADD: _ClassVar[StoreOp]
    STORE_CHECK: _ClassVar[StoreOp]
    STORE_WAIT: _ClassVar[StoreOp]
    STORE_COMPARE_SET: _ClassVar[StoreOp]
    STORE_DELETE: _ClassVar[StoreOp]
    STORE_NUM_KEYS: _ClassVar[StoreOp]
PUSH_VALUES: PushKind
PUSH_REPORT: PushKind
PUSH_SNAPSHOT: PushKind
STORE_OP_UNSPECIFIED: StoreOp
STORE_SET: StoreOp
STORE_GET: StoreOp
STORE_ADD: StoreOp
STORE_CHECK: StoreOp
STORE_WAIT: StoreOp
STORE_COMPARE_SET: StoreOp
STORE_DELETE: StoreOp
STORE_NUM_KEYS: StoreOp

class TensorSpec(_message.Message):
    __slots__ = ("name", "shape", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("name", "cores", "cuda", "cuda_device", "max_batch", "dataset_length", "dataset_fingerprint", "switch_paths")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    CUDA_FIELD_NUMBER: _ClassVar[int]
    CUDA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    DATASET_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DATASET_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SWITCH_PATHS_FIELD_NUMBER: _ClassVar[int]
    name: str
    cores: float
    cuda: bool
    cuda_device: str
    max_batch: int
    dataset_length: int
    dataset_fingerprint: str
    switch_paths: bool
    def __init__(self, name: _Optional[str] = ..., cores: _Optional[float] = ..., cuda: _Optional[bool] = ..., cuda_device: _Optional[str] = ..., max_batch: _Optional[int] = ..., dataset_length: _Optional[int] = ..., dataset_fingerprint: _Optional[str] = ..., switch_paths: _Optional[bool] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("worker_id", "job_json", "layout", "num_params", "batch_size", "round", "version", "epoch", "index", "heartbeat_interval_s", "rank", "world_size", "generation", "backend", "shards", "secret", "global_batch")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_JSON_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    job_json: str
    layout: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    num_params: int
    batch_size: int
    round: int
    version: int
    epoch: int
    index: int
    heartbeat_interval_s: float
    rank: int
    world_size: int
    generation: int
    backend: str
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    secret: str
    global_batch: int
    def __init__(self, worker_id: _Optional[str] = ..., job_json: _Optional[str] = ..., layout: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., num_params: _Optional[int] = ..., batch_size: _Optional[int] = ..., round: _Optional[int] = ..., version: _Optional[int] = ..., epoch: _Optional[int] = ..., index: _Optional[int] = ..., heartbeat_interval_s: _Optional[float] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., generation: _Optional[int] = ..., backend: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ..., secret: _Optional[str] = ..., global_batch: _Optional[int] = ...) -> None: ...

class ShardInfo(_message.Message):
    __slots__ = ("address", "start", "stop")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    address: str
    start: int
    stop: int
    def __init__(self, address: _Optional[str] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class PushHeader(_message.Message):
    __slots__ = ("worker_id", "round", "version", "batch_size", "compute_ms", "wire_dtype", "num_values", "kind", "generation", "secret", "offsets", "exposed_ms", "own_exposed_ms", "local_sq_norm", "global_sq_norm", "data_wait_ms", "sub_batch", "sub_sq_norm")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_VALUES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_MS_FIELD_NUMBER: _ClassVar[int]
    OWN_EXPOSED_MS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SQ_NORM_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_SQ_NORM_FIELD_NUMBER: _ClassVar[int]
    DATA_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    SUB_BATCH_FIELD_NUMBER: _ClassVar[int]
    SUB_SQ_NORM_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    round: int
    version: int
    batch_size: int
    compute_ms: float
    wire_dtype: str
    num_values: int
    kind: PushKind
    generation: int
    secret: str
    offsets: bool
    exposed_ms: float
    own_exposed_ms: float
    local_sq_norm: float
    global_sq_norm: float
    data_wait_ms: float
    sub_batch: int
    sub_sq_norm: float
    def __init__(self, worker_id: _Optional[str] = ..., round: _Optional[int] = ..., version: _Optional[int] = ..., batch_size: _Optional[int] = ..., compute_ms: _Optional[float] = ..., wire_dtype: _Optional[str] = ..., num_values: _Optional[int] = ..., kind: _Optional[_Union[PushKind, str]] = ..., generation: _Optional[int] = ..., secret: _Optional[str] = ..., offsets: _Optional[bool] = ..., exposed_ms: _Optional[float] = ..., own_exposed_ms: _Optional[float] = ..., local_sq_norm: _Optional[float] = ..., global_sq_norm: _Optional[float] = ..., data_wait_ms: _Optional[float] = ..., sub_batch: _Optional[int] = ..., sub_sq_norm: _Optional[float] = ...) -> None: ...

class PushEnd(_message.Message):
    __slots__ = ("compute_ms", "exposed_ms", "own_exposed_ms", "data_wait_ms")
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_MS_FIELD_NUMBER: _ClassVar[int]
    OWN_EXPOSED_MS_FIELD_NUMBER: _ClassVar[int]
    DATA_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    compute_ms: float
    exposed_ms: float
    own_exposed_ms: float
    data_wait_ms: float
    def __init__(self, compute_ms: _Optional[float] = ..., exposed_ms: _Optional[float] = ..., own_exposed_ms: _Optional[float] = ..., data_wait_ms: _Optional[float] = ...) -> None: ...

class PushChunk(_message.Message):
    __slots__ = ("header", "seq", "data", "pad", "offset", "end")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    header: PushHeader
    seq: int
    data: bytes
    pad: bytes
    offset: int
    end: PushEnd
    def __init__(self, header: _Optional[_Union[PushHeader, _Mapping]] = ..., seq: _Optional[int] = ..., data: _Optional[bytes] = ..., pad: _Optional[bytes] = ..., offset: _Optional[int] = ..., end: _Optional[_Union[PushEnd, _Mapping]] = ...) -> None: ...

class ParamsHeader(_message.Message):
    __slots__ = ("round", "version", "epoch", "batch_size", "done", "wire_dtype", "num_values", "lr", "global_batch", "reason", "generation", "rank", "world_size", "backend", "snapshot_requested", "hub_rank", "optimizer_state", "slice", "next_slice", "path", "probe")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_VALUES_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    HUB_RANK_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STATE_FIELD_NUMBER: _ClassVar[int]
    SLICE_FIELD_NUMBER: _ClassVar[int]
    NEXT_SLICE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    round: int
    version: int
    epoch: int
    batch_size: int
    done: bool
    wire_dtype: str
    num_values: int
    lr: float
    global_batch: int
    reason: str
    generation: int
    rank: int
    world_size: int
    backend: str
    snapshot_requested: bool
    hub_rank: int
    optimizer_state: bool
    slice: _containers.RepeatedCompositeFieldContainer[SliceRange]
    next_slice: _containers.RepeatedCompositeFieldContainer[SliceRange]
    path: str
    probe: bool
    def __init__(self, round: _Optional[int] = ..., version: _Optional[int] = ..., epoch: _Optional[int] = ..., batch_size: _Optional[int] = ..., done: _Optional[bool] = ..., wire_dtype: _Optional[str] = ..., num_values: _Optional[int] = ..., lr: _Optional[float] = ..., global_batch: _Optional[int] = ..., reason: _Optional[str] = ..., generation: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., backend: _Optional[str] = ..., snapshot_requested: _Optional[bool] = ..., hub_rank: _Optional[int] = ..., optimizer_state: _Optional[bool] = ..., slice: _Optional[_Iterable[_Union[SliceRange, _Mapping]]] = ..., next_slice: _Optional[_Iterable[_Union[SliceRange, _Mapping]]] = ..., path: _Optional[str] = ..., probe: _Optional[bool] = ...) -> None: ...

class SliceRange(_message.Message):
    __slots__ = ("epoch", "offset", "count")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    offset: int
    count: int
    def __init__(self, epoch: _Optional[int] = ..., offset: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class ParamsChunk(_message.Message):
    __slots__ = ("header", "seq", "data", "pad")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    header: ParamsHeader
    seq: int
    data: bytes
    pad: bytes
    def __init__(self, header: _Optional[_Union[ParamsHeader, _Mapping]] = ..., seq: _Optional[int] = ..., data: _Optional[bytes] = ..., pad: _Optional[bytes] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("worker_id", "header_only", "optimizer_state", "secret", "wait_for_batch")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HEADER_ONLY_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STATE_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_BATCH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    header_only: bool
    optimizer_state: bool
    secret: str
    wait_for_batch: bool
    def __init__(self, worker_id: _Optional[str] = ..., header_only: _Optional[bool] = ..., optimizer_state: _Optional[bool] = ..., secret: _Optional[str] = ..., wait_for_batch: _Optional[bool] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("worker_id", "secret", "reason")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    secret: str
    reason: str
    def __init__(self, worker_id: _Optional[str] = ..., secret: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "secret")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    secret: str
    def __init__(self, worker_id: _Optional[str] = ..., secret: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("done", "epoch", "round", "version")
    DONE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    done: bool
    epoch: int
    round: int
    version: int
    def __init__(self, done: _Optional[bool] = ..., epoch: _Optional[int] = ..., round: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class StoreRequest(_message.Message):
    __slots__ = ("worker_id", "secret", "generation", "op", "keys", "value", "expected", "amount", "wait_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    secret: str
    generation: int
    op: StoreOp
    keys: _containers.RepeatedScalarFieldContainer[str]
    value: bytes
    expected: bytes
    amount: int
    wait_s: float
    def __init__(self, worker_id: _Optional[str] = ..., secret: _Optional[str] = ..., generation: _Optional[int] = ..., op: _Optional[_Union[StoreOp, str]] = ..., keys: _Optional[_Iterable[str]] = ..., value: _Optional[bytes] = ..., expected: _Optional[bytes] = ..., amount: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class StoreReply(_message.Message):
    __slots__ = ("ready", "value", "number")
    READY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    value: bytes
    number: int
    def __init__(self, ready: _Optional[bool] = ..., value: _Optional[bytes] = ..., number: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "name", "cores", "batch_size", "compute_ms", "updates", "mean_staleness", "parked")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    MEAN_STALENESS_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    name: str
    cores: float
    batch_size: int
    compute_ms: float
    updates: int
    mean_staleness: float
    parked: bool
    def __init__(self, worker_id: _Optional[str] = ..., name: _Optional[str] = ..., cores: _Optional[float] = ..., batch_size: _Optional[int] = ..., compute_ms: _Optional[float] = ..., updates: _Optional[int] = ..., mean_staleness: _Optional[float] = ..., parked: _Optional[bool] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("mode", "controller", "round", "version", "epoch", "epochs", "done", "global_batch", "workers", "last_accuracy", "adjustments", "expected_workers", "path", "path_why", "job_json", "adaptive_batch", "noise_scale", "efficiency", "lr")
    MODE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ADJUSTMENTS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PATH_WHY_FIELD_NUMBER: _ClassVar[int]
    JOB_JSON_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_BATCH_FIELD_NUMBER: _ClassVar[int]
    NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    mode: str
    controller: str
    round: int
    version: int
    epoch: int
    epochs: int
    done: bool
    global_batch: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    last_accuracy: float
    adjustments: int
    expected_workers: int
    path: str
    path_why: str
    job_json: str
    adaptive_batch: str
    noise_scale: float
    efficiency: float
    lr: float
    def __init__(self, mode: _Optional[str] = ..., controller: _Optional[str] = ..., round: _Optional[int] = ..., version: _Optional[int] = ..., epoch: _Optional[int] = ..., epochs: _Optional[int] = ..., done: _Optional[bool] = ..., global_batch: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., last_accuracy: _Optional[float] = ..., adjustments: _Optional[int] = ..., expected_workers: _Optional[int] = ..., path: _Optional[str] = ..., path_why: _Optional[str] = ..., job_json: _Optional[str] = ..., adaptive_batch: _Optional[str] = ..., noise_scale: _Optional[float] = ..., efficiency: _Optional[float] = ..., lr: _Optional[float] = ...) -> None: ...

class BlobChunk(_message.Message):
    __slots__ = ("seq", "data")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    data: bytes
    def __init__(self, seq: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Contribution(_message.Message):
    __slots__ = ("worker_id", "batch_size")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    batch_size: int
    def __init__(self, worker_id: _Optional[str] = ..., batch_size: _Optional[int] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("round", "contributors", "lr", "wait_s", "revoked")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTORS_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    round: int
    contributors: _containers.RepeatedCompositeFieldContainer[Contribution]
    lr: float
    wait_s: float
    revoked: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, round: _Optional[int] = ..., contributors: _Optional[_Iterable[_Union[Contribution, _Mapping]]] = ..., lr: _Optional[float] = ..., wait_s: _Optional[float] = ..., revoked: _Optional[_Iterable[str]] = ...) -> None: ...

class ShardAck(_message.Message):
    __slots__ = ("round", "applied_batch", "missing")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    APPLIED_BATCH_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    round: int
    applied_batch: int
    missing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, round: _Optional[int] = ..., applied_batch: _Optional[int] = ..., missing: _Optional[_Iterable[str]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
