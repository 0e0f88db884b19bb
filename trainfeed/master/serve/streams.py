"""The master's Session streams: the one conversation of each reader session (issue 36).

A stream's first message names its session (`open`, checked by the coordinator); then each
message goes to `Coordinator.handle`, on the event loop, and its answer is sent once the ledger's
changes are durable. Each message is converted into the core's types once, as it is read, and
each answer and event into a WatchEvent once, as it is queued (trainfeed.master.serve.convert).
A `get_tasks` runs in a task of its own, so that its long-poll (the wait, which stays here, in
the shell) holds up none of the later messages. The events the coordinator decides (`Told`) go
to their session's stream, whichever call decided them.

Bounds, each against a client that floods or stalls: MAX_GRANTS_IN_FLIGHT long-polls per stream,
MAX_UNSENT_ANSWERS answers not yet sent (then the stream's messages are not read: HTTP/2 flow
control holds the client back), MAX_QUEUED_EVENTS events per stream (the oldest go).

A stream's end is not the reader leaving: its leases run until they time out (or LeaveJob), and a
reader reconnects with the same secret. A second stream of a session replaces the first (which
ends), so a reconnecting reader never has two streams told the same thing; an `exchange` stream
(a tool's one-off question) takes no events and replaces nothing.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Protocol

import grpc

from trainfeed.master.core.coordinator import Ask, Coordinator, Told
from trainfeed.master.core.decoders import DecoderRegistry
from trainfeed.master.core.jobs import CallError, Job
from trainfeed.master.core.messages import GetTasks
from trainfeed.master.core.sessions import clip
from trainfeed.master.serve import convert
from trainfeed.master.serve.decoder_streams import DecoderStreams
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)

# Upper bound of one long-poll: short enough that a reader notices a dead master quickly.
MAX_WAIT_MS = 5000
# `get_tasks` asked on one Session stream and not yet answered (each a task of its own while it
# long-polls). A reader asks one at a time (its producer); past this bound a stream flooding the
# master with long-polls gets `grant_refused` (RESOURCE_EXHAUSTED) at once instead of a task each.
MAX_GRANTS_IN_FLIGHT = 8
# Answers of one Session stream not yet sent (queued for the writer, or long-polling `get_tasks`):
# while this many are unsent the master takes no more of the stream's messages, so that HTTP/2
# flow control holds back a client that writes but never reads, instead of the master queueing
# an answer per message without end (issue 35: +285 MB in 45 s). Backpressure, not a refusal: an
# honest reader reads its answers and has a few unanswered at once (a heartbeat, a grant or two),
# so it never waits on this; a reader that stalls a while is slowed, not cut off. Each answer is
# at most a few KiB (coordinator.MAX_REFUSED_LISTED), so a stream holds at most ~1 MiB.
MAX_UNSENT_ANSWERS = 64
# Events queued for a stream that does not read them (a stalled reader): past this the oldest go
# (the answer to the session's next message carries what still matters: revocations, give-backs).
MAX_QUEUED_EVENTS = 256


class Shell(Protocol):
    """What the streams need of the servicer: its core, durability, waiting and scopes."""

    core: Coordinator

    async def durable(self, job: Job) -> None: ...

    def submit_soon(self, job: Job) -> None: ...

    def flush(self) -> None: ...

    def wait_changed(self, job: str, timeout: float) -> Awaitable[None]: ...

    def scope(self, context: grpc.aio.ServicerContext) -> str | None: ...


class _Outbox:
    """What one stream is to send: answers (each holding a slot of MAX_UNSENT_ANSWERS, which
    its reader takes before it takes a message and the writer gives back once it is sent) and
    events. Local to the stream, so that all it holds goes when the stream ends."""

    def __init__(self) -> None:
        self.answers: collections.deque[pb.WatchEvent] = collections.deque()
        self.events: collections.deque[pb.WatchEvent] = collections.deque(
            maxlen=MAX_QUEUED_EVENTS)
        self.room = asyncio.Semaphore(MAX_UNSENT_ANSWERS)
        self.wake = asyncio.Event()
        self.replaced = False

    def put(self, answer: pb.WatchEvent) -> None:
        """Queues an answer (its message's slot is taken) and wakes the writer."""
        self.answers.append(answer)
        self.wake.set()

    def tell(self, event: pb.WatchEvent) -> None:
        self.events.append(event)
        self.wake.set()


class Streams:
    """Every Session stream of a master, on its event loop."""

    def __init__(self, shell: Shell, status_code: Callable[[Exception], grpc.StatusCode],
                 refusals: tuple[type[Exception], ...]):
        self.shell = shell
        self.core = shell.core
        self.status_code = status_code  # the servicer's one table of refusals
        self.refusals = refusals
        # Seconds a grant asked without a long-poll took (the metrics' lease-grant histogram).
        self.on_grant: Callable[[float], None] = lambda seconds: None
        self._open: dict[tuple[str, str], _Outbox] = {}  # the session's stream for its events
        # The decode workers' streams (issue 37): their list goes to every reader stream.
        self.decoders = DecoderStreams(DecoderRegistry(), self.broadcast)

    def deliver(self, told: list[Told]) -> None:
        """Sends each event to its session's stream (if it has one: the answer to its next
        message carries what still matters)."""
        for t in told:
            outbox = self._open.get((t.job, t.worker))
            if outbox is not None:
                outbox.tell(convert.event(t.event))

    def broadcast(self, event: pb.WatchEvent) -> None:
        """Sends `event` to every reader stream (the decoders' list: one shared message)."""
        for outbox in self._open.values():
            outbox.tell(event)

    async def serve(self, requests: AsyncIterator[pb.SessionMessage],
                    context: grpc.aio.ServicerContext) -> AsyncGenerator[pb.WatchEvent, None]:
        """One Session stream: its opening, then answers and events until either side ends.
        A decoder's stream (its first message a `decoder` beat) goes to DecoderStreams."""
        opening = await anext(aiter(requests), None)
        if opening is None:
            return
        if opening.HasField("decoder"):
            async for event in self.decoders.serve(opening, requests, context,
                                                   self.shell.scope(context)):
                yield event
            return
        try:
            job = self.core.job(opening.open.job, self.shell.scope(context))
            key = self.core.open_stream(job, opening.open.worker_id,
                                        opening.open.session_secret, opening.open.exchange)
        except CallError as e:
            self._refuse(context, e)
            return
        outbox = _Outbox()
        if not opening.open.exchange:
            old = self._open.get(key)
            self._open[key] = outbox
            if old is not None:
                old.replaced = True
                old.wake.set()
        reading = asyncio.ensure_future(self._read(job, key[1], requests, outbox))
        try:
            first = self.decoders.listing_event()
            first.current_epoch, first.grants = job.ledger.epoch, True
            yield first
            while not outbox.replaced:
                await outbox.wake.wait()
                outbox.wake.clear()
                if outbox.replaced:
                    return
                while outbox.answers:
                    yield outbox.answers.popleft()
                    outbox.room.release()
                while outbox.events:
                    yield outbox.events.popleft()
                if reading.done():
                    self._ended(job, key[1], reading, context)
                    return  # the reader closed its side
        finally:
            reading.cancel()
            if self._open.get(key) is outbox:
                del self._open[key]
                self.core.close_stream(key)

    def _refuse(self, context: grpc.aio.ServicerContext, error: Exception) -> None:
        """Ends the stream with a refusal's status (the generator then returns). Not
        `context.abort`: raised inside a streaming handler, its error kept the stream's frames,
        and with them the messages (a 1 MiB `open` each), alive: +1 MiB of the master's memory
        per refused stream (tests/integration/test_borrowed_identities.py, huge names)."""
        context.set_code(self.status_code(error))
        context.set_details(error.message if isinstance(error, CallError) else str(error))
        context.set_trailing_metadata(error.trailer if isinstance(error, CallError) else ())

    def _ended(self, job: Job, worker: str, reading: asyncio.Future[None],
               context: grpc.aio.ServicerContext) -> None:
        """The stream's reader ended: aborts the stream with a refusal's status, if it raised
        one (what it changed made durable first, not waited for)."""
        error = None if reading.cancelled() else reading.exception()
        if error is None:
            return
        if not isinstance(error, self.refusals):
            logger.error("job %r: the Session stream of %s failed: %r", job.name, clip(worker),
                         error)
            return
        self.shell.flush()
        self._refuse(context, error)

    async def _read(self, job: Job, worker: str, requests: AsyncIterator[pb.SessionMessage],
                    outbox: _Outbox) -> None:
        """Takes a stream's messages as they come, while fewer than MAX_UNSENT_ANSWERS of its
        answers are unsent; queues their answers in `outbox`. Ends when the reader closes its
        side, or raises a refusal (which ends the stream)."""
        granting: set[asyncio.Task[None]] = set()
        messages = aiter(requests)
        try:
            while True:
                await outbox.room.acquire()  # (released once this message's answer is sent)
                received = await anext(messages, None)
                if received is None:
                    return
                message = convert.message(received)
                if isinstance(message, GetTasks):
                    self._start_grant(job, worker, message, outbox, granting)
                    continue
                answer, told = self.core.handle(job, worker, message, time.time())
                self.deliver(told)
                if job.ledger.journal:
                    if answer is None:
                        self.shell.submit_soon(job)  # nobody waits for it: durable soon
                    else:
                        await self.shell.durable(job)
                if answer is None or isinstance(answer, Ask):  # (an Ask: only of a get_tasks)
                    outbox.room.release()
                else:
                    outbox.put(convert.answer(answer))
        finally:
            for task in granting:
                task.cancel()
            outbox.wake.set()

    def _start_grant(self, job: Job, worker: str, message: GetTasks, outbox: _Outbox,
                     granting: set[asyncio.Task[None]]) -> None:
        if len(granting) >= MAX_GRANTS_IN_FLIGHT:
            outbox.put(pb.WatchEvent(
                current_epoch=job.ledger.epoch, answers=message.seq,
                grant_refused=f"RESOURCE_EXHAUSTED: {len(granting)} get_tasks asked on this "
                              f"stream are still unanswered (at most {MAX_GRANTS_IN_FLIGHT}); "
                              f"ask again once one is"))
            return
        task = asyncio.ensure_future(self._grant(job, worker, message, outbox))
        granting.add(task)
        task.add_done_callback(granting.discard)

    async def _grant(self, job: Job, worker: str, message: GetTasks, outbox: _Outbox) -> None:
        """Answers a `get_tasks` once durable, long-polling (up to its `wait_ms`, at most
        MAX_WAIT_MS) while the coordinator hands back an Ask; refused, with `grant_refused`
        (its status code's name, then why)."""
        started = time.perf_counter()
        try:
            event = await self._long_poll(job, worker, message)
            if not message.wait_ms:
                self.on_grant(time.perf_counter() - started)
        except self.refusals as e:
            self.shell.flush()  # (what it changed is made durable, not waited for)
            why = e.message if isinstance(e, CallError) else str(e)
            event = pb.WatchEvent(current_epoch=job.ledger.epoch, answers=message.seq,
                                  grant_refused=f"{self.status_code(e).name}: {why}")
        outbox.put(event)

    async def _long_poll(self, job: Job, worker: str, message: GetTasks) -> pb.WatchEvent:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + min(message.wait_ms, MAX_WAIT_MS) / 1000
        answer, told = self.core.handle(job, worker, message, time.time())
        while True:
            self.deliver(told)
            if job.ledger.journal:
                await self.shell.durable(job)
            if not isinstance(answer, Ask):
                assert answer is not None  # (a get_tasks is always answered)
                return convert.answer(answer)
            await self.shell.wait_changed(job.name, give_up - loop.time())
            answer.last = loop.time() >= give_up
            answer, told = self.core.handle(job, worker, answer, time.time())
