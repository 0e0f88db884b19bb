"""How busy the machine is now, for the bounds a test keeps against a hang (issue 38).

Users run the test command on busy laptops. A bound that exists to end a hang (pytest-timeout's
300 s, a subprocess's `timeout=`) must not fire on a test that is only slow because other work
shares its cores: beside `stress-ng --cpu 8` on 2 cores, mypy of the package took over 300 s.
Such bounds are scaled by the measured load: the 1-minute load average per core (runnable tasks
per core; 1 or less means the test has a core to itself), read when the bound is set.

A latency the product claims for a process that has its core (a reader joining mid-epoch gets
records within 2 s) is scaled the same way by `latency_bound`: a process that shares its core
with k others waits k times as long for the same work (CI, beside stress-ng at ~4 tasks per
core: 2.6 s). On an idle machine the claim is tested as stated. Bounds that come from configured
timeouts (a lease outlived, a wait said within 5 s) are not scaled: the product keeps them on
any machine.
"""
from __future__ import annotations

import os

import pytest

#: The largest factor a bound is scaled by: a machine 20 times oversubscribed is not a test run.
MAX_SLOWDOWN = 20.0


def slowdown() -> float:
    """Runnable tasks per core now (1-minute load average), within [1, MAX_SLOWDOWN]."""
    cores = len(os.sched_getaffinity(0)) or 1
    return min(MAX_SLOWDOWN, max(1.0, os.getloadavg()[0] / cores))


def hang_bound(seconds: float) -> float:
    """`seconds`, a bound against a hang measured on an idle machine, scaled to the load now."""
    return seconds * slowdown()


def latency_bound(seconds: float) -> float:
    """`seconds`, a latency claimed for a process with a core of its own, scaled to the load now."""
    return seconds * slowdown()


def scale_timeout(item: pytest.Item) -> None:
    """pytest-timeout ends a hung test; on a busy machine a slow one is not hung. Gives `item`
    its bound (its `timeout` mark, else the configured one) times the slowdown now, as a mark
    that comes before its own (tests/conftest.py calls this as each test starts)."""
    marker = item.get_closest_marker("timeout")
    base = marker.args[0] if marker is not None and marker.args else item.config.getini("timeout")
    factor = slowdown()
    if base and factor > 1:
        item.add_marker(pytest.mark.timeout(float(base) * factor), append=False)
