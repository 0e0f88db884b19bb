"""ArrayPool: a batch's memory is reused only when nothing outside the pool can reach it."""
from __future__ import annotations

import gc

import numpy as np
import pytest
from optional import require

from trainfeed.io.array_pool import ArrayPool

SHAPE = (4, 8, 8, 3)


def address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def test_a_dropped_batch_is_reused() -> None:
    pool = ArrayPool()
    first = pool.empty(SHAPE, np.uint8)
    where = address(first)
    del first
    again = pool.empty(SHAPE, np.uint8)
    assert address(again) == where and pool.reused == 1


@pytest.mark.slow
@pytest.mark.parametrize("holder", ["array", "view", "slice", "memoryview", "dlpack", "torch"])
def test_a_batch_anything_still_holds_is_never_written_over(holder: str) -> None:
    pool = ArrayPool()
    batch = pool.empty(SHAPE, np.uint8)
    batch[:] = 7
    if holder == "array":
        kept: object = batch
    elif holder == "view":
        kept = batch.reshape(-1)
    elif holder == "slice":
        kept = batch[1]  # one image of the batch, as a trainer's list of samples keeps it
    elif holder == "memoryview":
        kept = memoryview(batch)
    elif holder == "dlpack":
        kept = batch.__dlpack__()
    else:
        torch = require("torch")
        kept = torch.from_numpy(batch)
    where = address(batch)
    del batch
    gc.collect()
    for _ in range(3):
        other = pool.empty(SHAPE, np.uint8)
        assert address(other) != where
        other[:] = 1
        del other
    assert pool.reused == 2  # the later arrays are reused among themselves, never the held one
    if holder == "torch":
        assert int(kept.sum()) == 7 * np.prod(SHAPE)  # type: ignore[attr-defined]
    elif holder in ("array", "view", "slice"):
        assert (np.asarray(kept) == 7).all()
    del kept
    gc.collect()
    assert address(pool.empty(SHAPE, np.uint8)) == where  # once let go, it is fair game again


def test_tensorflow_tensors_made_from_a_batch_keep_their_values() -> None:
    """TensorFlow copies a numpy array into its own tensor (it holds no reference to the
    batch), so the pool may reuse the batch's memory: the tensor must not change."""
    tf = require("tensorflow")
    pool = ArrayPool()
    batch = pool.empty(SHAPE, np.uint8)
    batch[:] = 5
    tensor = tf.convert_to_tensor(batch)
    del batch
    for _ in range(3):
        other = pool.empty(SHAPE, np.uint8)
        other[:] = 1
        del other
    assert pool.reused == 3
    assert int(tf.reduce_sum(tf.cast(tensor, tf.int64))) == 5 * np.prod(SHAPE)


def test_only_the_same_shape_and_dtype_is_reused() -> None:
    pool = ArrayPool()
    pool.empty(SHAPE, np.uint8)
    assert pool.empty((3, 8, 8, 3), np.uint8).shape == (3, 8, 8, 3)  # the last, short batch
    assert pool.empty(SHAPE, np.float32).dtype == np.float32
    assert pool.empty(SHAPE, np.uint8).shape == SHAPE
    assert pool.reused == 1


def test_the_pool_keeps_at_most_keep_arrays() -> None:
    pool = ArrayPool(keep=2)
    held = [pool.empty(SHAPE, np.uint8) for _ in range(3)]  # all held: three fresh arrays
    first = address(held[0])
    del held
    # Only the last two stayed in the pool: the first went with the trainer's list.
    reused = {address(pool.empty(SHAPE, np.uint8)) for _ in range(2)}
    assert first not in reused and pool.reused >= 1
    with pytest.raises(ValueError, match="keep"):
        ArrayPool(keep=0)


def test_a_released_buffer_is_reused_for_a_read_of_a_similar_size() -> None:
    pool = ArrayPool()
    first = pool.buffer(3_000_000)
    assert first.shape == (3_000_000,) and first.dtype == np.uint8
    where = address(first)
    del first
    again = pool.buffer(2_500_000)  # another row group, a few records smaller
    assert address(again) == where and again.size == 2_500_000 and pool.reused == 1
    del again
    # Less than half its size: a small read does not pin the large buffer.
    assert address(pool.buffer(100_000)) != where
    assert address(pool.buffer(0)) != where
    with pytest.raises(ValueError, match="nbytes"):
        pool.buffer(-1)


@pytest.mark.slow
@pytest.mark.parametrize("holder", ["view", "arrow buffer", "arrow slice", "memoryview"])
def test_a_buffer_anything_still_holds_is_never_written_over(holder: str) -> None:
    """A row group's payloads become an Arrow column over the buffer, and the shuffle keeps
    slices of it: as long as any of them lives, the buffer is not handed out again."""
    pa = require("pyarrow")
    pool = ArrayPool()
    data = pool.buffer(2_000_000)
    data[:] = 7
    if holder == "view":
        kept: object = data[10:20]
    elif holder == "arrow buffer":
        kept = pa.py_buffer(data)
    elif holder == "arrow slice":
        offsets = np.array([0, 1_000_000, 2_000_000], np.int32)
        column = pa.Array.from_buffers(pa.binary(), 2, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)])
        kept = column.slice(1, 1)
        del column
    else:
        kept = memoryview(data)
    where = address(data)
    del data
    gc.collect()
    for _ in range(3):
        other = pool.buffer(2_000_000)
        assert address(other) != where
        other[:] = 1
        del other
    if holder == "arrow slice":
        assert set(kept[0].as_py()) == {7}  # type: ignore[index]
    elif holder == "arrow buffer":
        assert set(kept.to_pybytes()) == {7}  # type: ignore[attr-defined]
    else:
        assert (np.asarray(kept) == 7).all()
    del kept
    gc.collect()
    assert address(pool.buffer(2_000_000)) == where



@pytest.mark.slow
def test_keep_bytes_bounds_what_the_pool_holds_on_to() -> None:
    """Buffers of large partitions: the pool forgets the oldest beyond `keep_bytes`, so they
    are freed when their holders let go instead of being kept for reuse."""
    pool = ArrayPool(keep=8, keep_bytes=3 << 20)
    held = [pool.buffer(1 << 20) for _ in range(5)]  # all in use: five fresh 1 MiB buffers
    newest = {address(b) for b in held[2:]}
    assert len({address(b) for b in held}) == 5
    assert sum(a.nbytes for a in pool._handed) == 3 << 20
    del held
    gc.collect()
    again = [pool.buffer(1 << 20) for _ in range(5)]
    assert pool.reused == 3  # only the newest three (3 MiB) were kept (without the bound: 5)
    assert newest <= {address(b) for b in again}
    one = ArrayPool(keep_bytes=0)
    assert one.buffer(10).size == 10 and len(one._handed) == 1  # the newest stays
    with pytest.raises(ValueError, match="keep_bytes"):
        ArrayPool(keep_bytes=-1)
