"""What a reader session and the master's core say to each other, in the core's own types.

The core (trainfeed.master.core) speaks these, never the wire's generated classes: the shell
(trainfeed.master.serve.convert) turns each Session message into one of them once, as it arrives,
and each answer and event back into the wire's `WatchEvent` once, as it leaves. So the core's
rules read and test without gRPC or protobuf, and a change of the wire is a change of one
converter (issue 36).

After OpenJob (an `OpenJob`, answered by `Opened`) a reader's messages are a `Heartbeat`
(renews its leases, carries its reports and stats; with a `seq` it waits for a `Heard`) or a
`GetTasks` (answered by a `Granted`). What the master tells a session unasked is an `Event`
(`GiveBack`, `Revoked`, `Superseded`, `EpochComplete`, `GroupBroken`). LeaveJob is a `Leave`;
GetJobStatus's answer a `JobStatus`.

Immutable: a message is read by the core, never changed. Frozen, slotted dataclasses, but for
the parts a heartbeat (each reader's, every second) carries several of, its reports, held leases
and summary: those are named tuples, as immutable and about twice as cheap to build (a frozen
dataclass sets each field through object.__setattr__; benchmarks in the commit that made them).
Repeated parts are sequences as built (the converter's lists, the core's lists), never copied.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from trainfeed.master.core.ledger import LeaseStatus, Outcome

__all__ = ["NO_STATS", "DeliveryOrder", "EpochComplete", "Event", "FailedPartition", "GetTasks",
           "GiveBack", "Grant", "Granted", "GroupBroken", "Heard", "Heartbeat", "HeldTask",
           "Holding", "JobStatus", "Leave", "OpenJob", "Opened", "ReaderStats", "Report",
           "Resources", "ResumePosition", "Revoked", "SessionMessage", "Superseded", "SyncGroup",
           "Task"]


# -- what a reader sends ----------------------------------------------------------------------
class HeldTask(NamedTuple):
    """A lease a reader holds, or one it is told about: (epoch, partition, fencing token);
    `started`: whether the reader began reading it (a lease begun is not asked back)."""

    epoch: int
    partition: int
    lease: int
    started: bool = False


class Report(NamedTuple):
    """What a reader says of one lease. `outcome` is an int for an outcome this master does not
    know (its number on the wire), refused with INVALID_ARGUMENT naming it."""

    epoch: int
    partition: int
    outcome: Outcome | int
    lease: int
    consumed: int = 0
    reason: str = ""  # a FAILED report's


@dataclass(frozen=True, slots=True)
class SyncGroup:
    """The synchronous group a rank declares (trainfeed.master.core.sync_group)."""

    world_size: int
    rank: int
    batch_size: int


class ReaderStats(NamedTuple):
    """What a reader measured since its previous summary (trainfeed.master.core.reader_stats).
    The fields are the summary's figures, in the wire's order: times in seconds, then counts."""

    wall_s: float = 0.0
    input_wait_s: float = 0.0
    batches: int = 0
    records: int = 0
    bytes_read: int = 0
    read_s: float = 0.0
    records_decoded: int = 0
    decode_s: float = 0.0
    decode_failures: int = 0


# A message without a summary (most of them: a reader sends one with its next call once it has
# figures): one shared instance, not one per message.
NO_STATS = ReaderStats()


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A sign of life: renews the session's leases, applies its reports. `seq` 0: nobody waits
    for its answer (then it carries PROGRESS reports only)."""

    seq: int
    reports: Sequence[Report] = ()
    held: Sequence[HeldTask] = ()
    sync: SyncGroup | None = None
    stats: ReaderStats = NO_STATS


@dataclass(frozen=True, slots=True)
class GetTasks:
    """A request for up to `max_tasks` leases of `epoch` (-1: the current one), waiting up to
    `wait_ms` for some. `reconcile`: `held` is everything the reader holds (the master takes
    back what it does not list)."""

    seq: int
    epoch: int
    max_tasks: int
    wait_ms: int = 0
    max_records: int = 0
    reconcile: bool = False
    reports: Sequence[Report] = ()
    held: Sequence[HeldTask] = ()
    sync: SyncGroup | None = None
    stats: ReaderStats = NO_STATS


SessionMessage = Heartbeat | GetTasks


# -- what the master answers ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Task:
    """A partition as leased: where its rows are, what of it to skip and where to stop."""

    epoch: int
    partition: int
    shard: str
    row_group_start: int
    row_group_stop: int
    num_records: int
    skip_records: int
    lease: int
    stop_records: int
    row_start: int


@dataclass(frozen=True, slots=True)
class FailedPartition:
    partition: int
    reason: str
    num_records: int


@dataclass(frozen=True, slots=True)
class Holding:
    """Who holds partitions a WAIT answer waits for, and until when."""

    worker: str
    partitions: int
    lease_until: float
    quiet_s: float


@dataclass(frozen=True, slots=True)
class Grant:
    """What a `GetTasks` leased (`tasks`, of `epoch`), or why it leased nothing."""

    status: LeaseStatus
    epoch: int
    todo_left: int = 0
    tasks: Sequence[Task] = ()
    revoked: Sequence[HeldTask] = ()
    failed: Sequence[FailedPartition] = ()
    failed_known: bool = False
    give_back: Sequence[HeldTask] = ()
    group_broken: str = ""
    holders: Sequence[Holding] = ()
    revoked_why: str = ""
    superseded: str = ""


@dataclass(frozen=True, slots=True)
class Granted:
    """The answer to the `GetTasks` of `seq`: its grant, at the job's `epoch`, and the reports
    of the message that were refused (the first listed, all counted)."""

    seq: int
    epoch: int
    grant: Grant
    refused: Sequence[HeldTask] = ()
    refused_count: int = 0


@dataclass(frozen=True, slots=True)
class Heard:
    """The answer to the `Heartbeat` of `seq`: what of the leases it listed is no longer the
    reader's, what it is asked to give back, and its refused reports. `why`: the reader was
    superseded (by one restored from its checkpoint)."""

    seq: int
    epoch: int
    revoked: Sequence[HeldTask] = ()
    give_back: Sequence[HeldTask] = ()
    group_broken: str = ""
    why: str = ""
    refused: Sequence[HeldTask] = ()
    refused_count: int = 0


Answer = Heard | Granted


# -- what the master tells a session unasked --------------------------------------------------
@dataclass(frozen=True, slots=True)
class GiveBack:
    """The session is asked to give back `leases` (work stealing)."""

    epoch: int
    leases: Sequence[HeldTask]


@dataclass(frozen=True, slots=True)
class Revoked:
    """`leases` were taken from the session (expired, or by a resume: `why`)."""

    epoch: int
    leases: Sequence[HeldTask]
    why: str = ""


@dataclass(frozen=True, slots=True)
class Superseded:
    """A reader restored from the session's checkpoint took over: `why`."""

    epoch: int
    why: str


@dataclass(frozen=True, slots=True)
class EpochComplete:
    epoch: int


@dataclass(frozen=True, slots=True)
class GroupBroken:
    """The session's synchronous group broke: `why` it must stop."""

    epoch: int
    why: str


Event = GiveBack | Revoked | Superseded | EpochComplete | GroupBroken


# -- OpenJob, LeaveJob, GetJobStatus ----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Resources:
    """What a reader says of where it runs (the job's distribution rules admit it or not)."""

    hostname: str = ""
    name: str = ""
    gpus: int = 0


@dataclass(frozen=True, slots=True)
class DeliveryOrder:
    """The sampling options every reader of a job shares (trainfeed.master.core.delivery_order).
    Equal options are equal objects."""

    seed: int = 0
    shuffle_buffer: int = 0
    resample: str = ""
    sync_batch_size: int = 0


@dataclass(frozen=True, slots=True)
class ResumePosition:
    """A checkpoint a reader resumes: of session `worker_id` in `epoch`, the partitions it had
    whole (`done`) and the records it had of others (`positions`: partition -> records)."""

    epoch: int
    worker_id: str
    done: Sequence[int] = ()
    positions: Mapping[int, int] = field(default_factory=dict)
    credential: str = ""
    dataset_version: int = 0


@dataclass(frozen=True, slots=True)
class OpenJob:
    """A reader asks to join job `job` (reading `dataset`), creating it if it is new."""

    job: str
    dataset: str
    worker_name: str = ""
    seed: int = 0
    distribution_rules: str = ""
    resources: Resources = Resources()
    resume: ResumePosition | None = None
    sync: SyncGroup | None = None
    order: DeliveryOrder | None = None
    protocol_version: int = 0
    dataset_version: int = 0


@dataclass(frozen=True, slots=True)
class Opened:
    """The answer to an OpenJob: the session, where the dataset is, and what it is."""

    worker_id: str
    job: str
    dataset: str
    dataset_url: str
    storage_options_json: str
    fields: Sequence[tuple[str, str]]  # (name, type)
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


@dataclass(frozen=True, slots=True)
class Leave:
    """Session `worker_id` leaves: its leases go back at once."""

    job: str
    worker_id: str
    session_secret: str = ""


@dataclass(frozen=True, slots=True)
class JobStatus:
    """What `trainfeed status` shows of a job."""

    job: str
    dataset: str
    epoch: int
    num_partitions: int
    todo: int
    pending: int
    done: int
    failed: int
    workers: int
    failed_reasons: Sequence[str]
    records_served: int
    bytes_served: int
    reports_refused: int
    metrics_port: int
