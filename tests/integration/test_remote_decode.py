"""Remote decode (issue 37) against real `trainfeed decoder` processes on loopback.

A remote-decoded pass equals a local-decoded one byte for byte (train crops and flips, and the
validation centre crop); decoders SIGKILLed again and again while readers lease from a real
master lose and repeat nothing; a decoder that comes up mid-read takes requests; what remote
decode cannot run is refused when the reader is made, naming the option; calls without the
token, or over a request bound, are refused with the reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.flight as flight
import pytest
from integration.decoding import DECODER_TOKEN
from integration.services import free_port

from trainfeed import LocalSource, MasterSource, dist
from trainfeed.decode.remote import client as remote_client
from trainfeed.decode.remote import shared_pixels
from trainfeed.decode.remote.client import DecoderPool, RequestTemplate
from trainfeed.decode.remote.wire import (
    MAX_CALLS_PER_CLIENT,
    MAX_CHUNK_RECORDS,
    MAX_RECORDS,
    DecodeRequest,
    DecoderRefusedError,
)
from trainfeed.decoder.process import DecoderProcess
from trainfeed.errors import AuthenticationError, ConfigurationError
from trainfeed.formats.manifest import read_manifest
from trainfeed.io.prefetch import TaskRef
from trainfeed.master.serve.process import MasterProcess
from trainfeed.reader.options import (
    BatchOptions,
    DecodeOptions,
    PipelineOptions,
    SamplingOptions,
)
from trainfeed.security import job_token
from trainfeed.storage import open_storage

# Each test starts decoder processes (a second or more each on the shared CI machine).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = DECODER_TOKEN
SIZE = (24, 24)
TRAIN = PipelineOptions(
    decode=DecodeOptions(enabled=True, image_size=SIZE,
                         random_resized_crop=((0.08, 1.0), (3 / 4, 4 / 3)), random_flip=True),
    batch=BatchOptions(size=10), sampling=SamplingOptions(shuffle_buffer=30))
VALIDATION = PipelineOptions(
    decode=DecodeOptions(enabled=True, image_size=SIZE, resize_shorter=28),
    batch=BatchOptions(size=10), mode="validation")


def passes(reader: Any, epochs: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(epoch, ids, images) of every batch of `epochs` passes (copies)."""
    out = []
    try:
        for epoch in range(epochs):
            out += [(epoch, b["_id"].copy(), b["image"].copy()) for b in reader()]
    finally:
        reader.close()
    return out


@pytest.mark.parametrize("options", [TRAIN, VALIDATION], ids=["train", "validation"])
def test_a_remote_pass_equals_a_local_pass_byte_for_byte(storage: str, remote: Any,
                                                         options: PipelineOptions) -> None:
    local = passes(dist.reader("flowers", source=LocalSource(storage=storage, seed=7),
                               pipeline=options), 2)
    with DecoderProcess(storage, TOKEN) as one, DecoderProcess(storage, TOKEN) as two:
        remote(one.address, two.address)
        reader = dist.reader("flowers", source=LocalSource(storage=storage, seed=7),
                             pipeline=options)
        pool = reader._pipeline.remote.pool
        got = passes(reader, 2)
    # Every call answered whole the first time (none cut off and asked again).
    assert pool.failed() == {one.address: 0, two.address: 0}
    assert sum(pool.served().values()) >= 10
    assert len(got) == len(local) == 20
    for (epoch, ids, images), (_, want_ids, want) in zip(got, local):
        assert (ids == want_ids).all(), f"epoch {epoch}: another order"
        assert images.dtype == want.dtype and images.shape == want.shape
        assert images.tobytes() == want.tobytes(), f"epoch {epoch}: other pixels"
    if options is TRAIN:  # the crops are random: epochs differ, so the test can fail
        assert got[0][2].tobytes() != got[10][2].tobytes()


def test_a_remote_batch_is_a_view_of_where_the_decoder_wrote_its_pixels(
        storage: str, remote: Any) -> None:
    """A decoder on the trainer's host writes consecutive partitions' pixels one after another
    into the trainer's shared memory, so every batch, those spanning two partitions too
    (batches of 7, partitions of 10), is a view of it: the trainer copies no pixel. Byte for
    byte the local pass."""
    options = dataclasses.replace(VALIDATION, batch=BatchOptions(size=7))
    local = passes(dist.reader("flowers", source=LocalSource(storage=storage, seed=7),
                               pipeline=options), 1)
    with DecoderProcess(storage, TOKEN) as decoder:
        remote(decoder.address)
        reader = dist.reader("flowers", source=LocalSource(storage=storage, seed=7),
                             pipeline=options)
        pool = reader._pipeline.remote.pool
        got, views = [], []
        try:
            for batch in reader():
                arena = np.frombuffer(pool._arena._mapped, np.uint8)
                views.append(np.shares_memory(batch["image"], arena))
                got.append((0, batch["_id"].copy(), batch["image"].copy()))
        finally:
            reader.close()
    assert len(got) == len(local) == 15 and all(views), views
    for (_, ids, images), (_, want_ids, want) in zip(got, local):
        assert (ids == want_ids).all() and images.tobytes() == want.tobytes()


def local_pixels(storage: str, epochs: int) -> dict[tuple[int, int], bytes]:
    """Each (epoch, record)'s train pixels, decoded locally (crops are seeded per record, so
    any reader's order gives the same pixels for a record)."""
    return {(epoch, int(i)): image.tobytes()
            for epoch, ids, images in passes(
                dist.reader("flowers", source=LocalSource(storage=storage, seed=7),
                            pipeline=TRAIN), epochs)
            for i, image in zip(ids, images)}


def test_records_come_exactly_once_while_decoders_are_killed(storage: str,
                                                             remote: Any) -> None:
    """Three decoders, one SIGKILLed (and restarted on its port) every ~0.2 s, two readers
    leasing from a master: every record of three epochs exactly once, each with its local
    pixels."""
    want = local_pixels(storage, 3)
    decoders = [DecoderProcess(storage, TOKEN) for _ in range(3)]
    done = threading.Event()
    kills = Counter[int]()

    def killer() -> None:
        rng = random.Random(0)
        while not done.wait(0.2):
            k = rng.randrange(3)
            decoders[k].kill()
            kills[k] += 1
            decoders[k] = DecoderProcess(storage, TOKEN, port=decoders[k].port)
    thread = threading.Thread(target=killer, daemon=True)
    try:
        with MasterProcess(storage, token=TOKEN) as master:
            remote(*(d.address for d in decoders), token=job_token(TOKEN, "killed"))
            source = MasterSource(master.address, "killed", seed=7)
            reader = dist.reader("flowers", source=source, pipeline=TRAIN)
            thread.start()
            got = passes(reader, 3)
    finally:
        done.set()
        thread.join(30)
        for d in decoders:
            d.stop()
    seen = Counter((epoch, int(i)) for epoch, ids, _ in got for i in ids)
    assert set(seen) == set(want), "records lost or invented"
    assert max(seen.values()) == 1, "a record came twice"
    for epoch, ids, images in got:
        for i, image in zip(ids, images):
            assert image.tobytes() == want[(epoch, int(i))], f"record {i} of epoch {epoch}"
    assert sum(kills.values()) >= 1


def first_partition(storage: str) -> TaskRef:
    """Partition 0 of epoch 0 of "flowers": the first row group of its shard (10 records)."""
    shard = read_manifest(open_storage(storage), "flowers").shards[0].path
    return TaskRef(0, 0, shard, 0, 1, 10)


def a_request(storage: str, **changes: Any) -> DecodeRequest:
    """Validation records [0, 10) of partition 0, 10 a chunk, with `changes`."""
    template = RequestTemplate(
        dataset="flowers", version=None, shuffle_seed=None, seed=0, mode="validation",
        fields=("image", "label"), image_fields=("image",),
        decode={"enabled": True, "image_size": SIZE, "resize_shorter": 28},
        max_pixels=1 << 24, chunk=10)
    request = template.request(first_partition(storage), 0, 10)
    return DecodeRequest(**{**request.__dict__, **changes})


def test_a_segment_goes_on_from_the_last_record_received(storage: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The decoder serving a segment dies after two chunks of one record: the rest comes from
    the other one, and the records equal an undisturbed fetch's."""
    request = a_request(storage, shuffle_seed=7, seed=7, mode="train", skip=2, stop=9, chunk=1,
                        decode={"enabled": True, "image_size": SIZE, "random_flip": True,
                                "random_resized_crop": [[0.08, 1], [0.75, 1.3]]})
    with DecoderProcess(storage, TOKEN) as first, DecoderProcess(storage, TOKEN) as second:
        pool = DecoderPool([first.address], TOKEN)
        undisturbed = pool.fetch(request)
        pool.add(second.address)
        call = DecoderPool._call

        def dying(self: DecoderPool, decoder: Any, rest: DecodeRequest) -> Iterator[Any]:
            for n, batch in enumerate(call(self, decoder, rest)):
                yield batch
                if decoder.address == first.address and n == 1:
                    first.kill()  # mid-stream: two records received, credit for more
        monkeypatch.setattr(DecoderPool, "_call", dying)
        got = pool.fetch(request)
        pool.close()
    rows = [r for b in got for r in b.to_pylist()]
    assert rows == [r for b in undisturbed for r in b.to_pylist()]
    assert len(rows) == 7


def test_a_decoder_imports_what_a_request_needs_before_it_listens(storage: str) -> None:
    """pandas (which pyarrow's ChunkedArray.to_numpy imports) and OpenCV are loaded when the
    decoder says it listens (its shared libraries mapped), not by its first request: that
    import was 1.3-1.6 s of a fresh decoder's first call on a loaded machine, and a trainer
    sends a decoder it was just told of a segment first, so every restart stalled the
    partition waiting for it (benchmarks/decoder_faults.py, docs/benchmarks.md)."""
    with DecoderProcess(storage, TOKEN) as decoder:
        with open(f"/proc/{decoder.pid}/maps") as f:
            mapped = f.read()
    assert "/cv2/" in mapped, "OpenCV not loaded before listening"
    assert "/pandas/_libs/" in mapped, "pandas not loaded before listening"


def test_a_decoder_that_comes_up_mid_read_takes_requests(storage: str, remote: Any,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Two decoders listed, the second not yet started: the first serves; once the second is
    up (and its DOWN_S pause is over) the next epoch's requests go to both."""
    with DecoderProcess(storage, TOKEN) as first:
        late_port = free_port()
        remote(first.address, f"127.0.0.1:{late_port}")
        reader = dist.reader("flowers", source=LocalSource(storage=storage, seed=7),
                             pipeline=TRAIN)
        try:
            assert sum(len(b["_id"]) for b in reader()) == 100
            with DecoderProcess(storage, TOKEN, port=late_port) as late:
                time.sleep(remote_client.DOWN_S)
                assert sum(len(b["_id"]) for b in reader()) == 100
                pipeline = reader._pipeline
                assert pipeline.remote is not None
                served = pipeline.remote.pool.served()
        finally:
            reader.close()
    assert served[late.address] > 0, served
    assert served[first.address] > 0, served


def test_options_remote_decode_cannot_run_are_refused_at_creation(storage: str,
                                                                  remote: Any) -> None:
    remote("127.0.0.1:1")
    local = LocalSource(storage=storage)
    with pytest.raises(ConfigurationError, match="image_size=None"):
        dist.reader("flowers", source=local, pipeline=PipelineOptions(
            decode=DecodeOptions(enabled=True), batch=BatchOptions(size=10)))
    with pytest.raises(ConfigurationError, match="resample='uniform'"):
        dist.reader("flowers", source=local, pipeline=PipelineOptions(
            decode=DecodeOptions(enabled=True, image_size=SIZE), batch=BatchOptions(size=10),
            sampling=SamplingOptions(resample="uniform")))
    remote()
    with pytest.raises(ConfigurationError, match="TRAINFEED_DECODERS=host:port"):
        dist.reader("flowers", source=local, pipeline=TRAIN)


@pytest.mark.parametrize("token", [None, "not-the-decoders-token-0000", job_token("other", "j")],
                         ids=["missing", "wrong", "job-token-of-another-master"])
def test_a_call_without_the_token_is_refused(storage: str, remote: Any,
                                             token: str | None) -> None:
    with DecoderProcess(storage, TOKEN) as decoder:
        remote(decoder.address, token=token)
        reader = dist.reader("flowers", source=LocalSource(storage=storage), pipeline=TRAIN)
        with pytest.raises(AuthenticationError, match="refused the token"):
            passes(reader, 1)


def test_a_job_token_made_from_the_decoders_token_is_admitted(storage: str,
                                                              remote: Any) -> None:
    with DecoderProcess(storage, TOKEN) as decoder:
        remote(decoder.address, token=job_token(TOKEN, "some-job"))
        got = passes(dist.reader("flowers", source=LocalSource(storage=storage),
                                 pipeline=TRAIN), 1)
    assert sum(len(ids) for _, ids, _ in got) == 100


@pytest.mark.parametrize(("changes", "message"), [
    ({"chunk": MAX_CHUNK_RECORDS + 1}, f"outside the bound \\[1, {MAX_CHUNK_RECORDS}\\]"),
    ({"num_records": MAX_RECORDS + 1, "stop": MAX_RECORDS + 1},
     f"over the bound of {MAX_RECORDS} records per request"),
    ({"decode": {"enabled": True, "image_size": [5000, 5000]}}, "outside the bound"),
    ({"dataset": "../elsewhere"}, "dataset '../elsewhere'"),
    ({"shard": "../../outside.parquet"}, "refused unopened"),
    # Not a bound, a request it cannot serve: answered once, with the reason, not retried.
    ({"skip": 20, "stop": 30}, "the decoder failed: CheckpointError: partition 0 of epoch 0"),
], ids=["chunk", "records", "image-bytes", "dataset-path", "shard-path", "past-the-end"])
def test_a_request_over_the_bounds_is_refused_with_the_reason(storage: str, changes: Any,
                                                              message: str) -> None:
    with DecoderProcess(storage, TOKEN) as decoder:
        pool = DecoderPool([decoder.address], TOKEN)
        try:
            assert len(pool.fetch(a_request(storage))[0]) == 10  # the request as made is served
            with pytest.raises(DecoderRefusedError, match=message):
                pool.fetch(a_request(storage, **changes))
        finally:
            pool.close()


def admitted(client: flight.FlightClient, command: flight.FlightDescriptor,
             options: flight.FlightCallOptions) -> tuple[Any, Any]:
    """A call the decoder has admitted and holds in flight: one chunk granted and received
    (so the decoder counted it), the rest neither granted nor read, the trainer's side open.
    The decoder waits on it for credit until the call is closed."""
    writer, reader = client.do_exchange(command, options)
    writer.write_metadata(b'{"credit": 1}')
    first = reader.read_chunk()
    assert first.data is not None and first.data.num_rows == 1
    return writer, reader


def ended(writer: Any, reader: Any) -> None:
    """Closes a held call and reads its status: once that is read, its handler has returned
    (and its count in flight is given back) on the decoder."""
    with contextlib.suppress(flight.FlightError):  # the decoder's "closed" answer
        writer.done_writing()
    with contextlib.suppress(flight.FlightError, StopIteration):
        while True:
            reader.read_chunk()
    with contextlib.suppress(flight.FlightError):
        writer.close()


def test_calls_in_flight_per_client_are_bounded(storage: str) -> None:
    """A client holding MAX_CALLS_PER_CLIENT calls in flight (each admitted: its first chunk
    received; the rest never granted) is refused one more on its connection, with the bound
    named; once one of them ends, a call is admitted again.

    (Each held call is known to be admitted before the next is opened: opened all at once, the
    calls reach the decoder in any order, and the one refused could be a held call while the
    probe was admitted; that made this test flaky.)"""
    with DecoderProcess(storage, TOKEN) as decoder:
        client = flight.connect(f"grpc://{decoder.address}")
        options = flight.FlightCallOptions(
            headers=[(b"authorization", f"Bearer {TOKEN}".encode())], timeout=300)
        # Ten records, one a chunk: a held call has nine left to send.
        command = flight.FlightDescriptor.for_command(a_request(storage, chunk=1).encode())
        held: list[tuple[Any, Any]] = []
        try:
            for _ in range(MAX_CALLS_PER_CLIENT):
                held.append(admitted(client, command, options))
            writer, reader = client.do_exchange(command, options)
            writer.write_metadata(b'{"credit": 1}')
            with pytest.raises(flight.FlightServerError) as refused:
                reader.read_chunk()
            assert (f"{MAX_CALLS_PER_CLIENT} calls of this client are in flight: the bound is "
                    f"{MAX_CALLS_PER_CLIENT} per client connection") in str(refused.value)
            assert refused.value.extra_info == b"refused"
            ended(writer, reader)
            ended(*held.pop())
            held.append(admitted(client, command, options))  # a slot is free again
        finally:
            for call in held:
                ended(*call)
            client.close()


def test_a_pool_keeps_its_calls_to_one_decoder_under_the_bound(storage: str) -> None:
    """Twice MAX_CALLS_PER_CLIENT fetches at once through one decoder (more tasks than its
    bound, as a deep prefetch with one decoder makes): each waits for a slot instead of being
    refused, which failed the task."""
    from concurrent.futures import ThreadPoolExecutor

    with DecoderProcess(storage, TOKEN) as decoder:
        pool = DecoderPool([decoder.address], TOKEN)
        request = a_request(storage, chunk=1)  # ten one-record chunks: the calls overlap
        try:
            with ThreadPoolExecutor(2 * MAX_CALLS_PER_CLIENT) as ex:
                got = list(ex.map(pool.fetch, [request] * (2 * MAX_CALLS_PER_CLIENT)))
        finally:
            pool.close()
    assert [sum(b.num_rows for b in batches) for batches in got] == [10] * len(got)
    assert pool.served() == {decoder.address: 2 * MAX_CALLS_PER_CLIENT}


def test_every_other_flight_method_is_refused_plainly(storage: str) -> None:
    """Only DoExchange serves; the rest answer so, with no traceback quoted, and only after
    the token check."""
    with DecoderProcess(storage, TOKEN) as decoder:
        client = flight.connect(f"grpc://{decoder.address}")
        good = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
        calls = {
            "ListFlights": lambda o: list(client.list_flights(options=o)),
            "GetFlightInfo": lambda o: client.get_flight_info(
                flight.FlightDescriptor.for_command(b"x"), o),
            "DoGet": lambda o: client.do_get(flight.Ticket(b"x"), o).read_all(),
            "DoAction": lambda o: list(client.do_action(flight.Action("x", b""), o)),
            "ListActions": lambda o: client.list_actions(o),
        }
        try:
            for name, call in calls.items():
                with pytest.raises(flight.FlightUnauthenticatedError):
                    call(flight.FlightCallOptions())
                with pytest.raises(flight.FlightServerError) as refused:
                    call(good)
                assert "serves DoExchange (decode requests) only" in str(refused.value), name
                assert "Traceback" not in str(refused.value), name
        finally:
            client.close()


def train_request(storage: str) -> DecodeRequest:
    """Train records [2, 9) of partition 0, in chunks of 3 (three chunks, the last short)."""
    return a_request(storage, shuffle_seed=7, seed=7, mode="train", skip=2, stop=9, chunk=3,
                     decode={"enabled": True, "image_size": SIZE, "random_flip": True,
                             "random_resized_crop": [[0.08, 1], [0.75, 1.3]]})


def test_a_decoder_on_this_host_writes_the_pixels_into_shared_memory(storage: str) -> None:
    """The same records, through a memfd of the trainer's and over the network, are the same
    bytes; the memfd (the pool's arena) serves the next call too."""
    request = train_request(storage)
    with DecoderProcess(storage, TOKEN) as decoder:
        shared = DecoderPool([decoder.address], TOKEN)
        network = DecoderPool([decoder.address], TOKEN, shared_memory=False)
        try:
            got = [r for b in shared.fetch(request) for r in b.to_pylist()]
            again = [r for b in shared.fetch(request) for r in b.to_pylist()]
            want = [r for b in network.fetch(request) for r in b.to_pylist()]
            assert shared.shared() == {decoder.address: 2}
            assert network.shared() == {decoder.address: 0}
            assert shared._arena is not None and not shared._free  # one memfd, both calls
        finally:
            shared.close()
            network.close()
    assert len(got) == 7 and got == want == again


def test_a_decoder_that_cannot_open_the_memfd_is_asked_over_the_network(
        storage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decoder in another pid namespace (here: the memfd named under a pid it cannot see)
    refuses it, and the call is made again with the pixels in the chunks, as are the next."""
    class Elsewhere(shared_pixels.SharedPixels):
        def __init__(self, capacity: int):
            super().__init__(capacity)
            self.address = f"999999999/{self.address.split('/', 1)[1]}"
    monkeypatch.setattr(remote_client, "SharedPixels", Elsewhere)
    request = train_request(storage)
    with DecoderProcess(storage, TOKEN) as decoder:
        pool = DecoderPool([decoder.address], TOKEN)
        network = DecoderPool([decoder.address], TOKEN, shared_memory=False)
        try:
            got = [r for _ in range(2) for b in pool.fetch(request) for r in b.to_pylist()]
            want = [r for b in network.fetch(request) for r in b.to_pylist()]
            assert pool.shared() == {decoder.address: 0}
            assert pool.served() == {decoder.address: 2} and pool.failed()[decoder.address] == 0
        finally:
            pool.close()
            network.close()
    assert got == want * 2


def test_a_request_naming_a_descriptor_of_the_decoder_is_refused(storage: str) -> None:
    """A trainer names the decoder's own stdout as its memfd: refused (not a memfd of that
    name), nothing written to it, and the decoder serves on."""
    with DecoderProcess(storage, TOKEN) as decoder:
        request = a_request(storage, shared_pixels=(
            f"{decoder.pid}/1/{shared_pixels.PREFIX}{'0' * 32}"))
        client = flight.connect(f"grpc://{decoder.address}")
        options = flight.FlightCallOptions(
            headers=[(b"authorization", f"Bearer {TOKEN}".encode())], timeout=60)
        try:
            writer, reader = client.do_exchange(
                flight.FlightDescriptor.for_command(request.encode()), options)
            with pytest.raises(flight.FlightServerError) as refused:
                # (The decoder opens the memfd before it waits for credit: its refusal may
                # already be in when the credit goes out, which then raises it.)
                writer.write_metadata(b'{"credit": 1}')
                reader.read_chunk()
            assert refused.value.extra_info == shared_pixels.NO_SHARED_PIXELS
            assert "no shared memfd" in str(refused.value)
            with contextlib.suppress(flight.FlightError):  # (the refusal again)
                writer.close()
        finally:
            client.close()
        pool = DecoderPool([decoder.address], TOKEN)
        try:
            assert len(pool.fetch(a_request(storage))[0]) == 10
        finally:
            pool.close()
        assert not any("\x00" in line for line in decoder.log)  # no pixels on its stdout
