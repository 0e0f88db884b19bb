"""The master's board of reader figures (trainfeed.master.core.reader_stats): current shares
over the recent window, flags, job totals that never go back, sparkline buckets, forgetting."""
from __future__ import annotations

import pytest

from trainfeed.master.core.messages import ReaderStats
from trainfeed.master.core.reader_stats import (
    FORGET_S,
    HISTORY_BUCKET_S,
    HISTORY_BUCKETS,
    RECENT_S,
    ReaderBoard,
)


def summary(wall: float, wait: float, records: int = 0) -> ReaderStats:
    return ReaderStats(wall_s=wall, input_wait_s=wait, records=records, batches=1)


def test_the_current_share_is_over_the_recent_window_not_the_readers_life() -> None:
    board = ReaderBoard()
    for t in range(0, 60, 2):  # a minute without waiting, then waiting 90 %
        board.record("j", "r", summary(2, 0, 20), 1000.0 + t)
    for t in range(60, 60 + int(RECENT_S), 2):
        board.record("j", "r", summary(2, 1.8, 2), 1000.0 + t)
    [view] = board.views("j", 1000.0 + 60 + RECENT_S)
    assert view.input_bound == pytest.approx(0.9)
    assert view.flags == ("input-bound",)
    totals = board.totals("j")
    assert totals["input_wait_s"] == pytest.approx(0.9 * RECENT_S)
    assert totals["records"] == 30 * 20 + 15 * 2


def test_a_reader_far_below_the_median_rate_is_flagged_slow() -> None:
    board = ReaderBoard()
    for t in range(10):
        for worker, records in (("a", 100), ("b", 90), ("c", 20)):
            board.record("j", worker, summary(1, 0.1, records), 50.0 + t)
    flags = {v.worker: v.flags for v in board.views("j", 60.0)}
    assert flags == {"a": (), "b": (), "c": ("slow",)}


def test_empty_or_timeless_summaries_are_ignored() -> None:
    board = ReaderBoard()
    board.record("j", "r", ReaderStats(), 1.0)
    board.record("j", "r", ReaderStats(wall_s=float("nan")), 1.0)
    assert board.views("j", 2.0) == []


def test_silent_readers_are_forgotten_but_their_figures_stay_in_the_totals() -> None:
    board = ReaderBoard()
    board.record("j", "old", summary(5, 1, 50), 0.0)
    board.record("j", "new", summary(5, 1, 50), FORGET_S + 1)
    assert [v.worker for v in board.views("j", FORGET_S + 1)] == ["new"]
    assert board.totals("j")["records"] == 100


def test_sparklines_have_one_point_per_bucket_oldest_first() -> None:
    board = ReaderBoard()
    now = 100 * HISTORY_BUCKET_S
    board.record("j", "r", summary(1, 0, 50), now - 2 * HISTORY_BUCKET_S)
    board.record("j", "r", summary(1, 0, 10), now + 2)
    [view] = board.views("j", now + 2)
    assert len(view.sparkline) == HISTORY_BUCKETS
    # The current bucket's rate is over the 2 s of it that have passed, not all 10.
    assert view.sparkline[-3:] == (50 / HISTORY_BUCKET_S, 0.0, 10 / 2)
    assert board.job_sparkline("j", now + 2) == view.sparkline


def test_refusals_are_kept_newest_first_and_bounded() -> None:
    board = ReaderBoard()
    for i in range(30):
        board.refused("j", f"w{i}", 1, "not its lease", float(i))
    refusals = board.refusals("j")
    assert len(refusals) == 20 and refusals[0].worker == "w29"
