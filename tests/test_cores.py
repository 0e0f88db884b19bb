"""Every "one per core" default counts the cores this process may run on (its CPU affinity: a
container's cpuset, `taskset`), not the machine's: a packer or decode pool sized by the machine
on a slice of it oversubscribes the slice."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainfeed.cores import usable_cores

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="CPU affinity is a Linux interface")

PROBE = """
import json, os
os.sched_setaffinity(0, {%d})
from trainfeed.cores import usable_cores
from trainfeed.decode.pixels import default_decode_threads
from trainfeed.ingest.options import DEFAULT_PROCESSES, DEFAULT_READ_THREADS
print(json.dumps([usable_cores(), DEFAULT_PROCESSES, DEFAULT_READ_THREADS,
                  default_decode_threads({})]))
"""


def test_usable_cores_is_the_affinity_mask() -> None:
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_defaults_follow_a_narrowed_affinity_not_the_machine() -> None:
    """Pinned to one CPU (set before trainfeed is imported, as `taskset -c` would): one core,
    two packers, eight read threads, one decode thread, whatever os.cpu_count() says."""
    cpu = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", PROBE % cpu], capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout) == [1, 2, 8, 1]


def test_upload_help_states_the_narrowed_default() -> None:
    cpu = min(os.sched_getaffinity(0))
    out = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-m", "trainfeed.cli.main",
                          "upload", "--help"], capture_output=True, text=True, timeout=120,
                         check=True)
    assert "2 here" in " ".join(out.stdout.split())
