"""The cores this process may run on: what every "one per core" default counts.

`os.cpu_count()` counts the machine's cores. A container's cpuset, `taskset` or a batch
scheduler's CPU binding narrows the ones this process may use (its CPU affinity): a packer pool
or decode pool sized by the machine's count on a 4-core slice of a 96-core node would start 97
processes or 96 threads that take turns on 4 cores.
"""
from __future__ import annotations

import os


def usable_cores() -> int:
    """The CPUs in this process's affinity mask (os.cpu_count() where the platform has none,
    e.g. macOS), at least 1."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return max(1, len(affinity(0)))
    return max(1, os.cpu_count() or 1)
