"""The decode workers' Session streams (issue 37): registration, heartbeats, and the list the
trainers are told.

A decoder opens a Session stream whose first message carries `decoder` (not `open`): that
registers it (trainfeed.master.core.decoders holds the list and its bounds); each later message
is its heartbeat. The master answers the registration with the current list (so the decoder knows
it is listed) and says nothing after. The stream's end, or a decoder silent for the registry's
timeout, takes it off the list. Every change of the list is told to every reader stream
(`announce`, coalesced over ANNOUNCE_DELAY_S so that a pool scaled by ten tells each reader once).

Only the master's own token may register a decoder: trainers send their job's token to the
decoders they are told, so a job token that could register one could collect the other jobs'
tokens. A job token's decoder stream is refused (PERMISSION_DENIED) before anything is listed.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import grpc

from trainfeed.master.core.decoders import (
    Beat,
    DecoderRefused,
    DecoderRegistry,
    DecodersFull,
    Listed,
)
from trainfeed.master.core.sessions import clip
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)

# A change of the list is told to the readers this long after it (later changes join it).
ANNOUNCE_DELAY_S = 0.5


def listed_event(listing: list[Listed]) -> pb.WatchEvent:
    """The event that tells a stream the decoders (`decoders_listed`, even when empty)."""
    return pb.WatchEvent(decoders_listed=True, decoders=[
        pb.DecoderInfo(address=d.address, busy=d.busy, slots=d.slots) for d in listing])


def _beat(message: pb.DecoderBeat) -> Beat:
    return Beat(message.address, message.busy, message.slots, message.in_flight)


def _refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, why: str) -> None:
    """Ends the stream with `code` (not `context.abort`: see Streams._refuse)."""
    context.set_code(code)
    context.set_details(why)


class DecoderStreams:
    """Every decoder's stream of one master, on its event loop.

    Args:
        registry: the decoders (pure; owned by this object's loop).
        tell_readers: sends one event to every reader stream (Streams.broadcast).
    """

    def __init__(self, registry: DecoderRegistry,
                 tell_readers: Callable[[pb.WatchEvent], None]):
        self.registry = registry
        self._tell_readers = tell_readers
        self._announcing: asyncio.TimerHandle | None = None

    def listing_event(self) -> pb.WatchEvent:
        """The list as an event (what a reader stream's first event carries)."""
        return listed_event(self.registry.listing())

    def announce(self) -> None:
        """Tells every reader stream the list, once, ANNOUNCE_DELAY_S from now."""
        if self._announcing is None:
            self._announcing = asyncio.get_running_loop().call_later(
                ANNOUNCE_DELAY_S, self._announce)

    def _announce(self) -> None:
        self._announcing = None
        self._tell_readers(listed_event(self.registry.listing()))

    async def serve(self, opening: pb.SessionMessage, requests: AsyncIterator[pb.SessionMessage],
                    context: grpc.aio.ServicerContext, scope: str | None
                    ) -> AsyncGenerator[pb.WatchEvent, None]:
        """One decoder's stream: its registration, then its beats until it ends or goes silent.
        `scope`: the job its token is limited to (None: the master's token)."""
        if scope is not None:
            _refuse(context, grpc.StatusCode.PERMISSION_DENIED,
                    f"a job token (job {scope!r}) cannot register a decoder: start decoders "
                    f"with the master's token")
            return
        stream = object()
        address = clip(opening.decoder.address)
        try:
            if self.registry.beat(stream, _beat(opening.decoder), time.time()):
                logger.info("decoder %s registered (%d listed)", address, len(self.registry))
                self.announce()
            yield listed_event(self.registry.listing())
            async for problem in self._beats(stream, requests):
                _refuse(context, *problem)
                return
        except DecoderRefused as e:
            _refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED if isinstance(e, DecodersFull)
                    else grpc.StatusCode.INVALID_ARGUMENT, str(e))
        finally:
            if self.registry.leave(stream):
                logger.info("decoder %s left (%d listed)", address, len(self.registry))
                self.announce()

    async def _beats(self, stream: object, requests: AsyncIterator[pb.SessionMessage]
                     ) -> AsyncGenerator[tuple[grpc.StatusCode, str], None]:
        """Takes the beats; yields the one problem that ends the stream, if any (a silent
        decoder, a message that is not a beat); a DecoderRefused propagates."""
        messages = aiter(requests)
        while True:
            try:
                message = await asyncio.wait_for(anext(messages, None), self.registry.timeout_s)
            except TimeoutError:
                yield (grpc.StatusCode.DEADLINE_EXCEEDED,
                       f"no heartbeat for {self.registry.timeout_s:g} s: taken off the list")
                return
            if message is None:
                return
            if not message.HasField("decoder"):
                yield (grpc.StatusCode.INVALID_ARGUMENT,
                       "a decoder's stream carries only `decoder` heartbeats")
                return
            now = time.time()
            changed = self.registry.beat(stream, _beat(message.decoder), now)
            if self.registry.expire(now) or changed:
                self.announce()
