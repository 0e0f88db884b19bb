"""A reader's session in a job: the I/O shell around its `LeaseBook`.

A `WorkerSession` is one reader's membership in a job. The bookkeeping (held leases, started
marks, give-backs, progress, fencing, queued reports) is the book's (trainfeed.lease.book, pure);
the conversation with the master is the transport's (trainfeed.lease.transport: the Session
stream, reopened when it breaks); the session owns the rest: the lock, the reporter thread, and
what joins the two.

After OpenJob everything goes on the Session stream (issue 36; there is no other dialect):
- The producer's requests for tasks (long-polls included) are `get_tasks` messages, answered
  with the grant once the master made it durable, fenced as a call was.
- The reporter sends on its own only when the producer will not ask soon (it is long-polling at
  the epoch's tail, or no pass runs), so that the epoch can end; progress every
  PROGRESS_INTERVAL_S once a partition has PROGRESS_MIN_RECORDS unreported records (unanswered
  messages: re-sent whole if the stream breaks); and a heartbeat (answered) at a third of the
  lease timeout when nothing else reached the master, which keeps the leases of slow partitions
  alive. A frozen reader sends none, and the master, which renews leases only on messages, lets
  them expire although the stream stays open.
- What the master tells the reader between its messages (give-backs, revocations, epoch ends,
  group changes, supersession) comes pushed, so a reader holding leases it has not started
  sends nothing.
- Fencing never depends on the stream: only an answer to the reader's own message renews its
  view of its leases. A message whose answer was lost with a broken stream is sent again on the
  next one, which the transport reopens with the session's secret; the first answered message
  of a new stream lists every lease held, and the master takes back any it granted in an answer
  that never came.

Nothing connects before `open()` (or the first pass, which opens): building a session makes no
call, starts no thread and registers no SIGTERM hook.

Each pass's tasks come from `LeasedTasks` (trainfeed.lease.tasks), which the reader's one
producer loop (trainfeed.reader.producer) drives.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from trainfeed.errors import CallCancelled, JobError, SupersededError, SyncGroupBrokenError
from trainfeed.io.prefetch import TaskRef
from trainfeed.lease import shutdown
from trainfeed.lease.book import Answer, Applied, Lease, LeaseBook, Report
from trainfeed.lease.client import CALL_TIMEOUT_S, MasterClient, session_message, tasks_request
from trainfeed.lease.messages import answer_of, lease_of, leases, to_message
from trainfeed.lease.transport import Transport
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)

JOIN_CURRENT_EPOCH = -1
# A heartbeat unanswered this long: the stream is taken for broken, reopened, and the heartbeat
# sent again on the new one (within the 5 s of a silent wait).
ANSWER_TIMEOUT_S = 5.0
# A request for tasks the master refused for its load (RESOURCE_EXHAUSTED: too many asked on the
# stream at once) is asked again after this long.
REFUSED_RETRY_S = 0.1
# What is left to send when a pass is abandoned or the session closes is given up after this
# long without a stream that answers (the leases then expire on the master): close() returns.
HAND_BACK_S = CALL_TIMEOUT_S
# close() waits this long for the reporter thread to stop (it wakes on `_stopping`).
REPORTER_JOIN_S = 10.0
# close() returns within this, whatever the master does: the reporter's join, the hand-back,
# and one LeaveJob call begun just before the hand-back's deadline (said at exit, shutdown.py).
CLOSE_BOUND_S = REPORTER_JOIN_S + HAND_BACK_S + CALL_TIMEOUT_S

# The reader's figures since its last summary (issue 29), attached to every message it answers.
StatsHook = Callable[[], "pb.ReaderStats | None"]


@dataclasses.dataclass(frozen=True)
class Join:
    """What a reader joins its job with (OpenJob; see MasterClient.open_job): the reader's
    source (trainfeed.reader.sources.MasterSource, checked there), as the wire says it."""

    job: str
    dataset: str
    seed: int = 0
    distribution_rules: str = ""  # "": the dataset's own, else "all"
    resume: pb.ResumePosition | None = None  # a restored reader's rewind
    sync: pb.SyncGroup | None = None  # a synchronous rank's group
    order: pb.DeliveryOrder | None = None  # what shapes the reader's delivery order
    dataset_version: int = 0  # the version to read (0: the job's)


class WorkerSession:
    """A reader's membership in a job: its worker id, its lease book, its stream, its reporter.

    Thread-safe: the consumer's calls (`claim`, `report_done`, ...) may come while the producer
    leases and the transport applies pushed events. `close()` flushes reports, hands back any
    leases and stops the threads; it is idempotent.

    Args:
        stats: called before each answered message; what it returns rides on it (issue 29);
            None: none. Settable later, as `on_decoders` is (the master's decoders, issue 37).
    """
    close_bound_s = CLOSE_BOUND_S  # (the exit hook says when it gives up, shutdown.py)
    def __init__(self, client: MasterClient, join: Join, stats: StatsHook | None = None):
        self.client = client
        self.join = join
        self.job = join.job
        # A synchronous rank's group, sent with every message (a restarted master learns it).
        self.sync = join.sync
        self.stats = stats
        self.on_decoders: Callable[[list[tuple[str, float]]], object] | None = None
        self._opened: pb.OpenJobResponse | None = None
        self.book: LeaseBook | None = None
        # Guards the book and the flags below; notified when one changes (and by the transport).
        self._cond = threading.Condition()
        self._open_lock = threading.Lock()
        self._fetching = False  # a producer runs and will ask for tasks soon (not long-polling)
        self._stopping = False
        self._resync = False  # a stream broke: an answered heartbeat goes on the next at once
        self.transport = Transport(client, self._cond, self.apply, self._on_break)
        self.grants_on_stream = 0  # requests for tasks answered (tests and benchmarks)
        self._threads: list[threading.Thread] = []
        self.error: BaseException | None = None
        self.broken: SyncGroupBrokenError | None = None
        # Per finished epoch: the partitions the master gave up on (None: it no longer knew).
        self.epoch_failures: dict[int, list[pb.FailedPartition] | None] = {}
        self._closed = False

    # -- opening ------------------------------------------------------------------------------
    def open(self) -> WorkerSession:
        """Joins the job (OpenJob), opens the stream, starts the reporter and registers the
        SIGTERM hand-back. Idempotent; the first pass calls it."""
        with self._open_lock:
            if self._opened is not None:
                return self
            if self._closed:
                raise ValueError(f"session of job {self.job!r} is closed")
            j = self.join
            opened = self.client.open_job(j.job, j.dataset, j.seed, j.distribution_rules,
                                          j.resume, j.sync, j.order, j.dataset_version)
            if opened.resume_cut:
                logger.warning("the master resumed %d partition(s) of the checkpoint where the "
                               "master's records of its progress left them, not where the "
                               "checkpoint says (its progress had not reached the master): "
                               "their records after that are delivered again", opened.resume_cut)
            self.book = LeaseBook(opened.lease_timeout_s, time.monotonic())
            self.job = opened.job
            self._opened = opened
            self.transport.start(opened.job, opened.worker_id)
            thread = threading.Thread(target=self._report_loop, daemon=True,
                                      name=f"trainfeed-reporter-{opened.worker_id}")
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

    def _book(self) -> LeaseBook:
        if self.book is None:
            self.open()
        assert self.book is not None
        return self.book

    def held(self) -> dict[tuple[int, int], int]:
        """(epoch, partition) -> lease token of every lease held now (a copy)."""
        with self._cond:
            return dict(self._book().held)

    @contextlib.contextmanager
    def locked(self) -> Iterator[LeaseBook]:
        """The book under the session's lock: a pass's bookkeeping (trainfeed.lease.tasks)."""
        book = self._book()
        with self._cond:
            yield book

    # -- the consumer's side ------------------------------------------------------------------
    def note_progress(self, task: TaskRef, handed: int) -> None:
        """The trainer consumed the first `handed` records of this holder's share of `task`."""
        if self.broken is not None:
            raise self.broken
        with self._cond:
            if self._book().progress.note(lease_of(task), task.skip + handed, time.monotonic()):
                self._cond.notify_all()  # the reporter starts the PROGRESS_INTERVAL_S clock

    def report_done(self, task: TaskRef) -> None:
        with self._cond:
            book = self._book()
            first = not book.reports
            if book.done(lease_of(task), time.monotonic()):
                self._queued(first)
            self._cond.notify_all()  # (the producer may wait for it: epoch tail, lease depth)

    def report_failed(self, task: TaskRef, reason: str) -> None:
        with self._cond:
            book = self._book()
            first = not book.reports
            book.failed(lease_of(task), reason, time.monotonic())
            self._queued(first)

    def _queued(self, first: bool) -> None:
        """A report was queued (under `_cond`). While the producer fetches, it carries them:
        the reporter is woken only for the first (its COALESCE_S clock), not for each."""
        if first or not self._fetching:
            self._cond.notify_all()

    def claim(self, task: TaskRef) -> bool:
        """The trainer is about to get records of `task`: its lease is never given back from
        now on. Returns True instead if the lease was lost: its records, also those in the
        batch buffer, must be dropped (see `lease_lost`)."""
        if self.lease_lost(task):
            return True
        with self._cond:
            return self._book().claim(lease_of(task))

    def lease_lost(self, task: TaskRef) -> bool:
        """Whether the master took `task`'s lease away (its undelivered records are dropped:
        another reader delivers them); past the time the lease is sure to live, confirmed."""
        if self.broken is not None:
            raise self.broken
        lease = lease_of(task)
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
        """Sends the queued reports and progress now, with `positions` (partition -> records of
        `epoch` the trainer had; ahead of the noted progress), and waits for the answer, so that
        a checkpoint taken after it resumes exactly (an unreachable master costs exactness only,
        logged). Nothing before the session opened."""
        if self.book is None:
            return
        with self._cond:
            self.book.progress.note_positions(epoch, positions or {})
            if not self.book.owes():
                return
        try:
            self.send()
        except Exception as e:
            logger.warning("could not send this reader's progress to the master before a "
                           "checkpoint (%s): a reader restored from it repeats what was not "
                           "sent", e)

    # -- messages -----------------------------------------------------------------------------
    def send(self, answered: bool = True, given_up: Callable[[], bool] | None = None) -> None:
        """The queued reports, the progress not yet sent and the held leases, as a message of
        the stream, once it is up. `answered`: a heartbeat, waited for and applied (it renews
        `sure_until`); else progress alone, unanswered. What a broken stream lost goes again on
        the next. Raises why the stream is gone for good, or CallCancelled once `given_up()`."""
        book = self._book()
        while True:
            self.transport.wait_up(given_up)
            with self._cond:
                reports = book.drain() if answered else book.drain_progress()
                held, begun = book.held_now()
            sent_at = time.monotonic()
            message = session_message(0, [to_message(r) for r in reports], held, begun,
                                      self.sync, _figures(self.stats))
            event, sent = None, False
            try:
                if answered:
                    event = self.transport.ask(message, 0.0, ANSWER_TIMEOUT_S, "a heartbeat",
                                               given_up)
                sent = event is not None if answered else self.transport.post(message)
            finally:
                if not sent:
                    with self._cond:  # (progress too, as plain reports: the master keeps the max)
                        book.unsent(reports)
            if event is not None:
                self._answered(reports, answer_of(event), sent_at)
            if sent:
                return

    def get_tasks(self, epoch: int, max_tasks: int, wait_ms: int, max_records: int,
                  abandoned: Callable[[], bool] | None = None) -> pb.GetTasksResponse:
        """Asks for tasks on the stream with the queued reports; the answer's grants and news
        are in the book when it returns. Raises the group's break or a supersession. Given up
        (CallCancelled) once `abandoned()` or closing: the reports stay queued, and a grant
        made meanwhile goes back with the LeaveJob of end_pass_early or close."""
        book = self._book()

        def given_up() -> bool:
            return self._stopping or (abandoned is not None and abandoned())
        while True:
            self.transport.wait_up(given_up)
            with self._cond:
                reports = book.drain()
                held, begun = book.held_now()
            sent_at = time.monotonic()
            request = tasks_request(epoch, max_tasks, wait_ms, [to_message(r) for r in reports],
                                    held, max_records, begun, self.sync, _figures(self.stats))
            event = None
            try:
                event = self.transport.ask(pb.SessionMessage(get_tasks=request), wait_ms / 1000,
                                           CALL_TIMEOUT_S + wait_ms / 1000,
                                           "a request for tasks", given_up)
            finally:
                if event is None or event.grant_refused:
                    with self._cond:  # kept for the next try
                        book.unsent(reports)
            if event is None:
                continue  # the stream broke: asked again on the next
            if event.grant_refused:
                self._grant_refused(event.grant_refused, bool(reports), given_up)
                continue
            self.grants_on_stream += 1
            self._answered(reports, answer_of(event), sent_at, leases(event.grant.tasks))
            self.check()
            return event.grant

    def _grant_refused(self, why: str, had_reports: bool, given_up: Callable[[], bool]) -> None:
        """A request for tasks the master refused, changing nothing: its reports go on their
        own (the answer lists those refused, dropped as revoked leases) before it goes again;
        one refused for the master's load goes again after REFUSED_RETRY_S; others raise."""
        if had_reports:
            logger.debug("the master refused a request for tasks with reports (%s); sending "
                         "the reports on their own first", why)
            self.send(given_up=given_up)
        elif why.startswith("RESOURCE_EXHAUSTED"):
            logger.warning("master %s: %s; asking again in %g s", self.client.address, why,
                           REFUSED_RETRY_S)
            time.sleep(REFUSED_RETRY_S)
        else:
            raise JobError(f"master {self.client.address} refused this reader's request for "
                           f"tasks in job {self.job!r}: {why}")

    def _answered(self, reports: list[Report], answer: Answer, started: float,
                  granted: Sequence[Lease] = ()) -> None:
        with self._cond:
            applied = self._book().answered(reports, answer, started, time.monotonic(), granted)
            if applied.given or granted:
                # RELEASED reports wait to go; new leases may start the reporter's polling.
                self._cond.notify_all()
        self._consequences(applied, answer)

    def apply(self, event: pb.WatchEvent) -> Applied:
        """Applies one pushed event through the book, as the same fields of an answer (but it
        renews no lease: see LeaseBook.told). Returns what it changed."""
        if event.decoders_listed and self.on_decoders is not None:
            self.on_decoders([(d.address, d.busy) for d in event.decoders])
        answer = answer_of(event)
        with self._cond:
            applied = self._book().told(answer, time.monotonic())
            self._cond.notify_all()  # RELEASED reports to send, an epoch end to see
        self._consequences(applied, answer)
        return applied

    def _on_break(self) -> None:
        """The stream broke (under `_cond`): the progress it carried unanswered may be lost,
        so it goes again, and a heartbeat goes at once on the next stream, so that the news
        the master could not push meanwhile comes in its answer."""
        self._book().progress.resend()
        self._resync = True
        self._cond.notify_all()

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
        that stayed unreachable or refused the stream."""
        if self.broken is not None:
            raise self.broken
        error = self.error or self.transport.error
        if error is not None:
            raise error

    # -- a pass's side (see trainfeed.lease.tasks) ---------------------------------------------
    def set_fetching(self, fetching: bool) -> None:
        with self._cond:
            self._fetching = fetching
            self._cond.notify_all()

    def keep(self, tasks: list[TaskRef]) -> list[TaskRef]:
        """Granted tasks as the pass delivers them (a synchronous rank's cut to its quota)."""
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
        heartbeat = max(0.05, book.lease_timeout_s / 3)
        while True:
            with self._cond:  # until reports must go alone or a heartbeat is due
                while not self._stopping:
                    due = 0.0 if self._resync else book.send_in(time.monotonic(),
                                                                 self._fetching, heartbeat)
                    if due <= 0:
                        break
                    self._cond.wait(max(0.001, due))
                if self._stopping:
                    return
                answered = (self._resync or bool(book.reports)
                            or book.needs_answer(time.monotonic(), heartbeat))
                self._resync = False
            try:
                self.send(answered, given_up=lambda: self._stopping)
            except Exception as e:  # closing (close() sends the rest), or the stream is gone
                if not isinstance(e, CallCancelled):
                    self.error = self.error or e
                return
            if self.broken is not None:
                return  # the group is over: nothing to renew

    # -- the end ------------------------------------------------------------------------------
    def end_pass_early(self) -> None:
        """After a pass was abandoned mid-way: sends reports, hands leases back (not closed)."""
        if not self._closed and self._opened is not None:
            self._hand_back("after an abandoned pass")

    def _hand_back(self, when: str) -> None:
        deadline = time.monotonic() + HAND_BACK_S
        try:
            self.send(given_up=lambda: time.monotonic() > deadline)
            left = max(0.0, deadline - time.monotonic())
            released = self.client.leave_job(self.job, self.worker, left).released_tasks
        except Exception as e:  # the master or the channel is gone: the leases then expire
            logger.warning("could not hand tasks back %s: %s", when, e)
            return
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
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(REPORTER_JOIN_S)
        if self._opened is not None:  # (never joined: nothing to hand back)
            self._hand_back("on close")
        self.transport.close()


def _figures(hook: StatsHook | None) -> pb.ReaderStats | None:
    """The reader's figures for the next answered message (None: none, or the hook failed;
    the figures must never cost the data)."""
    if hook is None:
        return None
    try:
        return hook()
    except Exception:
        logger.exception("the reader's stats hook failed; this message goes without stats")
        return None
