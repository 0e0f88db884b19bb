"""The trainer's side of remote decode: a partition's records, decoded by decode workers.

`DecoderPool` holds the decoders: a static list (TRAINFEED_DECODERS), or the one the master
lists (`listed=True`: the reader's session calls `listed_by_master` with each list the master
sends, issue 37). It sends each request to the decoder with the fewest calls outstanding (ties:
the one asked least, then the one the master last saw least busy: the master's figure is as old
as its list, so it only orders decoders this trainer knows nothing about yet).
`RemoteLoad` is the pass's `Load` (trainfeed.io.load): it cuts a task's records into up to one
segment per decoder, fetches the segments at once, and returns them joined, in delivery order,
the image fields as fixed-size binary pixels (`received_pixels` turns them into the arrays local
decode makes). A decoder that dies mid-segment loses nothing: the rest of the segment, from the
last record received, goes to another decoder, which decodes it to the same bytes (crops are
seeded per record). A decoder that is stopping (draining: trainfeed.decoder.drain) refuses new
calls: the call goes to another decoder at once, and the refusal is not counted as a failure
(its calls in flight, on the same connection, go on).

Thread-safety: a pool is shared by a reader's passes and their segment threads (one lock);
`close()` is idempotent.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from trainfeed.decode.pixels import DecodedBatch
from trainfeed.decode.remote.shared_pixels import (
    NO_SHARED_PIXELS,
    PixelsCall,
    SharedPixels,
    is_local,
    pixel_bytes,
)
from trainfeed.decode.remote.wire import (
    DRAINING,
    MAX_CALLS_PER_CLIENT,
    MAX_CHUNK_BYTES,
    MAX_CHUNK_RECORDS,
    MAX_CREDIT,
    DecodeRequest,
    DecoderRefusedError,
    credit_message,
    parse_control,
)
from trainfeed.errors import (  # (DecodersUnavailableError: re-exported, its old home)
    AuthenticationError,
    DecodeError,
    DecodersUnavailableError,
)
from trainfeed.io.partition_reader import PartitionReader
from trainfeed.io.prefetch import TaskRef
from trainfeed.security import AUTH_METADATA_KEY, BEARER_SCHEME

logger = logging.getLogger(__name__)

__all__ = ["DecoderPool", "DecodersUnavailableError", "RemoteLoad", "received_pixels"]

# Chunks granted ahead (the decoder decodes while earlier chunks travel): 4 x ~8 MB in flight
# per segment, half the wire bound (MAX_CREDIT).
CREDIT = min(4, MAX_CREDIT)
# A decoder that failed a call is not asked again for this long (unless all are down).
DOWN_S = 1.0
# Without a record received from any decoder for this long, the task fails (the master gives
# it to another reader; a local pass ends with the error).
GIVE_UP_S = 60.0
# Free memfds kept for reuse (a call's memfd holds its segment's pixels: 38 MB for 256 images
# of 224x224x3): at most 8 and 512 MB, but always the largest one (a reader reading partitions
# of 20,000 images needs 3 GB a call, and making that memory afresh costs the trainer about as
# much as receiving it over the network). The ones in use are what the reader holds.
FREE_SHARED = 8
FREE_SHARED_BYTES = 512 << 20
# Consecutive calls' pixels go one after another into one memfd, the arena, so that a batch
# spanning two partitions is a view of it, not a copy (received_pixels): room for ARENA_CALLS
# calls of the first call's size (the partitions a reader holds at once: up to 32 loaded ahead,
# trainfeed.io.prefetch.MAX_PREFETCH, the one being cut and the batches queued), within
# [ARENA_MIN_BYTES, ARENA_MAX_BYTES] (its memory is allocated when it is made, once per reader);
# a call over 1/ARENA_MIN_CALLS of it (a partition of more than ~890 images of 224x224x3) gets
# a memfd of its own: batches then rarely span two calls. When the arena is full (every byte of
# it still held by batches and partitions), a call also gets its own.
ARENA_CALLS = 40
ARENA_MIN_CALLS = 4
ARENA_MIN_BYTES = 4 << 20
ARENA_MAX_BYTES = 512 << 20
# A whole call's deadline: a decoder that hangs (stopped, not dead) is given up after it.
CALL_TIMEOUT_S = 120.0
# A fetch without a record for this long logs what it waits for and until when, then every
# WAIT_LOG_EVERY_S: no wait over 5 s is silent (as the lease's waits, issue 26).
WAIT_LOG_S = 5.0
WAIT_LOG_EVERY_S = 15.0


@dataclass
class _Decoder:
    address: str
    client: flight.FlightClient | None = None
    outstanding: int = 0
    asked: int = 0
    served: int = 0  # calls answered whole
    failed: int = 0  # calls cut off (the decoder died, or the stream broke)
    drained: int = 0  # calls it refused because it is stopping (not failures)
    down_until: float = 0.0
    busy: float = 0.0  # its busy share when the master last listed it
    shared_memory: bool = True  # offered a shared memfd when on this host (until it cannot)
    shared: int = 0  # calls answered whole through a shared memfd


class DecoderPool:
    """Decode workers by address ("host:port"), the least loaded asked first. `listed`: the
    members are the master's list (it may start empty), else `addresses`."""

    def __init__(self, addresses: Sequence[str], token: str | None,
                 give_up_s: float = GIVE_UP_S, listed: bool = False,
                 shared_memory: bool = True):
        if not addresses and not listed:
            raise ValueError("remote decode needs at least one decoder address (host:port)")
        self.listed = listed
        # (Reentrant: a memfd comes back, through _put_shared, from whichever thread drops the
        # last array of its pixels.)
        self._lock = threading.RLock()
        # shared_memory: decoders on this host write the pixels into shared memory of ours
        # (trainfeed.decode.remote.shared_pixels) rather than send them.
        self._decoders = {a: _Decoder(a, shared_memory=shared_memory) for a in addresses}
        self._shared_memory = shared_memory
        self._free: list[SharedPixels] = []  # memfds no call uses now
        self._arena: SharedPixels | None = None  # the memfd consecutive calls share
        self._headers = ([(AUTH_METADATA_KEY.encode(), f"{BEARER_SCHEME} {token}".encode())]
                         if token else [])
        self.give_up_s = give_up_s
        self.closed = False

    @property
    def addresses(self) -> list[str]:
        with self._lock:
            return list(self._decoders)

    def add(self, address: str) -> None:
        """A decoder that joined (it takes requests from the next one on)."""
        with self._lock:
            self._decoders.setdefault(address, _Decoder(
                address, shared_memory=self._shared_memory))

    def listed_by_master(self, decoders: Sequence[tuple[str, float]]) -> None:
        """The master's list of decoders, (address, busy share) the least busy first: the pool
        becomes it. Calls in flight to a decoder no longer listed finish (its connection closes
        after). Ignored by a pool of TRAINFEED_DECODERS (the user's list wins)."""
        if not self.listed:
            return
        with self._lock:
            old = self._decoders
            self._decoders = {a: old.get(a) or _Decoder(a, shared_memory=self._shared_memory)
                              for a, _ in decoders}
            for address, busy in decoders:
                self._decoders[address].busy = busy
            gone = [d for a, d in old.items() if a not in self._decoders]
            idle = [d.client for d in gone if not d.outstanding]
            for d in gone:
                if not d.outstanding:
                    d.client = None
        for client in idle:
            _close(client)
        if gone or len(self._decoders) != len(old):
            logger.info("remote decode: the master lists %d decoder(s)", len(decoders))

    def described(self) -> str:
        """The decoders, for a message: their addresses, or what an empty master's list means."""
        addresses = self.addresses
        if addresses:
            return ", ".join(addresses)
        return ("none: the master lists no decoder (start `trainfeed decoder --master ...` "
                "with the master's token)")

    def live(self) -> int:
        """Decoders not marked down now."""
        now = time.monotonic()
        with self._lock:
            return sum(d.down_until <= now for d in self._decoders.values())

    def served(self) -> dict[str, int]:
        """Calls each decoder answered whole so far (tests, status)."""
        with self._lock:
            return {a: d.served for a, d in self._decoders.items()}

    def shared(self) -> dict[str, int]:
        """Calls of each decoder answered whole through shared memory (tests, status)."""
        with self._lock:
            return {a: d.shared for a, d in self._decoders.items()}

    def failed(self) -> dict[str, int]:
        """Calls of each decoder cut off so far (tests, status)."""
        with self._lock:
            return {a: d.failed for a, d in self._decoders.items()}

    def _take(self) -> _Decoder | None:
        now = time.monotonic()
        with self._lock:
            if self.closed:
                raise ValueError("the decoder pool is closed")
            # (At most the decoder's bound of calls per connection: a call over it would be
            # refused, and the refusal fail the task; it waits for one of ours to end instead.)
            up = [d for d in self._decoders.values()
                  if d.down_until <= now and d.outstanding < MAX_CALLS_PER_CLIENT]
            if not up:
                return None
            chosen = min(up, key=lambda d: (d.outstanding, d.asked, d.busy))
            chosen.outstanding += 1
            chosen.asked += 1
            if chosen.client is None:
                chosen.client = flight.connect(f"grpc://{chosen.address}")
            return chosen

    def drained(self) -> dict[str, int]:
        """Calls each decoder refused because it was stopping (tests, status)."""
        with self._lock:
            return {a: d.drained for a, d in self._decoders.items()}

    def _give(self, decoder: _Decoder, failed: bool, served: bool = False,
              draining: bool = False) -> None:
        """A call ended. `failed`: cut off (the decoder is not asked for DOWN_S, its connection
        closed); `draining`: refused by a stopping decoder (not asked for DOWN_S either, by
        which time the master no longer lists it, but its connection stays: calls of ours may
        still be in flight on it)."""
        with self._lock:
            decoder.outstanding -= 1
            decoder.served += served
            decoder.failed += failed
            decoder.drained += draining
            if failed or draining:
                decoder.down_until = time.monotonic() + DOWN_S
            unlisted = self._decoders.get(decoder.address) is not decoder
            client = None
            if failed or (unlisted and not decoder.outstanding):
                client, decoder.client = decoder.client, None
        _close(client)

    def fetch(self, request: DecodeRequest) -> list[pa.RecordBatch]:
        """The request's records, from whichever decoders answer: on a decoder's death the
        rest (from the last record received) is asked of another. Raises DecoderRefusedError
        (a request no decoder would serve), DecodeError (a record that cannot be decoded,
        under "raise"), AuthenticationError (a token refused), DecodersUnavailableError."""
        got: list[pa.RecordBatch] = []
        received = 0
        progress_at = time.monotonic()
        wait = _Wait(self, request)
        while True:
            # (Checked before each call, not only when every decoder is down: decoders that
            # fail in turn, each before the others are back, would otherwise be waited on
            # for ever.)
            waited = time.monotonic() - progress_at
            wait.log(waited)
            if waited > self.give_up_s:
                raise DecodersUnavailableError(
                    f"no decoder ({self.described()}) answered for {self.give_up_s:g} s "
                    f"(partition {request.partition} of epoch {request.epoch}; last: "
                    f"{wait.last}): start `trainfeed decoder`s, or unset TRAINFEED_DECODE to "
                    f"decode locally")
            rest = dataclasses.replace(request, skip=request.skip + received)
            decoder = self._take()
            if decoder is None:
                time.sleep(DOWN_S / 4)
                continue
            before = received
            try:
                for batch in self._call(decoder, rest):
                    got.append(batch)
                    received += batch.num_rows
                    progress_at = time.monotonic()
            except _Draining as e:  # (before any record: refused when the call came)
                self._give(decoder, failed=False, draining=True)
                wait.last = f"{decoder.address}: {e}"
                logger.debug("decoder %s is stopping; asking another", decoder.address)
                continue
            except _Died as e:
                self._give(decoder, failed=True)
                wait.last = f"{decoder.address}: {e}"
                logger.info("decoder %s failed after %d of %d records (%s); asking another for "
                            "the rest", decoder.address, received - before, rest.records, e)
                continue
            except BaseException:
                self._give(decoder, failed=False)
                raise
            self._give(decoder, failed=False, served=True)
            return got

    def _call(self, decoder: _Decoder, request: DecodeRequest) -> Any:
        """One DoExchange: yields the record batches; raises _Died if the decoder went away.
        A decoder on this host writes the pixels into a memfd of ours; one that cannot is
        asked again with the pixels in the chunks, and not offered one again."""
        size = pixel_bytes(request.records, request.image_bytes(), len(request.image_fields))
        call = self._shared(decoder, size, pixel_bytes(
            request.num_records, request.image_bytes(), len(request.image_fields)))
        if call is not None:
            clean = False  # a call cut off may still be written to: its bytes are not reused
            try:
                yield from self._exchange(decoder, dataclasses.replace(
                    request, shared_pixels=call.address, shared_offset=call.offset,
                    chunk=_shared_chunk(request)), call)
                clean = True
                with self._lock:
                    decoder.shared += 1
                return
            except _Draining:  # (refused before anything was written: the bytes are free)
                clean = True
                raise
            except _NoSharedPixels as e:  # (before any record: the decoder opens it first)
                clean = True
                logger.info("decoder %s cannot use this trainer's shared memory (%s): its "
                            "pixels come over the network", decoder.address, e)
                decoder.shared_memory = False
            finally:
                own = call.memory is not self._arena  # a memfd of this call alone
                call.end(clean, self._put_shared if own else None)
                if own and not clean:
                    call.memory.close()
        yield from self._exchange(decoder, request, None)

    def _shared(self, decoder: _Decoder, size: int, partition: int = 0) -> PixelsCall | None:
        """Room for a call's `size` pixel bytes in shared memory, when the decoder is on this
        host: in the arena, after the previous call's, if it fits; else in a memfd of its own
        (a free one if any is large enough). `partition`: the bytes of the call's whole
        partition (a call may be a segment of it, or its rest), which sizes the arena."""
        if not (decoder.shared_memory and size and is_local(decoder.address)):
            return None
        try:
            arena = self._arena_for(size, max(size, partition))
            call = arena.call(size) if arena is not None else None
            if call is not None:
                return call
            with self._lock:
                fits = [s for s in self._free if s.capacity >= size and s.pid == os.getpid()]
                if fits:
                    chosen = min(fits, key=lambda s: s.capacity)
                    self._free.remove(chosen)
                    return chosen.call(size)
            return SharedPixels(size).call(size)
        except OSError as e:  # no memfd here, or /dev/shm's memory is short
            logger.warning("no shared memory for remote decode's pixels (%s): they come over "
                           "the network", e)
            decoder.shared_memory = False
            return None

    def _arena_for(self, size: int, partition: int) -> SharedPixels | None:
        """The memfd consecutive calls share (made at the first call, ARENA_CALLS of its
        partition's bytes within [ARENA_MIN_BYTES, ARENA_MAX_BYTES]), if a call of `size`
        goes there."""
        with self._lock:
            if self._arena is None or self._arena.pid != os.getpid():
                capacity = min(ARENA_MAX_BYTES, max(ARENA_MIN_BYTES, ARENA_CALLS * partition))
                if size > capacity // ARENA_MIN_CALLS:
                    return None
                self._arena = SharedPixels(capacity)
            return self._arena if size <= self._arena.capacity // ARENA_MIN_CALLS else None

    def _put_shared(self, shared: SharedPixels) -> None:
        """A memfd whose pixels are all dropped: kept for the next call, within FREE_SHARED
        and FREE_SHARED_BYTES (the smallest closed first, the largest always kept)."""
        closing = [shared]
        with self._lock:
            if not self.closed and shared.pid == os.getpid():
                self._free.append(shared)
                self._free.sort(key=lambda s: -s.capacity)
                closing = []
                while len(self._free) > 1 and (
                        len(self._free) > FREE_SHARED
                        or sum(s.capacity for s in self._free) > FREE_SHARED_BYTES):
                    closing.append(self._free.pop())
        for extra in closing:
            extra.close()

    def _exchange(self, decoder: _Decoder, request: DecodeRequest,
                  shared: PixelsCall | None) -> Iterator[pa.RecordBatch]:
        assert decoder.client is not None
        options = flight.FlightCallOptions(headers=self._headers, timeout=CALL_TIMEOUT_S)
        with _translated(decoder.address):
            writer, reader = decoder.client.do_exchange(
                flight.FlightDescriptor.for_command(request.encode()), options)
            try:
                batches = _received(decoder.address, writer, reader, request.records,
                                    request.chunk)
                yield from (batches if shared is None
                            else _from_shared(batches, request, shared))
            finally:
                try:
                    writer.close()
                except flight.FlightError:
                    pass

    def close(self) -> None:
        with self._lock:
            self.closed = True
            clients = [d.client for d in self._decoders.values() if d.client is not None]
            free, self._free = self._free, []
            if self._arena is not None:
                free.append(self._arena)
                self._arena = None
            for d in self._decoders.values():
                d.client = None
        for client in clients:
            client.close()
        for shared in free:
            shared.close()


def _shared_chunk(request: DecodeRequest) -> int:
    """Records per chunk when the pixels go through shared memory: as many as the bounds allow
    (MAX_CHUNK_RECORDS, MAX_CHUNK_BYTES of decoded pixels), since a chunk then carries only
    the small fields, and each message costs the trainer ~0.5 ms of CPU on the project VM
    (gRPC's wakeups: docs/benchmarks.md); the trainer uses a partition once all of it came."""
    pixels = request.image_bytes() * max(1, len(request.image_fields))
    return max(request.chunk, min(MAX_CHUNK_RECORDS, MAX_CHUNK_BYTES // max(1, pixels)))


def _received(address: str, writer: flight.FlightStreamWriter,
              reader: flight.FlightStreamReader, expected: int,
              chunk_records: int) -> Iterator[pa.RecordBatch]:
    """The call's record batches (an empty one too: it carries the schema); checks the
    decoder's end message against what came and was asked.

    Credit is granted for what the call still needs, at most CREDIT chunks ahead: a call of a
    few chunks (a small partition) is granted them all at once and sends no message per chunk
    (each message wakes gRPC's threads on both sides). A chunk of credit more goes out only
    while the credit outstanding, counted in full chunks of `chunk_records`, falls short of the
    records still to come, so a decoder sending shorter chunks is never left without credit."""
    outstanding = min(CREDIT, max(1, -(-expected // max(1, chunk_records))))
    writer.write_metadata(credit_message(outstanding))
    sent = 0
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            raise _Died(f"the stream ended after {sent} of {expected} records") from None
        if chunk.data is not None:
            outstanding -= 1
            sent += chunk.data.num_rows
            if sent < expected and outstanding * chunk_records < expected - sent:
                writer.write_metadata(credit_message(1))
                outstanding += 1
            yield chunk.data
        end = parse_control(chunk.app_metadata.to_pybytes()
                            if chunk.app_metadata is not None else None).get("end")
        if end is not None:
            if end != sent or sent != expected:
                raise DecoderRefusedError(f"decoder {address} sent {sent} records and said "
                                          f"{end}; the request asked for {expected}")
            _finish(writer, reader)
            return


def _from_shared(batches: Iterator[pa.RecordBatch], request: DecodeRequest,
                 shared: PixelsCall) -> Iterator[pa.RecordBatch]:
    """The batches with each image field's pixels taken from the memfd (zero-copy): the
    decoder sent, for each, whether each record decoded. Every offset is ours, from the rows
    counted, checked against it by PixelsCall.column."""
    image = request.image_bytes()
    first = 0
    for batch in batches:
        columns = []
        for name, column in zip(batch.schema.names, batch.columns):
            if name in request.image_fields:
                field = request.image_fields.index(name)
                column = shared.column((field * request.records + first) * image,
                                       batch.num_rows, image, column)
            columns.append(column)
        first += batch.num_rows
        yield pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


@contextlib.contextmanager
def _translated(address: str) -> Iterator[None]:
    """Flight's errors as trainfeed's: refusals, undecodable records and refused tokens as
    such, everything else (the connection lost, the stream cut) as _Died."""
    try:
        yield
    except flight.FlightUnauthenticatedError as e:
        raise AuthenticationError(f"decoder {address} refused the token: "
                                  f"{_message(e)}") from None
    except flight.FlightServerError as e:
        kind = bytes(e.extra_info or b"")
        if kind == b"refused":
            raise DecoderRefusedError(f"decoder {address}: {_message(e)}") from None
        if kind == b"decode":
            raise DecodeError(_message(e)) from None
        if kind == NO_SHARED_PIXELS:
            raise _NoSharedPixels(_message(e)) from None
        if kind == DRAINING:
            raise _Draining(_message(e)) from None
        raise _Died(_message(e)) from None
    except (flight.FlightError, OSError, pa.ArrowException) as e:
        raise _Died(_message(e)) from None


def _finish(writer: flight.FlightStreamWriter, reader: flight.FlightStreamReader) -> None:
    """Closes the trainer's side and reads the call's status: the decoder waits for the close
    before it ends the call (trainfeed.decoder.service)."""
    writer.done_writing()
    try:
        while True:
            reader.read_chunk()
    except StopIteration:
        pass


class _Wait:
    """Says what a fetch without records waits for and until when: once it has waited
    WAIT_LOG_S, then every WAIT_LOG_EVERY_S (no silent waits)."""

    def __init__(self, pool: DecoderPool, request: DecodeRequest):
        self.pool = pool
        self.request = request
        self.last = "no decoder was up to ask"  # why the last call failed
        self._logged_at = float("-inf")

    def log(self, waited: float) -> None:
        now = time.monotonic()
        if waited < WAIT_LOG_S or now - self._logged_at < WAIT_LOG_EVERY_S:
            return
        self._logged_at = now
        until = time.strftime("%H:%M:%S",
                              time.localtime(time.time() + self.pool.give_up_s - waited))
        logger.warning(
            "no record of partition %d of epoch %d from decoders %s for %.0f s (%d up; last: "
            "%s); asking until %s, then the task fails (give-up time %g s)",
            self.request.partition, self.request.epoch, self.pool.described(),
            waited, self.pool.live(), self.last, until, self.pool.give_up_s)


class _Died(Exception):
    """A decoder went away mid-call (connection lost, stream cut, internal error)."""


class _Draining(Exception):
    """A decoder that is stopping refused a new call (its calls in flight go on)."""


class _NoSharedPixels(Exception):
    """A decoder cannot open this trainer's shared memfd (trainfeed.decode.remote.shared_pixels)."""


def _message(error: BaseException) -> str:
    """A Flight error's own message, without gRPC's debug context."""
    return str(error).split(". Detail:", 1)[0].split(". gRPC client debug context", 1)[0]


@dataclass(frozen=True)
class RequestTemplate:
    """What every request of one pipeline shares (DecodeRequest less the task)."""

    dataset: str
    version: int | None
    shuffle_seed: int | None
    seed: int
    mode: str
    fields: tuple[str, ...]
    image_fields: tuple[str, ...]
    decode: dict[str, Any]
    max_pixels: int
    chunk: int

    def request(self, task: TaskRef, skip: int, stop: int) -> DecodeRequest:
        return DecodeRequest(
            dataset=self.dataset, version=self.version, epoch=task.epoch,
            partition=task.partition, shard=task.shard, row_group_start=task.row_group_start,
            row_group_stop=task.row_group_stop, num_records=task.num_records,
            row_start=task.row_start, skip=skip, stop=stop, shuffle_seed=self.shuffle_seed,
            seed=self.seed, mode=self.mode, fields=self.fields,
            image_fields=self.image_fields, decode=self.decode,
            max_pixels=self.max_pixels, chunk=self.chunk)


class RemoteLoad:
    """A pass's `Load` through decoders: a task's records [skip, stop) in delivery order, cut
    into up to one segment per live decoder (at least a chunk each), fetched at once."""

    def __init__(self, pool: DecoderPool, template: RequestTemplate):
        self.pool = pool
        self.template = template

    def __call__(self, reader: PartitionReader, task: TaskRef) -> pa.Table:
        start, end = task.skip, task.stop or task.num_records
        if end <= start:
            end = start  # an empty request still checks the task against the decoder
        count = max(1, min(self.pool.live(), -(-(end - start) // self.template.chunk)))
        bounds = np.linspace(start, end, count + 1).round().astype(int).tolist()
        requests = [self.template.request(task, a, b) for a, b in zip(bounds, bounds[1:])]
        if len(requests) == 1:
            batches = self.pool.fetch(requests[0])
        else:
            with ThreadPoolExecutor(len(requests), thread_name_prefix="trainfeed-remote") as ex:
                batches = [b for part in ex.map(self.pool.fetch, requests) for b in part]
        if not batches:
            return _empty(self.template)
        return pa.Table.from_batches(batches)


def _empty(template: RequestTemplate) -> pa.Table:
    """A table of no rows (schema-less tasks are rare: a task with nothing left to deliver)."""
    return pa.table({"_id": pa.array([], pa.int64())})


def received_pixels(column: pa.ChunkedArray | pa.Array,
                    shape: tuple[int, int, int]) -> DecodedBatch:
    """A column of decoded pixels (fixed-size binary, null: failed under "skip") as the
    DecodedBatch local decode makes: the images of the rows that decoded, and which did.

    The images are the trainer's own writable memory, as local decode's are (torch.from_numpy
    warns on read-only arrays), made without copying where possible: chunks that lie one after
    another in writable memory (a call's pixels in shared memory, whichever chunks and
    partitions the batch spans) are one view of it; otherwise (the pixels came over the
    network, or a batch spans two calls' memory) each chunk is copied once, straight into the
    batch's array."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    size = int(np.prod(shape))
    if column.type.byte_width != size:  # a decoder answering with other options
        raise DecoderRefusedError(f"a decoder sent images of {column.type.byte_width} bytes; "
                                  f"this reader's are {shape} ({size} bytes)")
    chunks = [c for c in chunks if len(c)]
    n = sum(len(c) for c in chunks)
    images = _joined(chunks, n, size).reshape(n, *shape)
    if not any(c.null_count for c in chunks):
        return DecodedBatch(images, np.ones(n, dtype=bool), ())
    ok = np.concatenate([c.is_valid().to_numpy(zero_copy_only=False) for c in chunks])
    return DecodedBatch(images[ok], ok, ())


def _joined(chunks: list[pa.Array], n: int, size: int) -> np.ndarray:
    """The pixels of `chunks` (of `n` images of `size` bytes in all) as one flat writable
    array: a view where they are adjacent writable memory, else one copy of each."""
    if not chunks:
        return np.empty(0, np.uint8)
    buffers = [c.buffers()[1] for c in chunks]
    starts = [b.address + c.offset * size for b, c in zip(buffers, chunks)]
    if all(b.is_mutable for b in buffers) and all(
            start + len(c) * size == after
            for start, c, after in zip(starts, chunks, starts[1:])):
        if len(chunks) == 1:
            return np.frombuffer(buffers[0], np.uint8, count=n * size,
                                 offset=chunks[0].offset * size)
        return np.asarray(_Adjacent(chunks, starts[0], n * size))
    out = np.empty(n * size, np.uint8)
    at = 0
    for buffer, c in zip(buffers, chunks):
        count = len(c) * size
        out[at:at + count] = np.frombuffer(buffer, np.uint8, count=count,
                                           offset=c.offset * size)
        at += count
    return out


class _Adjacent:
    """Chunks whose pixels lie one after another in memory, as one array (numpy's
    `__array_interface__`): the array holds this, and this holds the chunks, so the memory
    they read (a memfd, until it is recycled: trainfeed.decode.remote.shared_pixels) lives
    as long as the array. Only made from chunks shown adjacent: every byte of the span is one
    of theirs."""

    def __init__(self, chunks: list[pa.Array], start: int, nbytes: int):
        self.chunks = chunks
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (start, False), "version": 3}


def _close(client: flight.FlightClient | None) -> None:
    """Closes a decoder's connection (a dead or unlisted one's; taken off it under the pool's
    lock: the next call reopens one)."""
    if client is not None:
        try:
            client.close()
        except Exception:  # a connection to a dead decoder may fail to close
            pass
