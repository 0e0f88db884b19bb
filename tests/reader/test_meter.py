"""The reader's own figures (trainfeed.reader.meter): the trainer's waits against a clock
the test moves, summaries as the changes between them, and what a pass yields counted."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainfeed.reader.meter import Counters, ReaderMeter, records_of


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def slow_batches(clock: FakeClock, waits: list[float]) -> Iterator[dict[str, list[int]]]:
    """Batches of 4 records, each ready `waits[i]` seconds after the trainer asks."""
    for wait in waits:
        clock.now += wait
        yield {"_id": [0, 1, 2, 3]}


def test_the_input_bound_share_is_the_trainers_wait_over_the_wall_time() -> None:
    clock = FakeClock()
    meter = ReaderMeter(clock)
    assert meter.take_summary() is None  # the trainer has not asked yet
    for _ in meter.timed(slow_batches(clock, [1.0, 3.0, 0.0])):
        clock.now += 2.0  # training on the batch
    totals = meter.totals()
    assert totals.wall_s == pytest.approx(10.0)
    assert totals.input_wait_s == pytest.approx(4.0)
    assert totals.input_bound == pytest.approx(0.4)
    assert (totals.batches, totals.records) == (3, 12)
    assert totals.records_per_s == pytest.approx(1.2)


def test_summaries_are_what_changed_since_the_last_one_and_add_up_to_the_totals() -> None:
    clock = FakeClock()
    bytes_read = [0]
    meter = ReaderMeter(clock, lambda: Counters(bytes_read=bytes_read[0]))
    summaries = []
    for _ in meter.timed(slow_batches(clock, [1.0, 1.0, 1.0, 1.0])):
        bytes_read[0] += 100
        clock.now += 1.0
        summaries.append(meter.take_summary())
    assert all(s is not None for s in summaries)
    assert sum(s.wall_s for s in summaries) == pytest.approx(meter.totals().wall_s)
    assert sum(s.input_wait_s for s in summaries) == pytest.approx(4.0)
    assert sum(s.bytes_read for s in summaries) == 400
    assert [s.records for s in summaries] == [4, 4, 4, 4]
    assert meter.take_summary() is None  # no time passed since


def test_a_wait_in_progress_counts_up_to_now() -> None:
    clock = FakeClock()
    meter = ReaderMeter(clock)
    meter.begin_wait()
    clock.now += 5.0
    assert meter.totals().input_bound == pytest.approx(1.0)
    meter.end_wait(4)
    clock.now += 5.0
    assert meter.totals().input_bound == pytest.approx(0.5)


def test_closing_the_timed_pass_closes_the_source_and_errors_end_the_wait() -> None:
    clock = FakeClock()
    meter = ReaderMeter(clock)
    closed = []

    def source() -> Iterator[int]:
        try:
            yield 1
            yield 2
        finally:
            closed.append(True)
    timed = meter.timed(source())
    next(timed)
    timed.close()
    assert closed == [True]

    def failing() -> Iterator[int]:
        clock.now += 1.0
        raise OSError("storage gone")
        yield 0
    with pytest.raises(OSError):
        next(meter.timed(failing()))
    clock.now += 1.0
    assert meter.totals().input_wait_s == pytest.approx(1.0)  # not still waiting


def test_timed_loads_add_up_read_time() -> None:
    clock = FakeClock()
    meter = ReaderMeter(clock)

    def load(reader: object, task: object) -> str:
        clock.now += 0.5
        return "table"
    timed = meter.timed_load(load)
    assert timed(None, None) == "table" and timed(None, None) == "table"
    meter.begin_wait()
    assert meter.totals().read_s == pytest.approx(1.0)


@pytest.mark.parametrize("item, records", [({"_id": [1, 2, 3]}, 3), ([("a", 1), ("b", 2)], 2),
                                           (("a", 1), 1), ({"image": b"x"}, 1)])
def test_records_of_what_a_pass_yields(item: object, records: int) -> None:
    assert records_of(item) == records


def test_a_counter_that_went_back_is_sent_as_zero_not_refused_by_the_wire() -> None:
    """A reader's close once dropped its storage counters before its last Report: the negative
    change made protobuf raise ('Value out of range'), and the leases were not handed back."""
    clock = FakeClock()
    bytes_read = [1000]
    meter = ReaderMeter(clock, lambda: Counters(bytes_read=bytes_read[0]))
    meter.begin_wait()
    clock.now += 1
    assert meter.take_summary().bytes_read == 1000  # type: ignore[union-attr]
    bytes_read[0] = 0
    clock.now += 1
    summary = meter.take_summary()
    assert summary is not None and summary.bytes_read == 0
