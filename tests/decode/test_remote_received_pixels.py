"""A batch of pixels from decoders as the trainer gets it (trainfeed.decode.remote.client.
received_pixels): the same bytes in writable memory, without a copy where the chunks lie one
after another in writable memory (a decoder on this host wrote them into the trainer's shared
memory: one call's chunks, or consecutive calls'), with one copy otherwise."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from trainfeed.decode.remote.client import received_pixels
from trainfeed.decode.remote.shared_pixels import PixelsWriter, SharedPixels

SHAPE = (2, 2, 3)
IMAGE = 12  # bytes per image


def column(memory: np.ndarray, rows: int, valid: list[bool] | None = None) -> pa.Array:
    """`rows` images in `memory` (writable numpy memory, as shared memory is) as a decoder's
    column, zero-copy."""
    bitmap = None if valid is None else pa.array(valid).buffers()[1]
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(IMAGE), rows,
                                                [bitmap, pa.py_buffer(memory)])


def test_a_batch_spanning_adjacent_chunks_is_a_view_not_a_copy() -> None:
    memory = np.arange(6 * IMAGE, dtype=np.uint8)
    first, second = column(memory[:4 * IMAGE], 4), column(memory[4 * IMAGE:], 2)
    batch = pa.chunked_array([first.slice(1), second])  # the end of one, the start of the next
    decoded = received_pixels(batch, SHAPE)
    assert decoded.images.shape == (5, *SHAPE) and decoded.ok.all()
    assert decoded.images.tobytes() == memory[IMAGE:].tobytes()
    assert decoded.images.flags.writeable  # (torch.from_numpy warns on read-only arrays)
    assert np.shares_memory(decoded.images, memory)
    decoded.images[0, 0, 0, 0] = 255  # the same memory
    assert memory[IMAGE] == 255


def test_consecutive_calls_in_shared_memory_make_one_view_kept_alive_by_the_batch() -> None:
    shared = SharedPixels(8 * IMAGE)
    first, second = shared.call(3 * IMAGE), shared.call(2 * IMAGE)
    assert first is not None and second is not None
    pixels = np.arange(5 * IMAGE, dtype=np.uint8)
    writer = PixelsWriter(shared.address, 5 * IMAGE)
    writer.write(0, pixels)
    writer.close()
    a = first.column(0, 3, IMAGE, pa.array([True] * 3))
    b = second.column(0, 2, IMAGE, pa.array([True, True]))
    decoded = received_pixels(pa.chunked_array([a.slice(2), b]), SHAPE)
    assert decoded.images.tobytes() == pixels[2 * IMAGE:].tobytes()
    assert np.shares_memory(decoded.images, np.frombuffer(a.buffers()[1], np.uint8))
    assert np.shares_memory(decoded.images, np.frombuffer(b.buffers()[1], np.uint8))
    first.end(True)
    second.end(True)
    del a, b
    assert not shared.idle  # the batch still reads both calls' bytes
    del decoded
    assert shared.idle
    shared.close()


def test_chunks_apart_or_read_only_are_copied_once_into_writable_memory() -> None:
    one, other = np.full(2 * IMAGE, 1, np.uint8), np.full(IMAGE, 2, np.uint8)
    apart = received_pixels(pa.chunked_array([column(one, 2), column(other, 1)]), SHAPE)
    assert apart.images.tobytes() == one.tobytes() + other.tobytes()
    assert apart.images.flags.writeable
    assert not np.shares_memory(apart.images, one) and not np.shares_memory(apart.images, other)
    # Over the network: Arrow's received buffers are read-only.
    received = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(IMAGE), 2, [None, pa.py_buffer(bytes([3]) * IMAGE + bytes([4]) * IMAGE)])
    assert not received.buffers()[1].is_mutable
    for batch in (received, pa.chunked_array([received]), pa.chunked_array([received] * 2)):
        decoded = received_pixels(batch, SHAPE)
        assert decoded.images.flags.writeable
        assert decoded.images.tobytes() == (bytes([3]) * IMAGE + bytes([4]) * IMAGE) * (
            2 if isinstance(batch, pa.ChunkedArray) and batch.num_chunks == 2 else 1)


def test_records_that_failed_to_decode_are_left_out() -> None:
    memory = np.arange(4 * IMAGE, dtype=np.uint8)
    batch = pa.chunked_array([column(memory[:2 * IMAGE], 2, [True, False]),
                              column(memory[2 * IMAGE:], 2, [True, True])])
    decoded = received_pixels(batch, SHAPE)
    assert decoded.ok.tolist() == [True, False, True, True]
    assert decoded.images.tobytes() == (memory[:IMAGE].tobytes()
                                        + memory[2 * IMAGE:].tobytes())
    empty = received_pixels(pa.chunked_array([], pa.binary(IMAGE)), SHAPE)
    assert empty.images.shape == (0, *SHAPE) and not len(empty.ok)
