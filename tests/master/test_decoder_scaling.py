"""The decoder pool's scaling policy (trainfeed.master.core.decoder_scaling): examples of each
rule, then Hypothesis over any sequence of observations for the invariants."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainfeed.master.core.decoder_scaling import (
    DOWN_BUSY,
    HOLD,
    REASONS,
    UP,
    UP_BUSY,
    UP_INPUT_BOUND,
    Bounds,
    DecoderScaler,
    Observation,
    trainer_shares,
)
from trainfeed.master.core.messages import ReaderStats
from trainfeed.master.core.reader_stats import RECENT_S, ReaderBoard

COOLDOWN = 60.0


def seen(replicas: int, busy: float, *shares: float, job: str = "resnet") -> Observation:
    return Observation({job: shares} if shares else {}, [busy] * replicas, replicas)


def test_up_while_input_bound_and_busy_estimates_the_size_that_feeds_the_trainers() -> None:
    scaler = DecoderScaler(Bounds(1, 8), COOLDOWN)
    d = scaler.decide(0.0, seen(2, 0.95, 0.5, 0.5))
    # Waiting half the time: twice the decoders would feed them.
    assert (d.action, d.before, d.replicas, d.reason) == (UP, 2, 4, "input-bound")
    assert "'resnet' input-bound 50%" in d.detail and "busy 95%" in d.detail


def test_up_is_the_estimate_at_most_double() -> None:
    # 10 / (1 - 0.11) = 11.2: 12.
    assert DecoderScaler(Bounds(1, 100)).decide(0, seen(10, 0.9, 0.11)).replicas == 12
    assert DecoderScaler(Bounds(1, 100)).decide(0, seen(3, 0.9, 1.0)).replicas == 6


def test_no_up_when_the_decoders_are_not_the_bottleneck() -> None:
    d = DecoderScaler(Bounds(1, 8)).decide(0, seen(2, 0.6, 0.9))
    assert (d.action, d.reason) == (HOLD, "not-busy")
    assert "storage" in d.detail


def test_no_up_at_the_maximum() -> None:
    d = DecoderScaler(Bounds(1, 4)).decide(0, seen(4, 1.0, 0.9))
    assert (d.action, d.replicas, d.reason) == (HOLD, 4, "at-max")
    assert DecoderScaler(Bounds(1, 5)).decide(0, seen(4, 1.0, 0.9)).replicas == 5


def test_down_when_idle_and_no_trainer_input_bound() -> None:
    d = DecoderScaler(Bounds(1, 8)).decide(0, seen(8, 0.3, 0.02, 0.0))
    # 8 x 30 % = 2.4 decoders' work, at 65 % busy: 4.
    assert (d.action, d.replicas, d.reason) == ("down", 4, "idle")
    # Trainers gone, decoders at 0: straight to the minimum.
    assert DecoderScaler(Bounds(2, 8)).decide(0, seen(8, 0.0)).replicas == 2
    assert DecoderScaler(Bounds(2, 8)).decide(0, seen(2, 0.0)).reason == "at-min"


def test_no_down_while_one_trainer_is_input_bound() -> None:
    # The job's mean is 5 %, but one of its trainers waits 20 % of its time.
    d = DecoderScaler(Bounds(1, 8)).decide(0, seen(4, 0.2, 0.2, 0.0, 0.0, 0.0))
    assert (d.action, d.reason) == (HOLD, "steady")
    # Nor while a job is input-bound for another reason than the decoders.
    assert DecoderScaler(Bounds(1, 8)).decide(0, seen(4, 0.2, 0.5)).reason == "not-busy"


def test_steady_between_the_thresholds() -> None:
    assert DecoderScaler(Bounds(1, 8)).decide(0, seen(4, 0.7, 0.05)).reason == "steady"


def test_cooldown_holds_then_lets_the_next_change_through() -> None:
    scaler = DecoderScaler(Bounds(1, 8), COOLDOWN)
    assert scaler.decide(100.0, seen(1, 1.0, 0.6)).replicas == 2
    held = scaler.decide(100.0 + COOLDOWN - 1, seen(2, 1.0, 0.6))
    assert (held.action, held.reason) == (HOLD, "cooldown")
    assert scaler.decide(100.0 + COOLDOWN, seen(2, 1.0, 0.6)).replicas == 4


def test_a_failed_change_does_not_start_a_cooldown() -> None:
    scaler = DecoderScaler(Bounds(1, 8), COOLDOWN)
    assert scaler.decide(0.0, seen(1, 1.0, 0.6)).changes
    scaler.failed()
    assert scaler.decide(1.0, seen(1, 1.0, 0.6)).changes


def test_a_size_outside_the_bounds_is_brought_back() -> None:
    assert DecoderScaler(Bounds(2, 4)).decide(0, seen(1, 0.0)).replicas == 2
    d = DecoderScaler(Bounds(2, 4)).decide(0, seen(9, 1.0, 0.9))
    assert (d.replicas, d.reason) == (4, "above-max")


def test_no_decoder_figures_hold() -> None:
    d = DecoderScaler(Bounds(1, 8)).decide(0, Observation({"a": [0.9]}, [], 2))
    assert (d.action, d.reason) == (HOLD, "no-figures")


def test_the_worst_job_decides_and_is_named() -> None:
    d = DecoderScaler(Bounds(1, 8)).decide(0, Observation(
        {"calm": [0.0], "hungry": [0.4, 0.6]}, [0.9, 0.9], 2))
    assert d.action == UP and "'hungry' input-bound 50%" in d.detail
    assert d.view()["input_bound"] == 0.5 and d.view()["reason"] == "input-bound"


def test_nan_figures_count_as_unknown() -> None:
    d = DecoderScaler(Bounds(1, 8)).decide(0, Observation({"a": [math.nan]}, [math.nan], 2))
    assert d.reason == "no-figures"


@pytest.mark.parametrize("text, bounds", [("4", (4, 4)), ("1:8", (1, 8)), ("3:3", (3, 3))])
def test_bounds_parse(text: str, bounds: tuple[int, int]) -> None:
    parsed = Bounds.parse(text)
    assert (parsed.low, parsed.high) == bounds and str(parsed) == f"{bounds[0]}:{bounds[1]}"


@pytest.mark.parametrize("text", ["0", "0:4", "5:4", "x", "1:", "1:2:3", "1:5000"])
def test_bounds_refuse(text: str) -> None:
    with pytest.raises(ValueError, match="--decoders"):
        Bounds.parse(text)


def test_trainer_shares_are_the_boards_current_ones() -> None:
    """What the master feeds the policy: each reader's share over its last RECENT_S, from the
    summaries it sends; one silent for longer has no current share and is left out."""
    board = ReaderBoard()
    board.record("resnet", "quiet", ReaderStats(wall_s=10, input_wait_s=9), 0.0)
    board.record("resnet", "busy", ReaderStats(wall_s=10, input_wait_s=6), RECENT_S + 1)
    board.record("resnet", "fed", ReaderStats(wall_s=10, input_wait_s=0.5), RECENT_S + 1)
    assert trainer_shares(board.views("resnet", RECENT_S + 1)) == [0.6, 0.05]
    assert trainer_shares(board.views("resnet", 3 * RECENT_S)) == []
    assert trainer_shares(board.views("other", 0.0)) == []


share = st.floats(0.0, 1.0)
observations = st.lists(st.tuples(
    st.floats(0.0, 200.0),  # seconds since the previous decision
    st.dictionaries(st.sampled_from(["a", "b"]), st.lists(share, max_size=4), max_size=2),
    st.lists(share, max_size=6),
    st.integers(1, 12),  # the size someone else may have set meanwhile (kubectl scale)
    st.booleans()),  # whether the pool is as the scaler left it
    min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(low=st.integers(1, 5), extra=st.integers(0, 6), cooldown=st.floats(0.0, 120.0),
       steps=observations)
def test_invariants(low: int, extra: int, cooldown: float,
                    steps: list[tuple[float, dict[str, list[float]], list[float], int, bool]]
                    ) -> None:
    bounds = Bounds(low, low + extra)
    scaler = DecoderScaler(bounds, cooldown)
    now, replicas, changed_at = 0.0, low, None
    for gap, trainers, busy, other, same in steps:
        now += gap
        replicas = replicas if same else other
        d = scaler.decide(now, Observation(trainers, busy, replicas))
        assert d.reason in REASONS and d.before == replicas
        if d.changes:
            # Never outside the bounds; never twice within a cooldown.
            assert bounds.low <= d.replicas <= bounds.high
            assert changed_at is None or now - changed_at >= cooldown
            changed_at = now
        elif bounds.low <= replicas <= bounds.high:
            assert d.replicas == replicas
        mean = sum(busy) / len(busy) if busy else None
        worst = max((sum(s) / len(s) for s in trainers.values() if s), default=0.0)
        in_bounds = bounds.low <= replicas <= bounds.high
        if d.action == UP and in_bounds:
            # Never up while the decoders idle, nor without an input-bound job.
            assert mean is not None and mean > UP_BUSY and worst > UP_INPUT_BOUND
        if d.action == "down" and in_bounds:
            # Never down while a trainer is input-bound, nor while the decoders are busy.
            assert mean is not None and mean < DOWN_BUSY
            assert all(s <= UP_INPUT_BOUND for v in trainers.values() for s in v)
        replicas = d.replicas
