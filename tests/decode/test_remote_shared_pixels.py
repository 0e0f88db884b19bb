"""Pixels through shared memory (trainfeed.decode.remote.shared_pixels), both ends in one process:
what a decoder writes, the trainer reads back zero-copy; a decoder opens only the sealed,
allocated memfd of the exact size a request names, so that a trainer can neither make it
allocate nor write elsewhere nor fault it; a trainer reads only inside its own memfd."""
from __future__ import annotations

import fcntl
import os
import secrets
import tempfile

import numpy as np
import pyarrow as pa
import pytest

from trainfeed.decode.remote.shared_pixels import (
    PREFIX,
    PixelsWriter,
    SharedPixels,
    SharedPixelsUnavailable,
    is_local,
)
from trainfeed.errors import DecoderRefusedError

IMAGE = 12  # bytes per image


def test_pixels_written_by_the_decoder_are_read_by_the_trainer_zero_copy() -> None:
    shared = SharedPixels(4 * IMAGE)
    call = shared.call(4 * IMAGE)
    assert call is not None and call.offset == 0
    writer = PixelsWriter(shared.address, 4 * IMAGE)
    pixels = np.arange(4 * IMAGE, dtype=np.uint8)
    writer.write(0, pixels[:2 * IMAGE])
    writer.write(2 * IMAGE, pixels[2 * IMAGE:])
    writer.close()
    writer.close()  # idempotent
    column = call.column(IMAGE, 3, IMAGE, pa.array([True, False, True]))
    recycled: list[SharedPixels] = []
    call.end(True, recycled.append)
    assert not recycled  # the column still uses it
    shared.close()
    shared.close()
    assert column.type == pa.binary(IMAGE) and column.null_count == 1
    assert column[0].as_py() == pixels[IMAGE:2 * IMAGE].tobytes()
    assert column[2].as_py() == pixels[3 * IMAGE:].tobytes()
    # The trainer's pixels are its own writable memory (no copy made for torch).
    view = np.frombuffer(column.buffers()[1], np.uint8)
    assert view.flags.writeable
    del column, view
    assert recycled == [shared]  # reused once its pixels are dropped


def test_a_calls_bytes_are_reused_only_once_its_pixels_are_dropped() -> None:
    shared = SharedPixels(2 * IMAGE)
    recycled: list[SharedPixels] = []
    call = shared.call(IMAGE)
    assert call is not None
    call.end(True, recycled.append)  # no column made: free at once
    assert recycled == [shared] and shared.idle
    call = shared.call(2 * IMAGE)  # (from the start: no room after the last call's bytes)
    assert call is not None and call.offset == 0
    table = pa.table({"image": call.column(0, 2, IMAGE, pa.array([True, True]))})
    call.end(True, recycled.append)
    assert shared.call(IMAGE) is None  # in use: no room
    batch = table.slice(1, 1)
    del table
    assert len(recycled) == 1  # a slice of the table still reads it
    taken = batch.take([0])  # (the shuffle buffer's take copies)
    del batch
    assert len(recycled) == 2 and taken.num_rows == 1 and shared.idle
    shared.close()


def test_consecutive_calls_lie_one_after_another_until_the_end_then_from_the_start() -> None:
    """So that a batch spanning two partitions is one view (trainfeed.decode.remote.client.
    received_pixels); a call never takes bytes another still uses."""
    shared = SharedPixels(10 * IMAGE)
    first, second = shared.call(4 * IMAGE), shared.call(4 * IMAGE)
    assert first is not None and second is not None
    assert (first.offset, second.offset) == (0, 4 * IMAGE)
    assert shared.call(4 * IMAGE) is None  # past the end, and the start is in use
    held = first.column(0, 1, IMAGE, pa.array([True]))
    first.end(True)
    assert shared.call(4 * IMAGE) is None  # still read by `held`
    del held
    third = shared.call(4 * IMAGE)
    assert third is not None and third.offset == 0
    assert shared.call(2 * IMAGE) is None  # after `third` is `second`, still in use
    second.end(True)
    fourth = shared.call(2 * IMAGE)
    assert fourth is not None and fourth.offset == 4 * IMAGE  # right after `third`
    shared.close()


def test_the_bytes_of_a_call_cut_off_are_never_reused() -> None:
    """Its decoder may still be writing there (a call given up on, not a dead decoder)."""
    shared = SharedPixels(4 * IMAGE)
    cut = shared.call(2 * IMAGE)
    assert cut is not None
    cut.end(False)
    later = [shared.call(IMAGE) for _ in range(4)]
    assert [c.offset for c in later if c is not None] == [2 * IMAGE, 3 * IMAGE]
    assert not shared.idle
    shared.close()


def test_the_trainer_reads_only_inside_its_memfd() -> None:
    shared = SharedPixels(8 * IMAGE)
    call = shared.call(4 * IMAGE)  # this call's bytes: the rest is not the decoder's to send
    assert call is not None
    with pytest.raises(DecoderRefusedError, match="bytes"):
        call.column(2 * IMAGE, 3, IMAGE, pa.array([True] * 3))  # rows past the end
    with pytest.raises(DecoderRefusedError, match="bytes"):
        call.column(-IMAGE, 1, IMAGE, pa.array([True]))
    with pytest.raises(DecoderRefusedError, match="validity"):
        call.column(0, 2, IMAGE, pa.array([True] * 3))  # not one boolean per row
    with pytest.raises(DecoderRefusedError, match="validity"):
        call.column(0, 2, IMAGE, pa.array([1, 1]))
    shared.close()


def test_a_decoder_cannot_shrink_the_trainers_memfd() -> None:
    """The seals: neither side can fault the other with SIGBUS by resizing the memfd."""
    shared = SharedPixels(4 * IMAGE)
    pid, fd, _ = shared.address.split("/")
    theirs = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(theirs, 0)
    finally:
        os.close(theirs)
        shared.close()


@pytest.mark.parametrize("address", [
    "1/2/../../etc/passwd", f"0/3/{PREFIX}{'0' * 32}", f"1/2/{PREFIX}{'0' * 31}",
    f"1/2/{PREFIX}{'0' * 32}/x", f"1/2/other-{'0' * 32}", "", f"1/-2/{PREFIX}{'0' * 32}"])
def test_a_malformed_memfd_address_is_refused(address: str) -> None:
    with pytest.raises(DecoderRefusedError, match="is not"):
        PixelsWriter(address, IMAGE)


def test_a_memfd_elsewhere_is_unavailable_not_fatal() -> None:
    """Another host or pid namespace: the decoder says so, and the trainer asks again over
    the network (trainfeed.decode.remote.client)."""
    with pytest.raises(SharedPixelsUnavailable):
        PixelsWriter(f"999999999/3/{PREFIX}{'0' * 32}", IMAGE)


def test_a_decoder_opens_nothing_but_the_named_memfd() -> None:
    """A request naming another of the trainer's (or the decoder's) descriptors, a regular
    file, is refused, and the file is left as it was."""
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * IMAGE)
        f.flush()
        address = f"{os.getpid()}/{f.fileno()}/{PREFIX}{secrets.token_hex(16)}"
        with pytest.raises(SharedPixelsUnavailable):
            PixelsWriter(address, IMAGE)
        f.seek(0)
        assert f.read() == b"x" * IMAGE
    # Another trainer's memfd, whose name this request does not know.
    other = SharedPixels(IMAGE)
    pid, fd, _ = other.address.split("/")
    with pytest.raises(SharedPixelsUnavailable):
        PixelsWriter(f"{pid}/{fd}/{PREFIX}{secrets.token_hex(16)}", IMAGE)
    other.close()


def _memfd(size: int, allocate: bool, seal: bool) -> tuple[int, str]:
    name = PREFIX + secrets.token_hex(16)
    fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if allocate:
        os.posix_fallocate(fd, 0, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd, f"{os.getpid()}/{fd}/{name}"


@pytest.mark.parametrize("allocate, seal, size, message", [
    (True, False, IMAGE, "not sealed"),  # could be shrunk under the decoder: SIGBUS
    (False, True, IMAGE, "not allocated"),  # the decoder's writes would allocate it
    (True, True, 2 * IMAGE, "has 12 bytes"),  # smaller than the request's pixels
])
def test_a_memfd_not_as_the_request_says_is_refused(allocate: bool, seal: bool, size: int,
                                                       message: str) -> None:
    fd, address = _memfd(IMAGE, allocate, seal)
    try:
        with pytest.raises(DecoderRefusedError, match=message):
            PixelsWriter(address, size)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("offset", "size"), [(1, 8192), (5000, 4096),
                                               (8192 - IMAGE + 1, IMAGE), (1 << 40, IMAGE)])
def test_a_request_whose_pixels_end_past_the_memfd_is_refused(offset: int, size: int) -> None:
    fd, address = _memfd(8192, True, True)
    try:
        with pytest.raises(DecoderRefusedError, match="has 8192 bytes"):
            PixelsWriter(address, size, offset)
    finally:
        os.close(fd)


def test_a_decoder_writes_a_call_at_its_offset_and_nowhere_else() -> None:
    """The second call's bytes start inside a page the first call's end in: the decoder maps
    from that page but writes only the request's bytes."""
    shared = SharedPixels(3 * 4096)
    first, second = shared.call(4096 + IMAGE), shared.call(2 * IMAGE)
    assert first is not None and second is not None and second.offset == 4096 + IMAGE
    writer = PixelsWriter(shared.address, 2 * IMAGE, second.offset)
    writer.write(0, np.full(2 * IMAGE, 7, np.uint8))
    with pytest.raises(DecoderRefusedError, match="do not fit"):
        writer.write(IMAGE + 1, np.zeros(IMAGE, np.uint8))
    writer.close()
    mine = first.column(0, 1, 4096 + IMAGE, pa.array([True]))
    theirs = second.column(0, 2, IMAGE, pa.array([True, True]))
    assert not any(mine[0].as_py())  # the first call's bytes: untouched
    assert theirs[0].as_py() + theirs[1].as_py() == bytes([7]) * 2 * IMAGE
    shared.close()


def test_a_decoder_writes_only_inside_the_requests_pixels() -> None:
    """A memfd larger than the request (reused from a larger call) is mapped only as far as
    the request's pixels go."""
    shared = SharedPixels(4 * IMAGE)
    writer = PixelsWriter(shared.address, 2 * IMAGE)
    with pytest.raises(DecoderRefusedError, match="do not fit"):
        writer.write(IMAGE + 1, np.zeros(IMAGE, np.uint8))
    writer.close()
    shared.close()


def test_only_loopback_decoders_are_offered_a_memfd() -> None:
    assert is_local("127.0.0.1:5000") and is_local("localhost:5000") and is_local("[::1]:50")
    assert not is_local("decoder-0.decoders:5000") and not is_local("10.0.0.3:5000")


def test_a_pool_reuses_its_memfds_but_a_forked_child_makes_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Consecutive calls go one after another into the pool's arena, and a call too large
    for it into a memfd of its own, reused once free. Two processes writing through one memfd
    would mix their pixels: a DataLoader worker forked from a trainer makes its own."""
    from trainfeed.decode.remote import client
    from trainfeed.decode.remote.client import DecoderPool

    monkeypatch.setattr(client, "ARENA_MIN_BYTES", 8 * IMAGE)
    monkeypatch.setattr(client, "ARENA_MAX_BYTES", 8 * IMAGE)
    pool = DecoderPool(["127.0.0.1:1"], None)
    decoder = pool._decoders["127.0.0.1:1"]
    first = pool._shared(decoder, IMAGE)
    assert first is not None and first.memory is pool._arena and first.offset == 0
    first.end(True)
    second = pool._shared(decoder, IMAGE)
    assert second is not None and second.memory is pool._arena
    assert second.offset == IMAGE  # right after the first
    second.end(True)
    big = pool._shared(decoder, 3 * IMAGE)  # over a quarter of the arena: its own memfd
    assert big is not None and big.memory is not pool._arena
    big.end(True, pool._put_shared)
    again = pool._shared(decoder, 3 * IMAGE)
    assert again is not None and again.memory is big.memory  # free, and large enough
    again.end(True, pool._put_shared)
    child = os.fork()
    if child == 0:  # (no Flight connection is open: the pool never called a decoder)
        mine, own = pool._shared(decoder, IMAGE), pool._shared(decoder, 3 * IMAGE)
        os._exit(0 if mine is not None and own is not None and mine.memory is not first.memory
                 and own.memory is not big.memory else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    pool.close()


def test_the_free_memfds_a_pool_keeps_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most FREE_SHARED and FREE_SHARED_BYTES of them, the smallest closed first, but the
    largest always kept (the next partition needs as much)."""
    from trainfeed.decode.remote import client
    from trainfeed.decode.remote.client import DecoderPool

    monkeypatch.setattr(client, "FREE_SHARED", 3)
    monkeypatch.setattr(client, "FREE_SHARED_BYTES", 10 * IMAGE)
    pool = DecoderPool(["127.0.0.1:1"], None)
    made = [SharedPixels(n * IMAGE) for n in (1, 2, 3, 4, 20)]
    for shared in made[:4]:
        pool._put_shared(shared)
    assert [s.capacity for s in pool._free] == [4 * IMAGE, 3 * IMAGE, 2 * IMAGE]  # count
    pool._put_shared(made[4])  # over the bytes alone: kept, the others closed
    assert pool._free == [made[4]]
    assert all(s._fd is None for s in made[:4]) and made[4]._fd is not None
    pool.close()
    assert made[4]._fd is None
