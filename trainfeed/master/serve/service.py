"""The gRPC servicer of the master: a thin shell around the pure core (coordinator.py).

What the shell does, and nothing else: it reads the clock and the call's scope, calls the
coordinator, maps its refusals to status codes (STATUS_CODES, the one table), hands the ledgers'
ops to the journal writer (trainfeed.master.serve.journal) and answers only once they are
durable, holds long-polls and Watch streams open, and reads manifests off the event loop.

Runs on one asyncio event loop, so the coordinator needs no locks. The journal writer commits the
ops of every call of a tick in one store transaction, off the loop; each job is snapshotted once
its journal is about twice as long as it has partitions (so replaying a journal after a restart
costs about as much as reading a snapshot, and a snapshot's O(partitions) cost is amortized over
as many calls). GetTasks long-polls: when the epoch's remaining partitions are leased to others it
waits (up to the caller's `wait_ms`) for a change (a report, an expiry, a leave) instead of making
readers spin. Watch (issue 28) streams to a reader session what it must be told between its own
calls (give-backs, revocations, the end of an epoch, a broken group, being superseded); Session
is Watch plus the reader's heartbeats and progress as messages on the same call (unary calls cost
the master about 0.7-1.5 ms each, a stream message a fraction of that); a reader also asks for its
leases on it (`get_tasks`, answered through the very path of a GetTasks call, long-polls included,
once durable).

Trust: a report counts only from the partition's current lease holder with the lease's fencing
token (Ledger.check_report). A call carrying any other report is refused whole with
FAILED_PRECONDITION (the refused reports listed in its trailing metadata, counted, logged with a
rate limit) and changes nothing; partition ids and epochs that cannot exist get INVALID_ARGUMENT.
Every call of a reader session carries the secret its OpenJob gave it
(trainfeed.master.core.sessions), else PERMISSION_DENIED; a call may be restricted to one job by
its token (trainfeed.master.serve.auth).
No answer or log line names another session's secret or lease token. A reader of another wire
protocol (trainfeed.protocol) is refused at OpenJob with FAILED_PRECONDITION naming both.

Outages: a master that restarts, or whose process was stalled (SIGSTOP, a swapped-out host),
could not hear the readers' heartbeats meanwhile. So it gives every outstanding lease a grace of
RESTART_GRACE_LEASES lease timeouts counted from when it serves again, instead of expiring the
leases of live readers that had no way to renew them.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from trainfeed.errors import (
    CorruptDatasetError,
    DatasetNotFoundError,
    LeadershipError,
    StateStoreError,
)
from trainfeed.formats.manifest import Manifest, read_manifest
from trainfeed.master.core.coordinator import RESTART_GRACE_LEASES, TOKEN_KEY_BYTES, Coordinator
from trainfeed.master.core.jobs import (
    DEFAULT_LEASE_TIMEOUT_S,
    CallError,
    FailedPrecondition,
    InvalidArgument,
    Job,
    JobStats,
    MasterConfig,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from trainfeed.master.core.ledger import LeaseStatus
from trainfeed.master.core.reader_stats import ReaderBoard
from trainfeed.master.core.sessions import clip
from trainfeed.master.serve import auth
from trainfeed.master.serve.journal import JournalWriter
from trainfeed.master.stores import StateStore
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

__all__ = ["DEFAULT_LEASE_TIMEOUT_S", "MAX_WAIT_MS", "RESTART_GRACE_LEASES", "STATUS_CODES",
           "Job", "JobStats", "MasterConfig", "MasterServicer"]

logger = logging.getLogger(__name__)

# Upper bound of one long-poll: short enough that a reader notices a dead master quickly.
MAX_WAIT_MS = 5000
# Progress that no reader waits for (unanswered Session messages) reaches the journal writer at
# most this long after it came (then durable a journal tick later): 200 readers' progress is then
# ~20 hand-overs a second, not 200. A master killed meanwhile loses at most this much progress,
# which a reader re-delivers (the contract: progress at most PROGRESS_INTERVAL_S old).
PROGRESS_JOURNAL_S = 0.05
# GetTasks asked on one Session stream and not yet answered (`get_tasks` messages, each a task of
# its own while it long-polls). A reader asks one at a time (its producer); past this bound a
# stream flooding the master with long-polls gets `grant_refused` (RESOURCE_EXHAUSTED) at once
# instead of a task each: the bound a unary call gets from HTTP/2's concurrent-stream limit.
MAX_GRANTS_IN_FLIGHT = 8
# Answers of one Session stream not yet sent (queued for the writer, or long-polling `get_tasks`):
# while this many are unsent the master takes no more of the stream's messages, so that HTTP/2
# flow control holds back a client that writes but never reads, instead of the master queueing
# an answer per message without end (issue 35: +285 MB in 45 s). Backpressure, not a refusal: an
# honest reader reads its answers and has a few unanswered at once (a heartbeat, a grant or two),
# so it never waits on this; a reader that stalls a while is slowed, not cut off. Each answer is
# at most a few KiB (coordinator.MAX_REFUSED_LISTED), so a stream holds at most ~1 MiB.
MAX_UNSENT_ANSWERS = 64
# The one table of refusals -> status codes (looked up along the exception's class hierarchy).
STATUS_CODES: dict[type[Exception], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    DatasetNotFoundError: grpc.StatusCode.NOT_FOUND,
    CorruptDatasetError: grpc.StatusCode.DATA_LOSS,
    # Not durable, or another master serves now: the reader retries and finds the one serving.
    LeadershipError: grpc.StatusCode.UNAVAILABLE,
    StateStoreError: grpc.StatusCode.UNAVAILABLE,
}
_REFUSALS = tuple(STATUS_CODES)
R = TypeVar("R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]


def status_code(error: Exception) -> grpc.StatusCode:
    """The status code STATUS_CODES gives `error` (its nearest listed class)."""
    for cls in type(error).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    raise KeyError(f"no status code for {type(error).__name__}")  # only _REFUSALS get here


def _answers(handler: Handler[R]) -> Handler[R]:
    """Aborts a call whose handler raised a refusal with its status code (and trailer); makes
    the ops of a refused call that did change a ledger durable anyway (not waited for)."""
    @functools.wraps(handler)
    async def call(self: MasterServicer, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await handler(self, request, context)
        except _REFUSALS as e:
            self.flush()
            trailer = e.trailer if isinstance(e, CallError) else ()
            await context.abort(status_code(e), e.message if isinstance(e, CallError)
                                else str(e), trailing_metadata=trailer)
            raise  # (abort raised)
    return call


class MasterServicer(master_pb2_grpc.MasterServicer):
    """Implements trainfeed.v1.Master over a Coordinator, journaled to a StateStore."""

    def __init__(self, config: MasterConfig, store: StateStore,
                 on_leadership_lost: Callable[[], None] | None = None):
        self.config = config
        self.store = store
        self.core = Coordinator(config)
        self.core.on_change = self._wake
        self.core.on_event = self._wake_watch
        self.journal = JournalWriter(store, on_leadership_lost)
        # Manifest reads in flight for jobs being created, so that workers joining a new job
        # at once share one read instead of each reading a (possibly large) manifest again.
        self._manifest_reads: dict[tuple[str, str, int | None],
                                  asyncio.Future[Manifest]] = {}
        # Long-polls wait on their job's event; each Watch stream on its own.
        self._changed: dict[str, asyncio.Event] = {}
        self._watchers: dict[tuple[str, str], asyncio.Event] = {}
        # Jobs whose unanswered progress is handed to the journal writer soon (_submit_soon).
        self._submit_due: set[str] = set()
        # Set by the server when calls carry tokens: a job token's call may touch its job only.
        self.job_scoped = False

    @property
    def jobs(self) -> dict[str, Job]:
        return self.core.jobs

    @property
    def reader_stats(self) -> ReaderBoard:
        """What readers measure (issue 29), for the status page and the metrics."""
        return self.core.reader_stats

    @property
    def leadership_lost(self) -> bool:
        return self.journal.lost

    # -- lifecycle ----------------------------------------------------------------------------
    def restore(self) -> None:
        """Loads every saved job (snapshot + journal) and snapshots each again, which compacts
        its journal. Before serving, from any thread (the journal writer is not running)."""
        restored = self.core.restore(
            self.store.load_jobs(),
            lambda name, version: read_manifest(self.config.storage, name, version), time.time())
        for job in restored:
            self._snapshot(job)

    def start(self) -> None:
        """Starts the journal writer: on the event loop, before serving."""
        self.journal.start(asyncio.get_running_loop())

    def close(self) -> None:
        """Writes what is queued and stops the journal writer; safe to call twice."""
        self.flush()
        self.journal.close()

    def grant_grace(self, now: float | None = None) -> None:
        self.core.grant_grace(time.time() if now is None else now)

    def expire_leases(self) -> None:
        """Called by the lease timer: overdue leases go back to todo (journaled, not waited
        for: no call waits on it)."""
        for job in self.core.expire_leases(time.time()):
            self._submit(job)

    def job_stats(self) -> list[JobStats]:
        """Every job's figures, read from the coordinator at scrape time (on the event loop)."""
        return self.core.job_stats(time.time())

    def flush(self) -> None:
        """Hands every job's pending ops to the journal writer without waiting (a refused call
        may have changed a ledger before it was refused)."""
        if self.journal.running:
            for job in self.core.jobs.values():
                if job.ledger.journal:
                    self._submit(job)

    # -- durability ---------------------------------------------------------------------------
    def _snapshot(self, job: Job) -> None:
        """Writes a snapshot at once, on this thread (restore only: the writer is not running)."""
        job.ledger.take_journal()  # the snapshot includes these ops
        self.store.save_snapshot(job.name, job.state())
        job.journal_ops = 0

    def _entry(self, job: Job) -> tuple[list[Any], dict[str, Any] | None]:
        """The job's new ops, or a snapshot when due (it includes them)."""
        ops = job.ledger.take_journal()
        if job.journal_ops + len(ops) >= job.ops_per_snapshot:
            job.journal_ops = 0
            return ops, job.state()
        job.journal_ops += len(ops)
        return ops, None

    async def _durable(self, job: Job, snapshot: bool = False) -> None:
        """Returns once the job's changes are durable (raises LeadershipError, StateStoreError:
        the call fails UNAVAILABLE and the reader retries)."""
        ops, state = self._entry(job)
        if snapshot and state is None:
            job.journal_ops, state = 0, job.state()
        await self.journal.write(job.name, ops, state)

    def _submit(self, job: Job) -> None:
        ops, state = self._entry(job)
        try:
            self.journal.submit(job.name, ops, state)
        except StateStoreError as e:
            logger.error("job %r: %s", job.name, e)

    def _submit_soon(self, job: Job) -> None:
        """Hands the job's ops to the journal writer within PROGRESS_JOURNAL_S, with whatever
        else changed meanwhile: unanswered progress (each reader's, every second) is one
        hand-over per job per tick, not one per message (each woke the writer thread)."""
        if job.name in self._submit_due:
            return
        self._submit_due.add(job.name)

        def submit() -> None:
            self._submit_due.discard(job.name)
            if job.ledger.journal and self.journal.running:
                self._submit(job)
        asyncio.get_running_loop().call_later(PROGRESS_JOURNAL_S, submit)

    # -- waking -------------------------------------------------------------------------------
    def _wake(self, job: str) -> None:
        event = self._changed.pop(job, None)
        if event is not None:
            event.set()

    async def _wait_changed(self, job: str, timeout: float) -> None:
        event = self._changed.get(job)
        if event is None:
            event = self._changed[job] = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))
        except asyncio.TimeoutError:
            pass

    def _wake_watch(self, job: str, worker: str) -> None:
        event = self._watchers.get((job, worker))
        if event is not None:
            event.set()

    def _scope(self, context: grpc.aio.ServicerContext) -> str | None:
        """The one job this call's token may touch; None: any (the master's own token)."""
        if not self.job_scoped:
            return None
        return auth.job_of_call(context.invocation_metadata())

    # -- RPCs ---------------------------------------------------------------------------------
    @_answers
    async def OpenJob(self, request: pb.OpenJobRequest,
                      context: grpc.aio.ServicerContext) -> pb.OpenJobResponse:
        rules = self.core.check_open(request, self._scope(context))
        job = self.core.jobs.get(request.job)
        if job is None:
            manifest = await self._read_manifest(request.job, request.dataset,
                                                 request.dataset_version or None)
            job = self.core.jobs.get(request.job)  # another OpenJob may have won while we read
            if job is None:
                job = self.core.create_job(request, manifest, rules,
                                           secrets.token_bytes(TOKEN_KEY_BYTES))
                await self._durable(job, snapshot=True)
        response, changed = self.core.open_session(job, request, time.time())
        if changed:
            await self._durable(job)
        return response

    async def _read_manifest(self, job: str, dataset: str, version: int | None) -> Manifest:
        """The manifest of `dataset` (its `version`, None: the current one), read on a thread;
        readers joining at once share one read."""
        key = (job, dataset, version)
        reading = self._manifest_reads.get(key)
        if reading is None:
            reading = asyncio.ensure_future(asyncio.to_thread(
                read_manifest, self.config.storage, dataset, version))
            self._manifest_reads[key] = reading
            reading.add_done_callback(lambda _: self._manifest_reads.pop(key, None))
        return await asyncio.shield(reading)

    @_answers
    async def GetTasks(self, request: pb.GetTasksRequest,
                       context: grpc.aio.ServicerContext) -> pb.GetTasksResponse:
        return await self._grant(self.core.job(request.job, self._scope(context)), request)

    async def _grant(self, job: Job, request: pb.GetTasksRequest) -> pb.GetTasksResponse:
        """A GetTasks, asked by a call or on a Session stream (`get_tasks`): checks, applies
        its reports, leases (long-polling up to `wait_ms`), and returns once durable."""
        core = self.core
        held, revoked, changed, stopped = core.begin_get_tasks(job, request, time.time())
        if stopped is not None:
            if changed:
                await self._durable(job)
            return stopped
        epoch = request.epoch if request.epoch >= 0 else job.ledger.join_epoch()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + min(request.wait_ms, MAX_WAIT_MS) / 1000
        while True:
            now = time.time()
            result, leased = core.lease(job, request, epoch, now)
            if changed or leased:
                await self._durable(job)
                if leased:
                    self._wake(job.name)
                changed = False
            if (result.status is not LeaseStatus.WAIT or loop.time() >= give_up
                    or core.group_waits(job, request.worker_id, now)):
                break
            await self._wait_changed(job.name, give_up - loop.time())
        return core.end_get_tasks(job, request, held, revoked, result, epoch, time.time())

    @_answers
    async def Report(self, request: pb.ReportRequest,
                     context: grpc.aio.ServicerContext) -> pb.ReportResponse:
        job = self.core.job(request.job, self._scope(context))
        response, changed = self.core.report(job, request, time.time())
        if changed:
            await self._durable(job)
        return response

    @_answers
    async def LeaveJob(self, request: pb.LeaveJobRequest,
                       context: grpc.aio.ServicerContext) -> pb.LeaveJobResponse:
        job = self.core.job(request.job, self._scope(context))
        response, changed = self.core.leave(job, request, time.time())
        if changed:
            await self._durable(job)
        return response

    @_answers
    async def GetJobStatus(self, request: pb.GetJobStatusRequest,
                           context: grpc.aio.ServicerContext) -> pb.JobStatus:
        return self.core.status(self.core.job(request.job, self._scope(context)), time.time())

    async def Watch(self, request: pb.WatchRequest,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WatchEvent]:
        """One stream per reader session: its events as they arise. A second stream of the
        same session ends the first; the stream ends when the master stops."""
        try:
            job = self.core.job(request.job, self._scope(context))
            key = self.core.watch(job, request)
        except CallError as e:
            await context.abort(status_code(e), e.message, trailing_metadata=e.trailer)
            return
        wake = self._replace_watcher(key)
        try:
            # The first event: the stream is open (the reader may stop polling), and the epoch.
            yield pb.WatchEvent(current_epoch=job.ledger.epoch)
            while True:
                await wake.wait()
                wake.clear()
                if self._watchers.get(key) is not wake:
                    return
                for event in self.core.take_events(key):
                    yield event
        finally:
            self._drop_watcher(key, wake)

    def _replace_watcher(self, key: tuple[str, str]) -> asyncio.Event:
        """Registers a new stream of a reader session (Watch or Session) and returns the event
        that wakes it. An older stream of the same session is woken: it sees it was replaced
        and ends (a reconnecting reader never has two streams told the same thing)."""
        old = self._watchers.get(key)
        wake = self._watchers[key] = asyncio.Event()
        if old is not None:
            old.set()
        return wake

    def _drop_watcher(self, key: tuple[str, str], wake: asyncio.Event) -> None:
        """Forgets a stream that ended, unless a newer one of the session replaced it."""
        if self._watchers.get(key) is wake:
            del self._watchers[key]
            self.core.unwatch(key)

    async def Session(self, requests: AsyncIterator[pb.SessionMessage],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WatchEvent]:
        """Watch, plus the session's heartbeats and progress as messages of the same call: a
        reader that only heartbeats and reports progress costs stream messages, not calls.
        Each message renews the session's leases when it arrives (the stream's liveness alone
        renews nothing); one with a `seq` is answered once its changes are durable. Its first
        message names the session (PERMISSION_DENIED without its secret)."""
        opening = await anext(aiter(requests), None)
        if opening is None:
            return
        try:
            job = self.core.job(opening.open.job, self._scope(context))
            key = self.core.watch(job, opening.open)
        except CallError as e:
            await context.abort(status_code(e), e.message, trailing_metadata=e.trailer)
            return
        wake = self._replace_watcher(key)
        outbox = _Outbox(wake)
        reading = asyncio.ensure_future(self._read_session(job, opening.open, requests, outbox))
        try:
            yield pb.WatchEvent(current_epoch=job.ledger.epoch, grants=True)
            while True:
                await wake.wait()
                wake.clear()
                if self._watchers.get(key) is not wake:
                    return
                while outbox.answers:
                    yield outbox.answers.popleft()
                    outbox.sent()
                for event in self.core.take_events(key):
                    yield event
                if reading.done():
                    error = None if reading.cancelled() else reading.exception()
                    if error is not None and not isinstance(error, _REFUSALS):
                        logger.error("job %r: the Session stream of %s failed: %r", job.name,
                                     clip(key[1]), error)
                    if isinstance(error, _REFUSALS):
                        self.flush()
                        await context.abort(
                            status_code(error),
                            error.message if isinstance(error, CallError) else str(error),
                            trailing_metadata=error.trailer if isinstance(error, CallError)
                            else ())
                    return  # the reader closed its side
        finally:
            reading.cancel()
            self._drop_watcher(key, wake)

    async def _read_session(self, job: Job, opening: pb.WatchRequest,
                            requests: AsyncIterator[pb.SessionMessage], outbox: _Outbox) -> None:
        """Takes a Session stream's messages as they come, while fewer than MAX_UNSENT_ANSWERS
        of its answers are unsent; queues the answers in `outbox` (which wakes the writer,
        Session). Ends when the reader closes its side, or raises a refusal. A `get_tasks`
        message is a GetTasks of the stream's session, answered on the stream (each in a task of
        its own, so that a long-poll holds up none of the later messages; they end with the
        stream)."""
        worker = opening.worker_id
        granting: set[asyncio.Task[None]] = set()
        messages = aiter(requests)
        try:
            while True:
                await outbox.room.acquire()  # (released once this message's answer is sent)
                message = await anext(messages, None)
                if message is None:
                    return
                if message.HasField("get_tasks"):
                    if len(granting) >= MAX_GRANTS_IN_FLIGHT:
                        outbox.put(pb.WatchEvent(
                            current_epoch=job.ledger.epoch, answers=message.seq,
                            grant_refused=f"RESOURCE_EXHAUSTED: {len(granting)} GetTasks asked "
                                          f"on this stream are still unanswered (at most "
                                          f"{MAX_GRANTS_IN_FLIGHT}); make this one as a call"))
                        continue
                    task = asyncio.ensure_future(
                        self._grant_on_stream(job, opening, message, outbox))
                    granting.add(task)
                    task.add_done_callback(granting.discard)
                    continue
                answer, changed = self.core.session_message(job, worker, message, time.time())
                if changed:
                    if answer is None:
                        self._submit_soon(job)  # nobody waits for it: durable soon
                    else:
                        await self._durable(job)
                if answer is None:
                    outbox.room.release()
                else:
                    outbox.put(answer)
        finally:
            for task in granting:
                task.cancel()
            outbox.wake.set()

    async def _grant_on_stream(self, job: Job, opening: pb.WatchRequest,
                               message: pb.SessionMessage, outbox: _Outbox) -> None:
        """Answers a Session message's `get_tasks` as the GetTasks call it stands for (the
        stream's session; the same checks, fencing and durability), or, refused, with
        `grant_refused`: the reader then makes the call, and handles its refusal as ever."""
        request = pb.GetTasksRequest()
        request.CopyFrom(message.get_tasks)
        request.job, request.worker_id = job.name, opening.worker_id
        request.session_secret = opening.session_secret
        try:
            grant = await self._grant(job, request)
            event = pb.WatchEvent(current_epoch=job.ledger.epoch, answers=message.seq,
                                  grant=grant)
        except _REFUSALS as e:
            self.flush()  # (as a refused call: what it changed is made durable, not waited for)
            why = e.message if isinstance(e, CallError) else str(e)
            event = pb.WatchEvent(current_epoch=job.ledger.epoch, answers=message.seq,
                                  grant_refused=f"{status_code(e).name}: {why}")
        outbox.put(event)


class _Outbox:
    """The answers of one Session stream waiting for its writer, and the room left for more
    (MAX_UNSENT_ANSWERS): the stream's reader takes a slot before it takes a message, and the
    writer gives it back once the message's answer is sent (at once if it needs none). Local to
    the stream, so that all it holds goes when the stream ends or is cancelled."""

    def __init__(self, wake: asyncio.Event):
        self.answers: collections.deque[pb.WatchEvent] = collections.deque()
        self.room = asyncio.Semaphore(MAX_UNSENT_ANSWERS)
        self.wake = wake

    def put(self, answer: pb.WatchEvent) -> None:
        """Queues an answer (its message's slot is taken) and wakes the writer."""
        self.answers.append(answer)
        self.wake.set()

    def sent(self) -> None:
        """An answer went out: its slot is free for the next message."""
        self.room.release()
