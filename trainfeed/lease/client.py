"""A blocking client of the master that rides through restarts.

Every call retries the transient statuses (UNAVAILABLE: master restarting or network blip;
DEADLINE_EXCEEDED: master stalled; RESOURCE_EXHAUSTED: master overloaded; ABORTED, CANCELLED: a call
cut by a stopping master) with exponential backoff capped at MAX_BACKOFF_S and full jitter, so a
fleet of readers does not hammer a master that comes back; after `give_up_s` it raises
MasterUnavailableError naming the address. The channel itself reconnects at most RECONNECT_MS after
an attempt failed (gRPC's default backoff grows to 120 s: readers came back up to 34 s after the
master did). Other errors are the master's answer and raise at once.

Sessions: `open_job` keeps the session secret the master answers with (never logged), and every
later call of that worker id carries it (issue 25: a job token alone must not let a caller act as
another reader).

Versions: OpenJob carries PROTOCOL_VERSION; a master speaking another one refuses with
FAILED_PRECONDITION naming both, raised as ProtocolVersionError. A master from before versioning
answers 0 and is not refused here: it lacks only Watch, which the session does without (polling).

Fencing: reports carry their lease's token. When the master refuses some (FAILED_PRECONDITION: this
reader no longer holds their lease), the call is retried at once without them, and the answer's
`revoked` lists them, so the caller drops their undelivered records like any other revoked lease.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import random
import re
import socket
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Protocol, TypeVar

import grpc

from trainfeed import settings
from trainfeed.errors import (
    AuthenticationError,
    CallCancelled,
    ConfigurationError,
    DeliveryOrderError,
    JobError,
    MasterUnavailableError,
    ProtocolVersionError,
    RankTakenError,
)
from trainfeed.lease.resources import detect_resources
from trainfeed.protocol import PROTOCOL_VERSION
from trainfeed.security import (
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TLS_SERVER_NAME_ENV,
    ClientSecurity,
)
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

MASTER_ENV = settings.MASTER.name
GIVE_UP_ENV = settings.MASTER_GIVE_UP_S.name
DEFAULT_GIVE_UP_S = settings.MASTER_GIVE_UP_S.default
# Per-call deadline on top of any long-poll wait the call asks for.
CALL_TIMEOUT_S = 10.0
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
              grpc.StatusCode.CANCELLED)
# RESOURCE_EXHAUSTED for a message over the size limit is this call's fault, and a job full of
# reader sessions an operator's setting (--max-sessions): no quick retry helps either.
_TOO_LARGE = re.compile(r"larger than max|message length|live reader sessions", re.IGNORECASE)
# Backoff between retries grows from 50 ms to this (with full jitter): a master that is back is
# found within about a second.
MAX_BACKOFF_S = 1.0
# The channel's own reconnect backoff, bounded the same way (gRPC's default grows to 120 s).
RECONNECT_MS = 1000
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", RECONNECT_MS))
# The longest worker name the master accepts (trainfeed.master.core.sessions.MAX_WORKER_NAME_BYTES).
WORKER_NAME_MAX_BYTES = 256
# The master lists refused reports here (trainfeed.master.serve.service.REFUSED_TRAILER).
REFUSED_TRAILER = "trainfeed-refused-bin"
# How gRPC reports, under UNAVAILABLE, that this client rejected the master's certificate.
# (A master that refuses this client's certificate just closes the connection: "Socket closed".)
_TLS_REFUSED = re.compile(r"verification check failed|certificate", re.IGNORECASE)
# Which refusal a FAILED_PRECONDITION OpenJob answer is (trainfeed.master.core.admission), and for a
# taken rank how long its holder has been quiet and may stay quiet before it is presumed dead.
REFUSAL_TRAILER = "trainfeed-refusal"
RANK_QUIET_TRAILER = "trainfeed-rank-quiet-s"
RANK_LAPSE_TRAILER = "trainfeed-rank-lapse-s"
_REFUSALS: dict[str, type[JobError]] = {"rank-taken": RankTakenError,
                                        "delivery-order": DeliveryOrderError}
# A FAILED_PRECONDITION refusal of OpenJob for the protocol version: its trailer kind, or (from a
# master that sets none) its text; the master's version may come in a trailer of its own.
PROTOCOL_REFUSAL = "protocol-version"
PROTOCOL_TRAILER = "trainfeed-protocol-version"
_VERSION_TEXT = re.compile(r"protocol[ _-]?version|wire protocol", re.IGNORECASE)
_MASTER_VERSION = re.compile(r"master speaks (?:wire protocol |protocol version |version )?(\d+)",
                             re.IGNORECASE)
# A call retried this long logs what it waits for and until when (then every WAIT_LOG_EVERY_S):
# no wait longer than that is silent.
WAIT_LOG_S = 5.0
WAIT_LOG_EVERY_S = 30.0
# A claim on a synchronous rank whose holder went quiet (a process restarted in its place) is
# retried this often until the holder's claim lapses; a holder heard from meanwhile is alive.
RANK_RETRY_S = 0.5
# What gRPC says when the connection closed during or instead of a TLS handshake (a plaintext
# client at a TLS master: "Socket closed"; a TLS client at a plaintext one: "handshake",
# "WRONG_VERSION_NUMBER"), as opposed to a master that is not there ("Connection refused").
_TLS_MISMATCH = re.compile(r"socket closed|handshake|ssl|tls|wrong_version|end of file",
                           re.IGNORECASE)
# How often a cancellable call (a long-poll) checks whether its caller gave up on it.
CANCEL_CHECK_S = 0.1
logger = logging.getLogger(__name__)
T = TypeVar("T")


def unreachable_hint(details: str | None, security: ClientSecurity) -> str:
    """What to set when an UNAVAILABLE call's `details` look like a TLS mismatch, else "".

    A master that closes the connection at once may want TLS, or a client certificate; one that
    refuses the connection is not there, whatever it serves (no hint: it would mislead)."""
    if not _TLS_MISMATCH.search(details or ""):
        return ""
    if not security.tls:
        return f"; if it serves TLS, set ${TLS_CA_ENV}"
    return (f"; if it requires client certificates, set ${TLS_CERT_ENV} and ${TLS_KEY_ENV} "
            f"to one that its --tls-client-ca signed")


def default_master_address() -> str:
    address = settings.MASTER.get()
    if not address:
        raise MasterUnavailableError(
            f"${MASTER_ENV} is not set: set it to the master's host:port (e.g. localhost:50051), "
            f"or set TRAIN_LOCAL=1 to read from storage without a master")
    return address


class MasterClient:
    """One channel to the master. Thread-safe (gRPC channels and stubs are); close() idempotent.

    Credentials: `security` (by default from the environment: `$TRAINFEED_TOKEN` or
    `$TRAINFEED_TOKEN_FILE`, and `$TRAINFEED_TLS_*`, see trainfeed.security); `token`, if given,
    replaces its token. A refused token raises AuthenticationError at once (never retried).
    """

    def __init__(self, address: str | None = None, give_up_s: float | None = None,
                 token: str | None = None, security: ClientSecurity | None = None):
        self.address = address or default_master_address()
        self.give_up_s = give_up_s if give_up_s is not None else settings.MASTER_GIVE_UP_S.get()
        if security is None:
            security = ClientSecurity.from_env(token=token)
        elif token is not None:
            security = dataclasses.replace(security, token=token)
        self.security = security
        self._metadata = security.metadata
        self._channel = security.open_channel(self.address, CHANNEL_OPTIONS)
        self.closed = False  # set by close(): a call after it cannot be made
        # The generated stub is untyped: each call names its answer's type (`Callable[..., T]`).
        self._stub = master_pb2_grpc.MasterStub(self._channel)  # type: ignore[no-untyped-call]
        # (job, worker id) -> the secret its OpenJob answer gave: sent with its every call.
        self._secrets: dict[tuple[str, str], str] = {}

    def _call(self, method: Callable[..., T], request: object, timeout: float) -> T:
        started = time.monotonic()
        delay = 0.05
        logged = 0.0  # when the last "still unreachable" line was logged (monotonic)
        while True:
            try:
                return method(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                code = e.code()
                details = e.details()
                if code is grpc.StatusCode.UNAUTHENTICATED:
                    sent = "a token" if self._metadata else "no token"
                    raise AuthenticationError(
                        f"master {self.address} refused the call, which carried {sent} "
                        f"(UNAUTHENTICATED: {details})") from None
                if code is grpc.StatusCode.FAILED_PRECONDITION:
                    self._refusal(e, details)
                if code not in _RETRYABLE or (code is grpc.StatusCode.RESOURCE_EXHAUSTED
                                              and _TOO_LARGE.search(details or "")):
                    raise JobError(f"master {self.address}: {code.name}: {details}") from None
                if _TLS_REFUSED.search(details or ""):  # this client's settings: no retry helps
                    raise ConfigurationError(
                        f"master {self.address}: the TLS handshake failed ({details}); check "
                        f"${TLS_CA_ENV} (the CA that signed the master's certificate) and "
                        f"${TLS_SERVER_NAME_ENV} (a name that certificate holds)") from None
                waited = time.monotonic() - started
                if waited >= self.give_up_s:
                    raise MasterUnavailableError(
                        f"master {self.address} unreachable for {waited:.0f} s ({details}); "
                        f"is it running? (give-up time: ${GIVE_UP_ENV}={self.give_up_s:g})"
                        f"{self._unreachable_hint(details)}") from None
                if waited >= WAIT_LOG_S and time.monotonic() - logged >= WAIT_LOG_EVERY_S:
                    logged = time.monotonic()
                    logger.warning(
                        "master %s unreachable for %.0f s (%s); retrying until %s (give-up "
                        "time: $%s=%g)", self.address, waited, details,
                        wall_clock(time.time() + self.give_up_s - waited), GIVE_UP_ENV,
                        self.give_up_s)
                time.sleep(random.uniform(0, delay))
                delay = min(delay * 2, MAX_BACKOFF_S)

    def _fenced(self, method: Callable[..., T], request: pb.GetTasksRequest | pb.ReportRequest,
                timeout: float) -> T:
        """`_call`, retried at once without the reports the master refused; the answer's
        `revoked` then also lists those."""
        refused: list[pb.HeldTask] = []
        while True:
            try:
                response = self._call(method, request, timeout)
            except _Refused as e:
                gone = {(t.epoch, t.partition, t.lease) for t in e.refused}
                kept = [r for r in request.reports
                        if (r.epoch, r.partition, r.lease) not in gone]
                if len(kept) == len(request.reports):  # refused what we did not send?
                    raise JobError(f"master {self.address}: FAILED_PRECONDITION: "
                                   f"{e.details}") from None
                refused.extend(e.refused)
                del request.reports[:]
                request.reports.extend(kept)
                continue
            response.revoked.extend(refused)  # type: ignore[attr-defined]
            return response

    def _refusal(self, error: grpc.RpcError, details: str | None) -> None:
        """Raises what a FAILED_PRECONDITION answer refused, where its trailers or text say
        (refused reports, another protocol version, a taken rank, another delivery order);
        returns for any other, which the caller raises as a plain JobError."""
        refused = _refused(error)
        if refused:
            raise _Refused(refused, details) from None
        kind = _trailer(error, REFUSAL_TRAILER)
        if kind == PROTOCOL_REFUSAL or (kind is None and _VERSION_TEXT.search(details or "")):
            raise self._version_error(error, details) from None
        if kind in _REFUSALS:
            refusal = _REFUSALS[kind](f"master {self.address}: {details}")
            if kind == "rank-taken":
                raise _RankTaken(refusal, float(_trailer(error, RANK_QUIET_TRAILER) or 0),
                                 float(_trailer(error, RANK_LAPSE_TRAILER) or 0)) from None
            raise refusal from None

    def _version_error(self, error: grpc.RpcError, details: str | None) -> ProtocolVersionError:
        theirs = _trailer(error, PROTOCOL_TRAILER)
        said = _MASTER_VERSION.search(details or "")
        theirs = theirs or (said.group(1) if said else None)
        master = f"the master speaks version {theirs}" if theirs else "the master another"
        return ProtocolVersionError(
            f"master {self.address} refused this reader's wire protocol: this reader speaks "
            f"version {PROTOCOL_VERSION}, {master} (FAILED_PRECONDITION: {details}); install "
            f"the same trainfeed release on the readers and the master")

    def _unreachable_hint(self, details: str | None) -> str:
        return unreachable_hint(details, self.security)

    def open_job(self, job: str, dataset: str, seed: int, distribution_rules: str = "",
                 resume: pb.ResumePosition | None = None,
                 sync: pb.SyncGroup | None = None,
                 order: pb.DeliveryOrder | None = None,
                 dataset_version: int = 0) -> pb.OpenJobResponse:
        """Joins `job`. `order`: what shapes this reader's delivery order (a reader whose order
        differs from the job's raises DeliveryOrderError). A synchronous rank (`sync`) held by a
        live reader raises RankTakenError; one whose holder went quiet (a restarted process in
        its place) is claimed again until the holder's claim lapses. `dataset_version`: the
        version to read (0: the job's; a job of another one refuses, JobError naming both)."""
        name = f"{socket.gethostname()}:{os.getpid()}"
        if sync is not None:
            name = f"rank{sync.rank}-{name}"
        # The master refuses names over 256 bytes or not printable ASCII (a very long FQDN).
        name = "".join(c if c.isascii() and c.isprintable() else "?" for c in name)
        name = name[:WORKER_NAME_MAX_BYTES]
        request = pb.OpenJobRequest(
            job=job, dataset=dataset, worker_name=name, seed=seed,
            distribution_rules=distribution_rules, resources=detect_resources(),
            resume=resume, sync=sync, order=order, protocol_version=PROTOCOL_VERSION,
            dataset_version=dataset_version)
        holder_heard: float | None = None  # when the rank's holder was last heard (wall clock)
        logged = False
        while True:
            try:
                open_job: Callable[..., pb.OpenJobResponse] = self._stub.OpenJob
                opened = self._call(open_job, request, CALL_TIMEOUT_S)
            except _RankTaken as e:
                heard = time.time() - e.quiet_s
                if holder_heard is not None and heard > holder_heard + RANK_RETRY_S:
                    raise e.error from None  # heard from since: a live process holds the rank
                holder_heard = heard if holder_heard is None else holder_heard
                if not logged:
                    logged = True
                    logger.warning("%s; waiting until %s to see whether its holder is alive",
                                   e.error, wall_clock(time.time() + e.lapse_s))
                time.sleep(min(RANK_RETRY_S, max(0.05, e.lapse_s)))
                continue
            self._secrets[(opened.job, opened.worker_id)] = opened.session_secret
            return opened

    def secret(self, job: str, worker: str) -> str:
        """The session secret of `worker` ("" for a worker this client did not open)."""
        return self._secrets.get((job, worker), "")

    def get_tasks(self, job: str, worker: str, epoch: int, max_tasks: int, wait_ms: int,
                  reports: Iterable[pb.TaskReport] = (),
                  held: Iterable[tuple[int, int, int]] | None = None,
                  max_records: int = 0,
                  started: Collection[tuple[int, int, int]] = (),
                  sync: pb.SyncGroup | None = None,
                  stats: pb.ReaderStats | None = None,
                  abandoned: Callable[[], bool] | None = None) -> pb.GetTasksResponse:
        """Leases tasks. `held`, when given, is every (epoch, partition, lease) the caller holds:
        the master then hands back any other lease it has on the caller (see the proto), and
        the answer's `revoked` lists those of them that are not the caller's any more.
        `started`: those of `held` the caller's trainer has begun (never asked back).
        `max_records` > 0: no more tasks than cover that many records (a synchronous quota).
        `stats`: the reader's figures since its last summary (issue 29), riding on the call.
        `abandoned`: checked every CANCEL_CHECK_S while the call is in flight; once true, the
        call is cancelled and CallCancelled raised (a long-poll need not run its course)."""
        request = tasks_request(epoch, max_tasks, wait_ms, reports, held, max_records, started,
                                sync, stats)
        return self.call_get_tasks(job, worker, request, abandoned)

    def call_get_tasks(self, job: str, worker: str, request: pb.GetTasksRequest,
                       abandoned: Callable[[], bool] | None = None) -> pb.GetTasksResponse:
        """`request` (see `tasks_request`) as a GetTasks call of `worker`'s session."""
        method: Callable[..., pb.GetTasksResponse] = self._stub.GetTasks
        if abandoned is not None:
            method = _cancellable(self._stub.GetTasks, abandoned)
        request.job, request.worker_id = job, worker
        request.session_secret = self.secret(job, worker)
        return self._fenced(method, request, CALL_TIMEOUT_S + request.wait_ms / 1000)

    def report(self, job: str, worker: str, reports: Iterable[pb.TaskReport] = (),
               held: Iterable[tuple[int, int, int]] = (),
               started: Collection[tuple[int, int, int]] = (),
               sync: pb.SyncGroup | None = None,
               stats: pb.ReaderStats | None = None) -> pb.ReportResponse:
        """Sends reports and renews this worker's leases; the answer's `revoked` lists the
        (epoch, partition, lease) of `held` that are not the caller's any more. `started` and
        `stats` as for `get_tasks`."""
        method: Callable[..., pb.ReportResponse] = self._stub.Report
        return self._fenced(method, pb.ReportRequest(
            job=job, worker_id=worker, session_secret=self.secret(job, worker),
            reports=list(reports), held=_held_tasks(held, started), sync=sync, stats=stats),
            CALL_TIMEOUT_S)

    def watch(self, job: str, worker: str) -> WatchStream:
        """Opens the session's Watch stream: what the master tells this reader between its own
        calls (give-backs, revocations, epoch ends, group changes). Not retried: the caller
        reopens a broken stream (see WorkerSession), and `cancel()` ends it."""
        return self._stub.Watch(  # type: ignore[no-any-return]
            pb.WatchRequest(job=job, worker_id=worker, session_secret=self.secret(job, worker)),
            metadata=self._metadata)

    def session(self, job: str, worker: str) -> SessionStream:
        """Opens the session's Session stream: Watch, plus this reader's heartbeats and progress
        as messages (`SessionStream.send`) instead of Report calls. Not retried: the caller
        reopens a broken stream; a master without it answers UNIMPLEMENTED (use `watch`)."""
        return SessionStream(self._stub, self._metadata, pb.WatchRequest(
            job=job, worker_id=worker, session_secret=self.secret(job, worker)))

    def leave_job(self, job: str, worker: str) -> pb.LeaveJobResponse:
        method: Callable[..., pb.LeaveJobResponse] = self._stub.LeaveJob
        return self._call(method, pb.LeaveJobRequest(
            job=job, worker_id=worker, session_secret=self.secret(job, worker)), CALL_TIMEOUT_S)

    def job_status(self, job: str) -> pb.JobStatus:
        method: Callable[..., pb.JobStatus] = self._stub.GetJobStatus
        return self._call(method, pb.GetJobStatusRequest(job=job), CALL_TIMEOUT_S)

    def close(self) -> None:
        self.closed = True
        self._channel.close()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WatchStream(Protocol):
    """A Watch call in flight (a grpc server-streaming call): iterate it for events."""

    def __iter__(self) -> Iterator[pb.WatchEvent]: ...

    def initial_metadata(self) -> object:
        """Blocks until the master accepted the stream (or the call ended)."""
        ...

    def cancel(self) -> bool: ...


class SessionStream:
    """A Session call in flight: `send` queues a message for the master (never blocks), and
    iterating it yields the master's events. gRPC's blocking API takes the messages from a
    queue on a thread of its own. Thread-safe; `cancel()` ends the call and is idempotent."""

    def __init__(self, stub: master_pb2_grpc.MasterStub, metadata: object,
                 opening: pb.WatchRequest):
        self._outbox: queue.SimpleQueue[pb.SessionMessage | None] = queue.SimpleQueue()
        self._outbox.put(pb.SessionMessage(open=opening))
        self._call = stub.Session(self._messages(), metadata=metadata)
        self.cancelled = False

    def _messages(self) -> Iterator[pb.SessionMessage]:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            yield message

    def send(self, message: pb.SessionMessage) -> None:
        """Queues `message`. One sent on a call that ended is lost: the caller waits for the
        answers it needs, and treats one that does not come as a broken stream."""
        self._outbox.put(message)

    def __iter__(self) -> Iterator[pb.WatchEvent]:
        return iter(self._call)

    def initial_metadata(self) -> object:
        """Blocks until the master accepted the stream (or the call ended)."""
        return self._call.initial_metadata()

    def cancel(self) -> bool:
        self.cancelled = True
        self._outbox.put(None)
        return bool(self._call.cancel())


def _cancellable(method: grpc.UnaryUnaryMultiCallable,
                 abandoned: Callable[[], bool]) -> Callable[..., pb.GetTasksResponse]:
    """`method`, called as a future that is cancelled once `abandoned()` (checked every
    CANCEL_CHECK_S); raises CallCancelled then."""
    def call(request: object, timeout: float, metadata: object) -> pb.GetTasksResponse:
        if abandoned():
            raise CallCancelled("the call was given up before it was made")
        future = method.future(request, timeout=timeout, metadata=metadata)
        while True:
            try:
                return future.result(timeout=CANCEL_CHECK_S)  # type: ignore[no-any-return]
            except grpc.FutureTimeoutError:
                if abandoned():
                    future.cancel()
                    raise CallCancelled("the call was cancelled: its caller gave up on it") \
                        from None
            except grpc.FutureCancelledError:
                raise CallCancelled("the call was cancelled") from None
    return call


class _Refused(Exception):
    """The master refused some of a call's reports (FAILED_PRECONDITION): not this reader's."""

    def __init__(self, refused: list[pb.HeldTask], details: str | None):
        super().__init__(details)
        self.refused = refused
        self.details = details


class _RankTaken(Exception):
    """OpenJob refused a synchronous rank that another reader holds: `error` to raise, unless
    its holder stays quiet `lapse_s` more seconds (it was quiet `quiet_s`)."""

    def __init__(self, error: JobError, quiet_s: float, lapse_s: float):
        super().__init__(str(error))
        self.error, self.quiet_s, self.lapse_s = error, quiet_s, lapse_s


def _trailer(error: grpc.RpcError, key: str) -> str | None:
    """A text value of an error's trailing metadata."""
    trailing = getattr(error, "trailing_metadata", None)
    for name, value in (trailing() if callable(trailing) else None) or ():
        if name == key:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def wall_clock(unix: float) -> str:
    """A wall-clock time for a log line: 23:05:17."""
    return time.strftime("%H:%M:%S", time.localtime(unix))


def _refused(error: grpc.RpcError) -> list[pb.HeldTask]:
    """The reports a FAILED_PRECONDITION answer lists in its REFUSED_TRAILER metadata."""
    trailing = getattr(error, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == REFUSED_TRAILER and isinstance(value, bytes):
            return list(pb.RefusedReports.FromString(value).reports)
    return []


def session_message(seq: int, reports: Iterable[pb.TaskReport],
                    held: Iterable[tuple[int, int, int]],
                    started: Collection[tuple[int, int, int]], sync: pb.SyncGroup | None,
                    stats: pb.ReaderStats | None) -> pb.SessionMessage:
    """A heartbeat or progress message of a Session stream (`seq` > 0: to be answered)."""
    return pb.SessionMessage(seq=seq, report=pb.ReportRequest(
        reports=list(reports), held=_held_tasks(held, started), sync=sync, stats=stats))


def tasks_request(epoch: int, max_tasks: int, wait_ms: int, reports: Iterable[pb.TaskReport],
                  held: Iterable[tuple[int, int, int]] | None, max_records: int,
                  started: Collection[tuple[int, int, int]], sync: pb.SyncGroup | None,
                  stats: pb.ReaderStats | None) -> pb.GetTasksRequest:
    """A GetTasks request without its session (job, worker id, secret): the arguments mean
    what they mean for `MasterClient.get_tasks`. Sent as a call or as a Session message."""
    return pb.GetTasksRequest(
        epoch=epoch, max_tasks=max_tasks, wait_ms=wait_ms, reports=list(reports),
        reconcile=held is not None, max_records=max_records,
        held=_held_tasks(held or (), started), sync=sync, stats=stats)


def _held_tasks(held: Iterable[tuple[int, int, int]],
                started: Collection[tuple[int, int, int]]) -> list[pb.HeldTask]:
    return [pb.HeldTask(epoch=e, partition=p, lease=t, started=(e, p, t) in started)
            for e, p, t in held]
