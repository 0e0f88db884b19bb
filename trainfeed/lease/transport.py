"""A reader session's one conversation with the master: its Session stream (issue 36).

After OpenJob, everything a reader and the master say to each other goes on this stream: the
reader's heartbeats, progress, DONE/FAILED/RELEASED reports and requests for tasks (messages), the
master's answers to them and what it tells the reader on its own (give-backs, revocations, epoch
ends, group changes, supersession: events). There is no other dialect to fall back to.

`Transport` owns the stream: it opens it with the session's secret (MasterClient.session), reads
its events on a thread of its own, hands each answer to the caller waiting for it (`ask`) and
every other event to `on_event`, and reopens a broken stream with backoff (full jitter, so that the
readers of a restarted master do not come back in step). Fencing does not depend on the stream:
what the master answers is applied by the caller, through the lease book, and a message whose
answer was lost with the stream is sent again on the next one (the master takes a repeated report
as a REPEAT, and a request for tasks lists the leases held, so that the master takes back any it
granted in an answer that never came). When a stream breaks, `on_break` runs (the session re-sends
its progress, which went unanswered).

No silent waits (issue 26): a stream down for WAIT_LOG_S logs why and until when it is reopened
(again every WAIT_LOG_EVERY_S), an answer later than WAIT_LOG_S past its expected time logs what it
waits for and until when; a stream down for the client's give-up time ends the session
(MasterUnavailableError, as an unreachable master's calls raise).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import grpc

from trainfeed.errors import (
    AuthenticationError,
    CallCancelled,
    JobError,
    MasterUnavailableError,
)
from trainfeed.lease.client import GIVE_UP_ENV, MasterClient, SessionStream, wall_clock
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)

# A broken stream is reopened after a backoff growing from RETRY_MIN_S to RETRY_MAX_S (with full
# jitter); a stream that lived HEALTHY_S starts the backoff afresh. The stream is the reader's only
# way to the master, so the bound is the client's own retry bound (MAX_BACKOFF_S, 1 s): a master
# that is back is found within about a second.
RETRY_MIN_S = 0.05
RETRY_MAX_S = 1.0
HEALTHY_S = 10.0
# A wait this long logs what it waits for and until when, then every WAIT_LOG_EVERY_S (issue 26).
WAIT_LOG_S = 5.0
WAIT_LOG_EVERY_S = 30.0
# How often a waiting caller checks whether it gave up (a long-poll of an abandoned pass).
CHECK_S = 0.1
# A stream refused with one of these is not reopened: no retry changes the master's answer (the
# job is gone, the session's secret is not the master's, the token is refused, no Session rpc).
_FATAL = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
          grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
          grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED)

EventHook = Callable[[pb.WatchEvent], object]


class Transport:
    """The Session stream of one reader session, kept open from `start()` to `close()`.

    Thread-safe. `cond` is the session's condition: the transport waits on it and notifies it
    when the stream comes up, breaks, or an answer arrives, so that a session waiting for any of
    these under its own lock wakes. `on_event` gets every event that answers no message (on the
    stream's thread, without `cond` held); `on_break` runs under `cond` when a stream that was up
    ends.
    """

    def __init__(self, client: MasterClient, cond: threading.Condition, on_event: EventHook,
                 on_break: Callable[[], None]):
        self.client = client
        self.job = self.worker = ""  # (known once the session joined: `start`)
        self._cond = cond
        self._on_event = on_event
        self._on_break = on_break
        self._stream: SessionStream | None = None  # the stream in flight (opening, or up)
        self._up = False  # its first event came: messages may go
        self._answers: dict[int, pb.WatchEvent | None] = {}  # seq -> its answer (None: not yet)
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None  # why no stream is reopened any more
        self.down_since: float | None = time.monotonic()  # None while a stream is up
        self._down_why = "not opened yet"
        self._logged_at = 0.0  # when the stream's being down was last logged
        self.opened = 0  # streams opened (for tests and benchmarks)
        self.messages = 0  # messages sent (the same)

    # -- the stream's life --------------------------------------------------------------------
    def start(self, job: str, worker: str) -> None:
        """Opens the stream of `worker`'s session in `job` (on a thread of its own,
        `trainfeed-stream-<worker>`), and keeps it open until `close()`."""
        self.job, self.worker = job, worker
        self.down_since = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"trainfeed-stream-{self.worker}")
        self._thread.start()

    @property
    def up(self) -> bool:
        """Whether a stream is up (the master sent its first event): messages go on it."""
        return self._up

    def close(self) -> None:
        """Ends the stream and its thread; what waits on it raises CallCancelled. Idempotent."""
        self._stop.set()
        with self._cond:
            stream = self._stream
            self._cond.notify_all()
        if stream is not None:
            stream.cancel()
        if self._thread is not None:
            self._thread.join(10)

    def reconnect(self) -> None:
        """Cancels the stream in flight: it is reopened with the usual backoff (a master that
        stopped answering on it, or a test)."""
        with self._cond:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def _run(self) -> None:
        delay = RETRY_MIN_S
        while not self._stop.is_set():
            opened_at = time.monotonic()
            try:
                self._once()
                self._down_why = "the master ended it"
            except grpc.RpcError as e:
                if self._stop.is_set() or self.client.closed:
                    self._closed_under_us()
                    return
                if e.code() in _FATAL:
                    self._fail(self._refusal(e))
                    return
                self._down_why = f"{e.code().name}: {e.details()}"
            except Exception as e:
                if self._stop.is_set() or self.client.closed:
                    self._closed_under_us()
                    return
                logger.exception("the Session stream failed; reopening it")
                self._down_why = repr(e)
            if time.monotonic() - opened_at >= HEALTHY_S:
                delay = RETRY_MIN_S
            with self._cond:
                self._log_down()
            if self._gave_up():
                return
            self._stop.wait(random.uniform(delay / 2, delay))
            delay = min(delay * 2, RETRY_MAX_S)

    def _once(self) -> None:
        """One stream, from its opening to its end: answers to their askers, events on."""
        stream = self.client.session(self.job, self.worker)
        with self._cond:
            if self._stop.is_set():
                stream.cancel()
                return
            self._stream = stream
        self.opened += 1
        try:
            for event in stream:
                if not self._up:
                    self._came_up()
                if event.answers:
                    self._answer(event)
                else:
                    self._on_event(event)
        finally:
            stream.cancel()  # (ends the thread gRPC feeds the call's messages from)
            with self._cond:
                self._stream = None
                if self._up:
                    self._up = False
                    self.down_since = time.monotonic()
                    self._on_break()
                self._cond.notify_all()

    def _came_up(self) -> None:
        with self._cond:
            down_since, self.down_since = self.down_since, None
            self._up = True
            self._cond.notify_all()
        if down_since is not None and self.opened > 1:
            level = logging.INFO if time.monotonic() - down_since >= WAIT_LOG_S else logging.DEBUG
            logger.log(level, "job %r: the Session stream to master %s is open again after "
                       "%.1f s", self.job, self.client.address, time.monotonic() - down_since)

    def _answer(self, event: pb.WatchEvent) -> None:
        with self._cond:
            if event.answers in self._answers:  # (else its asker gave up on it: dropped)
                self._answers[event.answers] = event
                self._cond.notify_all()

    def _log_down(self) -> None:
        """Under `cond`: logs, once the stream was down WAIT_LOG_S (then every
        WAIT_LOG_EVERY_S), why and until when it is reopened (issue 26: no silent waits)."""
        now = time.monotonic()
        down = now - (self.down_since if self.down_since is not None else now)
        if down < WAIT_LOG_S or now - self._logged_at < WAIT_LOG_EVERY_S:
            return
        self._logged_at = now
        logger.warning("job %r: the Session stream to master %s is down for %.0f s (%s); "
                       "reopening it until %s (give-up time: $%s=%g)", self.job,
                       self.client.address, down, self._down_why,
                       wall_clock(time.time() + self.client.give_up_s - down), GIVE_UP_ENV,
                       self.client.give_up_s)

    def _gave_up(self) -> bool:
        """Ends the session once the stream was down for the client's give-up time."""
        now = time.monotonic()
        down = now - (self.down_since if self.down_since is not None else now)
        if down < self.client.give_up_s:
            return False
        self._fail(MasterUnavailableError(
            f"master {self.client.address} unreachable for {down:.0f} s ({self._down_why}): "
            f"this reader's Session stream could not be reopened; is it running? (give-up "
            f"time: ${GIVE_UP_ENV}={self.client.give_up_s:g})"))
        return True

    def _refusal(self, error: grpc.RpcError) -> JobError:
        code, details = error.code(), error.details()
        if code is grpc.StatusCode.UNAUTHENTICATED:
            return AuthenticationError(f"master {self.client.address} refused this reader's "
                                       f"Session stream (UNAUTHENTICATED: {details})")
        return JobError(f"master {self.client.address} refused the Session stream of reader "
                        f"{self.worker!r} in job {self.job!r}: {code.name}: {details}")

    def _closed_under_us(self) -> None:
        """Closed, or its client first (a process dying): nothing to keep open, nothing to
        log; what waits on the stream raises."""
        with self._cond:
            if not self._stop.is_set():
                self.error = CallCancelled(f"the client of master {self.client.address} was "
                                           f"closed: this reader's Session stream is over")
            self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        logger.error("%s", error)
        with self._cond:
            self.error = error
            self._cond.notify_all()

    # -- messages -----------------------------------------------------------------------------
    def wait_up(self, given_up: Callable[[], bool] | None = None) -> None:
        """Blocks until a stream is up. Raises why none will be (`error`), or CallCancelled
        once `given_up()` or the transport closes."""
        with self._cond:
            while not self._up:
                self._check(given_up)
                self._log_down()
                self._cond.wait(CHECK_S)
            self._check(given_up)

    def _check(self, given_up: Callable[[], bool] | None) -> None:
        if self.error is not None:
            raise self.error
        if self._stop.is_set() or (given_up is not None and given_up()):
            raise CallCancelled("the message to the master was given up (closing, or its "
                                "caller no longer wants the answer)")

    def post(self, message: pb.SessionMessage) -> bool:
        """Sends `message` unanswered (seq 0: progress). Returns False if no stream is up (the
        caller keeps what it carried)."""
        with self._cond:
            if not self._up or self._stream is None:
                return False
            self._stream.send(message)
            self.messages += 1
            return True

    def ask(self, message: pb.SessionMessage, expect_s: float, timeout_s: float, what: str,
            given_up: Callable[[], bool] | None = None) -> pb.WatchEvent | None:
        """Sends `message` with a fresh seq and waits for its answer. Returns None if no stream
        is up, the stream broke, or no answer came within `timeout_s` (the stream is then
        reopened, logged): the caller sends again on the next stream. Raises CallCancelled once
        `given_up()` or the transport closes. `expect_s`: how long the answer may rightly take
        (a long-poll); WAIT_LOG_S past it, the wait is logged naming `what`."""
        with self._cond:
            stream = self._stream
            if not self._up or stream is None:
                return None
            self._seq += 1
            seq = message.seq = self._seq
            self._answers[seq] = None
            stream.send(message)
            self.messages += 1
            sent_at = time.monotonic()
            try:
                late = self._wait_answer(seq, stream, sent_at, expect_s, timeout_s, what, given_up)
            finally:
                answer = self._answers.pop(seq, None)
        if answer is None and late:
            logger.warning("job %r: master %s did not answer %s on the Session stream within "
                           "%g s; reopening the stream to send it again", self.job,
                           self.client.address, what, timeout_s)
            stream.cancel()
        return answer

    def _wait_answer(self, seq: int, stream: SessionStream, sent_at: float, expect_s: float,
                     timeout_s: float, what: str, given_up: Callable[[], bool] | None) -> bool:
        """Under `cond`: waits until `seq` is answered or its stream ended (False), or
        `timeout_s` passed (True)."""
        logged = False
        while self._answers.get(seq) is None and self._stream is stream:
            self._check(given_up)
            waited = time.monotonic() - sent_at
            if waited >= timeout_s:
                return True
            if not logged and waited >= expect_s + WAIT_LOG_S:
                logged = True
                logger.warning("job %r: waiting for master %s to answer %s, sent %.0f s ago on "
                               "the Session stream; it is sent again on a new stream at %s if "
                               "no answer comes", self.job, self.client.address, what, waited,
                               wall_clock(time.time() + timeout_s - waited))
            self._cond.wait(min(CHECK_S, timeout_s - waited))
        return False
