"""The gRPC servicer of the master: the imperative shell around each job's Ledger.

Runs on one asyncio event loop, so the ledgers need no locks. Every change is appended to the state
store's journal before the call that caused it is answered, and each job is snapshotted once its
journal is about twice as long as it has partitions (so replaying a journal after a restart costs
about as much as reading a snapshot, and a snapshot's O(partitions) cost is amortized over as many
calls). GetTasks long-polls: when the epoch's remaining
partitions are leased to others it waits (up to the caller's `wait_ms`) for a change (a report, an
expiry, a leave) instead of making readers spin.

Trust: a report counts only from the partition's current lease holder with the lease's fencing
token (Ledger.check_report). A call carrying any other report is refused whole with
FAILED_PRECONDITION (the refused reports listed in its trailing metadata, counted, logged with a
rate limit) and changes nothing; partition ids and epochs that cannot exist get INVALID_ARGUMENT.
Every call of a reader session carries the secret its OpenJob gave it (trainfeed.master.sessions),
else PERMISSION_DENIED; a call may be restricted to one job by its token (trainfeed.master.auth).
No answer or log line names another session's secret or lease token.

Outages: a master that restarts, or whose process was stalled (SIGSTOP, a swapped-out host),
could not hear the readers' heartbeats meanwhile. So it gives every outstanding lease a grace of
RESTART_GRACE_LEASES lease timeouts counted from when it serves again, instead of expiring the
leases of live readers that had no way to renew them.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from trainfeed.errors import (
    CorruptDatasetError,
    DatasetNotFoundError,
    LeadershipError,
    StateStoreError,
)
from trainfeed.formats.manifest import PACKED_KIND, Manifest, dataset_storage, read_manifest
from trainfeed.master import admission, auth
from trainfeed.master.admission import Refusal
from trainfeed.master.ledger import (
    DEFAULT_MAX_FAILURES,
    LeaseStatus,
    Ledger,
    Outcome,
    Verdict,
)
from trainfeed.master.reader_stats import ReaderBoard
from trainfeed.master.sessions import (
    DEFAULT_MAX_SESSIONS,
    RateLimitedLog,
    SessionKeys,
    check_worker_name,
    clip,
)
from trainfeed.master.stealing import Stealing
from trainfeed.master.stores import StateStore
from trainfeed.master.sync_group import SyncMembers
from trainfeed.names import validate_dataset_name, validate_job_name
from trainfeed.planning.distribution import DistributionRules
from trainfeed.planning.partitions import (
    DEFAULT_TARGET_PARTITIONS,
    Partition,
    plan_partitions,
    restored_plan,
)
from trainfeed.storage import Storage
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

logger = logging.getLogger(__name__)

JOB_STATE_VERSION = 1
# A reader heartbeats every third of this; 30 s rides out a GC pause or a slow storage read while
# a dead worker's tasks still move on within half a minute.
DEFAULT_LEASE_TIMEOUT_S = 30.0
# Upper bound of one long-poll: short enough that a reader notices a dead master quickly.
MAX_WAIT_MS = 5000
# A job is snapshotted once its journal holds this many ops per partition (and at least
# MIN_OPS_PER_SNAPSHOT): replay stays short and a snapshot costs O(1) per call amortized.
OPS_PER_PARTITION_PER_SNAPSHOT = 2
MIN_OPS_PER_SNAPSHOT = 4096
# How stale the count of live workers (the fair-share divisor) may be: counting is O(workers).
LIVE_WORKERS_REFRESH_S = 1.0
# After a restart or a stall, outstanding leases live this many lease timeouts from the moment the
# master serves again: one timeout is the contract (a reader heartbeats at a third of it), the
# second covers readers that were still backing off (at most ~1 s, see lease/client.py) or that
# queued behind a crowd of reconnecting readers on a small master.
RESTART_GRACE_LEASES = 2
# The lease timer ticks at most every second: a gap of this many seconds between two signs of life
# of the event loop means the process did not run (stopped, or blocked), so the readers could not
# reach it either.
STALL_S = 2.0
# The binary trailing metadata of a FAILED_PRECONDITION answer: a serialized RefusedReports.
REFUSED_TRAILER = "trainfeed-refused-bin"
# It lists at most this many (gRPC caps metadata at 16 KiB; a HeldTask takes at most ~25 bytes):
# a client sending more refused reports learns the rest on its retry.
MAX_REFUSED_LISTED = 512
# A FAILED report's reason is kept in the ledger (and its state) and shown by status: this much.
MAX_REASON_CHARS = 2000
# Random bytes of each job's lease-token key (trainfeed.master.ledger.lease_token).
TOKEN_KEY_BYTES = 32
_OUTCOMES = {pb.TaskReport.DONE: Outcome.DONE, pb.TaskReport.FAILED: Outcome.FAILED,
             pb.TaskReport.PROGRESS: Outcome.PROGRESS, pb.TaskReport.RELEASED: Outcome.RELEASED}


@dataclass(frozen=True)
class MasterConfig:
    """How the master serves. Validated on creation."""

    storage: Storage
    lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S
    max_failures: int = DEFAULT_MAX_FAILURES
    target_partitions: int = DEFAULT_TARGET_PARTITIONS
    # Live reader sessions per job (trainfeed.master.sessions); OpenJob past it: RESOURCE_EXHAUSTED.
    max_sessions: int = DEFAULT_MAX_SESSIONS

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"max sessions per job must be ≥ 1, got {self.max_sessions}")
        if self.lease_timeout_s <= 0:
            raise ValueError(f"lease timeout must be > 0 s, got {self.lease_timeout_s}")
        if self.max_failures < 1:
            raise ValueError(f"max failures must be ≥ 1, got {self.max_failures}")
        if self.target_partitions < 1:
            raise ValueError(f"target partitions must be ≥ 1, got {self.target_partitions}")


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
class Job:
    """One job: a dataset, its partition plan, its ledger and the workers seen."""

    name: str
    manifest: Manifest
    partitions: tuple[Partition, ...]
    ledger: Ledger
    target_partitions: int
    rules: DistributionRules = DistributionRules("all")
    workers: dict[str, float] = field(default_factory=dict)  # worker id -> last seen (time.time)
    journal_ops: int = 0  # ops appended since the last snapshot
    live_workers: int = 1
    live_workers_at: float = 0.0
    # Of partitions reported done (all epochs, since this master started): metrics.
    records_served: int = 0
    bytes_served: int = 0
    # Reports refused (not from the holder with its token) since this master started: metrics.
    reports_refused: int = 0
    # Derives and checks the secrets of its reader sessions (saved with the job's state).
    sessions: SessionKeys = field(default_factory=SessionKeys.new)
    # Work stealing: rates, outstanding asks (not state: a restart forgets them).
    stealing: Stealing = field(default_factory=Stealing)
    # Issues 25, 26 (trainfeed.master.admission; not state: readers tell a restarted master
    # again): the synchronous group's members, the delivery order of the job's readers (and
    # which reader set it), readers whose partitions went to a reader restored from their
    # checkpoint (worker id -> why).
    members: SyncMembers | None = None
    order: pb.DeliveryOrder | None = None
    order_by: str = ""
    superseded: dict[str, str] = field(default_factory=dict)
    # admission.holdings' last answer: (when, epoch, holders); recomputed at most twice a second.
    holdings_cache: tuple[float, int, list[pb.Holding]] = (float("-inf"), -1, [])
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ops_per_snapshot(self) -> int:
        return max(MIN_OPS_PER_SNAPSHOT, OPS_PER_PARTITION_PER_SNAPSHOT * len(self.partitions))

    def notify(self) -> None:
        """Wakes every long-poll waiting on this job."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout: float) -> None:
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))
        except asyncio.TimeoutError:
            pass

    def state(self) -> dict[str, Any]:
        return {"version": JOB_STATE_VERSION, "dataset": self.manifest.name,
                "fingerprint": self.manifest.fingerprint,
                "target_partitions": self.target_partitions,
                "distribution_rules": str(self.rules), "ledger": self.ledger.state(),
                "session_key": self.sessions.hex(),
                "sync_group": list(self.ledger.group) if self.ledger.group else None}


class MasterServicer(master_pb2_grpc.MasterServicer):
    """Implements trainfeed.v1.Master over in-memory jobs backed by a StateStore."""

    def __init__(self, config: MasterConfig, store: StateStore,
                 on_leadership_lost: Callable[[], None] | None = None):
        self.config = config
        self.store = store
        self.on_leadership_lost = on_leadership_lost
        self.leadership_lost = False
        self.jobs: dict[str, Job] = {}
        # Manifest reads in flight for jobs being created, so that workers joining a new job
        # at once share one read instead of each reading a (possibly large) manifest again.
        self._manifest_reads: dict[tuple[str, str], asyncio.Future[Manifest]] = {}
        # When the event loop last ran (time.time): a longer gap is a stall (see `alive`).
        self._alive_at = time.time()
        # Set by the server when calls carry tokens: a job token's call may touch its job only.
        self.job_scoped = False
        # Refusals (of reports, of sessions) hostile callers can make at will: a bounded log.
        self._refusal_log = RateLimitedLog(logger)
        self.reader_stats = ReaderBoard()  # what readers measure (issue 29): the status page

    # -- lifecycle ----------------------------------------------------------------------------
    def restore(self) -> None:
        """Loads every saved job (snapshot + journal); outstanding leases get a fresh deadline;
        each restored job is snapshotted again, which compacts its journal."""
        now = time.time()
        for name, saved in self.store.load_jobs().items():
            state = saved.snapshot
            try:
                manifest = read_manifest(self.config.storage, state["dataset"])
            except (DatasetNotFoundError, CorruptDatasetError) as e:
                logger.error("job %r not restored: %s", name, e)
                continue
            if manifest.fingerprint != state["fingerprint"]:
                logger.warning("job %r: dataset %r was re-uploaded since; starting the job afresh",
                               name, manifest.name)
                continue
            ledger = Ledger.from_state(state["ledger"])
            try:  # a job saved before row groups were sliced keeps its partition ids
                partitions = restored_plan(manifest, state["target_partitions"],
                                           ledger.num_partitions)
            except ValueError as e:
                logger.warning("job %r: %s; starting the job afresh", name, e)
                continue
            ledger.sizes = tuple(p.num_records for p in partitions)  # before replay: cuts use it
            group = state.get("sync_group")
            ledger.group = (int(group[0]), int(group[1])) if group else None
            ledger.replay(saved.journal)
            if ledger.token_key is None:  # saved before keyed tokens: the next leases get them
                ledger.token_key = secrets.token_bytes(TOKEN_KEY_BYTES)
            ledger.refresh_deadlines(now, self.config.lease_timeout_s)
            rules = DistributionRules.parse(state.get("distribution_rules"))
            job = Job(name, manifest, partitions, ledger, state["target_partitions"], rules,
                      sessions=SessionKeys.from_state(state.get("session_key")))
            self.jobs[name] = job
            self._snapshot(job)
            logger.info("restored job %r (dataset %r, epoch %d, %s; %d journaled ops replayed)",
                        name, manifest.name, ledger.epoch, ledger.counts(), len(saved.journal))

    def grant_grace(self, now: float | None = None) -> None:
        """Gives every outstanding lease RESTART_GRACE_LEASES lease timeouts from `now` (default:
        the present): called when the master starts serving after a restart, and after a stall."""
        now = time.time() if now is None else now
        self._alive_at = now
        grace = RESTART_GRACE_LEASES * self.config.lease_timeout_s
        for job in self.jobs.values():
            job.ledger.refresh_deadlines(now, grace)
            admission.hold_off(job, now, now + grace)

    def alive(self) -> float:
        """Notes that the event loop runs, and returns the time. After a gap of more than STALL_S
        (this process was stopped or blocked, so readers could not renew their leases) every
        lease first gets its grace. Called by the lease timer and at the start of every call,
        before any lease can expire."""
        now = time.time()
        if now - self._alive_at > STALL_S:
            logger.warning("the master did not run for %.1f s (stopped or blocked); outstanding "
                           "leases get %g s of grace", now - self._alive_at,
                           RESTART_GRACE_LEASES * self.config.lease_timeout_s)
            self.grant_grace(now)
        self._alive_at = now
        return now

    def expire_leases(self) -> None:
        """Called by the lease timer: overdue leases go back to todo."""
        now = self.alive()
        for job in self.jobs.values():
            overdue = job.ledger.expire(now)
            if overdue:
                logger.warning("job %r: %d lease(s) expired, partitions %s back to todo",
                               job.name, len(overdue), overdue[:10])
                self._save(job)
                job.notify()
            if admission.check_group(job, now, self.config.lease_timeout_s):
                job.notify()

    def job_stats(self) -> list[JobStats]:
        """Every job's figures. O(jobs + workers): called per scrape, not per call; like every
        method here, on the server's event loop only (the ledgers are not thread-safe)."""
        now = time.time()
        return [JobStats(job=job.name, dataset=job.manifest.name, epoch=job.ledger.epoch,
                         num_partitions=len(job.partitions), **job.ledger.counts(),
                         workers_alive=self._count_live_workers(job, now),
                         leases_expired=job.ledger.expired_leases,
                         records_served=job.records_served, bytes_served=job.bytes_served,
                         reports_refused=job.reports_refused)
                for job in self.jobs.values()]

    def _snapshot(self, job: Job) -> None:
        job.ledger.take_journal()  # the snapshot includes these ops
        self.store.save_snapshot(job.name, job.state())
        job.journal_ops = 0

    def _save(self, job: Job) -> None:
        """Makes the job's changes durable: appends its new ops, or snapshots it when due.

        On lost leadership (another master now serves this state) it stops this master and
        raises: answering would hand out tasks the other master also hands out."""
        if self.leadership_lost:
            raise LeadershipError("this master lost the leadership of its state store")
        ops = job.ledger.take_journal()
        try:
            if job.journal_ops + len(ops) >= job.ops_per_snapshot:
                self.store.save_snapshot(job.name, job.state())
                job.journal_ops = 0
            elif ops:
                self.store.append(job.name, ops)
                job.journal_ops += len(ops)
        except Exception as e:
            # Not durable: keep the ops for the next save, so the journal never skips one (a
            # replay would diverge), and fail the call rather than acknowledge.
            job.ledger.journal[:0] = ops
            if not isinstance(e, LeadershipError):
                raise StateStoreError(f"state store {self.store.url} failed: {e}") from e
            logger.critical("lost the leadership of state %s; stopping", self.store.url)
            self.leadership_lost = True
            if self.on_leadership_lost is not None:
                self.on_leadership_lost()
            raise

    async def _durably(self, job: Job, context: grpc.aio.ServicerContext) -> None:
        """`_save` inside a call: lost leadership answers UNAVAILABLE, so that readers retry
        and find the master that now serves."""
        try:
            self._save(job)
        except (LeadershipError, StateStoreError) as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    # -- helpers ------------------------------------------------------------------------------
    async def _job(self, name: str, context: grpc.aio.ServicerContext) -> Job:
        """The job named by a request: INVALID_ARGUMENT for a name no job can have, NOT_FOUND
        for one not here. (A known name was validated when its job was created, so the check
        costs nothing on the hot path.)"""
        await self._check_scope(name, context)
        job = self.jobs.get(name)
        if job is None:
            try:
                validate_job_name(name)
            except ValueError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            listed = "" if self._scope(context) is not None else f" (jobs: {sorted(self.jobs)})"
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"no job {name!r} on this master{listed}; "
                                f"a reader creates its job with OpenJob")
        assert job is not None  # abort raised
        return job

    async def _check_reports(self, job: Job, worker: str, reports: Any,
                             context: grpc.aio.ServicerContext) -> list[Verdict]:
        """Each report's verdict. Aborts the call, before anything changed, with
        INVALID_ARGUMENT if a report names what cannot exist, or FAILED_PRECONDITION (the refused
        reports in the REFUSED_TRAILER metadata) if one is not from the holder with its token."""
        verdicts: list[Verdict] = []
        refused: list[Any] = []
        for r in reports:
            outcome = _OUTCOMES.get(r.outcome)
            if outcome is None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"report on partition {r.partition}: outcome {r.outcome} is "
                                    f"not DONE, FAILED, PROGRESS or RELEASED")
            assert outcome is not None  # abort raised
            verdict = job.ledger.check_report(worker, r.epoch, r.partition, r.lease, outcome)
            if verdict is Verdict.INVALID:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self._out_of_range(
                    job, f"report on partition {r.partition} of epoch {r.epoch}"))
            if (outcome in (Outcome.PROGRESS, Outcome.RELEASED)
                    and r.consumed > max_delivered(job, r.partition)):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"job {job.name!r}: report on partition {r.partition}: "
                                    f"{r.consumed} records consumed of "
                                    f"{job.partitions[r.partition].num_records}")
            if verdict is Verdict.REFUSE:
                refused.append(r)
            verdicts.append(verdict)
        if refused:
            await self._refuse(job, worker, refused, context)
        return verdicts

    # -- sessions and scopes (issue 25; trainfeed.master.sessions, trainfeed.master.auth) --------
    def _scope(self, context: grpc.aio.ServicerContext) -> str | None:
        """The one job this call's token may touch; None: any (the master's own token)."""
        if not self.job_scoped:
            return None
        return auth.job_of_call(context.invocation_metadata())

    async def _check_scope(self, name: str, context: grpc.aio.ServicerContext) -> None:
        """PERMISSION_DENIED for a call about job `name` whose token is another job's."""
        scope = self._scope(context)
        if scope is not None and scope != name:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, (
                f"job {clip(name)!r}: this call's token is a job token of another job; a job "
                f"token opens only its own job (`trainfeed token JOB` prints it; the master's "
                f"token opens every job)"))

    async def _session(self, job: Job, worker: str, secret: str,
                       context: grpc.aio.ServicerContext) -> None:
        """PERMISSION_DENIED unless `secret` is the one OpenJob gave session `worker`. The
        answer names neither the secret nor anything about the session it names."""
        if job.sessions.is_secret(worker, secret):
            return
        self._refusal_log.warning(f"job {job.name!r}: refused a call as worker {clip(worker)}: "
                                  f"{'a wrong' if secret else 'no'} session secret")
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, (
            f"job {job.name!r}: the call carries {'a wrong' if secret else 'no'} session secret "
            f"for worker {clip(worker)}; every call of a reader session carries the "
            f"session_secret of its OpenJob answer (a reader that lost it opens a new session)"))

    async def _check_room(self, job: Job, context: grpc.aio.ServicerContext) -> None:
        """RESOURCE_EXHAUSTED when the job has `max_sessions` live sessions; first forgets the
        sessions not heard from within three lease timeouts (their leases expired long ago)."""
        now = time.time()
        limit = self.config.max_sessions
        if len(job.workers) < limit:
            return
        alive_since = now - self._live_window_s
        for worker in [w for w, seen in job.workers.items() if seen < alive_since]:
            del job.workers[worker]
        job.live_workers_at = 0.0
        if len(job.workers) >= limit:
            self._refusal_log.warning(f"job {job.name!r}: refused a new session: {limit} live "
                                      f"reader sessions already")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"job {job.name!r} has {len(job.workers)} live reader sessions, the most this "
                f"master allows per job (trainfeed master --max-sessions {limit}); sessions "
                f"that stop calling are forgotten after {self._live_window_s:g} s"))

    @staticmethod
    def _out_of_range(job: Job, what: str) -> str:
        return (f"job {job.name!r}: {what}: partitions are 0..{len(job.partitions) - 1} and "
                f"reports name an epoch from 0 to the current one, {job.ledger.epoch}")

    async def _refuse(self, job: Job, worker: str, refused: list[Any],
                      context: grpc.aio.ServicerContext) -> None:
        job.reports_refused += len(refused)
        first = refused[0]
        # Neither the partition's holder nor any token: that is what let a caller report as
        # another reader (issue 25).
        why = (f"partition {first.partition} of epoch {first.epoch}: not this worker's lease "
               f"(any more); the job is at epoch {job.ledger.epoch}")
        self.reader_stats.refused(job.name, worker, len(refused), why, time.time())
        self._refusal_log.warning(
            f"job {job.name!r}: refused {len(refused)} report(s) of worker {clip(worker)}, "
            f"which does not hold their lease; first: {why}")
        trailer = pb.RefusedReports(reports=[
            pb.HeldTask(epoch=r.epoch, partition=r.partition, lease=r.lease)
            for r in refused[:MAX_REFUSED_LISTED]]).SerializeToString()
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                            f"job {job.name!r}: {len(refused)} report(s) of worker "
                            f"{clip(worker)} refused: it does not hold their lease (it expired, "
                            f"or the partition went to another reader); first: {why}",
                            trailing_metadata=((REFUSED_TRAILER, trailer),))

    async def _check_held(self, job: Job, held: Any,
                          context: grpc.aio.ServicerContext) -> list[tuple[int, int, int]]:
        """The (epoch, partition, lease) triples a request says it holds; INVALID_ARGUMENT for a
        partition that cannot exist."""
        triples = [(t.epoch, t.partition, t.lease) for t in held]
        for _, p, _ in triples:
            if p >= len(job.partitions):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    self._out_of_range(job, f"held task on partition {p}"))
        return triples

    def _apply_reports(self, job: Job, worker: str, reports: Any,
                       verdicts: list[Verdict]) -> bool:
        changed = False
        ledger, now = job.ledger, time.time()
        for report, verdict in zip(reports, verdicts):
            if verdict is not Verdict.APPLY:
                continue
            current = report.epoch == ledger.epoch
            if report.outcome == pb.TaskReport.DONE:
                left = ledger.remaining(report.partition) if current else 0
                if ledger.report_done(report.epoch, report.partition, worker):
                    changed = True
                    job.stealing.rates.add(worker, left, now)
                    served = job.partitions[report.partition]
                    job.records_served += served.num_records
                    job.bytes_served += served.num_bytes
            elif report.outcome == pb.TaskReport.PROGRESS:
                had = ledger.progress.get(report.partition, 0) if current else report.consumed
                if ledger.report_progress(report.epoch, report.partition, report.consumed,
                                          worker):
                    changed = True
                    job.stealing.rates.add(worker, report.consumed - had, now)
            elif report.outcome == pb.TaskReport.RELEASED:
                if ledger.report_released(report.epoch, report.partition, report.consumed,
                                          worker):
                    changed = True
                    job.stealing.released(worker, report.partition, now)
            elif report.outcome == pb.TaskReport.FAILED:
                reason = clip(report.reason, MAX_REASON_CHARS)
                if job.ledger.report_failed(report.epoch, report.partition, reason):
                    changed = True
                    failed = report.partition in job.ledger.failed
                    logger.warning("job %r: worker %s failed partition %d (epoch %d)%s: %s",
                                   job.name, worker, report.partition, report.epoch,
                                   "; giving up on it this epoch" if failed else "",
                                   clip(reason, 500))
        return changed

    @staticmethod
    def _revoked(job: Job, worker: str, held: list[tuple[int, int, int]],
                 reports: Any) -> list[pb.HeldTask]:
        """Of `held`, the leases no longer `worker`'s, but for those this call reported."""
        reported = {(r.epoch, r.partition) for r in reports
                    if r.outcome != pb.TaskReport.PROGRESS}
        return [pb.HeldTask(epoch=e, partition=p, lease=t)
                for e, p, t in job.ledger.revoked(worker, held) if (e, p) not in reported]

    def _ask_back(self, job: Job, thief: str, now: float) -> None:
        """Work stealing: `thief` found nothing to lease while others hold leases they have not
        started: asks them for what it would finish sooner (trainfeed.master.stealing). The
        holders answer on their next call (a reader holding unstarted leases calls at least
        every STEAL_POLL_S, see trainfeed.lease.session), and what they hand back wakes the
        thief's long-poll."""
        if job.ledger.group is not None:
            return  # synchronous ranks lease their quota alone, and keep it
        for victim, partition in job.stealing.ask(job.ledger, thief, now):
            logger.debug("job %r: %s is idle; asking %s to give back partition %d", job.name,
                         thief, victim, partition)

    def _group_waits(self, job: Job, worker: str, now: float) -> bool:
        """A synchronous rank is about to wait for records: whether its group is broken (a
        rank that left counts as missing now), so that it is told at once, not after a wait."""
        if job.members is None:
            return False
        if admission.check_group(job, now, self.config.lease_timeout_s, waiting=True):
            job.notify()
        return bool(job.members.message_for(worker))

    @staticmethod
    def _listed(job: Job, worker: str, held: Any) -> None:
        """A call's held leases, and which of them its trainer began: an ask for one begun is
        void, and the thief (woken) may ask elsewhere."""
        if job.stealing.listed(job.ledger, worker, ((t.partition, t.started) for t in held
                                                    if t.epoch == job.ledger.epoch)):
            job.notify()

    @staticmethod
    def _asked_back(job: Job, worker: str,
                    held: list[tuple[int, int, int]]) -> list[pb.HeldTask]:
        """What `worker` is asked to give back, once, of the leases its call lists."""
        return [pb.HeldTask(epoch=e, partition=p, lease=t)
                for e, p, t in job.stealing.due(job.ledger, worker, held)]

    def _touch(self, job: Job, worker: str) -> None:
        now = time.time()
        if worker not in job.workers:
            job.live_workers_at = 0.0  # a newcomer changes everyone's fair share: recount
        job.workers[worker] = now
        job.ledger.renew(worker, now, self.config.lease_timeout_s)

    def _live_workers(self, job: Job, now: float) -> int:
        """Workers heard from within three lease timeouts (those that left are forgotten);
        recounted at most every LIVE_WORKERS_REFRESH_S."""
        if now - job.live_workers_at >= LIVE_WORKERS_REFRESH_S:
            job.live_workers = self._count_live_workers(job, now)
            job.live_workers_at = now
        return max(1, job.live_workers)

    @property
    def _live_window_s(self) -> float:
        """How recently a worker must have called to count as live: three lease timeouts (its
        leases expired long before). The one window of the live count, the session cap and
        the forgetting of silent sessions."""
        return 3 * self.config.lease_timeout_s

    def _count_live_workers(self, job: Job, now: float) -> int:
        """Workers heard from within the live window, counted now."""
        alive_since = now - self._live_window_s
        return sum(1 for seen in job.workers.values() if seen >= alive_since)

    def _task(self, job: Job, epoch: int, partition: int) -> pb.Task:
        p = job.partitions[partition]
        return pb.Task(epoch=epoch, partition=partition, shard=p.shard,
                       row_group_start=p.row_group_start, row_group_stop=p.row_group_stop,
                       num_records=p.num_records, skip_records=job.ledger.skip(partition),
                       lease=job.ledger.token_of(partition),
                       stop_records=job.ledger.limits.get(partition, 0),
                       row_start=p.row_start)

    # -- RPCs ---------------------------------------------------------------------------------
    async def OpenJob(self, request: pb.OpenJobRequest,
                      context: grpc.aio.ServicerContext) -> pb.OpenJobResponse:
        await self._check_scope(request.job, context)
        bad_name = (check_worker_name(request.worker_name)
                    or check_worker_name(request.resources.name, "worker resources name")
                    or check_worker_name(request.resources.hostname, "worker hostname"))
        if bad_name is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"job {clip(request.job)!r}: {bad_name}")
        try:
            validate_job_name(request.job)
            validate_dataset_name(request.dataset)
            rules = DistributionRules.parse(request.distribution_rules)
        except ValueError as e:  # InvalidNameError is one
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        job = self.jobs.get(request.job)
        if job is None:
            key = (request.job, request.dataset)
            reading = self._manifest_reads.get(key)
            if reading is None:
                reading = asyncio.ensure_future(asyncio.to_thread(
                    read_manifest, self.config.storage, request.dataset))
                self._manifest_reads[key] = reading
                reading.add_done_callback(lambda _: self._manifest_reads.pop(key, None))
            try:
                manifest = await asyncio.shield(reading)
            except DatasetNotFoundError as e:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
            except CorruptDatasetError as e:
                await context.abort(grpc.StatusCode.DATA_LOSS, str(e))
            job = self.jobs.get(request.job)  # another OpenJob may have won while we read
            if job is None:
                if not request.distribution_rules and manifest.kind == PACKED_KIND:
                    # MADlib's distribution_rules, given to the preprocessor, travel with the
                    # packed dataset: a reader that names none gets them.
                    rules = DistributionRules.parse(
                        manifest.extra.get("summary", {}).get("distribution_rules"))
                partitions = plan_partitions(manifest, self.config.target_partitions)
                ledger = Ledger(len(partitions), seed=request.seed,
                                max_failures=self.config.max_failures,
                                token_key=secrets.token_bytes(TOKEN_KEY_BYTES))
                ledger.sizes = tuple(p.num_records for p in partitions)
                job = Job(request.job, manifest, partitions, ledger,
                          self.config.target_partitions, rules)
                self.jobs[request.job] = job
                self._snapshot(job)
                logger.info("job %r created: dataset %r, %d records in %d partitions, "
                            "distribution rules %r", job.name, manifest.name,
                            manifest.num_records, len(partitions), str(rules))
        if job.manifest.name != request.dataset:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {request.job!r} reads dataset {job.manifest.name!r}, not "
                f"{request.dataset!r}; use another job name (TRAINFEED_JOB or job=...)")
        res = request.resources
        if not job.rules.admits(res.name, res.gpus):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                job.rules.refusal(job.name, res.name, res.hostname, res.gpus))
        await self._admit(job, request, context)
        if request.HasField("sync"):
            await self._join_group(job, request.sync, context)
        elif job.ledger.group is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, (
                f"job {job.name!r} is synchronous (world size {job.ledger.group[0]}, batch size "
                f"{job.ledger.group[1]}): read it with dist.reader(..., sync=True), or use "
                f"another job name"))
        if request.HasField("resume"):
            await self._check_resume(job, request.resume, context)
        await self._check_room(job, context)
        worker = new_worker_id(job, request.worker_name)
        self._touch(job, worker)
        resumed: list[int] = []
        cut: list[int] = []
        if request.HasField("sync"):
            await self._admit(job, request, context, worker)
        if request.HasField("resume"):
            admission.superseded(job, request.resume.worker_id, request.worker_name, worker)
            resumed, cut = await self._resume(job, worker, request.resume, context)
        folder = dataset_storage(self.config.storage, job.manifest.name)
        return pb.OpenJobResponse(
            worker_id=worker, job=job.name, dataset=job.manifest.name, dataset_url=folder.url,
            storage_options_json=folder.options_json(),
            fields=[pb.Field(name=f.name, type=f.type) for f in job.manifest.fields],
            num_records=job.manifest.num_records, num_partitions=len(job.partitions),
            current_epoch=job.ledger.join_epoch(), lease_timeout_s=self.config.lease_timeout_s,
            num_bytes=job.manifest.num_bytes, resumed_partitions=len(resumed),
            session_secret=job.sessions.secret(worker),
            resume_credential=job.sessions.resume_credential(worker), resume_cut=len(cut))

    async def _join_group(self, job: Job, sync: pb.SyncGroup,
                          context: grpc.aio.ServicerContext) -> None:
        """Checks a synchronous rank's group against the job's; a new group (the first ranks of
        the job, or a group restarted with another world size) takes effect at once if the
        current epoch is untouched, else from the next epoch, refused while one is half done."""
        world, batch = sync.world_size, sync.batch_size
        if world < 1 or batch < 1 or sync.rank >= world:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, (
                f"job {job.name!r}: synchronous rank {sync.rank} of world size {world} with "
                f"batch size {batch}: need world size ≥ 1, batch size ≥ 1 and rank < world size"))
        records = job.manifest.num_records
        if records < world * batch:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, (
                f"job {job.name!r}: dataset {job.manifest.name!r} has {records} records, fewer "
                f"than world size × batch size = {world} × {batch}: a synchronous epoch would "
                f"have no step"))
        group = (world, batch)
        ledger = job.ledger
        if group == ledger.group:
            return
        if not (ledger.untouched or ledger.complete):
            now = ledger.group
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, (
                f"job {job.name!r}: epoch {ledger.epoch} is half read by "
                + (f"a synchronous group of world size {now[0]}, batch size {now[1]}"
                   if now else "asynchronous readers")
                + f"; a group of world size {world}, batch size {batch} can join at an epoch "
                f"boundary (restore the ranks from reader.state() saved at the end of an epoch, "
                f"or wait for it to end), or use another job name"))
        ledger.set_group(group)
        logger.info("job %r: synchronous, world size %d, batch size %d (from epoch %d%s)",
                    job.name, world, batch, ledger.epoch + (0 if ledger.untouched else 1),
                    f"; {ledger.dropped} records of it dropped" if ledger.untouched else "")
        await self._durably(job, context)

    async def _admit(self, job: Job, request: pb.OpenJobRequest,
                     context: grpc.aio.ServicerContext, worker: str = "") -> None:
        """Before the reader has an id: FAILED_PRECONDITION for a reader whose delivery order
        differs from the job's, or a synchronous rank a live reader holds; with its `worker`
        id, makes it a member of the job's group (see trainfeed.master.admission)."""
        now, timeout = time.time(), self.config.lease_timeout_s
        name = request.worker_name or "a reader"
        resumes = request.resume.worker_id if request.HasField("resume") else ""
        if worker:
            admission.join_rank(job, request.sync, worker, name, resumes, now, timeout)
            return
        try:
            if request.HasField("order"):
                admission.check_order(job, request.order, name, now, timeout)
            if request.HasField("sync"):
                admission.check_rank(job, request.sync, name, resumes, now, timeout)
        except Refusal as e:
            logger.warning("job %r: refused %s: %s", job.name, name, e.message[:500])
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, e.message,
                                trailing_metadata=e.trailer)

    async def _check_resume(self, job: Job, resume: pb.ResumePosition,
                            context: grpc.aio.ServicerContext) -> None:
        """PERMISSION_DENIED, before anything changed, for a resume without the checkpointing
        session's resume credential; INVALID_ARGUMENT for a resume position naming a partition
        that does not exist or more records of one than it has."""
        if not job.sessions.is_resume_credential(resume.worker_id, resume.credential):
            self._refusal_log.warning(f"job {job.name!r}: refused a resume of worker "
                                      f"{clip(resume.worker_id)}: no or a wrong resume credential")
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, (
                f"job {job.name!r}: resume of worker {clip(resume.worker_id)} refused: the "
                f"checkpoint carries {'a wrong' if resume.credential else 'no'} resume "
                f"credential for it (a reader's state_dict() carries the one its session got; "
                f"a checkpoint of another job, of another master's state, or from before "
                f"resume credentials cannot be resumed: start the reader without state)"))
        for p in (*resume.done, *resume.positions):
            if p >= len(job.partitions):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self._out_of_range(
                    job, f"resume position names partition {p}"))
        for p, n in resume.positions.items():
            if n > max_delivered(job, p):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"job {job.name!r}: resume position: {n} records consumed of "
                                    f"partition {p}, which has {job.partitions[p].num_records}")

    async def _resume(self, job: Job, worker: str, resume: pb.ResumePosition,
                      context: grpc.aio.ServicerContext) -> tuple[list[int], list[int]]:
        """Rewinds what the checkpointing reader `resume.worker_id` did after its checkpoint,
        as far as the ledger can vouch for it (Ledger.vouched_resume): returns the partitions
        put back, and those whose claim went beyond what reports showed (cut to it)."""
        keep, positions, cut = job.ledger.vouched_resume(
            resume.epoch, resume.worker_id, resume.done,
            {int(p): int(n) for p, n in resume.positions.items()})
        if cut:
            logger.warning("job %r: the checkpoint of %s claims more than its reports showed "
                           "consumed, or partitions it never held, in %d partition(s) (%s): "
                           "they resume where the reports left them", job.name,
                           resume.worker_id, len(cut), cut[:10])
        back = job.ledger.rewind(resume.epoch, resume.worker_id, keep, positions)
        if resume.epoch != job.ledger.epoch:
            logger.warning("job %r: worker %s resumes a checkpoint of epoch %d, but the job is "
                           "at epoch %d; nothing to rewind", job.name, worker, resume.epoch,
                           job.ledger.epoch)
        else:
            logger.info("job %r: worker %s resumes the checkpoint of %s in epoch %d: %d "
                        "partition(s) back to todo", job.name, worker, resume.worker_id,
                        resume.epoch, len(back))
        job.workers.pop(resume.worker_id, None)  # the checkpointing reader is gone
        await self._durably(job, context)
        job.notify()
        return back, cut

    async def GetTasks(self, request: pb.GetTasksRequest,
                       context: grpc.aio.ServicerContext) -> pb.GetTasksResponse:
        job = await self._job(request.job, context)
        worker = request.worker_id
        await self._session(job, worker, request.session_secret, context)
        if not -1 <= request.epoch <= job.ledger.epoch + 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"job {job.name!r}: cannot lease tasks of epoch {request.epoch}: "
                                f"the job is at epoch {job.ledger.epoch}; ask for an epoch up to "
                                f"the next one, {job.ledger.epoch + 1} (-1 joins the current one)")
        held = await self._check_held(job, request.held, context)
        self.reader_stats.record(job.name, worker, request.stats, self.alive())
        verdicts = await self._check_reports(job, worker, request.reports, context)
        changed = self._apply_reports(job, worker, request.reports, verdicts)
        if request.reconcile:  # (the call lists what the caller holds)
            self._listed(job, worker, request.held)
        revoked = self._revoked(job, worker, held, request.reports)
        if request.reconcile:
            orphans = job.ledger.reconcile(worker, ((t.epoch, t.partition) for t in request.held))
            if orphans:
                logger.warning("job %r: worker %s did not know of its lease(s) on %s (an answer "
                               "lost to a restart?); back to todo", job.name, worker, orphans)
                changed = True
        self._touch(job, worker)
        stop = admission.on_call(job, worker, request.sync if request.HasField("sync") else None,
                                 time.time())
        why = admission.revoked_why(job, worker)
        if stop or why:  # a broken synchronous group, or a superseded reader: no more tasks
            if changed:
                await self._durably(job, context)
                job.notify()
            return pb.GetTasksResponse(status=pb.GetTasksResponse.WAIT,
                                       current_epoch=job.ledger.epoch, revoked=revoked,
                                       group_broken=stop, revoked_why=why, superseded=why)
        epoch = request.epoch if request.epoch >= 0 else job.ledger.join_epoch()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + min(request.wait_ms, MAX_WAIT_MS) / 1000
        while True:
            now = time.time()
            result = job.ledger.lease(worker, epoch, request.max_tasks, now,
                                      self.config.lease_timeout_s, self._live_workers(job, now),
                                      max_records=request.max_records,
                                      reserved=job.stealing.reserved(job.ledger, now))
            if result.status is LeaseStatus.TASKS:
                changed = True
                job.stealing.leased(result.partitions)
            if result.status is LeaseStatus.WAIT and result.epoch == epoch:
                self._ask_back(job, worker, now)
            if changed:
                await self._durably(job, context)
                job.notify()
                changed = False
            if result.status is not LeaseStatus.WAIT or loop.time() >= give_up:
                break
            if self._group_waits(job, worker, now):
                break
            await job.wait_changed(give_up - loop.time())
        status = {LeaseStatus.TASKS: pb.GetTasksResponse.TASKS,
                  LeaseStatus.WAIT: pb.GetTasksResponse.WAIT,
                  LeaseStatus.EPOCH_DONE: pb.GetTasksResponse.EPOCH_DONE}[result.status]
        failed: list[pb.FailedPartition] = []
        failed_known = False
        if result.status is LeaseStatus.EPOCH_DONE:
            lost = job.ledger.failed_in(epoch)  # the epoch the reader asked for
            failed_known = lost is not None
            failed = [pb.FailedPartition(partition=p, reason=r,
                                         num_records=job.partitions[p].num_records)
                      for p, r in sorted((lost or {}).items())]
        return pb.GetTasksResponse(
            status=status, current_epoch=result.epoch, todo_left=len(job.ledger.todo),
            tasks=[self._task(job, result.epoch, p) for p in result.partitions], revoked=revoked,
            failed=failed, failed_known=failed_known,
            give_back=self._asked_back(job, worker, held),
            group_broken=admission.on_call(job, worker, None, time.time()),
            holders=(admission.holdings(job, time.time(), worker)
                     if result.status is LeaseStatus.WAIT else ()),
            revoked_why=admission.revoked_why(job, worker))

    async def Report(self, request: pb.ReportRequest,
                     context: grpc.aio.ServicerContext) -> pb.ReportResponse:
        job = await self._job(request.job, context)
        await self._session(job, request.worker_id, request.session_secret, context)
        held = await self._check_held(job, request.held, context)
        self.reader_stats.record(job.name, request.worker_id, request.stats, self.alive())
        verdicts = await self._check_reports(job, request.worker_id, request.reports, context)
        if self._apply_reports(job, request.worker_id, request.reports, verdicts):
            await self._durably(job, context)
            job.notify()
        self._listed(job, request.worker_id, request.held)
        self._touch(job, request.worker_id)
        stop = admission.on_call(job, request.worker_id,
                                 request.sync if request.HasField("sync") else None, time.time())
        return pb.ReportResponse(current_epoch=job.ledger.epoch,
                                 revoked=self._revoked(job, request.worker_id, held,
                                                       request.reports),
                                 give_back=self._asked_back(job, request.worker_id, held),
                                 group_broken=stop,
                                 revoked_why=admission.revoked_why(job, request.worker_id),
                                 superseded=admission.revoked_why(job, request.worker_id))

    async def LeaveJob(self, request: pb.LeaveJobRequest,
                       context: grpc.aio.ServicerContext) -> pb.LeaveJobResponse:
        job = await self._job(request.job, context)
        await self._session(job, request.worker_id, request.session_secret, context)
        released = job.ledger.release(request.worker_id)
        job.workers.pop(request.worker_id, None)
        job.stealing.forget(request.worker_id)
        admission.left(job, request.worker_id, time.time())
        job.live_workers_at = 0.0
        if released:
            logger.info("job %r: worker %s left, %d task(s) back to todo", job.name,
                        request.worker_id, len(released))
            await self._durably(job, context)
            job.notify()
        return pb.LeaveJobResponse(released_tasks=len(released))

    async def GetJobStatus(self, request: pb.GetJobStatusRequest,
                           context: grpc.aio.ServicerContext) -> pb.JobStatus:
        job = await self._job(request.job, context)
        counts = job.ledger.counts()
        return pb.JobStatus(
            job=job.name, dataset=job.manifest.name, epoch=job.ledger.epoch,
            num_partitions=len(job.partitions),
            workers=self._count_live_workers(job, time.time()),
            failed_reasons=[f"partition {p}: {r}" for p, r in sorted(job.ledger.failed.items())],
            records_served=job.records_served, bytes_served=job.bytes_served,
            reports_refused=job.reports_refused, **counts)


# Random bits of a worker id after its name: ids (and so session secrets) never repeat in a job.
WORKER_ID_HEX = 16


def new_worker_id(job: Job, name: str) -> str:
    """`name`-<64 random bits>, none of the job's known workers' (a session's secret derives
    from its id, so two sessions must never share one)."""
    while True:
        worker = f"{name or 'worker'}-{uuid.uuid4().hex[:WORKER_ID_HEX]}"
        if worker not in job.workers and worker not in job.ledger.by_worker:
            return worker


# Positions count records in delivery order, where over-sampling (resample=) repeats records:
# a partition may deliver more than it holds, but never this many copies of each record.
MAX_COPIES_PER_RECORD = 1 << 20


def max_delivered(job: Job, partition: int) -> int:
    """The most records a reader can have consumed of `partition` (a PROGRESS or a resume
    position beyond it is a forged or broken report: INVALID_ARGUMENT)."""
    return job.partitions[partition].num_records * MAX_COPIES_PER_RECORD
