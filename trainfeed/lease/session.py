"""A reader's session in a job: the I/O shell around its `LeaseBook`.

A `WorkerSession` is one reader's membership in a job. The bookkeeping (held leases, started
marks, give-backs, progress, fencing, queued reports) is the book's (trainfeed.lease.book, pure);
the session owns what the book must not: the client, the lock, and two threads.

- The reporter sends reports on its own only when the producer will not call soon (it is
  long-polling at the epoch's tail, or no pass runs), so that the epoch can end; progress every
  PROGRESS_INTERVAL_S once a partition has PROGRESS_MIN_RECORDS unreported records (fewer ride
  what goes anyway); and a heartbeat at a third of the lease timeout when no other call reached
  the master, which keeps the leases of slow partitions alive.
- The watcher (with a master of protocol version 2 or later) holds the session's Session stream
  open: what the master must tell this reader between its own calls (give-backs, revocations,
  epoch ends, group changes) comes pushed, so a reader holding leases it has not started makes
  no calls; and what the reporter sends goes on it as messages, not Report calls (issue 28: a
  unary call cost the master ~0.7-1.5 ms, a stream message a fraction). A message with reports
  or a due heartbeat is answered once the master made it durable, and the answer is applied as
  a Report's; progress alone goes unanswered (re-sent whole if the stream breaks). A heartbeat is
  a message the reporter thread sends: a frozen reader sends none, and the master, which renews
  leases only on messages, lets them expire although the stream stays open. A master without
  Session (UNIMPLEMENTED) gets Watch and Report calls; one without Watch either, or a broken
  stream (or an answer that does not come within ANSWER_TIMEOUT_S), falls back to Report calls
  and to polling every STEAL_POLL_S while unstarted leases are held, and the stream is reopened
  with backoff. Fencing never depends on the stream: only an answer to the reader's own call or
  message renews its view of its leases.
- Grants on the stream: with a master that offers it (the stream's first event says `grants`),
  the producer's GetTasks (long-polls included) goes as a message of the Session stream and is
  answered there, fenced and durable as the call; one the master refuses, or whose answer does not
  come (a broken stream, or not within the call's deadline), is made as a GetTasks call. A
  partition then costs two stream messages instead of a unary call (issue 28).

Nothing connects before `open()` (or the first pass, which opens): building a session makes no
call, starts no thread and registers no SIGTERM hook.

Each pass's tasks come from `LeasedTasks` (trainfeed.lease.tasks), which the reader's one
producer loop (trainfeed.reader.producer) drives.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence

import grpc

from trainfeed.errors import (
    CallCancelled,
    MasterUnavailableError,
    SupersededError,
    SyncGroupBrokenError,
)
from trainfeed.io.prefetch import TaskRef
from trainfeed.lease import shutdown
from trainfeed.lease.book import Answer, Applied, Lease, LeaseBook, Outcome, Report
from trainfeed.lease.client import (
    CALL_TIMEOUT_S,
    MasterClient,
    SessionStream,
    session_message,
    tasks_request,
)
from trainfeed.storage import Storage
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)

JOIN_CURRENT_EPOCH = -1
# Without a Watch stream (a master before it, or the stream down), a reader holding leases it
# has not started calls the master at least this often, so that a give_back (work stealing,
# issue 13) reaches it within about this long. With the stream it makes no such calls.
STEAL_POLL_S = 0.25
# A broken Watch stream is reopened after a backoff growing from WATCH_RETRY_MIN_S to
# WATCH_RETRY_MAX_S (with full jitter, so that readers of a restarted master do not come back in
# step); a stream that lived WATCH_HEALTHY_S starts the backoff afresh. A master without Watch
# costs one call per WATCH_RETRY_MAX_S (it may be replaced by one with it).
WATCH_RETRY_MIN_S = 0.1
WATCH_RETRY_MAX_S = 30.0
WATCH_HEALTHY_S = 10.0
# Masters answering OpenJob with an older protocol version have no Watch: no stream is opened to
# them (the reader polls, as readers did before it), so they see no calls they cannot answer.
WATCH_SINCE_VERSION = 2
# A report that failed for a reason other than an unreachable master (which the client retries
# itself) is sent again after a backoff doubling from REPORT_RETRY_MIN_S to REPORT_RETRY_MAX_S.
REPORT_RETRY_MIN_S = 0.1
REPORT_RETRY_MAX_S = 5.0
# A heartbeat sent on the Session stream unanswered this long: the stream is taken for broken
# (reopened), and the heartbeat goes as a Report call instead (within the 5 s of a silent wait).
ANSWER_TIMEOUT_S = 5.0

_OUTCOMES = {Outcome.DONE: pb.TaskReport.DONE, Outcome.FAILED: pb.TaskReport.FAILED,
             Outcome.RELEASED: pb.TaskReport.RELEASED, Outcome.PROGRESS: pb.TaskReport.PROGRESS}

# The reader's figures since its last summary (issue 29), attached to every GetTasks and Report.
StatsHook = Callable[[], "pb.ReaderStats | None"]


def to_message(report: Report) -> pb.TaskReport:
    return pb.TaskReport(epoch=report.epoch, partition=report.partition,
                         outcome=_OUTCOMES[report.outcome], lease=report.lease,
                         consumed=report.consumed, reason=report.reason)


def leases(tasks: Sequence[pb.HeldTask]) -> tuple[Lease, ...]:
    return tuple((t.epoch, t.partition, t.lease) for t in tasks)


def answer_of(response: pb.GetTasksResponse | pb.WatchEvent) -> Answer:
    return Answer(leases(response.revoked), leases(response.give_back), response.revoked_why,
                  response.group_broken, response.superseded)


def event_answer(event: pb.WatchEvent) -> Answer:
    # "0 if none" (the proto): an announcement of epoch 0's end is not told apart from none.
    return Answer(leases(event.revoked), leases(event.give_back), event.revoked_why,
                  event.group_broken, event.superseded,
                  event.epoch_complete if event.epoch_complete > 0 else None)


class WorkerSession:
    """A reader's membership in a job: its worker id, the dataset location, and the reporter.

    Thread-safe: the consumer's calls (`claim`, `report_done`, ...) may come while the producer
    leases and the watcher applies pushed events. `close()` flushes reports, hands back any
    leases and stops the threads; it is idempotent.

    Args:
        stats: called before each GetTasks and Report; what it returns rides on the call
            (`stats`, issue 29). None: no stats.
    """

    def __init__(self, client: MasterClient, job: str, dataset: str, seed: int,
                 distribution_rules: str = "", resume: pb.ResumePosition | None = None,
                 sync: pb.SyncGroup | None = None, order: pb.DeliveryOrder | None = None,
                 stats: StatsHook | None = None, dataset_version: int = 0):
        self.client = client
        # dataset_version: the version to read (0: the job's; trainfeed.formats.manifest).
        self._join = (job, dataset, seed, distribution_rules, resume, sync, order,
                      dataset_version)
        self.job = job
        # A synchronous rank's group, sent with every call (a restarted master learns it again).
        self.sync = sync
        self._stats = stats
        self._opened: pb.OpenJobResponse | None = None
        self.book: LeaseBook | None = None
        # Guards the book, _fetching, _stopping and _watching; notified when one changes.
        self._cond = threading.Condition()
        self._open_lock = threading.Lock()
        self._fetching = False  # a producer runs and will call GetTasks soon (not long-polling)
        self._stopping = False
        self._stop = threading.Event()  # set with _stopping: ends the watcher's backoff
        self._watching = False  # the master accepted the Watch stream, which is up
        self._stream: object = None  # the Watch or Session call in flight (cancelled by close)
        # The Session stream while the master accepts it: heartbeats and progress go on it.
        self._carrier: SessionStream | None = None
        self._session_rpc = True  # False once the master answered Session with UNIMPLEMENTED
        # Session messages sent and waiting for their answer: seq -> (progress sent, when).
        self._pending: dict[int, tuple[list[Report], float]] = {}
        # The carrier's master answers GetTasks asked on the stream (its first event said so).
        self._grants = False
        # GetTasks asked on the Session stream: seq -> its answer once it came (None before).
        self._granting: dict[int, pb.WatchEvent | None] = {}
        self.grants_on_stream = 0  # GetTasks answered on the stream (for tests and benchmarks)
        self.stream_messages = 0  # messages sent on its own Session stream (the same)
        self._seq = 0
        self._threads: list[threading.Thread] = []
        self.error: BaseException | None = None
        self.broken: SyncGroupBrokenError | None = None
        # Per finished epoch: the partitions the master gave up on (None: it no longer knew).
        self.epoch_failures: dict[int, list[pb.FailedPartition] | None] = {}
        self._closed = False

    # -- opening ------------------------------------------------------------------------------
    def open(self) -> WorkerSession:
        """Joins the job (OpenJob), starts the reporter and the watcher and registers the
        SIGTERM hand-back. Idempotent; the first pass calls it."""
        with self._open_lock:
            if self._opened is not None:
                return self
            if self._closed:
                raise ValueError(f"session of job {self.job!r} is closed")
            opened = self.client.open_job(*self._join)
            if opened.resume_cut:
                logger.warning("the master resumed %d partition(s) of the checkpoint where the "
                               "master's records of its progress left them, not where the "
                               "checkpoint says (its progress had not reached the master): "
                               "their records after that are delivered again", opened.resume_cut)
            self.book = LeaseBook(opened.lease_timeout_s, time.monotonic())
            self.job = opened.job
            self._opened = opened
            loops = [(self._report_loop, "reporter")]
            if opened.protocol_version >= WATCH_SINCE_VERSION:
                loops.append((self._watch_loop, "watch"))
            for target, name in loops:
                thread = threading.Thread(target=target, daemon=True,
                                          name=f"trainfeed-{name}-{opened.worker_id}")
                thread.start()
                self._threads.append(thread)
            shutdown.register(self)
        return self

    @property
    def opened(self) -> pb.OpenJobResponse:
        """The master's OpenJob answer (opens the session if it is not yet)."""
        if self._opened is None:
            self.open()
        assert self._opened is not None
        return self._opened

    @property
    def is_open(self) -> bool:
        return self._opened is not None

    @property
    def worker(self) -> str:
        return self.opened.worker_id

    @property
    def resume_credential(self) -> str:
        """What a checkpoint of this session carries so that a restored reader may rewind its
        work (never its session secret, which the client keeps)."""
        return self.opened.resume_credential

    @property
    def dataset(self) -> Storage:
        """The dataset's folder, where the master says it is."""
        opened = self.opened
        return Storage(opened.dataset_url, json.loads(opened.storage_options_json or "{}"))

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.opened.fields)

    @property
    def binary_fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.opened.fields if f.type == "binary")

    @property
    def lease_timeout_s(self) -> float:
        return self.opened.lease_timeout_s

    def _book(self) -> LeaseBook:
        if self.book is None:
            self.open()
        assert self.book is not None
        return self.book

    def held(self) -> dict[tuple[int, int], int]:
        """(epoch, partition) -> lease token of every lease held now (a copy)."""
        with self._cond:
            return dict(self._book().held)

    # -- the consumer's side ------------------------------------------------------------------
    def note_progress(self, task: TaskRef, handed: int) -> None:
        """The trainer consumed the first `handed` records of this holder's share of `task`."""
        if self.broken is not None:
            raise self.broken
        with self._cond:
            if self._book().note_progress(_lease(task), task.skip + handed, time.monotonic()):
                self._cond.notify_all()  # the reporter starts the PROGRESS_INTERVAL_S clock

    def report_done(self, task: TaskRef) -> None:
        with self._cond:
            book = self._book()
            first = not book.reports
            if book.done(_lease(task), time.monotonic()):
                self._queued(first)
            # The producer may be waiting for this (epoch tail, or a full lease depth).
            self._cond.notify_all()

    def report_failed(self, task: TaskRef, reason: str) -> None:
        with self._cond:
            book = self._book()
            first = not book.reports
            book.failed(_lease(task), reason, time.monotonic())
            self._queued(first)

    def _queued(self, first: bool) -> None:
        """A report was queued. Under `_cond`. While the producer fetches it carries reports
        itself: the reporter is woken only to start the COALESCE_S clock on the first pending
        report, not for each one (that would churn threads and the GIL on the hot path)."""
        if first or not self._fetching:
            self._cond.notify_all()

    def claim(self, task: TaskRef) -> bool:
        """The trainer is about to get records of `task`: from now on its lease is never given
        back. Returns True instead if the lease was lost (revoked, or given back before): its
        records must then be dropped, also those already in the batch buffer (see
        `lease_lost`)."""
        if self.lease_lost(task):
            return True
        with self._cond:
            return self._book().claim(_lease(task))

    def lease_lost(self, task: TaskRef) -> bool:
        """Whether the master took `task`'s lease away, so that its records not yet handed to
        the trainer must be dropped (another reader delivers them). Past the time the lease is
        sure to live (this process was frozen, or the master unreachable), first confirms with
        a heartbeat: blocks until the master answers."""
        if self.broken is not None:
            raise self.broken
        lease = _lease(task)
        with self._cond:
            book = self._book()
            if book.lost(lease):
                return True
            unsure = book.unsure(lease, time.monotonic())
        if unsure:
            self.send()
        with self._cond:
            return book.lost(lease)

    def flush(self, epoch: int = -1, positions: dict[int, int] | None = None) -> None:
        """Sends every queued report and the progress not yet sent, now, and waits for the
        answer: a checkpoint taken after it resumes exactly (the master lets a resume claim
        only what reports showed consumed). `positions` (partition -> records of it the trainer
        had, of `epoch`) may be ahead of the progress noted so far (the batcher notes it every
        few records): it is sent too, for the leases still held. A master that cannot be
        reached only costs exactness: logged, not raised (a resume then repeats the unsent
        part). Nothing before the session opened (it owes nothing)."""
        if self.book is None:
            return
        with self._cond:
            self.book.note_positions(epoch, positions or {})
            if not self.book.owes():
                return
        try:
            self.send()
        except Exception as e:
            logger.warning("could not send this reader's progress to the master before a "
                           "checkpoint (%s): a reader restored from it repeats what was not "
                           "sent", e)

    # -- calls --------------------------------------------------------------------------------
    def use_stats(self, hook: StatsHook | None) -> None:
        """Sets what rides on each GetTasks and Report as `stats` (the reader's own figures,
        issue 29): the reader's meter exists only once the reader does, after this session."""
        self._stats = hook

    def _stats_now(self) -> pb.ReaderStats | None:
        if self._stats is None:
            return None
        try:
            return self._stats()
        except Exception:  # the figures must never cost the data
            logger.exception("the reader's stats hook failed; this call goes without stats")
            return None

    def send(self) -> None:
        """A Report call now: the queued reports and progress, and a heartbeat."""
        book = self._book()
        with self._cond:
            reports = book.drain()
            held, begun = book.held_now()
        started = time.monotonic()
        try:
            response = self.client.report(self.job, self.worker,
                                          [to_message(r) for r in reports], held, begun,
                                          sync=self.sync, stats=self._stats_now())
        except BaseException:
            with self._cond:  # keep them for the next try
                book.unsent(reports)
            raise
        self._answered(reports, answer_of(response), started)

    def get_tasks(self, epoch: int, max_tasks: int, wait_ms: int, max_records: int,
                  abandoned: Callable[[], bool] | None = None) -> pb.GetTasksResponse:
        """A GetTasks call carrying the queued reports; its grants, revocations and give-back
        asks are in the book when it returns. Raises the group's break or the supersession it
        announced. A long-poll (`wait_ms` > 0) is cancelled once `abandoned()` or the session
        closes (CallCancelled: the reports stay queued, and any grant it made is handed back
        by the LeaveJob of end_pass_early or close)."""
        book = self._book()
        with self._cond:
            reports = book.drain()
            held, begun = book.held_now()
        started = time.monotonic()
        request = tasks_request(epoch, max_tasks, wait_ms, [to_message(r) for r in reports],
                                held, max_records, begun, self.sync, self._stats_now())
        given_up = self._given_up(abandoned) if wait_ms > 0 else None
        try:
            with self._cond:
                carrier = self._carrier if self._grants else None
            response = None
            if carrier is not None:
                response = self._grant_on(carrier, request, given_up)
                self.grants_on_stream += response is not None
            if response is None:
                response = self.client.call_get_tasks(self.job, self.worker, request, given_up)
        except BaseException:
            with self._cond:  # keep them for the next try
                book.unsent(reports)
            raise
        self._answered(reports, answer_of(response), started, leases(response.tasks))
        self.check()
        return response

    def _grant_on(self, carrier: SessionStream, request: pb.GetTasksRequest,
                  given_up: Callable[[], bool] | None) -> pb.GetTasksResponse | None:
        """`request` asked on the Session stream (grants on the stream: one message each way
        instead of a unary call); the master answers it as the GetTasks call, once durable.
        Returns None when the answer does not come (the stream broke, or not within the call's
        deadline: the stream is then cancelled, to be reopened) or the master refused it: the
        caller makes the call instead (a refusal is handled there, as ever; reports the master
        may already have applied are REPEATs to it). Raises CallCancelled once `given_up()`."""
        with self._cond:
            self._seq += 1
            seq = self._seq
            self._granting[seq] = None
        carrier.send(pb.SessionMessage(seq=seq, get_tasks=request))
        self.stream_messages += 1
        deadline = time.monotonic() + CALL_TIMEOUT_S + request.wait_ms / 1000
        stopped = False
        with self._cond:
            while (self._granting.get(seq) is None and self._carrier is carrier
                   and time.monotonic() < deadline):
                if given_up is not None and given_up():
                    stopped = True
                    break
                self._cond.wait(min(0.1, max(0.001, deadline - time.monotonic())))
            event = self._granting.pop(seq, None)
            timed_out = event is None and not stopped and self._carrier is carrier
        if stopped:
            # (A grant it makes later goes unheard: the pass's LeaveJob hands it back, as a
            # cancelled GetTasks call's.)
            raise CallCancelled("the GetTasks asked on the Session stream was given up")
        if timed_out:
            logger.warning("the master did not answer a GetTasks asked on the Session stream "
                           "within %g s; making the call instead and reopening the stream",
                           CALL_TIMEOUT_S + request.wait_ms / 1000)
            carrier.cancel()
        if event is None:
            return None
        if event.grant_refused:
            logger.debug("the master refused a GetTasks asked on the Session stream (%s); "
                         "making the call", event.grant_refused)
            return None
        return event.grant

    def _given_up(self, abandoned: Callable[[], bool] | None) -> Callable[[], bool]:
        """Whether a long-poll in flight is no longer wanted: `abandoned()`, or this session
        is closing."""
        return lambda: self._stopping or (abandoned is not None and abandoned())

    def _answered(self, reports: list[Report], answer: Answer, started: float,
                  granted: Sequence[Lease] = ()) -> None:
        with self._cond:
            applied = self._book().answered(reports, answer, started, time.monotonic(), granted)
            if applied.given or granted:
                # RELEASED reports wait to go; new leases may start the reporter's polling.
                self._cond.notify_all()
        self._consequences(applied, answer)

    def _consequences(self, applied: Applied, answer: Answer) -> None:
        """Logs and raises-later what an answer or event changed."""
        if applied.broke:
            self.broken = SyncGroupBrokenError(f"job {self.job!r}: {answer.group_broken}")
            self.error = self.error or self.broken
            logger.error("%s", self.broken)
            with self._cond:
                self._cond.notify_all()
        if applied.superseded and not isinstance(self.error, SupersededError):
            self.error = SupersededError(f"job {self.job!r}: {answer.superseded}; this reader "
                                         f"gets no more tasks (close it, and read on with the "
                                         f"restored one)")
        if applied.gone:
            logger.warning("the master took away %d lease(s) of this reader (%s); their "
                           "undelivered records are dropped: %s", len(applied.gone),
                           answer.revoked_why or "it was not heard from for longer than the "
                           "lease timeout: frozen, or cut off from the master?",
                           applied.gone[:10])
        if applied.given:
            logger.info("handed %d unstarted lease(s) back for an idle reader", applied.given)

    def check(self) -> None:
        """Raises what ended this session's passes: a broken group, a supersession, a master
        that stayed unreachable."""
        if self.broken is not None:
            raise self.broken
        if self.error is not None:
            raise self.error

    def set_fetching(self, fetching: bool) -> None:
        with self._cond:
            self._fetching = fetching
            self._cond.notify_all()

    # -- a pass's bookkeeping (see trainfeed.lease.tasks) --------------------------------------
    def begin_pass(self, quota: int | None) -> None:
        with self._cond:
            self._book().begin_pass(quota)

    def handed_over(self) -> None:
        with self._cond:
            self._book().handed_over()

    def need(self) -> int | None:
        """A synchronous pass's records still to lease (None: not synchronous)."""
        with self._cond:
            return self._book().need

    def lease_depth(self, window: int) -> int:
        with self._cond:
            return self._book().lease_depth(window)

    def completed_epoch(self) -> int:
        """The last epoch the Watch stream announced complete (-1: none)."""
        with self._cond:
            return self._book().completed_epoch

    def keep(self, tasks: list[TaskRef]) -> list[TaskRef]:
        """Newly granted tasks as this pass delivers them (a synchronous rank keeps only what
        its quota needs and hands the rest back at once: see LeaseBook.keep)."""
        with self._cond:
            book, now = self._book(), time.monotonic()
            first = not book.reports
            kept = [book.keep(task, now) for task in tasks]
            if book.reports:
                self._queued(first)
        return kept

    def wait_acknowledged(self, timeout_s: float, abandoned: Callable[[], bool]) -> None:
        """Waits until the consumer acknowledged every partition handed to it, the pass was
        `abandoned()` (checked every 50 ms), or `timeout_s` passed."""
        book = self._book()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while book.outstanding > 0 and not self._stopping and not abandoned():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, 0.05))

    # -- the reporter -------------------------------------------------------------------------
    def _report_loop(self) -> None:
        book = self._book()
        failures = 0
        heartbeat = max(0.05, book.lease_timeout_s / 3)
        while True:
            with self._cond:
                # Sleep until reports need sending alone or a heartbeat is due; every notify
                # re-computes how long that is.
                while not self._stopping:
                    poll = None if self._watching else STEAL_POLL_S
                    due = book.send_in(time.monotonic(), self._fetching, heartbeat, poll)
                    if due <= 0:
                        break
                    self._cond.wait(max(0.001, due))
                if self._stopping:
                    return
                # Reports, progress and heartbeats ride on the Session stream while it is up.
                carrier = self._carrier
            if carrier is not None and self._send_on(carrier, heartbeat):
                failures = 0
                continue
            try:
                self.send()
                failures = 0
            except MasterUnavailableError as e:
                self.error = e
                logger.error("%s", e)
                return
            except Exception as e:
                if self._stopping or self.client.closed:
                    return  # the client closed under us: nothing more can be sent
                failures += 1
                # Backed off, and the traceback once: a failure that repeats at once would
                # otherwise spin this thread and flood the log.
                delay = min(REPORT_RETRY_MAX_S, REPORT_RETRY_MIN_S * 2 ** (failures - 1))
                logger.warning("report to master failed (%s); retrying in %.1f s", e, delay,
                               exc_info=failures == 1)
                self._stop.wait(delay)
            if self.broken is not None:
                return  # the group is over: nothing to renew

    def _send_on(self, carrier: SessionStream, heartbeat_s: float) -> bool:
        """What a Report call would carry (queued reports, progress not yet sent, the held
        leases, the stats), as a message of the Session stream. With queued reports or a
        heartbeat due it waits for the answer (sent once the master made the reports durable),
        which is applied as the answer to a Report; progress alone goes unanswered. Returns
        False if the answer did not come (the reports are queued again, the stream is
        cancelled, to be reopened, and the caller sends a Report instead)."""
        book = self._book()
        now = time.monotonic()
        with self._cond:
            answered = bool(book.reports) or book.needs_answer(now, heartbeat_s)
            reports = book.drain() if answered else book.drain_progress()
            held, begun = book.held_now()
            seq = 0
            if answered:
                self._seq += 1
                seq = self._seq
                self._pending[seq] = (reports, now)
        carrier.send(session_message(seq, [to_message(r) for r in reports], held, begun,
                                     self.sync, self._stats_now()))
        self.stream_messages += 1
        if not answered:
            return True
        deadline = now + ANSWER_TIMEOUT_S
        with self._cond:
            while (seq in self._pending and self._carrier is carrier and not self._stopping
                   and time.monotonic() < deadline):
                self._cond.wait(max(0.001, deadline - time.monotonic()))
            if seq not in self._pending:
                return True
            del self._pending[seq]
            book.unsent(reports)  # (progress too, as plain reports: the master keeps the max)
            if self._stopping:
                return True  # close() sends them
            timed_out = self._carrier is carrier
        if timed_out:
            logger.warning("the master did not answer a heartbeat on the Session stream within "
                           "%g s; sending it as a Report call and reopening the stream",
                           ANSWER_TIMEOUT_S)
            carrier.cancel()
        return False

    def _answer(self, event: pb.WatchEvent) -> None:
        """The master's answer to a Session message of ours: applied as the answer to a call
        (it renews `sure_until`); progress it refused is dropped like a revoked lease."""
        with self._cond:
            if event.answers in self._granting:
                self._granting[event.answers] = event  # (the asker applies it)
                self._cond.notify_all()
                return
        answer = event_answer(event)
        answer = dataclasses.replace(answer, revoked=answer.revoked + leases(event.refused))
        with self._cond:  # (re-entrant: the waiting sender sees the answer applied)
            pending = self._pending.pop(event.answers, None)
            if pending is None:
                return  # it came after the sender gave up on it
            reports, sent_at = pending
            self._answered(reports, answer, sent_at)
            self._cond.notify_all()

    # -- the watcher --------------------------------------------------------------------------
    def _watch_loop(self) -> None:
        """Keeps the Watch stream open and applies its events, reopening it with backoff."""
        delay = WATCH_RETRY_MIN_S
        unimplemented_logged = False
        while not self._stopping and self.broken is None:
            opened_at = time.monotonic()
            try:
                self._watch_once()
            except grpc.RpcError as e:
                code = e.code()
                if self._stopping:
                    return
                if code is grpc.StatusCode.UNIMPLEMENTED and self._session_rpc:
                    self._session_rpc = False  # a master before Session: Watch, and Reports
                    logger.info("master %s has no Session stream (an older master): this "
                                "reader's heartbeats and progress go as Report calls",
                                self.client.address)
                    continue
                if code is grpc.StatusCode.UNIMPLEMENTED:
                    if not unimplemented_logged:
                        unimplemented_logged = True
                        logger.info("master %s has no Watch stream (an older master): this "
                                    "reader polls every %g s while it holds unstarted leases",
                                    self.client.address, STEAL_POLL_S)
                else:
                    logger.debug("the Watch stream broke (%s: %s); polling until it is back",
                                 code, e.details())
            except Exception:
                if self._stopping or self.client.closed:
                    return  # closed under us (the client first): nothing to watch any more
                logger.exception("the Watch stream failed; polling until it is back")
            finally:
                self._set_watching(False)
            if time.monotonic() - opened_at >= WATCH_HEALTHY_S:
                delay = WATCH_RETRY_MIN_S
            # (Not on `_cond`: every report notifies it, which would cut the backoff short.)
            self._stop.wait(random.uniform(delay / 2, delay))
            delay = min(delay * 2, WATCH_RETRY_MAX_S)

    def _watch_once(self) -> None:
        carrier = self.client.session(self.job, self.worker) if self._session_rpc else None
        stream = carrier if carrier is not None else self.client.watch(self.job, self.worker)
        with self._cond:
            if self._stopping:
                stream.cancel()
                return
            self._stream = stream
        try:
            # The master sends its headers (or a first event) once the stream is registered:
            # from then on it pushes what it would otherwise put in answers to our calls.
            stream.initial_metadata()
            self._set_watching(True)
            for event in stream:
                if event.answers:
                    self._answer(event)
                    continue
                with self._cond:
                    if carrier is not None and self._carrier is None:
                        self._carrier = carrier  # (the first event: the master took it)
                        self._grants = event.grants
                        self._cond.notify_all()
                self._set_watching(True)
                self.apply(event)
        finally:
            if carrier is not None:
                carrier.cancel()  # (ends the thread gRPC feeds the call's messages from)
            with self._cond:
                self._stream = None
                if carrier is not None and self._carrier is carrier:
                    self._carrier = None
                    self._grants = False
                    # What it carried unanswered may be lost: sent again, by call or stream
                    # (a sender waiting for an answer requeues its reports itself).
                    self._book().resend_progress()
                    self._cond.notify_all()

    def apply(self, event: pb.WatchEvent) -> Applied:
        """Applies one Watch event through the book, as the same fields of an answer (but it
        renews no lease: see LeaseBook.told). Returns what it changed."""
        answer = event_answer(event)
        with self._cond:
            applied = self._book().told(answer, time.monotonic())
            self._cond.notify_all()  # RELEASED reports to send, an epoch end to see
        self._consequences(applied, answer)
        return applied

    def _set_watching(self, watching: bool) -> None:
        with self._cond:
            if self._watching != watching:
                self._watching = watching
                self._cond.notify_all()

    @property
    def watching(self) -> bool:
        return self._watching

    # -- the end ------------------------------------------------------------------------------
    def end_pass_early(self) -> None:
        """After a pass was abandoned mid-way: send reports, hand unconsumed tasks back. Nothing
        once the session is closed (its close did it; a pass ended after that has no channel)."""
        if self._closed or self._opened is None:
            return
        try:
            self._hand_back()
        except Exception as e:  # the master or the channel is gone: the leases then expire
            logger.warning("could not hand tasks back after an abandoned pass: %s", e)

    def _hand_back(self) -> None:
        self.send()
        released = self.client.leave_job(self.job, self.worker).released_tasks
        with self._cond:
            self._book().left()
        if released:
            logger.info("handed %d unfinished task(s) back to the master", released)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._cond:
            self._stopping = True
            self._stop.set()
            stream, self._stream = self._stream, None
            self._cond.notify_all()
        if stream is not None:
            stream.cancel()  # type: ignore[attr-defined]
        for thread in self._threads:
            thread.join(10)
        if self._opened is None:
            return  # never joined: nothing to hand back
        try:
            self._hand_back()
        except Exception as e:  # the master may be gone for good; leases then expire
            logger.warning("could not hand tasks back on close: %s", e)


def _lease(task: TaskRef) -> Lease:
    return (task.epoch, task.partition, task.lease)
