"""Bounds against hangs follow the machine's load (issue 38): beside `stress-ng --cpu 8` on 2
cores (load 17), mypy of the package ran past pytest-timeout's 300 s and failed a test that was
only slow."""
from __future__ import annotations

import pytest
from machine_load import MAX_SLOWDOWN, hang_bound, latency_bound, scale_timeout, slowdown


def loaded(monkeypatch: pytest.MonkeyPatch, load: float, cores: int = 2) -> None:
    monkeypatch.setattr("os.getloadavg", lambda: (load, load, load))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))


@pytest.mark.parametrize(("load", "factor"), [(0.3, 1.0), (2.0, 1.0), (17.0, 8.5), (400.0, None)])
def test_a_hang_bound_grows_with_the_runnable_tasks_per_core(
        monkeypatch: pytest.MonkeyPatch, load: float, factor: float | None) -> None:
    loaded(monkeypatch, load)
    expected = MAX_SLOWDOWN if factor is None else factor
    assert slowdown() == expected
    assert hang_bound(300) == 300 * expected
    assert latency_bound(2.0) == 2.0 * expected


@pytest.mark.timeout(40)
def test_a_tests_timeout_is_scaled_to_the_load_when_it_starts(
        request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own mark (40 s here) times the slowdown, ahead of the mark it had; on an idle
    machine nothing is added."""
    node = request.node
    mark = node.get_closest_marker("timeout")
    assert mark is not None
    before = mark.args[0]  # (40, or more where this run's machine was busy)
    loaded(monkeypatch, 0.5)
    scale_timeout(node)
    assert node.get_closest_marker("timeout").args[0] == before
    loaded(monkeypatch, 10.0)
    scale_timeout(node)
    assert node.get_closest_marker("timeout").args[0] == before * 5
