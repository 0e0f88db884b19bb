"""ArrayPool: a batch's memory is reused only when nothing outside the pool can reach it."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from trainfeed.worker.array_pool import ArrayPool

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
        torch = pytest.importorskip("torch")
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
    tf = pytest.importorskip("tensorflow")
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
