"""The master's pure core: the jobs, their ledgers, the stealing plan and what readers are told.

Every method takes the time as an argument and returns what the call answers; nothing here
touches a socket, a clock, a thread or gRPC. A refusal is raised as a `CallError` subclass (the
gRPC shell, trainfeed.master.serve.service, maps each to a status code in one table). Changes to a
ledger are journaled in the ledger (`Ledger.take_journal`); the shell hands them to the journal
writer and answers only once they are durable. The shell also owns the waiting: a call that
changed a job says so (`changed` results, or `Coordinator.on_change`), and the shell wakes the
long-polls and Watch streams.

Watch (issue 28): a reader session may hold one stream; while it does, what the master must tell
it between its own calls (a give-back asked of it, leases taken from it, the end of an epoch, a
broken synchronous group, being superseded) is queued in its outbox (`events`) as WatchEvents,
and `on_event(job, worker)` tells the shell to send them. A session that does not watch is told
on its next call, as before (the answers carry the same fields), so old readers keep polling.

Trust, sessions, outages: as described in trainfeed.master.serve.service (the rules did not move,
only where they are decided).
"""
from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from trainfeed.errors import CorruptDatasetError, DatasetNotFoundError
from trainfeed.formats.manifest import PACKED_KIND, Manifest, dataset_storage
from trainfeed.master.core import admission, liveness
from trainfeed.master.core.admission import Refusal
from trainfeed.master.core.jobs import (
    FailedPrecondition,
    InvalidArgument,
    Job,
    JobMetrics,
    JobStats,
    MasterConfig,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    max_delivered,
    new_worker_id,
)
from trainfeed.master.core.ledger import (
    LeaseResult,
    LeaseStatus,
    Ledger,
    Outcome,
    Verdict,
)
from trainfeed.master.core.reader_stats import ReaderBoard
from trainfeed.master.core.saved_job import SavedJob
from trainfeed.master.core.sessions import (
    RateLimitedLog,
    SessionKeys,
    check_worker_name,
    clip,
)
from trainfeed.names import validate_dataset_name, validate_job_name
from trainfeed.planning.distribution import DistributionRules
from trainfeed.planning.partitions import (
    plan_partitions,
    restored_plan,
)
from trainfeed.protocol import PROTOCOL_VERSION
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)

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
# a client sending more refused reports learns the rest on its retry. So do a Session answer's
# `refused` (with `refused_count`) and any answer's `revoked`: an answer's size does not grow with
# what a message lists (a reader holds and reports far fewer leases than this at once).
MAX_REFUSED_LISTED = 512
# A FAILED report's reason is kept in the ledger (and its state) and shown by status: this much.
MAX_REASON_CHARS = 2000
# Random bytes of each job's lease-token key (trainfeed.master.core.ledger.lease_token).
TOKEN_KEY_BYTES = 32
# Readers before protocol versioning send 0: refused like any other version (FAILED_PRECONDITION
# naming both), since they know nothing of the Watch stream or of ReaderStats. (A switch, so that
# a test can show the refusal is this rule's doing.)
ACCEPT_UNVERSIONED = False
# Events queued for a watching session that does not read them (a stalled reader): past this the
# oldest go (the session's next call carries what still matters: revocations, give-backs).
MAX_QUEUED_EVENTS = 256
_OUTCOMES = {pb.TaskReport.DONE: Outcome.DONE, pb.TaskReport.FAILED: Outcome.FAILED,
             pb.TaskReport.PROGRESS: Outcome.PROGRESS, pb.TaskReport.RELEASED: Outcome.RELEASED}
_STATUS = {LeaseStatus.TASKS: pb.GetTasksResponse.TASKS,
           LeaseStatus.WAIT: pb.GetTasksResponse.WAIT,
           LeaseStatus.EPOCH_DONE: pb.GetTasksResponse.EPOCH_DONE}


@dataclass(frozen=True)
class Held:
    """A call's held leases, as (epoch, partition, lease) triples."""

    triples: list[tuple[int, int, int]]


class Coordinator:
    """Every job of this master. Not thread-safe: the shell calls it from one event loop.

    Hooks the shell sets: `on_change(job)` (long-polls of the job may proceed) and
    `on_event(job, worker)` (a watching session has events queued).
    """

    def __init__(self, config: MasterConfig):
        self.config = config
        self.jobs: dict[str, Job] = {}
        self.metrics: dict[str, JobMetrics] = {}
        # When the event loop last ran: a longer gap is a stall (see `alive`).
        self.alive_at = 0.0
        # Refusals (of reports, of sessions) hostile callers can make at will: a bounded log.
        self.refusal_log = RateLimitedLog(logger)
        self.reader_stats = ReaderBoard()  # what readers measure (issue 29): the status page
        # Watching sessions: (job, worker) -> events not yet sent.
        self.events: dict[tuple[str, str], list[pb.WatchEvent]] = {}
        self.on_change: Callable[[str], None] = lambda job: None
        self.on_event: Callable[[str, str], None] = lambda job, worker: None
        # Synchronous job -> (its epoch, the ranks that asked for the next one while it was
        # open, whether the stuck epoch was logged): see `_note_ahead`.
        self._ahead: dict[str, tuple[int, set[int], bool]] = {}
        # The port of /metrics and /status.json once the shell serves them (0: none), which
        # JobStatus tells `status --watch` (it would guess the default port otherwise).
        self.metrics_port = 0

    # -- lifecycle ----------------------------------------------------------------------------
    def restore(self, saved_jobs: dict[str, SavedJob],
                read_manifest: Callable[[str, int | None], Manifest], now: float) -> list[Job]:
        """Loads every saved job (snapshot + journal); outstanding leases get a fresh deadline.
        Returns the jobs restored (the shell snapshots each again, compacting its journal)."""
        restored = []
        for name, saved in saved_jobs.items():
            job = self._restore_job(name, saved, read_manifest, now)
            if job is not None:
                self._add(job)
                restored.append(job)
        return restored

    def _restore_job(self, name: str, saved: SavedJob,
                     read_manifest: Callable[[str, int | None], Manifest], now: float
                     ) -> Job | None:
        state = saved.snapshot
        try:  # the version the job read (None in states before versions: the current one)
            manifest = read_manifest(state["dataset"], state.get("dataset_version"))
        except (DatasetNotFoundError, CorruptDatasetError) as e:
            logger.error("job %r not restored: %s", name, e)
            return None
        if manifest.fingerprint != state["fingerprint"]:
            logger.warning("job %r: dataset %r was re-uploaded since; starting the job afresh",
                           name, manifest.name)
            return None
        ledger = Ledger.from_state(state["ledger"])
        try:  # a job saved before row groups were sliced keeps its partition ids
            partitions = restored_plan(manifest, state["target_partitions"],
                                       ledger.num_partitions)
        except ValueError as e:
            logger.warning("job %r: %s; starting the job afresh", name, e)
            return None
        ledger.sizes = tuple(p.num_records for p in partitions)  # before replay: cuts use it
        group = state.get("sync_group")
        ledger.group = (int(group[0]), int(group[1])) if group else None
        ledger.replay(saved.journal)
        if ledger.token_key is None:  # saved before keyed tokens: the next leases get them
            ledger.token_key = secrets.token_bytes(TOKEN_KEY_BYTES)
        ledger.refresh_deadlines(now, self.config.lease_timeout_s)
        rules = DistributionRules.parse(state.get("distribution_rules"))
        logger.info("restored job %r (dataset %r, epoch %d, %s; %d journaled ops replayed)",
                    name, manifest.name, ledger.epoch, ledger.counts(), len(saved.journal))
        return Job(name, manifest, partitions, ledger, state["target_partitions"], rules,
                   sessions=SessionKeys.from_state(state.get("session_key")))

    def _add(self, job: Job) -> None:
        self.jobs[job.name] = job
        self.metrics.setdefault(job.name, JobMetrics())

    def grant_grace(self, now: float) -> None:
        """Gives every outstanding lease RESTART_GRACE_LEASES lease timeouts from `now`: when
        the master starts serving after a restart, and after a stall."""
        self.alive_at = now
        grace = RESTART_GRACE_LEASES * self.config.lease_timeout_s
        for job in self.jobs.values():
            job.ledger.refresh_deadlines(now, grace)
            admission.hold_off(job, now, now + grace)

    def alive(self, now: float) -> None:
        """Notes that the event loop runs at `now`. After a gap of more than STALL_S (this
        process was stopped or blocked, so readers could not renew their leases) every lease
        first gets its grace. Called by the lease timer and by every call, before any lease can
        expire."""
        if self.alive_at and now - self.alive_at > STALL_S:
            logger.warning("the master did not run for %.1f s (stopped or blocked); outstanding "
                           "leases get %g s of grace", now - self.alive_at,
                           RESTART_GRACE_LEASES * self.config.lease_timeout_s)
            self.grant_grace(now)
        self.alive_at = now

    def expire_leases(self, now: float) -> list[Job]:
        """The lease timer: overdue leases go back to todo (their holders, if watching, are
        told). Returns the jobs whose ledger changed."""
        self.alive(now)
        changed = []
        for job in self.jobs.values():
            if self._expire(job, now):  # (it checked the group too)
                changed.append(job)
            elif admission.check_group(job, now, self.config.lease_timeout_s):
                self._tell_group(job)
                self.on_change(job.name)
        return changed

    def _expire(self, job: Job, now: float) -> bool:
        """Takes back `job`'s overdue leases, telling their watching holders; whether any.

        A synchronous rank whose leases expired was not heard from for a lease timeout: its
        group breaks at once, whichever path noticed the expiry (the lease timer, or another
        rank's GetTasks), before any other rank can lease what it held. Else the rank could
        call again before the timer's next check, stay in the group, and find its partitions
        read by another rank: records its trainer had would be read twice, and the quotas
        would no longer add up to the epoch (a rank short, or records nobody asks for)."""
        overdue = job.ledger.expire(now)
        if not overdue:
            return False
        logger.warning("job %r: %d lease(s) expired, partitions %s back to todo", job.name,
                       len(overdue), overdue[:10])
        # (an expiry keeps each partition's latest lease until it is leased again)
        self._tell_revoked(job, [(p, job.ledger.leases.get(p)) for p in overdue], "")
        if admission.check_group(job, now, self.config.lease_timeout_s):
            self._tell_group(job)
        self.on_change(job.name)
        return True

    def job_stats(self, now: float) -> list[JobStats]:
        """Every job's figures. O(jobs + workers): called per scrape, not per call."""
        return [JobStats(job=job.name, dataset=job.manifest.name, epoch=job.ledger.epoch,
                         num_partitions=len(job.partitions), **job.ledger.counts(),
                         workers_alive=liveness.readers_alive(job.workers, now,
                                                              self.config.lease_timeout_s),
                         leases_expired=job.ledger.expired_leases,
                         records_served=self.metrics[job.name].records_served,
                         bytes_served=self.metrics[job.name].bytes_served,
                         reports_refused=self.metrics[job.name].reports_refused)
                for job in self.jobs.values()]

    # -- jobs, scopes and sessions ------------------------------------------------------------
    def job(self, name: str, scope: str | None) -> Job:
        """The job named by a request: INVALID_ARGUMENT for a name no job can have, NOT_FOUND
        for one not here. (A known name was validated when its job was created, so the check
        costs nothing on the hot path.)"""
        self.check_scope(name, scope)
        job = self.jobs.get(name)
        if job is not None:
            return job
        try:
            validate_job_name(name)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        listed = "" if scope is not None else f" (jobs: {sorted(self.jobs)})"
        raise NotFound(f"no job {name!r} on this master{listed}; a reader creates its job with "
                       f"OpenJob")

    @staticmethod
    def check_scope(name: str, scope: str | None) -> None:
        """PERMISSION_DENIED for a call about job `name` whose token is another job's."""
        if scope is not None and scope != name:
            raise PermissionDenied(
                f"job {clip(name)!r}: this call's token is a job token of another job; a job "
                f"token opens only its own job (`trainfeed token JOB` prints it; the master's "
                f"token opens every job)")

    def session(self, job: Job, worker: str, secret: str) -> None:
        """PERMISSION_DENIED unless `secret` is the one OpenJob gave session `worker`. The
        answer names neither the secret nor anything about the session it names."""
        if job.sessions.is_secret(worker, secret):
            return
        self.refusal_log.warning(f"job {job.name!r}: refused a call as worker {clip(worker)}: "
                                 f"{'a wrong' if secret else 'no'} session secret")
        raise PermissionDenied(
            f"job {job.name!r}: the call carries {'a wrong' if secret else 'no'} session secret "
            f"for worker {clip(worker)}; every call of a reader session carries the "
            f"session_secret of its OpenJob answer (a reader that lost it opens a new session)")

    def check_room(self, job: Job, now: float) -> None:
        """RESOURCE_EXHAUSTED when the job has `max_sessions` live sessions; first forgets the
        sessions not heard from within three lease timeouts (their leases expired long ago)."""
        limit = self.config.max_sessions
        if len(job.workers) < limit:
            return
        alive_since = now - self.live_window_s
        for worker in [w for w, seen in job.workers.items() if seen < alive_since]:
            del job.workers[worker]
        job.live_workers_at = 0.0
        if len(job.workers) >= limit:
            self.refusal_log.warning(f"job {job.name!r}: refused a new session: {limit} live "
                                     f"reader sessions already")
            raise ResourceExhausted(
                f"job {job.name!r} has {len(job.workers)} live reader sessions, the most this "
                f"master allows per job (trainfeed master --max-sessions {limit}); sessions "
                f"that stop calling are forgotten after {self.live_window_s:g} s")

    @staticmethod
    def out_of_range(job: Job, what: str) -> str:
        return (f"job {job.name!r}: {what}: partitions are 0..{len(job.partitions) - 1} and "
                f"reports name an epoch from 0 to the current one, {job.ledger.epoch}")

    # -- OpenJob ------------------------------------------------------------------------------
    @staticmethod
    def check_version(request: pb.OpenJobRequest) -> None:
        """FAILED_PRECONDITION, naming both versions, for a reader of another protocol."""
        version = request.protocol_version
        if version == PROTOCOL_VERSION or (version == 0 and ACCEPT_UNVERSIONED):
            return
        spoken = "0 (a reader from before protocol versions)" if version == 0 else str(version)
        raise FailedPrecondition(
            f"job {clip(request.job)!r}: the reader speaks wire protocol {spoken}, this master "
            f"speaks {PROTOCOL_VERSION}; run readers and master of the same trainfeed release "
            f"(pip show trainfeed on both sides)")

    def check_open(self, request: pb.OpenJobRequest, scope: str | None) -> DistributionRules:
        """What an OpenJob must get right before any job is touched or created."""
        self.check_scope(request.job, scope)
        self.check_version(request)
        bad_name = (check_worker_name(request.worker_name)
                    or check_worker_name(request.resources.name, "worker resources name")
                    or check_worker_name(request.resources.hostname, "worker hostname"))
        if bad_name is not None:
            raise InvalidArgument(f"job {clip(request.job)!r}: {bad_name}")
        try:
            validate_job_name(request.job)
            validate_dataset_name(request.dataset)
            return DistributionRules.parse(request.distribution_rules)
        except ValueError as e:  # InvalidNameError is one
            raise InvalidArgument(str(e)) from None

    def create_job(self, request: pb.OpenJobRequest, manifest: Manifest,
                   rules: DistributionRules, token_key: bytes) -> Job:
        """A new job of `manifest` (the shell snapshots it before answering)."""
        if not request.distribution_rules and manifest.kind == PACKED_KIND:
            # MADlib's distribution_rules, given to the preprocessor, travel with the packed
            # dataset: a reader that names none gets them.
            rules = DistributionRules.parse(
                manifest.extra.get("summary", {}).get("distribution_rules"))
        partitions = plan_partitions(manifest, self.config.target_partitions)
        ledger = Ledger(len(partitions), seed=request.seed, max_failures=self.config.max_failures,
                        token_key=token_key)
        ledger.sizes = tuple(p.num_records for p in partitions)
        job = Job(request.job, manifest, partitions, ledger, self.config.target_partitions, rules)
        self._add(job)
        logger.info("job %r created: dataset %r, %d records in %d partitions, distribution "
                    "rules %r", job.name, manifest.name, manifest.num_records, len(partitions),
                    str(rules))
        return job

    def open_session(self, job: Job, request: pb.OpenJobRequest, now: float
                     ) -> tuple[pb.OpenJobResponse, bool]:
        """Admits a reader to `job` (refusals raise before anything changed, but for a new
        synchronous group, which takes effect first). Returns the answer and whether the
        ledger changed."""
        self._check_joinable(job, request)
        self._admit(job, request, now)
        changed = False
        if request.HasField("sync"):
            changed = self._join_group(job, request.sync)
        elif job.ledger.group is not None:
            raise FailedPrecondition(
                f"job {job.name!r} is synchronous (world size {job.ledger.group[0]}, batch size "
                f"{job.ledger.group[1]}): read it with dist.reader(..., sync=True), or use "
                f"another job name")
        if request.HasField("resume"):
            self._check_resume(job, request.resume)
        self.check_room(job, now)
        worker = new_worker_id(job, request.worker_name)
        self.touch(job, worker, now)
        resumed: list[int] = []
        cut: list[int] = []
        if request.HasField("sync"):
            admission.join_rank(job, request.sync, worker, request.worker_name or "a reader",
                                _resumes(request), now, self.config.lease_timeout_s)
        if request.HasField("resume"):
            old = request.resume.worker_id
            admission.superseded(job, old, request.worker_name, worker)
            resumed, cut = self._resume(job, worker, request.resume)
            self._tell_superseded(job, old)
            changed = True
        folder = dataset_storage(self.config.storage, job.manifest.name)
        return pb.OpenJobResponse(
            worker_id=worker, job=job.name, dataset=job.manifest.name, dataset_url=folder.url,
            storage_options_json=folder.options_json(),
            fields=[pb.Field(name=f.name, type=f.type) for f in job.manifest.fields],
            num_records=job.manifest.num_records, num_partitions=len(job.partitions),
            current_epoch=job.ledger.join_epoch(), lease_timeout_s=self.config.lease_timeout_s,
            num_bytes=job.manifest.num_bytes, resumed_partitions=len(resumed),
            session_secret=job.sessions.secret(worker),
            resume_credential=job.sessions.resume_credential(worker), resume_cut=len(cut),
            protocol_version=PROTOCOL_VERSION,
            dataset_version=job.manifest.dataset_version), changed

    @staticmethod
    def _check_joinable(job: Job, request: pb.OpenJobRequest) -> None:
        if job.manifest.name != request.dataset:
            raise FailedPrecondition(
                f"job {request.job!r} reads dataset {job.manifest.name!r}, not "
                f"{request.dataset!r}; use another job name (TRAINFEED_JOB or job=...)")
        _check_version(job, request)
        res = request.resources
        if not job.rules.admits(res.name, res.gpus):
            raise FailedPrecondition(job.rules.refusal(job.name, res.name, res.hostname,
                                                       res.gpus))

    def _admit(self, job: Job, request: pb.OpenJobRequest, now: float) -> None:
        """Before the reader has an id: FAILED_PRECONDITION for a reader whose delivery order
        differs from the job's, or a synchronous rank a live reader holds (see admission)."""
        timeout = self.config.lease_timeout_s
        name = request.worker_name or "a reader"
        try:
            if request.HasField("order"):
                admission.check_order(job, request.order, name, now, timeout)
            if request.HasField("sync"):
                admission.check_rank(job, request.sync, name, _resumes(request), now, timeout)
        except Refusal as e:
            logger.warning("job %r: refused %s: %s", job.name, name, e.message[:500])
            raise FailedPrecondition(e.message, e.trailer) from None

    def _join_group(self, job: Job, sync: pb.SyncGroup) -> bool:
        """Checks a synchronous rank's group against the job's; a new group (the first ranks of
        the job, or a group restarted with another world size) takes effect at once if the
        current epoch is untouched, else from the next epoch, refused while one is half done.
        Returns whether the ledger changed."""
        world, batch = sync.world_size, sync.batch_size
        if world < 1 or batch < 1 or sync.rank >= world:
            raise InvalidArgument(
                f"job {job.name!r}: synchronous rank {sync.rank} of world size {world} with "
                f"batch size {batch}: need world size ≥ 1, batch size ≥ 1 and rank < world size")
        records = job.manifest.num_records
        if records < world * batch:
            raise FailedPrecondition(
                f"job {job.name!r}: dataset {job.manifest.name!r} has {records} records, fewer "
                f"than world size × batch size = {world} × {batch}: a synchronous epoch would "
                f"have no step")
        group = (world, batch)
        ledger = job.ledger
        if group == ledger.group:
            return False
        if not (ledger.untouched or ledger.complete):
            now = ledger.group
            raise FailedPrecondition(
                f"job {job.name!r}: epoch {ledger.epoch} is half read by "
                + (f"a synchronous group of world size {now[0]}, batch size {now[1]}"
                   if now else "asynchronous readers")
                + f"; a group of world size {world}, batch size {batch} can join at an epoch "
                f"boundary (restore the ranks from reader.state() saved at the end of an epoch, "
                f"or wait for it to end), or use another job name")
        ledger.set_group(group)
        logger.info("job %r: synchronous, world size %d, batch size %d (from epoch %d%s)",
                    job.name, world, batch, ledger.epoch + (0 if ledger.untouched else 1),
                    f"; {ledger.dropped} records of it dropped" if ledger.untouched else "")
        return True

    def _check_resume(self, job: Job, resume: pb.ResumePosition) -> None:
        """PERMISSION_DENIED, before anything changed, for a resume without the checkpointing
        session's resume credential; INVALID_ARGUMENT for a resume position naming a partition
        that does not exist or more records of one than it has."""
        if not job.sessions.is_resume_credential(resume.worker_id, resume.credential):
            self.refusal_log.warning(f"job {job.name!r}: refused a resume of worker "
                                     f"{clip(resume.worker_id)}: no or a wrong resume credential")
            raise PermissionDenied(
                f"job {job.name!r}: resume of worker {clip(resume.worker_id)} refused: the "
                f"checkpoint carries {'a wrong' if resume.credential else 'no'} resume "
                f"credential for it (a reader's state_dict() carries the one its session got; "
                f"a checkpoint of another job, of another master's state, or from before "
                f"resume credentials cannot be resumed: start the reader without state)")
        for p in (*resume.done, *resume.positions):
            if p >= len(job.partitions):
                raise InvalidArgument(self.out_of_range(
                    job, f"resume position names partition {p}"))
        for p, n in resume.positions.items():
            if n > max_delivered(job, p):
                raise InvalidArgument(
                    f"job {job.name!r}: resume position: {n} records consumed of partition {p}, "
                    f"which has {job.partitions[p].num_records}")

    def _resume(self, job: Job, worker: str, resume: pb.ResumePosition
                ) -> tuple[list[int], list[int]]:
        """Rewinds what the checkpointing reader `resume.worker_id` did after its checkpoint,
        as far as the ledger can vouch for it (Ledger.vouched_resume): returns the partitions
        put back, and those whose claim went beyond what reports showed (cut to it)."""
        old = resume.worker_id
        tokens = {p: job.ledger.leases.get(p) for p in job.ledger.held_by(old)}
        keep, positions, cut = job.ledger.vouched_resume(
            resume.epoch, old, resume.done, {int(p): int(n) for p, n in resume.positions.items()})
        if cut:
            logger.warning("job %r: the checkpoint of %s claims more than its reports showed "
                           "consumed, or partitions it never held, in %d partition(s) (%s): "
                           "they resume where the reports left them", job.name, old, len(cut),
                           cut[:10])
        back = job.ledger.rewind(resume.epoch, old, keep, positions)
        if resume.epoch != job.ledger.epoch:
            logger.warning("job %r: worker %s resumes a checkpoint of epoch %d, but the job is "
                           "at epoch %d; nothing to rewind", job.name, worker, resume.epoch,
                           job.ledger.epoch)
        else:
            logger.info("job %r: worker %s resumes the checkpoint of %s in epoch %d: %d "
                        "partition(s) back to todo", job.name, worker, old, resume.epoch,
                        len(back))
        self._tell_revoked(job, [(p, tokens[p]) for p in back if p in tokens],
                           admission.revoked_why(job, old))
        job.workers.pop(old, None)  # the checkpointing reader is gone
        self.on_change(job.name)
        return back, cut

    # -- GetTasks -----------------------------------------------------------------------------
    def begin_get_tasks(self, job: Job, request: pb.GetTasksRequest, now: float
                        ) -> tuple[Held, list[pb.HeldTask], bool, pb.GetTasksResponse | None]:
        """What a GetTasks does before it leases: checks, applies its reports, reconciles.
        Returns its held leases, those revoked, whether the ledger changed, and the answer if
        the caller may lease nothing (a broken group, a superseded reader)."""
        worker = request.worker_id
        self.session(job, worker, request.session_secret)
        if not -1 <= request.epoch <= job.ledger.epoch + 1:
            raise InvalidArgument(
                f"job {job.name!r}: cannot lease tasks of epoch {request.epoch}: the job is at "
                f"epoch {job.ledger.epoch}; ask for an epoch up to the next one, "
                f"{job.ledger.epoch + 1} (-1 joins the current one)")
        held = self.check_held(job, request.held)
        self.alive(now)
        self.reader_stats.record(job.name, worker, request.stats, now)
        verdicts = self.check_reports(job, worker, request.reports)
        changed = self.apply_reports(job, worker, request.reports, verdicts, now)
        if request.reconcile:  # (the call lists what the caller holds)
            self.listed(job, worker, request.held)
        revoked = self.revoked(job, worker, held, request.reports)
        if request.reconcile:
            orphans = job.ledger.reconcile(worker, ((t.epoch, t.partition) for t in request.held))
            if orphans:
                logger.warning("job %r: worker %s did not know of its lease(s) on %s (an answer "
                               "lost to a restart?); back to todo", job.name, worker, orphans)
                changed = True
        self.touch(job, worker, now)
        stop = admission.on_call(job, worker, request.sync if request.HasField("sync") else None,
                                 now)
        why = admission.revoked_why(job, worker)
        if stop or why:  # a broken synchronous group, or a superseded reader: no more tasks
            return held, revoked, changed, pb.GetTasksResponse(
                status=pb.GetTasksResponse.WAIT, current_epoch=job.ledger.epoch, revoked=revoked,
                group_broken=stop, revoked_why=why, superseded=why)
        return held, revoked, changed, None

    def lease(self, job: Job, request: pb.GetTasksRequest, epoch: int, now: float
              ) -> tuple[LeaseResult, bool]:
        """One attempt to lease for a GetTasks; returns the result and whether it changed the
        ledger. On WAIT (and no synchronous group) it asks other readers to give back what the
        caller would finish sooner; watching holders are told at once."""
        worker = request.worker_id
        if self._expire(job, now) and job.members is not None and job.members.message_for(
                worker):  # the expiry broke the caller's group: it leases nothing more
            return LeaseResult(LeaseStatus.WAIT, job.ledger.epoch), True
        result = job.ledger.lease(worker, epoch, request.max_tasks, now,
                                  self.config.lease_timeout_s, self.live_workers(job, now),
                                  max_records=request.max_records,
                                  reserved=job.stealing.reserved(job.ledger, now))
        changed = result.status is LeaseStatus.TASKS or bool(job.ledger.journal)
        if result.status is LeaseStatus.TASKS:
            job.stealing.leased(result.partitions)
        if result.status is LeaseStatus.WAIT and epoch > result.epoch:
            self._note_ahead(job, worker)
        if result.status is LeaseStatus.WAIT and result.epoch == epoch:
            self._ask_back(job, worker, now)
        return result, changed

    def _note_ahead(self, job: Job, worker: str) -> None:
        """A synchronous rank asks for the next epoch while the current one is open: it had
        its whole quota of this one. Once every rank of the group has, with no lease out, what
        is left in todo is work no rank's quota asks for, and the epoch can never end: a fault
        of the quota accounting (the ranks' own logs say only that they wait). Logged once per
        epoch as an error naming the records left, so that such a hang names its cause."""
        members, ledger = job.members, job.ledger
        rank = members.rank_of(worker) if members is not None else None
        if members is None or rank is None:
            return
        epoch, ranks, logged = self._ahead.get(job.name, (ledger.epoch, set(), False))
        if epoch != ledger.epoch:
            epoch, ranks, logged = ledger.epoch, set(), False
        ranks.add(rank)
        stuck = (not logged and len(ranks) >= members.world_size and not ledger.pending
                 and bool(ledger.todo))
        self._ahead[job.name] = (epoch, ranks, logged or stuck)
        if stuck:
            left = sorted(ledger.todo)
            logger.error(
                "job %r: every rank of the synchronous group (world size %d) had its quota of "
                "epoch %d and asks for the next, but the epoch keeps %d record(s) in todo that "
                "no rank's quota asks for (partitions %s%s): it cannot end, and the ranks wait. "
                "This is a fault of the master's quota accounting; restart the group from a "
                "checkpoint (reader.state_dict()) and report it", job.name,
                members.world_size, epoch, sum(ledger.remaining(p) for p in left), left[:10],
                " …" if len(left) > 10 else "")

    def end_get_tasks(self, job: Job, request: pb.GetTasksRequest, held: Held,
                      revoked: list[pb.HeldTask], result: LeaseResult, epoch: int, now: float
                      ) -> pb.GetTasksResponse:
        """The answer of a GetTasks whose lease attempts ended with `result`."""
        worker = request.worker_id
        failed: list[pb.FailedPartition] = []
        failed_known = False
        if result.status is LeaseStatus.EPOCH_DONE:
            lost = job.ledger.failed_in(epoch)  # the epoch the reader asked for
            failed_known = lost is not None
            failed = [pb.FailedPartition(partition=p, reason=r,
                                         num_records=job.partitions[p].num_records)
                      for p, r in sorted((lost or {}).items())]
        return pb.GetTasksResponse(
            status=_STATUS[result.status], current_epoch=result.epoch,
            todo_left=len(job.ledger.todo),
            tasks=[self.task(job, result.epoch, p) for p in result.partitions], revoked=revoked,
            failed=failed, failed_known=failed_known,
            give_back=self.asked_back(job, worker, held),
            group_broken=admission.on_call(job, worker, None, now),
            holders=(admission.holdings(job, now, worker)
                     if result.status is LeaseStatus.WAIT else ()),
            revoked_why=admission.revoked_why(job, worker))

    def group_waits(self, job: Job, worker: str, now: float) -> bool:
        """A synchronous rank is about to wait for records: whether its group is broken (a
        rank that left counts as missing now), so that it is told at once, not after a wait."""
        if job.members is None:
            return False
        if admission.check_group(job, now, self.config.lease_timeout_s, waiting=True):
            self._tell_group(job)
            self.on_change(job.name)
        return bool(job.members.message_for(worker))

    # -- Report, LeaveJob, GetJobStatus -------------------------------------------------------
    def report(self, job: Job, request: pb.ReportRequest, now: float
               ) -> tuple[pb.ReportResponse, bool]:
        """A heartbeat with reports; returns the answer and whether the ledger changed."""
        self.session(job, request.worker_id, request.session_secret)
        held = self.check_held(job, request.held)
        verdicts, changed = self._heard(job, request.worker_id, request, held, now)
        worker = request.worker_id
        stop = admission.on_call(job, worker, request.sync if request.HasField("sync") else None,
                                 now)
        why = admission.revoked_why(job, worker)
        return pb.ReportResponse(current_epoch=job.ledger.epoch,
                                 revoked=self.revoked(job, worker, held, request.reports),
                                 give_back=self.asked_back(job, worker, held),
                                 group_broken=stop, revoked_why=why, superseded=why), changed

    def _heard(self, job: Job, worker: str, request: pb.ReportRequest, held: Held, now: float,
               refuse: bool = True) -> tuple[list[Verdict], bool]:
        """What a Report call and a Session message share: stats, reports (`refuse`: a call
        with a report that is not the holder's is refused whole), the started marks, and the
        renewal of every lease of `worker`. Returns the verdicts and whether the ledger
        changed."""
        self.alive(now)
        self.reader_stats.record(job.name, worker, request.stats, now)
        verdicts = self.check_reports(job, worker, request.reports, refuse)
        changed = self.apply_reports(job, worker, request.reports, verdicts, now)
        self.listed(job, worker, request.held)
        self.touch(job, worker, now)
        return verdicts, changed

    def session_message(self, job: Job, worker: str, message: pb.SessionMessage, now: float
                        ) -> tuple[pb.WatchEvent | None, bool]:
        """A message of `worker`'s Session stream (its secret was checked when the stream
        opened): renews its leases and takes its reports and stats, as a Report would. One
        without `seq` (nobody waits for its answer) carries PROGRESS reports only
        (INVALID_ARGUMENT for others: a DONE must be confirmed). Reports not from the holder
        with its token do not refuse the message: the others are applied, and the answer lists
        them in `refused` (what a refused Report call and its retry come to); such progress is
        not counted as a refusal (unanswered progress may race a DONE of another call).
        Returns the answer (None without `seq`) and whether the ledger changed; the shell
        answers once the change is durable."""
        request = message.report
        if not message.seq:
            for r in request.reports:
                if r.outcome != pb.TaskReport.PROGRESS:
                    # (an outcome no enum value names was a ValueError, which ended the stream)
                    outcome = (pb.TaskReport.Outcome.Name(r.outcome)
                               if r.outcome in pb.TaskReport.Outcome.values()
                               else f"outcome {r.outcome}")
                    raise InvalidArgument(
                        f"job {job.name!r}: a Session message without seq carries only "
                        f"PROGRESS reports; the {outcome} report on partition {r.partition} "
                        f"needs an answer (give the message a seq, or send it with Report)")
        held = self.check_held(job, request.held)
        verdicts, changed = self._heard(job, worker, request, held, now, refuse=False)
        stop = admission.on_call(job, worker, request.sync if request.HasField("sync") else None,
                                 now)
        refused = [r for r, v in zip(request.reports, verdicts) if v is Verdict.REFUSE]
        counted = [r for r in refused if r.outcome != pb.TaskReport.PROGRESS]
        if counted:
            self._count_refused(job, worker, counted)
        if not message.seq:
            return None, changed
        why = admission.revoked_why(job, worker)
        return pb.WatchEvent(
            current_epoch=job.ledger.epoch, answers=message.seq,
            revoked=self.revoked(job, worker, held, request.reports),
            give_back=self.asked_back(job, worker, held), group_broken=stop,
            revoked_why=why, superseded=why, refused_count=len(refused),
            refused=[pb.HeldTask(epoch=r.epoch, partition=r.partition, lease=r.lease)
                     for r in refused[:MAX_REFUSED_LISTED]]), changed

    def leave(self, job: Job, request: pb.LeaveJobRequest, now: float
              ) -> tuple[pb.LeaveJobResponse, bool]:
        self.session(job, request.worker_id, request.session_secret)
        released = job.ledger.release(request.worker_id)
        job.workers.pop(request.worker_id, None)
        job.stealing.forget(request.worker_id)
        admission.left(job, request.worker_id, now)
        self.events.pop((job.name, request.worker_id), None)
        job.live_workers_at = 0.0
        if released:
            logger.info("job %r: worker %s left, %d task(s) back to todo", job.name,
                        request.worker_id, len(released))
            self.on_change(job.name)
        return pb.LeaveJobResponse(released_tasks=len(released)), bool(released)

    def status(self, job: Job, now: float) -> pb.JobStatus:
        metrics = self.metrics[job.name]
        return pb.JobStatus(
            job=job.name, dataset=job.manifest.name, epoch=job.ledger.epoch,
            num_partitions=len(job.partitions),
            workers=liveness.readers_alive(job.workers, now, self.config.lease_timeout_s),
            failed_reasons=[f"partition {p}: {r}" for p, r in sorted(job.ledger.failed.items())],
            records_served=metrics.records_served, bytes_served=metrics.bytes_served,
            reports_refused=metrics.reports_refused, metrics_port=self.metrics_port,
            **job.ledger.counts())

    # -- reports ------------------------------------------------------------------------------
    def check_reports(self, job: Job, worker: str, reports: Any,
                      refuse: bool = True) -> list[Verdict]:
        """Each report's verdict. Raises, before anything changed, INVALID_ARGUMENT if a report
        names what cannot exist, or (with `refuse`) FAILED_PRECONDITION (the refused reports in
        the REFUSED_TRAILER metadata) if one is not from the holder with its token; without
        `refuse` those are left to the caller (their verdict is REFUSE)."""
        verdicts: list[Verdict] = []
        refused: list[Any] = []
        for r in reports:
            outcome = _OUTCOMES.get(r.outcome)
            if outcome is None:
                raise InvalidArgument(f"report on partition {r.partition}: outcome {r.outcome} "
                                      f"is not DONE, FAILED, PROGRESS or RELEASED")
            verdict = job.ledger.check_report(worker, r.epoch, r.partition, r.lease, outcome,
                                              r.consumed)
            if verdict is Verdict.INVALID:
                raise InvalidArgument(self.out_of_range(
                    job, f"report on partition {r.partition} of epoch {r.epoch}"))
            if (outcome in (Outcome.PROGRESS, Outcome.RELEASED)
                    and r.consumed > max_delivered(job, r.partition)):
                raise InvalidArgument(
                    f"job {job.name!r}: report on partition {r.partition}: {r.consumed} records "
                    f"consumed of {job.partitions[r.partition].num_records}")
            if verdict is Verdict.REFUSE:
                refused.append(r)
            verdicts.append(verdict)
        if refused and refuse:
            self._refuse(job, worker, refused)
        return verdicts

    def _refuse(self, job: Job, worker: str, refused: list[Any]) -> None:
        why = self._count_refused(job, worker, refused)
        trailer = pb.RefusedReports(reports=[
            pb.HeldTask(epoch=r.epoch, partition=r.partition, lease=r.lease)
            for r in refused[:MAX_REFUSED_LISTED]]).SerializeToString()
        raise FailedPrecondition(
            f"job {job.name!r}: {len(refused)} report(s) of worker {clip(worker)} refused: it "
            f"does not hold their lease (it expired, or the partition went to another reader); "
            f"first: {why}", ((REFUSED_TRAILER, trailer),))

    def _count_refused(self, job: Job, worker: str, refused: list[Any]) -> str:
        """Counts and logs (rate-limited) refused reports; returns why the first was."""
        self.metrics[job.name].reports_refused += len(refused)
        first = refused[0]
        # Neither the partition's holder nor any token: that is what let a caller report as
        # another reader (issue 25).
        why = (f"partition {first.partition} of epoch {first.epoch}: not this worker's lease "
               f"(any more); the job is at epoch {job.ledger.epoch}")
        self.reader_stats.refused(job.name, worker, len(refused), why, self.alive_at)
        self.refusal_log.warning(
            f"job {job.name!r}: refused {len(refused)} report(s) of worker {clip(worker)}, "
            f"which does not hold their lease; first: {why}")
        return why

    def check_held(self, job: Job, held: Any) -> Held:
        """The (epoch, partition, lease) triples a request says it holds; INVALID_ARGUMENT for a
        partition that cannot exist."""
        triples = [(t.epoch, t.partition, t.lease) for t in held]
        for _, p, _ in triples:
            if p >= len(job.partitions):
                raise InvalidArgument(self.out_of_range(job, f"held task on partition {p}"))
        return Held(triples)

    def apply_reports(self, job: Job, worker: str, reports: Any, verdicts: list[Verdict],
                      now: float) -> bool:
        """Applies the reports checked APPLY; returns whether the ledger changed. Long-polls
        are woken only by what may let them lease or end: a partition back in todo (FAILED,
        RELEASED) or the epoch complete. Not by progress, nor by a DONE that leaves the epoch
        open (a waiting GetTasks waits for todo, which neither fills): every reader reports
        progress each second and a DONE every partition, and each woke every waiting GetTasks,
        which made the epoch's tail cost the master more than the reads (issue 28)."""
        changed = freed = False
        complete = job.ledger.complete
        for report, verdict in zip(reports, verdicts):
            if verdict is Verdict.APPLY and self._apply_report(job, worker, report, now):
                changed = True
                freed |= report.outcome not in (pb.TaskReport.PROGRESS, pb.TaskReport.DONE)
        ended = job.ledger.complete and not complete
        if freed or ended:
            self.on_change(job.name)
        if ended:
            self._tell_complete(job)
        return changed

    def _apply_report(self, job: Job, worker: str, report: Any, now: float) -> bool:
        ledger = job.ledger
        current = report.epoch == ledger.epoch
        if report.outcome == pb.TaskReport.DONE:
            left = ledger.remaining(report.partition) if current else 0
            if not ledger.report_done(report.epoch, report.partition, worker):
                return False
            job.stealing.rates.add(worker, left, now)
            served, metrics = job.partitions[report.partition], self.metrics[job.name]
            metrics.records_served += served.num_records
            metrics.bytes_served += served.num_bytes
            return True
        if report.outcome == pb.TaskReport.PROGRESS:
            had = ledger.progress.get(report.partition, 0) if current else report.consumed
            if not ledger.report_progress(report.epoch, report.partition, report.consumed,
                                          worker):
                return False
            job.stealing.rates.add(worker, report.consumed - had, now)
            return True
        if report.outcome == pb.TaskReport.RELEASED:
            if not ledger.report_released(report.epoch, report.partition, report.consumed,
                                          worker):
                return False
            job.stealing.released(worker, report.partition, now)
            return True
        reason = clip(report.reason, MAX_REASON_CHARS)  # FAILED
        if not ledger.report_failed(report.epoch, report.partition, reason):
            return False
        failed = report.partition in ledger.failed
        logger.warning("job %r: worker %s failed partition %d (epoch %d)%s: %s", job.name,
                       worker, report.partition, report.epoch,
                       "; giving up on it this epoch" if failed else "", clip(reason, 500))
        return True

    @staticmethod
    def revoked(job: Job, worker: str, held: Held, reports: Any) -> list[pb.HeldTask]:
        """Of `held`, the leases no longer `worker`'s, but for those this call reported: the
        first MAX_REFUSED_LISTED (the caller learns the rest on its next call)."""
        reported = {(r.epoch, r.partition) for r in reports
                    if r.outcome != pb.TaskReport.PROGRESS}
        gone = (t for t in job.ledger.revoked(worker, held.triples) if t[:2] not in reported)
        return [pb.HeldTask(epoch=e, partition=p, lease=t)
                for e, p, t in itertools.islice(gone, MAX_REFUSED_LISTED)]

    # -- work stealing ------------------------------------------------------------------------
    def _ask_back(self, job: Job, thief: str, now: float) -> None:
        """Work stealing: `thief` found nothing to lease while others hold leases they have not
        started: asks them for what it would finish sooner (trainfeed.master.core.stealing). A
        watching holder is told at once on its stream; another one on its next call (a reader
        that does not watch polls while it holds unstarted leases). What they hand back wakes
        the thief's long-poll."""
        if job.ledger.group is not None:
            return  # synchronous ranks lease their quota alone, and keep it
        for victim, partition in job.stealing.ask(job.ledger, thief, now):
            logger.debug("job %r: %s is idle; asking %s to give back partition %d", job.name,
                         thief, victim, partition)
            if (job.name, victim) in self.events:
                ask = job.stealing.asks[partition]
                ask.delivered = True
                self._tell(job, victim, pb.WatchEvent(
                    current_epoch=job.ledger.epoch, give_back=[pb.HeldTask(
                        epoch=job.ledger.epoch, partition=partition, lease=ask.lease)]))

    def listed(self, job: Job, worker: str, held: Any) -> None:
        """A call's held leases, and which of them its trainer began: an ask for one begun is
        void, and the thief (woken) may ask elsewhere."""
        if job.stealing.listed(job.ledger, worker, ((t.partition, t.started) for t in held
                                                    if t.epoch == job.ledger.epoch)):
            self.on_change(job.name)

    @staticmethod
    def asked_back(job: Job, worker: str, held: Held) -> list[pb.HeldTask]:
        """What `worker` is asked to give back, once, of the leases its call lists."""
        return [pb.HeldTask(epoch=e, partition=p, lease=t)
                for e, p, t in job.stealing.due(job.ledger, worker, held.triples)]

    # -- Watch --------------------------------------------------------------------------------
    def watch(self, job: Job, request: pb.WatchRequest) -> tuple[str, str]:
        """Opens the outbox of a session's stream (PERMISSION_DENIED without its secret); a
        second stream of the same session replaces the first. Returns its key."""
        self.session(job, request.worker_id, request.session_secret)
        key = (job.name, request.worker_id)
        self.events[key] = []
        return key

    def unwatch(self, key: tuple[str, str]) -> None:
        self.events.pop(key, None)

    def take_events(self, key: tuple[str, str]) -> list[pb.WatchEvent]:
        events = self.events.get(key)
        if not events:
            return []
        self.events[key] = []
        return events

    def _tell(self, job: Job, worker: str, event: pb.WatchEvent) -> None:
        queue = self.events.get((job.name, worker))
        if queue is None:
            return
        if len(queue) >= MAX_QUEUED_EVENTS:
            del queue[0]
        queue.append(event)
        self.on_event(job.name, worker)

    def _tell_revoked(self, job: Job, taken: Iterable[tuple[int, tuple[str, int] | None]],
                      why: str) -> None:
        """Tells each watching former holder the leases just taken from it."""
        by_worker: dict[str, list[pb.HeldTask]] = {}
        for p, lease in taken:
            if lease is not None and (job.name, lease[0]) in self.events:
                by_worker.setdefault(lease[0], []).append(
                    pb.HeldTask(epoch=job.ledger.epoch, partition=p, lease=lease[1]))
        for worker, revoked in by_worker.items():
            self._tell(job, worker, pb.WatchEvent(current_epoch=job.ledger.epoch,
                                                  revoked=revoked, revoked_why=why))

    def _tell_superseded(self, job: Job, old: str) -> None:
        why = admission.revoked_why(job, old)
        if why:
            self._tell(job, old, pb.WatchEvent(current_epoch=job.ledger.epoch, superseded=why,
                                               revoked_why=why))

    def _tell_complete(self, job: Job) -> None:
        """Every watching session of `job`: its epoch is complete (once per epoch)."""
        epoch = job.ledger.epoch
        if job.announced_complete >= epoch:
            return
        job.announced_complete = epoch
        for _, worker in [k for k in self.events if k[0] == job.name]:
            self._tell(job, worker, pb.WatchEvent(current_epoch=epoch, epoch_complete=epoch))

    def _tell_group(self, job: Job) -> None:
        """Every watching rank of a group that just broke: why it must stop."""
        if job.members is None:
            return
        for _, worker in [k for k in self.events if k[0] == job.name]:
            why = job.members.message_for(worker)
            if why:
                self._tell(job, worker, pb.WatchEvent(current_epoch=job.ledger.epoch,
                                                      group_broken=why))

    # -- workers ------------------------------------------------------------------------------
    def touch(self, job: Job, worker: str, now: float) -> None:
        if worker not in job.workers:
            job.live_workers_at = 0.0  # a newcomer changes everyone's fair share: recount
        job.workers[worker] = now
        job.ledger.renew(worker, now, self.config.lease_timeout_s)

    def live_workers(self, job: Job, now: float) -> int:
        """Workers heard from within three lease timeouts (those that left are forgotten);
        recounted at most every LIVE_WORKERS_REFRESH_S."""
        if now - job.live_workers_at >= LIVE_WORKERS_REFRESH_S:
            job.live_workers = self.count_live_workers(job, now)
            job.live_workers_at = now
        return max(1, job.live_workers)

    @property
    def live_window_s(self) -> float:
        """How recently a worker must have called to count as live: three lease timeouts (its
        leases expired long before). The one window of the live count, the session cap and
        the forgetting of silent sessions, and the window of `silent` (liveness)."""
        return liveness.SESSION_LEASES * self.config.lease_timeout_s

    def count_live_workers(self, job: Job, now: float) -> int:
        """Workers heard from within the live window, counted now."""
        alive_since = now - self.live_window_s
        return sum(1 for seen in job.workers.values() if seen >= alive_since)

    @staticmethod
    def task(job: Job, epoch: int, partition: int) -> pb.Task:
        p = job.partitions[partition]
        return pb.Task(epoch=epoch, partition=partition, shard=p.shard,
                       row_group_start=p.row_group_start, row_group_stop=p.row_group_stop,
                       num_records=p.num_records, skip_records=job.ledger.skip(partition),
                       lease=job.ledger.token_of(partition),
                       stop_records=job.ledger.limits.get(partition, 0),
                       row_start=p.row_start)



def _check_version(job: Job, request: pb.OpenJobRequest) -> None:
    """FAILED_PRECONDITION for a reader of `job` asking for another version of its dataset, or
    resuming a state saved on another: a job reads the version it was created on until it ends
    (trainfeed.formats.manifest, "Versions"). Before anything changed."""
    pinned = job.manifest.dataset_version
    if request.dataset_version and request.dataset_version != pinned:
        raise FailedPrecondition(
            f"job {request.job!r} reads version {pinned} of dataset {request.dataset!r}, "
            f"not version {request.dataset_version}: a job reads the version it was created "
            f"on until it ends. Read {request.dataset}@{pinned}, or read version "
            f"{request.dataset_version} under another job name (TRAINFEED_JOB or job=...)")
    saved = request.resume.dataset_version if request.HasField("resume") else 0
    if saved and saved != pinned:
        raise FailedPrecondition(
            f"job {request.job!r} reads version {pinned} of dataset {request.dataset!r}; "
            f"the reader state restored was saved reading version {saved}, whose partitions "
            f"it counts. Restore it into a job of version {saved} (another job name, "
            f"dataset {request.dataset}@{saved}), or start the reader without the state")


def _resumes(request: pb.OpenJobRequest) -> str:
    return request.resume.worker_id if request.HasField("resume") else ""
