"""How many decode threads a reader starts when not told: the cores this process may run on,
shared among the training processes torchrun started on the node (LOCAL_WORLD_SIZE)."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import simplejpeg

from trainfeed.decode.crops import DEFAULT_RATIO, DEFAULT_SCALE, CropOptions
from trainfeed.decode.pixels import CROP_CHUNK, ImageDecoder, default_decode_threads
from trainfeed.errors import ConfigurationError

CORES = len(os.sched_getaffinity(0))


def test_every_core_of_this_process_by_default() -> None:
    assert default_decode_threads({}) == CORES
    decoder = ImageDecoder()
    assert decoder.threads == default_decode_threads()
    decoder.close()


def test_torchrun_s_local_ranks_share_the_cores() -> None:
    assert default_decode_threads({"LOCAL_WORLD_SIZE": "2"}) == max(1, CORES // 2)
    assert default_decode_threads({"LOCAL_WORLD_SIZE": str(CORES * 4)}) == 1  # never 0
    assert default_decode_threads({"LOCAL_WORLD_SIZE": "1"}) == CORES
    with pytest.raises(ConfigurationError, match="LOCAL_WORLD_SIZE"):
        default_decode_threads({"LOCAL_WORLD_SIZE": "two"})


@pytest.mark.slow
def test_a_narrower_cpu_affinity_is_what_counts() -> None:
    """As in a container's cpuset or under taskset: os.cpu_count() would still say every core."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from trainfeed.decode.pixels import default_decode_threads; "
            "print(default_decode_threads({}), os.cpu_count())")
    threads, machine = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                      text=True, check=True).stdout.split()
    assert threads == "1" and int(machine) >= 1


def test_an_explicit_count_wins() -> None:
    decoder = ImageDecoder(threads=3)
    assert decoder.threads == 3
    decoder.close()


class CountingPool(ThreadPoolExecutor):
    """A real pool that counts the tasks handed to it."""

    def __init__(self, workers: int):
        super().__init__(workers, thread_name_prefix="counted-decode")
        self.submitted = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def,override]
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def test_a_batch_is_one_pool_task_per_thread_not_one_per_chunk() -> None:
    """Issue 39, item 2: a task per chunk of CROP_CHUNK images (32 for a batch of 256) cost a
    future, a wake-up and a lock hand-off each under the GIL; the threads now take the chunks
    from one shared queue, so a batch is at most `threads` tasks, and every image is decoded
    once, into its own slot."""
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (24 + i % 9, 32, 3), dtype=np.uint8) for i in range(256)]
    blobs = [simplejpeg.encode_jpeg(image, quality=95) for image in images]
    decoder = ImageDecoder((16, 16), threads=2,
                           crops=CropOptions((16, 16), (DEFAULT_SCALE, DEFAULT_RATIO), flip=0.5))
    reference = ImageDecoder((16, 16), threads=1, crops=decoder.crops)
    pool = CountingPool(2)
    decoder._pool = pool
    try:
        ids = np.arange(len(blobs))
        got = decoder.decode(blobs, ["r"] * len(blobs), ids, seed=3, epoch=1)
        want = reference.decode(blobs, ["r"] * len(blobs), ids, seed=3, epoch=1)
        assert len(blobs) // CROP_CHUNK > decoder.threads  # chunks enough to tell the two apart
        assert pool.submitted <= decoder.threads
        assert sum(decoder.backend_counts.values()) == len(blobs)
        np.testing.assert_array_equal(got.images, want.images)
    finally:
        decoder.close()
        reference.close()
