"""How many decode threads a reader starts when not told: the cores this process may run on,
shared among the training processes torchrun started on the node (LOCAL_WORLD_SIZE)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trainfeed.decode.pixels import ImageDecoder, default_decode_threads
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
