"""The decoder's Flight shell: token check, request bounds, the trainer's credit.

One Arrow Flight method is served, `DoExchange` (the request shape and bounds are in
trainfeed.decode.remote.wire); every other Flight method answers "not implemented". Calls are
admitted like the master's: metadata `authorization: Bearer <token>` with the token the decoder
was started with or a job token made from it (trainfeed.master.serve.auth decides, the same code
as the master's), checked before the request is read. A request over a bound, naming a dataset
outside the decoder's storage, or with options it cannot run is refused (FlightServerError with
extra_info b"refused"); an undecodable record under "raise" with extra_info b"decode".

Once draining (`drain()`, on SIGTERM: trainfeed.decoder.drain), a new call is refused with
extra_info DRAINING, which the trainer takes as "ask another decoder now", and the calls already
admitted go on; `in_flight()` says how many are left.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from trainfeed.cores import usable_cores
from trainfeed.decode.remote.shared_pixels import (
    NO_SHARED_PIXELS,
    PixelsWriter,
    SharedPixelsUnavailable,
    pixel_bytes,
)
from trainfeed.decode.remote.wire import (
    DRAINING,
    MAX_CALLS_PER_CLIENT,
    MAX_CREDIT,
    MAX_RECORDS,
    DecodeRequest,
    DecoderRefusedError,
    end_message,
    parse_control,
)
from trainfeed.decoder.work import Datasets, Decoders, decoded_chunks
from trainfeed.errors import CorruptDatasetError, DecodeError, StorageAccessError
from trainfeed.master.serve.auth import TokenInterceptor
from trainfeed.security import AUTH_METADATA_KEY
from trainfeed.storage import Storage

logger = logging.getLogger(__name__)

__all__ = ["DecoderServer"]

# A refused call is logged once per this many seconds (a misconfigured trainer retries).
LOG_EVERY_S = 60.0
# Credit messages read after the end before the call ends anyway: one per chunk sent at most.
MAX_CREDIT_MESSAGES = MAX_RECORDS + 1


class _TokenCheck(flight.ServerMiddlewareFactory):
    """Admits a call whose bearer token the master would admit (see the module docstring)."""

    def __init__(self, token: str):
        # The master's check itself, not a copy: its problem() takes gRPC-style metadata.
        self._check = TokenInterceptor(token)
        self.rejected = 0
        self._logged_at = float("-inf")

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
        given = headers.get(AUTH_METADATA_KEY, [])
        metadata = [(AUTH_METADATA_KEY, v if isinstance(v, str) else v.decode("latin-1"))
                    for v in given[:1]]
        problem = self._check.problem(metadata)
        if problem is None:
            return None
        self.rejected += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            logger.warning("refused %d unauthenticated call(s) so far: %s", self.rejected,
                           "no token" if not given else "wrong token")
            self._logged_at = now
        raise flight.FlightUnauthenticatedError(problem.replace("this master", "this decoder"))


class DecoderServer(flight.FlightServerBase):
    """Serves decode requests for datasets of `storage`. `token` None: no token check
    (--insecure). `close()` (Flight's `shutdown`) stops it."""

    def __init__(self, location: str, storage: Storage, token: str | None,
                 threads: int | None = None):
        middleware = {"auth": _TokenCheck(token)} if token else {}
        super().__init__(location, middleware=middleware)
        self.datasets = Datasets(storage)
        self.decoders = Decoders(threads)
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._draining = False
        self._closed = False
        self.records_sent = 0

    def do_exchange(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader,
                    writer: flight.MetadataRecordBatchWriter) -> None:
        peer = context.peer()
        with self._lock:
            if self._draining:  # (the trainer asks another decoder, without counting a failure)
                raise flight.FlightServerError(
                    "this decoder is stopping (draining its calls in flight): ask another",
                    extra_info=DRAINING)
            if self._calls[peer] >= MAX_CALLS_PER_CLIENT:
                raise _refused(f"{self._calls[peer]} calls of this client are in flight: the "
                               f"bound is {MAX_CALLS_PER_CLIENT} per client connection")
            self._calls[peer] += 1
        try:
            self._serve(descriptor, reader, writer)
        except SharedPixelsUnavailable as e:  # the trainer asks again, pixels in the chunks
            raise flight.FlightServerError(str(e), extra_info=NO_SHARED_PIXELS) from None
        except DecoderRefusedError as e:
            raise _refused(str(e)) from None
        except (CorruptDatasetError, StorageAccessError) as e:
            raise _refused(str(e)) from None
        except DecodeError as e:
            raise flight.FlightServerError(str(e), extra_info=b"decode") from None
        except flight.FlightError:
            raise
        except OSError as e:  # storage trouble: another decoder may read it (the trainer asks)
            logger.warning("decode request failed reading storage: %s", e)
            raise flight.FlightServerError(f"reading storage failed: {e}",
                                           extra_info=b"retry") from None
        except Exception as e:  # a bug, or a request it cannot serve: never a traceback out
            logger.exception("decode request failed")
            raise _refused(f"the decoder failed: {type(e).__name__}: {e}") from None
        finally:
            with self._lock:
                self._calls[peer] -= 1
                if not self._calls[peer]:
                    del self._calls[peer]

    def _serve(self, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader,
               writer: flight.MetadataRecordBatchWriter) -> None:
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise DecoderRefusedError("the descriptor must be a command (a decode request)")
        request = DecodeRequest.parse(descriptor.command)
        credit = 0
        sent = 0
        began = False
        ended = False
        for batch in _answers(request, decoded_chunks(request, self.datasets, self.decoders)):
            while credit == 0:
                credit += _credit(reader)
                if credit > MAX_CREDIT:
                    raise DecoderRefusedError(f"credit of {credit} chunks is over the bound "
                                              f"of {MAX_CREDIT}")
            if not began:
                writer.begin(batch.schema)
                began = True
            credit -= 1
            sent += batch.num_rows
            if sent >= request.records:  # the last chunk carries the end: one message less
                writer.write_with_metadata(batch, pa.py_buffer(end_message(sent)))
                ended = True
                break
            writer.write_batch(batch)
        if not ended:
            writer.write_metadata(end_message(sent))
        # Returning now would drop what is still queued to send (the last chunks, the end
        # message: seen with pyarrow 26's Flight server when the trainer's credit messages are
        # unread, and the trainer then asked again for nothing): wait until it closes its side.
        for _ in range(MAX_CREDIT_MESSAGES):
            try:
                _credit(reader)
            except DecoderRefusedError:
                break
        with self._lock:
            self.records_sent += sent

    # Every other Flight method: refused without pyarrow's default answer, which quotes a
    # Python traceback to the caller.
    def list_flights(self, context: Any, criteria: Any) -> Any:
        raise _only_exchange()

    def get_flight_info(self, context: Any, descriptor: Any) -> Any:
        raise _only_exchange()

    def get_schema(self, context: Any, descriptor: Any) -> Any:
        raise _only_exchange()

    def do_get(self, context: Any, ticket: Any) -> Any:
        raise _only_exchange()

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise _only_exchange()

    def do_action(self, context: Any, action: Any) -> Any:
        raise _only_exchange()

    def list_actions(self, context: Any) -> Any:
        raise _only_exchange()

    def figures(self) -> tuple[int, int]:
        """(slots, calls in flight): what its registration tells the master (issue 37). Slots
        are its decode threads (its cores when not set)."""
        return self.decoders.threads or usable_cores(), self.in_flight()

    def drain(self) -> None:
        """Refuses every call from now on (DRAINING); the calls admitted go on. Idempotent."""
        with self._lock:
            self._draining = True

    def in_flight(self) -> int:
        """Calls admitted and not yet ended."""
        with self._lock:
            return sum(self._calls.values())

    def close(self) -> None:
        """Stops serving (waits for the calls in flight) and its decode threads; idempotent
        (Flight's shutdown may be called only once)."""
        with self._lock:
            closed, self._closed = self._closed, True
        if closed:
            return
        self.shutdown()
        self.decoders.close()


def _credit(reader: flight.MetadataRecordBatchReader) -> int:
    """The next grant of credit from the trainer (blocks); raises DecoderRefusedError when the
    trainer hung up or sent something else."""
    try:
        chunk = reader.read_chunk()
    except StopIteration:
        raise DecoderRefusedError("the trainer closed the call") from None
    if chunk.data is not None:
        raise DecoderRefusedError("a trainer sends only credit, no record batches")
    metadata = chunk.app_metadata.to_pybytes() if chunk.app_metadata is not None else None
    return parse_control(metadata).get("credit", 0)


def _answers(request: DecodeRequest,
             chunks: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The chunks as sent: as decoded, or, when the request names the trainer's shared memfd,
    with their pixels written there (opened and checked before anything is decoded, and
    unmapped when the call ends)."""
    if request.shared_pixels is None or not request.records or not request.image_fields:
        yield from chunks
        return
    shared = PixelsWriter(request.shared_pixels, pixel_bytes(
        request.records, request.image_bytes(), len(request.image_fields)),
        request.shared_offset)
    first = 0
    try:
        for batch in chunks:
            yield _into_shared(batch, request, shared, first)
            first += batch.num_rows
    finally:
        shared.close()


def _into_shared(batch: pa.RecordBatch, request: DecodeRequest, shared: PixelsWriter,
                  first: int) -> pa.RecordBatch:
    """The chunk of records [first, first + rows) with its pixels written into the memfd
    (each image field's images one after another) and each image field sent as whether each
    record decoded."""
    image = request.image_bytes()
    columns = []
    for name, column in zip(batch.schema.names, batch.columns):
        if name in request.image_fields:
            field = request.image_fields.index(name)
            pixels = column.buffers()[1]
            shared.write((field * request.records + first) * image,
                          np.frombuffer(pixels, np.uint8, count=len(column) * image,
                                        offset=column.offset * image))
            column = column.is_valid()
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _only_exchange() -> flight.FlightServerError:
    return _refused("a trainfeed decoder serves DoExchange (decode requests) only")


def _refused(message: str) -> flight.FlightServerError:
    return flight.FlightServerError(message, extra_info=b"refused")


