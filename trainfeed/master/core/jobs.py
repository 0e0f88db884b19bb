"""What the master's core works on, apart from how: a job (its dataset, plan, ledger, sessions
and the state it saves), its figures, the master's settings, and the refusals a call can meet.

The coordinator (trainfeed.master.core.coordinator) decides with these; the gRPC shell
(trainfeed.master.serve.service) maps each refusal class to a status code in one table.
"""
from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainfeed.errors import ConfigurationError
from trainfeed.formats.manifest import Manifest
from trainfeed.master.core.ledger import DEFAULT_MAX_FAILURES, Ledger
from trainfeed.master.core.messages import DeliveryOrder, Holding
from trainfeed.master.core.sessions import DEFAULT_MAX_SESSIONS, SessionKeys
from trainfeed.master.core.stealing import Stealing
from trainfeed.master.core.sync_group import SyncMembers
from trainfeed.planning.distribution import DistributionRules
from trainfeed.planning.partitions import DEFAULT_TARGET_PARTITIONS, Partition
from trainfeed.storage import Storage

JOB_STATE_VERSION = 1
# A reader heartbeats every third of this; 30 s rides out a GC pause or a slow storage read while
# a dead worker's tasks still move on within half a minute.
DEFAULT_LEASE_TIMEOUT_S = 30.0
# A reader heartbeats every third of the lease timeout but never more often than every 50 ms
# (trainfeed.lease.session), so below 0.5 s a lease could not outlive one slow round trip.
MIN_LEASE_TIMEOUT_S = 0.5
# A dead reader's partitions wait this long before another reader gets them: past a day no epoch
# waits that long in earnest, and the timer's arithmetic stays far from overflow.
MAX_LEASE_TIMEOUT_S = 86_400.0
# A job is snapshotted once its journal holds this many ops per partition (and at least
# MIN_OPS_PER_SNAPSHOT): replay stays short and a snapshot costs O(1) per call amortized.
OPS_PER_PARTITION_PER_SNAPSHOT = 2
MIN_OPS_PER_SNAPSHOT = 4096

# Random bits of a worker id after its name: ids (and so session secrets) never repeat in a job.
WORKER_ID_HEX = 16
# Positions count records in delivery order, where over-sampling (resample=) repeats records:
# a partition may deliver more than it holds, but never this many copies of each record.
MAX_COPIES_PER_RECORD = 1 << 20


# -- refusals: the shell maps each class to a status code (service.STATUS_CODES) -------------------
class CallError(Exception):
    """A call the master refuses: `message` for the caller, `trailer` metadata (key, value)."""

    def __init__(self, message: str, trailer: Sequence[tuple[str, str | bytes]] = ()):
        super().__init__(message)
        self.message = message
        self.trailer = tuple(trailer)


class InvalidArgument(CallError):
    """The request names what cannot exist."""


class NotFound(CallError):
    """No such job (or dataset)."""


class FailedPrecondition(CallError):
    """Not now, or not for this caller: a refused report, another group, another version."""


class PermissionDenied(CallError):
    """A wrong session secret, resume credential or job scope."""


class ResourceExhausted(CallError):
    """The job has as many live sessions as the master allows."""


@dataclass(frozen=True)
class MasterConfig:
    """How the master serves. Validated on creation."""

    storage: Storage
    lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S
    max_failures: int = DEFAULT_MAX_FAILURES
    target_partitions: int = DEFAULT_TARGET_PARTITIONS
    # Live reader sessions per job (trainfeed.master.core.sessions); OpenJob past it:
    # RESOURCE_EXHAUSTED.
    max_sessions: int = DEFAULT_MAX_SESSIONS

    def __post_init__(self) -> None:
        lease = self.lease_timeout_s
        # `not a <= x <= b` (not `x < a or x > b`): NaN compares false, so it fails here too.
        if not (isinstance(lease, int | float) and not isinstance(lease, bool)
                and math.isfinite(lease) and MIN_LEASE_TIMEOUT_S <= lease <= MAX_LEASE_TIMEOUT_S):
            raise ConfigurationError(
                f"--lease-timeout (lease_timeout_s) must be a number of seconds in "
                f"{MIN_LEASE_TIMEOUT_S:g}..{MAX_LEASE_TIMEOUT_S:g}, got {lease!r}")
        for flag, name, value in (("--max-sessions", "max_sessions", self.max_sessions),
                                  ("--max-failures", "max_failures", self.max_failures),
                                  ("--partitions", "target_partitions", self.target_partitions)):
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ConfigurationError(f"{flag} ({name}) must be a whole number ≥ 1, got "
                                         f"{value!r}")


@dataclass(frozen=True)
class JobStats:
    """One job's figures for the metrics exporter, read at scrape time (see `job_stats`)."""

    job: str
    dataset: str
    epoch: int
    num_partitions: int
    todo: int
    pending: int
    done: int
    failed: int
    workers_alive: int
    leases_expired: int
    records_served: int
    bytes_served: int
    reports_refused: int = 0


@dataclass
class JobMetrics:
    """What the master counts of a job since it started (not state): read by `job_stats`."""

    records_served: int = 0
    bytes_served: int = 0
    reports_refused: int = 0  # reports not from the holder with its token


@dataclass
class Job:
    """One job: a dataset, its partition plan, its ledger and the workers seen."""

    name: str
    manifest: Manifest
    partitions: tuple[Partition, ...]
    ledger: Ledger
    target_partitions: int
    rules: DistributionRules = DistributionRules("all")
    workers: dict[str, float] = field(default_factory=dict)  # worker id -> last seen
    journal_ops: int = 0  # ops appended since the last snapshot
    live_workers: int = 1
    live_workers_at: float = 0.0
    # Derives and checks the secrets of its reader sessions (saved with the job's state).
    sessions: SessionKeys = field(default_factory=SessionKeys.new)
    # Work stealing: rates, outstanding asks (not state: a restart forgets them).
    stealing: Stealing = field(default_factory=Stealing)
    # Issues 25, 26 (trainfeed.master.core.admission; not state: readers tell a restarted master
    # again): the synchronous group's members, the delivery order of the job's readers (and
    # which reader set it), readers whose partitions went to a reader restored from their
    # checkpoint (worker id -> why).
    members: SyncMembers | None = None
    order: DeliveryOrder | None = None
    order_by: str = ""
    superseded: dict[str, str] = field(default_factory=dict)
    # admission.holdings' last answer: (when, epoch, holders); recomputed at most twice a second.
    holdings_cache: tuple[float, int, list[Holding]] = (float("-inf"), -1, [])
    # The last epoch announced complete to watching sessions (once per epoch).
    announced_complete: int = -1

    @property
    def ops_per_snapshot(self) -> int:
        return max(MIN_OPS_PER_SNAPSHOT, OPS_PER_PARTITION_PER_SNAPSHOT * len(self.partitions))

    def state(self) -> dict[str, Any]:
        return {"version": JOB_STATE_VERSION, "dataset": self.manifest.name,
                "fingerprint": self.manifest.fingerprint,
                # The version the job reads until it ends (a restarted master reads it again).
                "dataset_version": self.manifest.dataset_version,
                "target_partitions": self.target_partitions,
                "distribution_rules": str(self.rules), "ledger": self.ledger.state(),
                "session_key": self.sessions.hex(),
                "sync_group": list(self.ledger.group) if self.ledger.group else None}


def new_worker_id(job: Job, name: str) -> str:
    """`name`-<64 random bits>, none of the job's known workers' (a session's secret derives
    from its id, so two sessions must never share one)."""
    while True:
        worker = f"{name or 'worker'}-{uuid.uuid4().hex[:WORKER_ID_HEX]}"
        if worker not in job.workers and worker not in job.ledger.by_worker:
            return worker


def max_delivered(job: Job, partition: int) -> int:
    """The most records a reader can have consumed of `partition` (a PROGRESS or a resume
    position beyond it is a forged or broken report: INVALID_ARGUMENT)."""
    return job.partitions[partition].num_records * MAX_COPIES_PER_RECORD
