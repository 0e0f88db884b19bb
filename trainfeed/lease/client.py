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
FAILED_PRECONDITION naming both, raised as ProtocolVersionError.

One conversation (protocol 3): after OpenJob a session speaks on its Session stream (`session`,
which the reader keeps open) and LeaveJob. `get_tasks` and `report` are that conversation in
short, for tools and tests: each opens an `exchange` stream with the session's secret, sends one
message, takes its answer and closes it (retried as a call is; an exchange takes none of the
session's events and leaves its own stream open). A decode worker's stream is `decoder_stream`.

Fencing: reports carry their lease's token. The master applies a message's reports from the
holder with its token and lists the others (`refused`); the answers `get_tasks` and `report`
return list them in `revoked` too, so the caller drops their undelivered records like any other
revoked lease.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TypeVar

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
# How often a cancellable exchange (a long-poll) checks whether its caller gave up on it.
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

    def _call(self, method: Callable[..., T], request: object, timeout: float,
              give_up_s: float | None = None) -> T:
        started = time.monotonic()
        give_up = self.give_up_s if give_up_s is None else give_up_s
        delay = 0.05
        logged = 0.0  # when the last "still unreachable" line was logged (monotonic)
        while True:
            try:
                return method(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                details = e.details()
                self._raise_if_final(e, details)
                waited = time.monotonic() - started
                if waited >= give_up:
                    raise MasterUnavailableError(
                        f"master {self.address} unreachable for {waited:.0f} s ({details}); "
                        f"is it running? (give-up time: ${GIVE_UP_ENV}={give_up:g})"
                        f"{self._unreachable_hint(details)}") from None
                if waited >= WAIT_LOG_S and time.monotonic() - logged >= WAIT_LOG_EVERY_S:
                    logged = time.monotonic()
                    logger.warning(
                        "master %s unreachable for %.0f s (%s); retrying until %s (give-up "
                        "time: $%s=%g)", self.address, waited, details,
                        wall_clock(time.time() + give_up - waited), GIVE_UP_ENV, give_up)
                time.sleep(random.uniform(0, delay))
                delay = min(delay * 2, MAX_BACKOFF_S)

    def _raise_if_final(self, error: grpc.RpcError, details: str | None) -> None:
        """Raises what no retry changes (a refused token, a refusal, a call the master will
        never take, this client's TLS settings); returns for what a retry may get past."""
        code = error.code()
        if code is grpc.StatusCode.UNAUTHENTICATED:
            sent = "a token" if self._metadata else "no token"
            raise AuthenticationError(
                f"master {self.address} refused the call, which carried {sent} "
                f"(UNAUTHENTICATED: {details})") from None
        if code is grpc.StatusCode.FAILED_PRECONDITION:
            self._refusal(error, details)
        if code not in _RETRYABLE or (code is grpc.StatusCode.RESOURCE_EXHAUSTED
                                      and _TOO_LARGE.search(details or "")):
            raise JobError(f"master {self.address}: {code.name}: {details}") from None
        if _TLS_REFUSED.search(details or ""):  # this client's settings: no retry helps
            raise ConfigurationError(
                f"master {self.address}: the TLS handshake failed ({details}); check "
                f"${TLS_CA_ENV} (the CA that signed the master's certificate) and "
                f"${TLS_SERVER_NAME_ENV} (a name that certificate holds)") from None

    def _refusal(self, error: grpc.RpcError, details: str | None) -> None:
        """Raises what a FAILED_PRECONDITION answer refused, where its trailers or text say
        (another protocol version, a taken rank, another delivery order); returns for any
        other, which the caller raises as a plain JobError."""
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
        """Leases tasks (a `get_tasks` exchange). `held`, when given, is every (epoch,
        partition, lease) the caller holds: the master then hands back any other lease it has on
        the caller (see the proto), and the answer's `revoked` lists those of them that are not
        the caller's any more, and the leases of refused `reports`. `started`: those of `held`
        the caller's trainer has begun (never asked back). `max_records` > 0: no more tasks
        than cover that many records (a synchronous quota). `stats`: the reader's figures since
        its last summary (issue 29). `abandoned`: checked every CANCEL_CHECK_S while the
        exchange is in flight; once true, it is cancelled and CallCancelled raised (a long-poll
        need not run its course)."""
        request = tasks_request(epoch, max_tasks, wait_ms, reports, held, max_records, started,
                                sync, stats)
        return self.call_get_tasks(job, worker, request, abandoned)

    def call_get_tasks(self, job: str, worker: str, request: pb.GetTasksRequest,
                       abandoned: Callable[[], bool] | None = None) -> pb.GetTasksResponse:
        """`request` (see `tasks_request`) as a `get_tasks` exchange of `worker`'s session."""
        answer = self._exchange(job, worker, pb.SessionMessage(seq=1, get_tasks=request),
                                CALL_TIMEOUT_S + request.wait_ms / 1000, abandoned)
        answer.grant.revoked.extend(answer.refused)
        return answer.grant

    def report(self, job: str, worker: str, reports: Iterable[pb.TaskReport] = (),
               held: Iterable[tuple[int, int, int]] = (),
               started: Collection[tuple[int, int, int]] = (),
               sync: pb.SyncGroup | None = None,
               stats: pb.ReaderStats | None = None) -> pb.WatchEvent:
        """Sends reports and renews this worker's leases (a heartbeat exchange); the answer's
        `revoked` lists the (epoch, partition, lease) of `held` that are not the caller's any
        more, and those of refused `reports` (also in `refused`). `started` and `stats` as for
        `get_tasks`."""
        answer = self._exchange(job, worker, session_message(1, reports, held, started, sync,
                                                             stats), CALL_TIMEOUT_S)
        answer.revoked.extend(answer.refused)
        return answer

    def session(self, job: str, worker: str, exchange: bool = False) -> SessionStream:
        """Opens the session's Session stream: its heartbeats, progress and requests for tasks
        as messages (`SessionStream.send`), and the master's answers and events. Not retried:
        the caller reopens a broken stream with the same secret. `exchange`: a stream for a few
        messages of this client's own, told none of the session's events."""
        return SessionStream(self._stub, self._metadata, pb.WatchRequest(
            job=job, worker_id=worker, session_secret=self.secret(job, worker),
            exchange=exchange))

    def decoder_stream(self, beats: Iterator[pb.SessionMessage]) -> SessionStream:
        """A decode worker's Session stream (issue 37): `beats` are its messages (the first
        registers it), the master's events come back. Not retried (trainfeed.decoder.registrar
        reopens it)."""
        return SessionStream(self._stub, self._metadata, beats)

    def _exchange(self, job: str, worker: str, message: pb.SessionMessage, timeout: float,
                  abandoned: Callable[[], bool] | None = None) -> pb.WatchEvent:
        """`message` (its `seq` set) on an `exchange` stream of `worker`'s session: its answer,
        retried like a call (a refused `get_tasks` raises as a refused call would)."""
        def exchange(request: pb.SessionMessage, timeout: float, metadata: object
                     ) -> pb.WatchEvent:
            stream = SessionStream(self._stub, metadata, pb.WatchRequest(
                job=job, worker_id=worker, session_secret=self.secret(job, worker),
                exchange=True), timeout)
            return _answer_of(stream, request, abandoned)
        return self._call(exchange, message, timeout)

    def leave_job(self, job: str, worker: str,
                  give_up_s: float | None = None) -> pb.LeaveJobResponse:
        """`give_up_s`: retry a master that does not answer no longer than this (default: the
        client's give-up time); a closing session bounds it by its hand-back deadline."""
        method: Callable[..., pb.LeaveJobResponse] = self._stub.LeaveJob
        return self._call(method, pb.LeaveJobRequest(
            job=job, worker_id=worker, session_secret=self.secret(job, worker)), CALL_TIMEOUT_S,
            give_up_s)

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


class SessionStream:
    """A Session call in flight: `send` queues a message for the master (never blocks), and
    iterating it yields the master's events. gRPC's blocking API takes the messages from a
    queue on a thread of its own. Thread-safe; `cancel()` ends the call and is idempotent."""

    def __init__(self, stub: master_pb2_grpc.MasterStub, metadata: object,
                 opening: pb.WatchRequest | Iterator[pb.SessionMessage],
                 timeout: float | None = None):
        """`opening`: a session's (its messages then come from `send`), or a decoder's
        messages themselves (`send` is not used)."""
        self._outbox: queue.SimpleQueue[pb.SessionMessage | None] = queue.SimpleQueue()
        if isinstance(opening, pb.WatchRequest):
            self._outbox.put(pb.SessionMessage(open=opening))
            messages: Iterator[pb.SessionMessage] = self._messages()
        else:
            messages = opening
        self._call = stub.Session(messages, metadata=metadata, timeout=timeout)
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


class _Refused(grpc.RpcError):  # type: ignore[misc]
    """A `grant_refused` answer (or a stream ended unanswered), raised as a refused call (its
    text starts with the status code's name), so that `_call` handles it as one."""

    def __init__(self, text: str):
        name, _, why = text.partition(": ")
        self._code = getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)
        self._details = why if self._code is not grpc.StatusCode.UNKNOWN else text
        super().__init__(text)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


def _answer_of(stream: SessionStream, message: pb.SessionMessage,
               abandoned: Callable[[], bool] | None) -> pb.WatchEvent:
    """Sends `message` on `stream` and returns its answer, then ends the stream. With
    `abandoned`, checked every CANCEL_CHECK_S: once true, the stream is cancelled and
    CallCancelled raised."""
    done = threading.Event()
    if abandoned is not None:
        if abandoned():
            stream.cancel()
            raise CallCancelled("the exchange was given up before it was made")

        def watch() -> None:
            while not done.wait(CANCEL_CHECK_S):
                if abandoned():
                    stream.cancel()
                    return
        threading.Thread(target=watch, name="trainfeed-exchange-cancel", daemon=True).start()
    try:
        stream.send(message)
        for event in stream:
            if event.answers == message.seq:
                if event.grant_refused:
                    raise _Refused(event.grant_refused)
                return event
        raise _Refused("UNAVAILABLE: the master ended the stream before it answered")
    except grpc.RpcError as e:
        if abandoned is not None and abandoned() and not isinstance(e, _Refused):
            raise CallCancelled("the exchange was cancelled: its caller gave up on it") from None
        raise
    finally:
        done.set()
        stream.cancel()


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
