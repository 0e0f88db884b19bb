"""The decoder's drain state (trainfeed.decoder.drain): pure, time as an argument."""
from __future__ import annotations

import pytest

from trainfeed.decoder.drain import Drain


def test_a_drain_admits_until_it_begins_and_ends_when_nothing_is_in_flight() -> None:
    drain = Drain(grace_s=20)
    assert drain.accepting and not drain.over(100.0, 0) and drain.deadline == float("inf")
    assert drain.begin(100.0)
    assert not drain.accepting and drain.deadline == 120.0
    assert not drain.begin(101.0) and drain.deadline == 120.0  # a second begin changes nothing
    assert not drain.over(110.0, 2)
    assert drain.over(110.0, 0)


def test_calls_outlasting_the_grace_end_the_drain_at_its_deadline() -> None:
    drain = Drain(grace_s=20)
    drain.begin(100.0)
    assert not drain.over(119.9, 1)
    assert drain.over(120.0, 1)


def test_a_second_signal_cuts_the_grace_short() -> None:
    drain = Drain(grace_s=20)
    drain.begin(100.0)
    drain.cut(103.0)
    assert drain.deadline == 103.0 and drain.over(103.0, 4)


def test_a_long_drain_says_so_after_five_seconds_then_every_five() -> None:
    drain = Drain(grace_s=20)
    drain.begin(100.0)
    assert [t for t in (100.0, 104.9, 105.0, 105.1, 109.9, 110.0, 112.0)
            if drain.log_due(t)] == [105.0, 110.0]


def test_until_is_the_deadline_as_a_wall_clock_time() -> None:
    drain = Drain(grace_s=20)
    drain.begin(100.0)
    # (time.localtime: the test's zone; only the shape and the 20 s offset are checked)
    assert drain.until(100.0, wall_now=0.0) == drain.until(110.0, wall_now=10.0)
    assert len(drain.until(100.0).split(":")) == 3


@pytest.mark.parametrize("grace", [-1.0, float("nan")])
def test_a_grace_below_zero_is_refused(grace: float) -> None:
    with pytest.raises(ValueError, match="drain grace"):
        Drain(grace_s=grace)
