"""The master's pure core: the jobs, their ledgers, the stealing plan and what readers are told.

Every method takes the time as an argument and returns what the call answers; nothing here
touches a socket, a clock, a thread or gRPC. A refusal is raised as a `CallError` subclass (the
gRPC shell, trainfeed.master.serve.service, maps each to a status code in one table). Changes to a
ledger are journaled in the ledger (`Ledger.take_journal`); the shell hands them to the journal
writer and answers only once they are durable. The shell also owns the waiting: a change that
may let a long-poll lease calls `Coordinator.on_change(job)`, and the shell wakes its long-polls.

One conversation (issue 36): after OpenJob a reader session speaks on its Session stream, and
every message of it goes through one entry, `handle(job, worker, message, now) -> (answer,
events)`: a `Heartbeat`, or a `GetTasks`, whose answer may be an `Ask` the shell holds while it
long-polls and hands back for the next attempt. The core takes and gives its own types
(trainfeed.master.core.messages), never the wire's: the shell converts each message once
(trainfeed.master.serve.convert). Everything a
reader is told that it did not ask (give-backs, revocations, the end of an epoch, a broken group,
being superseded) is a `Told` event (trainfeed.master.core.news), whichever entry decided it.

The pure parts sit beside this class: OpenJob's checks (opening), reports (reports), answers
(answers), events (news), admission and stealing. Trust, sessions, outages: as described in
trainfeed.master.serve.service (the rules did not move, only where they are decided).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from trainfeed.formats.manifest import Manifest
from trainfeed.master.core import admission, answers, liveness, opening, reports
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
    new_worker_id,
)
from trainfeed.master.core.ledger import LeaseResult, LeaseStatus, Outcome, Verdict
from trainfeed.master.core.messages import (
    GetTasks,
    Granted,
    Heard,
    Heartbeat,
    HeldTask,
    JobStatus,
    Leave,
    Opened,
    OpenJob,
    Report,
    ResumePosition,
    SessionMessage,
)
from trainfeed.master.core.news import Newsroom, Told
from trainfeed.master.core.opening import TOKEN_KEY_BYTES
from trainfeed.master.core.reader_stats import ReaderBoard
from trainfeed.master.core.reports import MAX_REFUSED_LISTED, Held
from trainfeed.master.core.saved_job import SavedJob
from trainfeed.master.core.sessions import RateLimitedLog, clip
from trainfeed.names import validate_job_name
from trainfeed.planning.distribution import DistributionRules

__all__ = ["MAX_REFUSED_LISTED", "RESTART_GRACE_LEASES", "TOKEN_KEY_BYTES", "Ask", "Coordinator",
           "Told"]

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
# Readers before protocol versioning send 0: refused like any other version (FAILED_PRECONDITION
# naming both), since they know nothing of the Session stream or of ReaderStats. (A switch, so
# that a test can show the refusal is this rule's doing.)
ACCEPT_UNVERSIONED = False


@dataclass
class Ask:
    """A `get_tasks` between its lease attempts: what its first attempt checked and applied.
    The shell holds it while it long-polls and hands it back to `handle` (with `last` once its
    wait ran out: that attempt answers, whatever it gets)."""

    seq: int
    request: GetTasks
    epoch: int
    held: Held
    revoked: list[HeldTask]  # (its refused reports' leases among them)
    refused: list[HeldTask]
    refused_count: int
    last: bool = False


# What `handle` answers: the message's answer, an Ask to hold, or None (a message without seq).
Answer = Heard | Granted | Ask | None


class Coordinator:
    """Every job of this master. Not thread-safe: the shell calls it from one event loop.

    The shell sets `on_change(job)` (long-polls of the job may proceed), tells `open_stream` /
    `close_stream` which sessions have a stream, and sends every `Told` of `news.take()`.
    """

    def __init__(self, config: MasterConfig):
        self.config = config
        self.jobs: dict[str, Job] = {}
        self.metrics: dict[str, JobMetrics] = {}
        # When the event loop last ran: a longer gap is a stall (see `alive`).
        # mutmut: `None` for 0.0 is equivalent: both are falsy, which is all `alive` asks of it
        # before the first sign of life sets it, and nothing else reads it before then.
        self.alive_at = 0.0
        # Refusals (of reports, of sessions) hostile callers can make at will: a bounded log.
        self.refusal_log = RateLimitedLog(logger)
        self.reader_stats = ReaderBoard()  # what readers measure (issue 29): the status page
        self.news = Newsroom()  # who has a stream, and what they are to be told
        # mutmut: `lambda job: 0` is equivalent: no caller uses what on_change returns.
        self.on_change: Callable[[str], None] = lambda job: None
        # Synchronous job -> (its epoch, the ranks that asked for the next one while it was
        # open, whether the stuck epoch was logged): see admission.note_ahead.
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
            job = opening.restore_job(name, saved, read_manifest, now,
                                      self.config.lease_timeout_s)
            if job is not None:
                self.jobs[job.name] = job
                self.metrics.setdefault(job.name, JobMetrics())
                restored.append(job)
        return restored

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
                self.news.group(job)
                self.on_change(job.name)
        return changed

    def _expire(self, job: Job, now: float) -> bool:
        """Takes back `job`'s overdue leases, telling their watching holders; whether any.

        A synchronous rank whose leases expired was not heard from for a lease timeout: its
        group breaks at once, whichever path noticed the expiry (the lease timer, or another
        rank's `get_tasks`), before any other rank can lease what it held. Else the rank could
        ask again before the timer's next check, stay in the group, and find its partitions
        read by another rank: records its trainer had would be read twice, and the quotas
        would no longer add up to the epoch (a rank short, or records nobody asks for)."""
        overdue = job.ledger.expire(now)
        if not overdue:
            return False
        logger.warning("job %r: %d lease(s) expired, partitions %s back to todo", job.name,
                       len(overdue), overdue[:10])
        # (an expiry keeps each partition's latest lease until it is leased again)
        self.news.revoked(job, [(p, job.ledger.leases.get(p)) for p in overdue], "")
        if admission.check_group(job, now, self.config.lease_timeout_s):
            self.news.group(job)
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
        for one not here, PERMISSION_DENIED for a call whose token is another job's. (A known
        name was validated when its job was created, so the check costs nothing on the hot
        path.)"""
        _check_scope(name, scope)
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

    @property
    def live_window_s(self) -> float:
        """How recently a worker must have called to count as live: three lease timeouts (its
        leases expired long before). The one window of the live count, the session cap and
        the forgetting of silent sessions, and the window of `silent` (liveness)."""
        return liveness.SESSION_LEASES * self.config.lease_timeout_s

    def touch(self, job: Job, worker: str, now: float) -> None:
        if worker not in job.workers:
            job.live_workers_at = 0.0  # a newcomer changes everyone's fair share: recount
        job.workers[worker] = now
        job.ledger.renew(worker, now, self.config.lease_timeout_s)

    # -- OpenJob ------------------------------------------------------------------------------
    def check_open(self, request: OpenJob, scope: str | None) -> DistributionRules:
        """What an OpenJob must get right before any job is touched or created."""
        _check_scope(request.job, scope)
        opening.check_version(request, ACCEPT_UNVERSIONED)
        return opening.check_names(request)

    def create_job(self, request: OpenJob, manifest: Manifest,
                   rules: DistributionRules, token_key: bytes) -> Job:
        """A new job of `manifest` (the shell snapshots it before answering)."""
        job = opening.new_job(request, manifest, rules, token_key, self.config)
        self.jobs[job.name] = job
        self.metrics.setdefault(job.name, JobMetrics())
        logger.info("job %r created: dataset %r, %d records in %d partitions, distribution "
                    "rules %r", job.name, manifest.name, manifest.num_records,
                    len(job.partitions), str(job.rules))
        return job

    def open_session(self, job: Job, request: OpenJob, now: float) -> tuple[Opened, bool]:
        """Admits a reader to `job` (refusals raise before anything changed, but for a new
        synchronous group, which takes effect first). Returns the answer and whether the
        ledger changed."""
        opening.check_joinable(job, request)
        self._admit(job, request, now)
        changed = False
        if request.sync is not None:
            changed = opening.join_group(job, request.sync)
        elif job.ledger.group is not None:
            raise FailedPrecondition(
                f"job {job.name!r} is synchronous (world size {job.ledger.group[0]}, batch size "
                f"{job.ledger.group[1]}): read it with dist.reader(..., sync=True), or use "
                f"another job name")
        if request.resume is not None:
            self._check_resume(job, request.resume)
        self.check_room(job, now)
        worker = new_worker_id(job, request.worker_name)
        self.touch(job, worker, now)
        resumed: list[int] = []
        cut: list[int] = []
        if request.sync is not None:
            admission.join_rank(job, request.sync, worker, request.worker_name or "a reader",
                                opening.resumes(request), now, self.config.lease_timeout_s)
        if request.resume is not None:
            resumed, cut = self._resume(job, worker, request.resume, request.worker_name)
            changed = True
        return opening.answer(job, worker, self.config, len(resumed), len(cut)), changed

    def _admit(self, job: Job, request: OpenJob, now: float) -> None:
        """Before the reader has an id: FAILED_PRECONDITION for a reader whose delivery order
        differs from the job's, or a synchronous rank a live reader holds (see admission)."""
        timeout = self.config.lease_timeout_s
        name = request.worker_name or "a reader"
        try:
            if request.order is not None:
                admission.check_order(job, request.order, name, now, timeout)
            if request.sync is not None:
                admission.check_rank(job, request.sync, name, opening.resumes(request), now,
                                     timeout)
        except Refusal as e:
            logger.warning("job %r: refused %s: %s", job.name, name, e.message[:500])
            raise FailedPrecondition(e.message, e.trailer) from None

    def _check_resume(self, job: Job, resume: ResumePosition) -> None:
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
        opening.check_resume_range(job, resume)

    def _resume(self, job: Job, worker: str, resume: ResumePosition, name: str
                ) -> tuple[list[int], list[int]]:
        """Session `worker` (named `name`) takes over from the checkpointing session: its later
        work is undone (opening.rewind), and it is told it was superseded, with the leases taken
        from it."""
        old = resume.worker_id
        admission.superseded(job, old, name, worker)
        back, cut, tokens = opening.rewind(job, worker, resume)
        self.news.revoked(job, [(p, tokens[p]) for p in back if p in tokens],
                          admission.revoked_why(job, old))
        job.workers.pop(old, None)  # the checkpointing reader is gone
        self.on_change(job.name)
        self.news.superseded(job, old)
        return back, cut

    # -- the Session stream -------------------------------------------------------------------
    def open_stream(self, job: Job, worker: str, secret: str, exchange: bool
                    ) -> tuple[str, str]:
        """Checks a Session stream's `open` (PERMISSION_DENIED without the session's secret);
        unless it is an `exchange`, the session is told its events on it from now on. Returns
        the session's key."""
        self.session(job, worker, secret)
        key = (job.name, worker)
        if not exchange:
            self.news.watching.add(key)
        return key

    def close_stream(self, key: tuple[str, str]) -> None:
        """The session's stream ended (not the reader leaving: its leases run on)."""
        self.news.watching.discard(key)

    def handle(self, job: Job, worker: str, message: SessionMessage | Ask, now: float
               ) -> tuple[Answer, list[Told]]:
        """One message of session `worker`'s stream (its secret was checked when the stream
        opened), or an Ask handed back for its next attempt. Returns the answer (None for a
        message without `seq`; an Ask while a `get_tasks` may wait for tasks) and every event
        it decided. The shell answers once the ledger's changes (its journal) are durable."""
        if isinstance(message, Ask):
            answer: Answer = self._attempt(job, worker, message, now)
        elif isinstance(message, GetTasks):
            answer = self._ask(job, worker, message, now)
        else:
            answer = self._heartbeat(job, worker, message, now)
        return answer, self.news.take()

    def _heartbeat(self, job: Job, worker: str, message: Heartbeat, now: float
                   ) -> Heard | None:
        """A heartbeat: renews `worker`'s leases and takes its reports and stats. One without
        `seq` (nobody waits for its answer) carries PROGRESS reports only (INVALID_ARGUMENT for
        others: a DONE must be confirmed). Reports not from the holder with its token do not
        refuse the message: the others are applied, and the answer lists them in `refused`."""
        if not message.seq:
            reports.check_unanswered(job, message.reports)
        held = reports.check_held(job, message.held)
        refused = self._take_reports(job, worker, message, now, listed=True)
        self.touch(job, worker, now)
        stop = admission.on_call(job, worker, message.sync, now)
        if not message.seq:
            return None
        return Heard(
            seq=message.seq, epoch=job.ledger.epoch,
            revoked=reports.revoked(job, worker, held, message.reports),
            give_back=answers.asked_back(job, worker, held), group_broken=stop,
            why=admission.revoked_why(job, worker), refused=reports.listed(refused),
            refused_count=len(refused))

    def _ask(self, job: Job, worker: str, request: GetTasks, now: float) -> Granted | Ask:
        """A `get_tasks`: checks, applies its reports (its refused ones are listed, and go in
        its grant's `revoked` too), reconciles, then makes its first lease attempt."""
        if not -1 <= request.epoch <= job.ledger.epoch + 1:
            raise InvalidArgument(
                f"job {job.name!r}: cannot lease tasks of epoch {request.epoch}: the job is at "
                f"epoch {job.ledger.epoch}; ask for an epoch up to the next one, "
                f"{job.ledger.epoch + 1} (-1 joins the current one)")
        held = reports.check_held(job, request.held)
        refused = self._take_reports(job, worker, request, now, listed=request.reconcile)
        revoked = reports.revoked(job, worker, held, request.reports)
        revoked += reports.listed(refused)[:MAX_REFUSED_LISTED - len(revoked)]
        if request.reconcile:  # (the message lists what the reader holds)
            orphans = job.ledger.reconcile(worker, ((t.epoch, t.partition) for t in request.held))
            if orphans:
                logger.warning("job %r: worker %s did not know of its lease(s) on %s (an answer "
                               "lost to a restart?); back to todo", job.name, worker, orphans)
        self.touch(job, worker, now)
        stop = admission.on_call(job, worker, request.sync, now)
        why = admission.revoked_why(job, worker)
        if stop or why:  # a broken synchronous group, or a superseded reader: no more tasks
            return Granted(seq=request.seq, epoch=job.ledger.epoch,
                           grant=answers.stopped(job, revoked, stop, why),
                           refused=reports.listed(refused), refused_count=len(refused))
        epoch = request.epoch if request.epoch >= 0 else job.ledger.join_epoch()
        ask = Ask(request.seq, request, epoch, held, revoked, reports.listed(refused), len(refused))
        return self._attempt(job, worker, ask, now)

    def _attempt(self, job: Job, worker: str, ask: Ask, now: float) -> Granted | Ask:
        """One lease attempt of `ask`: its answer, or `ask` again while it found nothing to
        lease yet and may wait (no `last`, a `wait_ms`, and no broken group). On WAIT (and no
        synchronous group) it asks other readers to give back what the reader would finish
        sooner."""
        result = self._lease(job, worker, ask, now)
        if (result.status is LeaseStatus.WAIT and not ask.last and ask.request.wait_ms
                and not self._group_waits(job, worker, now)):
            return ask
        grant = answers.grant(job, worker, ask.held, ask.revoked, result, ask.epoch, now)
        return Granted(seq=ask.seq, epoch=job.ledger.epoch, grant=grant, refused=ask.refused,
                       refused_count=ask.refused_count)

    def _lease(self, job: Job, worker: str, ask: Ask, now: float) -> LeaseResult:
        if self._expire(job, now) and job.members is not None and job.members.message_for(
                worker):  # the expiry broke the reader's group: it leases nothing more
            return LeaseResult(LeaseStatus.WAIT, job.ledger.epoch)
        if now - job.live_workers_at >= LIVE_WORKERS_REFRESH_S:  # (O(workers): not per call)
            alive_since = now - self.live_window_s
            job.live_workers = sum(1 for seen in job.workers.values() if seen >= alive_since)
            job.live_workers_at = now
        result = job.ledger.lease(worker, ask.epoch, ask.request.max_tasks, now,
                                  self.config.lease_timeout_s, max(1, job.live_workers),
                                  max_records=ask.request.max_records,
                                  reserved=job.stealing.reserved(job.ledger, now))
        if result.status is LeaseStatus.TASKS:
            job.stealing.leased(result.partitions)
            self.on_change(job.name)
        if result.status is LeaseStatus.WAIT and ask.epoch > result.epoch:
            stuck = admission.note_ahead(self._ahead, job, worker)
            if stuck:
                logger.error("job %r: %s", job.name, stuck)
        if result.status is LeaseStatus.WAIT and result.epoch == ask.epoch:
            self._ask_back(job, worker, now)
        return result

    def _group_waits(self, job: Job, worker: str, now: float) -> bool:
        """A synchronous rank is about to wait for records: whether its group is broken (a
        rank that left counts as missing now), so that it is told at once, not after a wait."""
        if job.members is None:
            return False
        if admission.check_group(job, now, self.config.lease_timeout_s, waiting=True):
            self.news.group(job)
            self.on_change(job.name)
        return bool(job.members.message_for(worker))

    # -- reports and work stealing ------------------------------------------------------------
    def _take_reports(self, job: Job, worker: str, request: SessionMessage, now: float,
                      listed: bool) -> list[Report]:
        """Stats and reports of a message (and, `listed`, its held leases' started marks);
        returns the refused reports (counted and logged but for progress: unanswered progress
        may race a DONE of another message, and is no sign of a hostile caller). Long-polls are
        woken only by what may let them lease or end: a partition back in todo (FAILED,
        RELEASED) or the epoch complete. Not by progress, nor by a DONE that leaves the epoch
        open: every reader reports progress each second and a DONE every partition, and each
        woke every waiting `get_tasks`, which made the epoch's tail cost the master more than
        the reads (issue 28)."""
        self.alive(now)
        self.reader_stats.record(job.name, worker, request.stats, now)
        verdicts = reports.verdicts(job, worker, request.reports)
        freed, complete = False, job.ledger.complete
        for report, verdict in zip(request.reports, verdicts):
            if verdict is Verdict.APPLY and reports.apply(job, worker, report, now,
                                                          self.metrics[job.name]):
                freed |= reports.frees(report)
        ended = job.ledger.complete and not complete
        if freed or ended:
            self.on_change(job.name)
        if ended:
            self.news.complete(job)
        if listed and job.stealing.listed(job.ledger, worker, (
                (t.partition, t.started) for t in request.held if t.epoch == job.ledger.epoch)):
            self.on_change(job.name)  # an ask for a lease begun is void: the thief may ask again
        refused = reports.refused(request.reports, verdicts)
        counted = [r for r in refused if r.outcome is not Outcome.PROGRESS]
        if counted:
            self.metrics[job.name].reports_refused += len(counted)
            first = counted[0]
            # Neither the partition's holder nor any token: that is what let a caller report
            # as another reader (issue 25).
            why = (f"partition {first.partition} of epoch {first.epoch}: not this worker's "
                   f"lease (any more); the job is at epoch {job.ledger.epoch}")
            self.reader_stats.refused(job.name, worker, len(counted), why, self.alive_at)
            self.refusal_log.warning(
                f"job {job.name!r}: refused {len(counted)} report(s) of worker {clip(worker)}, "
                f"which does not hold their lease; first: {why}")
        return refused

    def _ask_back(self, job: Job, thief: str, now: float) -> None:
        """Work stealing: `thief` found nothing to lease while others hold leases they have not
        started: asks them for what it would finish sooner (trainfeed.master.core.stealing). A
        watching holder is told at once on its stream; another one in the answer to its next
        message. What they hand back wakes the thief's long-poll."""
        if job.ledger.group is not None:
            return  # synchronous ranks lease their quota alone, and keep it
        for victim, partition in job.stealing.ask(job.ledger, thief, now):
            logger.debug("job %r: %s is idle; asking %s to give back partition %d", job.name,
                         thief, victim, partition)
            if self.news.watches(job.name, victim):
                ask = job.stealing.asks[partition]
                ask.delivered = True
                self.news.give_back(job, victim, partition, ask.lease)

    # -- LeaveJob, GetJobStatus ---------------------------------------------------------------
    def leave(self, job: Job, request: Leave, now: float) -> int:
        """Session `request.worker_id` leaves (PERMISSION_DENIED without its secret): its
        leases go back to todo. Returns how many (the ledger changed if any)."""
        self.session(job, request.worker_id, request.session_secret)
        released = job.ledger.release(request.worker_id)
        job.workers.pop(request.worker_id, None)
        job.stealing.forget(request.worker_id)
        admission.left(job, request.worker_id, now)
        self.news.watching.discard((job.name, request.worker_id))
        job.live_workers_at = 0.0
        if released:
            logger.info("job %r: worker %s left, %d task(s) back to todo", job.name,
                        request.worker_id, len(released))
            self.on_change(job.name)
        return len(released)

    def status(self, job: Job, now: float) -> JobStatus:
        metrics = self.metrics[job.name]
        return JobStatus(
            job=job.name, dataset=job.manifest.name, epoch=job.ledger.epoch,
            num_partitions=len(job.partitions),
            workers=liveness.readers_alive(job.workers, now, self.config.lease_timeout_s),
            failed_reasons=[f"partition {p}: {r}" for p, r in sorted(job.ledger.failed.items())],
            records_served=metrics.records_served, bytes_served=metrics.bytes_served,
            reports_refused=metrics.reports_refused, metrics_port=self.metrics_port,
            **job.ledger.counts())


def _check_scope(name: str, scope: str | None) -> None:
    """PERMISSION_DENIED for a call about job `name` whose token is another job's."""
    if scope is not None and scope != name:
        raise PermissionDenied(
            f"job {clip(name)!r}: this call's token is a job token of another job; a job "
            f"token opens only its own job (`trainfeed token JOB` prints it; the master's "
            f"token opens every job)")
