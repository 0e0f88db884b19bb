from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenJobRequest(_message.Message):
    __slots__ = ("job", "dataset", "worker_name", "seed", "distribution_rules", "resources", "resume", "sync", "order", "protocol_version", "dataset_version")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTION_RULES_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DATASET_VERSION_FIELD_NUMBER: _ClassVar[int]
    job: str
    dataset: str
    worker_name: str
    seed: int
    distribution_rules: str
    resources: WorkerResources
    resume: ResumePosition
    sync: SyncGroup
    order: DeliveryOrder
    protocol_version: int
    dataset_version: int
    def __init__(self, job: _Optional[str] = ..., dataset: _Optional[str] = ..., worker_name: _Optional[str] = ..., seed: _Optional[int] = ..., distribution_rules: _Optional[str] = ..., resources: _Optional[_Union[WorkerResources, _Mapping]] = ..., resume: _Optional[_Union[ResumePosition, _Mapping]] = ..., sync: _Optional[_Union[SyncGroup, _Mapping]] = ..., order: _Optional[_Union[DeliveryOrder, _Mapping]] = ..., protocol_version: _Optional[int] = ..., dataset_version: _Optional[int] = ...) -> None: ...

class DeliveryOrder(_message.Message):
    __slots__ = ("seed", "shuffle_buffer", "resample", "sync_batch_size")
    SEED_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_BUFFER_FIELD_NUMBER: _ClassVar[int]
    RESAMPLE_FIELD_NUMBER: _ClassVar[int]
    SYNC_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    seed: int
    shuffle_buffer: int
    resample: str
    sync_batch_size: int
    def __init__(self, seed: _Optional[int] = ..., shuffle_buffer: _Optional[int] = ..., resample: _Optional[str] = ..., sync_batch_size: _Optional[int] = ...) -> None: ...

class SyncGroup(_message.Message):
    __slots__ = ("world_size", "rank", "batch_size")
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    world_size: int
    rank: int
    batch_size: int
    def __init__(self, world_size: _Optional[int] = ..., rank: _Optional[int] = ..., batch_size: _Optional[int] = ...) -> None: ...

class ResumePosition(_message.Message):
    __slots__ = ("epoch", "worker_id", "done", "positions", "credential", "dataset_version")
    class PositionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    DATASET_VERSION_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    worker_id: str
    done: _containers.RepeatedScalarFieldContainer[int]
    positions: _containers.ScalarMap[int, int]
    credential: str
    dataset_version: int
    def __init__(self, epoch: _Optional[int] = ..., worker_id: _Optional[str] = ..., done: _Optional[_Iterable[int]] = ..., positions: _Optional[_Mapping[int, int]] = ..., credential: _Optional[str] = ..., dataset_version: _Optional[int] = ...) -> None: ...

class WorkerResources(_message.Message):
    __slots__ = ("hostname", "name", "gpus")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    name: str
    gpus: int
    def __init__(self, hostname: _Optional[str] = ..., name: _Optional[str] = ..., gpus: _Optional[int] = ...) -> None: ...

class Field(_message.Message):
    __slots__ = ("name", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class OpenJobResponse(_message.Message):
    __slots__ = ("worker_id", "job", "dataset", "dataset_url", "storage_options_json", "fields", "num_records", "num_partitions", "current_epoch", "lease_timeout_s", "num_bytes", "resumed_partitions", "session_secret", "resume_credential", "resume_cut", "protocol_version", "dataset_version")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DATASET_URL_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OPTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESUMED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    RESUME_CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    RESUME_CUT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DATASET_VERSION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    job: str
    dataset: str
    dataset_url: str
    storage_options_json: str
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    num_records: int
    num_partitions: int
    current_epoch: int
    lease_timeout_s: float
    num_bytes: int
    resumed_partitions: int
    session_secret: str
    resume_credential: str
    resume_cut: int
    protocol_version: int
    dataset_version: int
    def __init__(self, worker_id: _Optional[str] = ..., job: _Optional[str] = ..., dataset: _Optional[str] = ..., dataset_url: _Optional[str] = ..., storage_options_json: _Optional[str] = ..., fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., num_records: _Optional[int] = ..., num_partitions: _Optional[int] = ..., current_epoch: _Optional[int] = ..., lease_timeout_s: _Optional[float] = ..., num_bytes: _Optional[int] = ..., resumed_partitions: _Optional[int] = ..., session_secret: _Optional[str] = ..., resume_credential: _Optional[str] = ..., resume_cut: _Optional[int] = ..., protocol_version: _Optional[int] = ..., dataset_version: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("epoch", "partition", "shard", "row_group_start", "row_group_stop", "num_records", "skip_records", "lease", "row_start", "stop_records")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ROW_GROUP_START_FIELD_NUMBER: _ClassVar[int]
    ROW_GROUP_STOP_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    SKIP_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ROW_START_FIELD_NUMBER: _ClassVar[int]
    STOP_RECORDS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    partition: int
    shard: str
    row_group_start: int
    row_group_stop: int
    num_records: int
    skip_records: int
    lease: int
    row_start: int
    stop_records: int
    def __init__(self, epoch: _Optional[int] = ..., partition: _Optional[int] = ..., shard: _Optional[str] = ..., row_group_start: _Optional[int] = ..., row_group_stop: _Optional[int] = ..., num_records: _Optional[int] = ..., skip_records: _Optional[int] = ..., lease: _Optional[int] = ..., row_start: _Optional[int] = ..., stop_records: _Optional[int] = ...) -> None: ...

class TaskReport(_message.Message):
    __slots__ = ("epoch", "partition", "outcome", "reason", "consumed", "lease")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[TaskReport.Outcome]
        DONE: _ClassVar[TaskReport.Outcome]
        FAILED: _ClassVar[TaskReport.Outcome]
        PROGRESS: _ClassVar[TaskReport.Outcome]
        RELEASED: _ClassVar[TaskReport.Outcome]
    OUTCOME_UNSPECIFIED: TaskReport.Outcome
    DONE: TaskReport.Outcome
    FAILED: TaskReport.Outcome
    PROGRESS: TaskReport.Outcome
    RELEASED: TaskReport.Outcome
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    partition: int
    outcome: TaskReport.Outcome
    reason: str
    consumed: int
    lease: int
    def __init__(self, epoch: _Optional[int] = ..., partition: _Optional[int] = ..., outcome: _Optional[_Union[TaskReport.Outcome, str]] = ..., reason: _Optional[str] = ..., consumed: _Optional[int] = ..., lease: _Optional[int] = ...) -> None: ...

class GetTasksRequest(_message.Message):
    __slots__ = ("epoch", "max_tasks", "wait_ms", "reports", "reconcile", "held", "max_records", "sync", "stats")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    max_tasks: int
    wait_ms: int
    reports: _containers.RepeatedCompositeFieldContainer[TaskReport]
    reconcile: bool
    held: _containers.RepeatedCompositeFieldContainer[HeldTask]
    max_records: int
    sync: SyncGroup
    stats: ReaderStats
    def __init__(self, epoch: _Optional[int] = ..., max_tasks: _Optional[int] = ..., wait_ms: _Optional[int] = ..., reports: _Optional[_Iterable[_Union[TaskReport, _Mapping]]] = ..., reconcile: _Optional[bool] = ..., held: _Optional[_Iterable[_Union[HeldTask, _Mapping]]] = ..., max_records: _Optional[int] = ..., sync: _Optional[_Union[SyncGroup, _Mapping]] = ..., stats: _Optional[_Union[ReaderStats, _Mapping]] = ...) -> None: ...

class HeldTask(_message.Message):
    __slots__ = ("epoch", "partition", "lease", "started")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    partition: int
    lease: int
    started: bool
    def __init__(self, epoch: _Optional[int] = ..., partition: _Optional[int] = ..., lease: _Optional[int] = ..., started: _Optional[bool] = ...) -> None: ...

class GetTasksResponse(_message.Message):
    __slots__ = ("status", "tasks", "current_epoch", "todo_left", "revoked", "failed", "failed_known", "give_back", "group_broken", "holders", "revoked_why", "superseded")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[GetTasksResponse.Status]
        TASKS: _ClassVar[GetTasksResponse.Status]
        WAIT: _ClassVar[GetTasksResponse.Status]
        EPOCH_DONE: _ClassVar[GetTasksResponse.Status]
    STATUS_UNSPECIFIED: GetTasksResponse.Status
    TASKS: GetTasksResponse.Status
    WAIT: GetTasksResponse.Status
    EPOCH_DONE: GetTasksResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TODO_LEFT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    FAILED_KNOWN_FIELD_NUMBER: _ClassVar[int]
    GIVE_BACK_FIELD_NUMBER: _ClassVar[int]
    GROUP_BROKEN_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_WHY_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    status: GetTasksResponse.Status
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    current_epoch: int
    todo_left: int
    revoked: _containers.RepeatedCompositeFieldContainer[HeldTask]
    failed: _containers.RepeatedCompositeFieldContainer[FailedPartition]
    failed_known: bool
    give_back: _containers.RepeatedCompositeFieldContainer[HeldTask]
    group_broken: str
    holders: _containers.RepeatedCompositeFieldContainer[Holding]
    revoked_why: str
    superseded: str
    def __init__(self, status: _Optional[_Union[GetTasksResponse.Status, str]] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., current_epoch: _Optional[int] = ..., todo_left: _Optional[int] = ..., revoked: _Optional[_Iterable[_Union[HeldTask, _Mapping]]] = ..., failed: _Optional[_Iterable[_Union[FailedPartition, _Mapping]]] = ..., failed_known: _Optional[bool] = ..., give_back: _Optional[_Iterable[_Union[HeldTask, _Mapping]]] = ..., group_broken: _Optional[str] = ..., holders: _Optional[_Iterable[_Union[Holding, _Mapping]]] = ..., revoked_why: _Optional[str] = ..., superseded: _Optional[str] = ...) -> None: ...

class Holding(_message.Message):
    __slots__ = ("worker", "partitions", "lease_until", "quiet_s")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    QUIET_S_FIELD_NUMBER: _ClassVar[int]
    worker: str
    partitions: int
    lease_until: float
    quiet_s: float
    def __init__(self, worker: _Optional[str] = ..., partitions: _Optional[int] = ..., lease_until: _Optional[float] = ..., quiet_s: _Optional[float] = ...) -> None: ...

class FailedPartition(_message.Message):
    __slots__ = ("partition", "reason", "num_records")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    reason: str
    num_records: int
    def __init__(self, partition: _Optional[int] = ..., reason: _Optional[str] = ..., num_records: _Optional[int] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("reports", "held", "sync", "stats")
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    SYNC_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[TaskReport]
    held: _containers.RepeatedCompositeFieldContainer[HeldTask]
    sync: SyncGroup
    stats: ReaderStats
    def __init__(self, reports: _Optional[_Iterable[_Union[TaskReport, _Mapping]]] = ..., held: _Optional[_Iterable[_Union[HeldTask, _Mapping]]] = ..., sync: _Optional[_Union[SyncGroup, _Mapping]] = ..., stats: _Optional[_Union[ReaderStats, _Mapping]] = ...) -> None: ...

class LeaveJobRequest(_message.Message):
    __slots__ = ("job", "worker_id", "session_secret")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    job: str
    worker_id: str
    session_secret: str
    def __init__(self, job: _Optional[str] = ..., worker_id: _Optional[str] = ..., session_secret: _Optional[str] = ...) -> None: ...

class LeaveJobResponse(_message.Message):
    __slots__ = ("released_tasks",)
    RELEASED_TASKS_FIELD_NUMBER: _ClassVar[int]
    released_tasks: int
    def __init__(self, released_tasks: _Optional[int] = ...) -> None: ...

class GetJobStatusRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job", "dataset", "epoch", "num_partitions", "todo", "pending", "done", "failed", "workers", "failed_reasons", "records_served", "bytes_served", "reports_refused", "metrics_port")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TODO_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    FAILED_REASONS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_SERVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    REPORTS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    job: str
    dataset: str
    epoch: int
    num_partitions: int
    todo: int
    pending: int
    done: int
    failed: int
    workers: int
    failed_reasons: _containers.RepeatedScalarFieldContainer[str]
    records_served: int
    bytes_served: int
    reports_refused: int
    metrics_port: int
    def __init__(self, job: _Optional[str] = ..., dataset: _Optional[str] = ..., epoch: _Optional[int] = ..., num_partitions: _Optional[int] = ..., todo: _Optional[int] = ..., pending: _Optional[int] = ..., done: _Optional[int] = ..., failed: _Optional[int] = ..., workers: _Optional[int] = ..., failed_reasons: _Optional[_Iterable[str]] = ..., records_served: _Optional[int] = ..., bytes_served: _Optional[int] = ..., reports_refused: _Optional[int] = ..., metrics_port: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("job", "worker_id", "session_secret", "exchange")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_SECRET_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_FIELD_NUMBER: _ClassVar[int]
    job: str
    worker_id: str
    session_secret: str
    exchange: bool
    def __init__(self, job: _Optional[str] = ..., worker_id: _Optional[str] = ..., session_secret: _Optional[str] = ..., exchange: _Optional[bool] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("current_epoch", "give_back", "revoked", "revoked_why", "epoch_complete", "group_broken", "superseded", "answers", "refused", "grant", "grants", "grant_refused", "refused_count", "decoders", "decoders_listed")
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GIVE_BACK_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_WHY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    GROUP_BROKEN_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    GRANT_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    GRANT_REFUSED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_COUNT_FIELD_NUMBER: _ClassVar[int]
    DECODERS_FIELD_NUMBER: _ClassVar[int]
    DECODERS_LISTED_FIELD_NUMBER: _ClassVar[int]
    current_epoch: int
    give_back: _containers.RepeatedCompositeFieldContainer[HeldTask]
    revoked: _containers.RepeatedCompositeFieldContainer[HeldTask]
    revoked_why: str
    epoch_complete: int
    group_broken: str
    superseded: str
    answers: int
    refused: _containers.RepeatedCompositeFieldContainer[HeldTask]
    grant: GetTasksResponse
    grants: bool
    grant_refused: str
    refused_count: int
    decoders: _containers.RepeatedCompositeFieldContainer[DecoderInfo]
    decoders_listed: bool
    def __init__(self, current_epoch: _Optional[int] = ..., give_back: _Optional[_Iterable[_Union[HeldTask, _Mapping]]] = ..., revoked: _Optional[_Iterable[_Union[HeldTask, _Mapping]]] = ..., revoked_why: _Optional[str] = ..., epoch_complete: _Optional[int] = ..., group_broken: _Optional[str] = ..., superseded: _Optional[str] = ..., answers: _Optional[int] = ..., refused: _Optional[_Iterable[_Union[HeldTask, _Mapping]]] = ..., grant: _Optional[_Union[GetTasksResponse, _Mapping]] = ..., grants: _Optional[bool] = ..., grant_refused: _Optional[str] = ..., refused_count: _Optional[int] = ..., decoders: _Optional[_Iterable[_Union[DecoderInfo, _Mapping]]] = ..., decoders_listed: _Optional[bool] = ...) -> None: ...

class SessionMessage(_message.Message):
    __slots__ = ("open", "report", "seq", "get_tasks", "decoder")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    GET_TASKS_FIELD_NUMBER: _ClassVar[int]
    DECODER_FIELD_NUMBER: _ClassVar[int]
    open: WatchRequest
    report: ReportRequest
    seq: int
    get_tasks: GetTasksRequest
    decoder: DecoderBeat
    def __init__(self, open: _Optional[_Union[WatchRequest, _Mapping]] = ..., report: _Optional[_Union[ReportRequest, _Mapping]] = ..., seq: _Optional[int] = ..., get_tasks: _Optional[_Union[GetTasksRequest, _Mapping]] = ..., decoder: _Optional[_Union[DecoderBeat, _Mapping]] = ...) -> None: ...

class DecoderBeat(_message.Message):
    __slots__ = ("address", "busy", "slots", "in_flight")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    address: str
    busy: float
    slots: int
    in_flight: int
    def __init__(self, address: _Optional[str] = ..., busy: _Optional[float] = ..., slots: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class DecoderInfo(_message.Message):
    __slots__ = ("address", "busy", "slots")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    address: str
    busy: float
    slots: int
    def __init__(self, address: _Optional[str] = ..., busy: _Optional[float] = ..., slots: _Optional[int] = ...) -> None: ...

class ReaderStats(_message.Message):
    __slots__ = ("wall_s", "input_wait_s", "batches", "records", "bytes_read", "read_s", "records_decoded", "decode_s", "decode_failures")
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    INPUT_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    READ_S_FIELD_NUMBER: _ClassVar[int]
    RECORDS_DECODED_FIELD_NUMBER: _ClassVar[int]
    DECODE_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    wall_s: float
    input_wait_s: float
    batches: int
    records: int
    bytes_read: int
    read_s: float
    records_decoded: int
    decode_s: float
    decode_failures: int
    def __init__(self, wall_s: _Optional[float] = ..., input_wait_s: _Optional[float] = ..., batches: _Optional[int] = ..., records: _Optional[int] = ..., bytes_read: _Optional[int] = ..., read_s: _Optional[float] = ..., records_decoded: _Optional[int] = ..., decode_s: _Optional[float] = ..., decode_failures: _Optional[int] = ...) -> None: ...
