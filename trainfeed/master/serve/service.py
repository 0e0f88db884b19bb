"""The gRPC servicer of the master: a thin shell around the pure core (coordinator.py).

What the shell does, and nothing else: it reads the clock and the call's scope, calls the
coordinator, maps its refusals to status codes (STATUS_CODES, the one table), hands the ledgers'
ops to the journal writer (trainfeed.master.serve.journal) and answers only once they are
durable, holds long-polls and Session streams open, and reads manifests off the event loop.

Runs on one asyncio event loop, so the coordinator needs no locks. The journal writer commits the
ops of every call of a tick in one store transaction, off the loop; each job is snapshotted once
its journal is about twice as long as it has partitions (so replaying a journal after a restart
costs about as much as reading a snapshot, and a snapshot's O(partitions) cost is amortized over
as many calls). After OpenJob a reader session speaks one conversation, its Session stream (issue
36; unary calls cost the master about 0.7-1.5 ms each, a stream message a fraction of that): its
heartbeats and progress, its requests for tasks (`get_tasks`), and what it must be told between
its own messages (give-backs, revocations, the end of an epoch, a broken group, being superseded).
A `get_tasks` long-polls: when the epoch's remaining partitions are leased to others it waits (up
to the message's `wait_ms`) for a change (a report, an expiry, a leave) instead of making readers
spin.

Trust: a report counts only from the partition's current lease holder with the lease's fencing
token (Ledger.check_report). Any other report is refused: it changes nothing, the answer lists it
(`refused`; a grant's `revoked`), and it is counted and logged with a rate limit; partition ids and
epochs that cannot exist get INVALID_ARGUMENT. Every stream of a reader session (and its LeaveJob)
carries the secret its OpenJob gave it
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
from trainfeed.master.core.reader_stats import ReaderBoard
from trainfeed.master.serve import auth, convert
from trainfeed.master.serve.decoder_autoscaler import DecoderAutoscaler
from trainfeed.master.serve.journal import JournalWriter
from trainfeed.master.serve.streams import (
    MAX_GRANTS_IN_FLIGHT,
    MAX_UNSENT_ANSWERS,
    MAX_WAIT_MS,
    Streams,
)
from trainfeed.master.stores import StateStore
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

__all__ = ["DEFAULT_LEASE_TIMEOUT_S", "MAX_GRANTS_IN_FLIGHT", "MAX_UNSENT_ANSWERS", "MAX_WAIT_MS",
           "RESTART_GRACE_LEASES", "STATUS_CODES",
           "Job", "JobStats", "MasterConfig", "MasterServicer"]

logger = logging.getLogger(__name__)

# Progress that no reader waits for (unanswered Session messages) reaches the journal writer at
# most this long after it came (then durable a journal tick later): 200 readers' progress is then
# ~20 hand-overs a second, not 200. A master killed meanwhile loses at most this much progress,
# which a reader re-delivers (the contract: progress at most PROGRESS_INTERVAL_S old).
PROGRESS_JOURNAL_S = 0.05
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
        self.streams = Streams(self, status_code, _REFUSALS)
        self.journal = JournalWriter(store, on_leadership_lost)
        # Manifest reads in flight for jobs being created, so that workers joining a new job
        # at once share one read instead of each reading a (possibly large) manifest again.
        self._manifest_reads: dict[tuple[str, str, int | None],
                                  asyncio.Future[Manifest]] = {}
        # Long-polls wait on their job's event.
        self._changed: dict[str, asyncio.Event] = {}
        # Jobs whose unanswered progress is handed to the journal writer soon (_submit_soon).
        self._submit_due: set[str] = set()
        # Set by the server when calls carry tokens: a job token's call may touch its job only.
        self.job_scoped = False
        # The jobs whose decoders this master scales (--scale-decoders; issue 37), by job.
        self.decoder_scalers: dict[str, DecoderAutoscaler] = {}

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
        self.streams.deliver(self.core.news.take())

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

    async def durable(self, job: Job, snapshot: bool = False) -> None:
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

    def submit_soon(self, job: Job) -> None:
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

    async def wait_changed(self, job: str, timeout: float) -> None:
        event = self._changed.get(job)
        if event is None:
            event = self._changed[job] = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))
        except asyncio.TimeoutError:
            pass

    def scope(self, context: grpc.aio.ServicerContext) -> str | None:
        """The one job this call's token may touch; None: any (the master's own token)."""
        if not self.job_scoped:
            return None
        return auth.job_of_call(context.invocation_metadata())

    # -- RPCs ---------------------------------------------------------------------------------
    @_answers
    async def OpenJob(self, request: pb.OpenJobRequest,
                      context: grpc.aio.ServicerContext) -> pb.OpenJobResponse:
        asked = convert.open_job(request)
        rules = self.core.check_open(asked, self.scope(context))
        job = self.core.jobs.get(asked.job)
        if job is None:
            manifest = await self._read_manifest(asked.job, asked.dataset,
                                                 asked.dataset_version or None)
            job = self.core.jobs.get(asked.job)  # another OpenJob may have won while we read
            if job is None:
                job = self.core.create_job(asked, manifest, rules,
                                           secrets.token_bytes(TOKEN_KEY_BYTES))
                await self.durable(job, snapshot=True)
        opened, changed = self.core.open_session(job, asked, time.time())
        self.streams.deliver(self.core.news.take())
        if changed:
            await self.durable(job)
        return convert.opened(opened)

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
    async def LeaveJob(self, request: pb.LeaveJobRequest,
                       context: grpc.aio.ServicerContext) -> pb.LeaveJobResponse:
        job = self.core.job(request.job, self.scope(context))
        released = self.core.leave(job, convert.leave(request), time.time())
        if released:
            await self.durable(job)
        return pb.LeaveJobResponse(released_tasks=released)

    @_answers
    async def GetJobStatus(self, request: pb.GetJobStatusRequest,
                           context: grpc.aio.ServicerContext) -> pb.JobStatus:
        job = self.core.job(request.job, self.scope(context))
        return convert.job_status(self.core.status(job, time.time()))

    async def Session(self, requests: AsyncIterator[pb.SessionMessage],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.WatchEvent]:
        """The one conversation of a reader session after OpenJob (trainfeed.master.serve.
        streams): its heartbeats, progress and requests for tasks, each answered once its
        changes are durable, and the session's events between them."""
        stream = self.streams.serve(requests, context)
        try:
            async for event in stream:
                yield event
        finally:
            await stream.aclose()  # (its cleanup runs now, not when it is collected)
