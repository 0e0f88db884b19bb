"""Work stealing's choices (trainfeed.master.core.stealing): what an idle reader asks back, from
whom, and what happens to an ask until it is answered. The integration tests run it in a master
process (test_give_back_*.py, and the timing test in test_training_together.py)."""
from __future__ import annotations

import pytest

from trainfeed.master.core.ledger import LeaseStatus, Ledger
from trainfeed.master.core.stealing import (
    ASK_AGAIN_S,
    MAX_RATE_SAMPLES,
    MIN_RATE_SPAN_S,
    PLAN_S,
    RATE_FORGET_S,
    RATE_WINDOW_S,
    RESERVE_S,
    Holding,
    Plan,
    RateMeter,
    Stealing,
    choose,
)

T = 30.0


def test_a_rate_is_the_records_between_the_first_and_last_report_of_the_window() -> None:
    meter = RateMeter()
    meter.add("a", 25, 0.0)
    assert meter.rate("a") is None  # one report: no span yet
    meter.add("a", 25, MIN_RATE_SPAN_S / 2)
    assert meter.rate("a") is None
    meter.add("a", 50, 1.0)
    assert meter.rate("a") == pytest.approx(75 / 1.0)  # the first report's records came before
    meter.add("a", 0, 2.0)  # nothing consumed: not a report of work
    assert meter.rate("a") == pytest.approx(75 / 1.0)
    # Older reports leave the window: the reader slowed down to 10 records/s.
    for i in range(1, 3 * int(RATE_WINDOW_S)):
        meter.add("a", 10, 1.0 + i)
    assert meter.rate("a") == pytest.approx(10.0)
    assert meter.rate("b") is None
    meter.forget("a")
    assert meter.rate("a") is None


def test_a_reader_not_heard_of_for_a_minute_is_forgotten() -> None:
    meter = RateMeter()
    meter.add("gone", 10, 0.0)
    meter.add("gone", 10, 1.0)
    meter.add("alive", 10, RATE_FORGET_S / 2)
    meter.add("alive", 10, RATE_FORGET_S / 2 + 1)
    assert meter.rate("gone") == pytest.approx(10.0)
    meter.add("alive", 10, RATE_FORGET_S + 2)
    assert meter.rate("gone") is None and meter.rate("alive") is not None


def test_an_idle_reader_takes_the_later_half_of_an_equal_readers_unstarted_leases() -> None:
    holder = Holding(None, [(p, 8, True) for p in range(8)])
    chosen = choose("thief", {"holder": holder})
    assert chosen == [("holder", 7), ("holder", 6), ("holder", 5), ("holder", 4)]


def test_started_leases_are_never_asked_for() -> None:
    holder = Holding(10.0, [(0, 25, False), (1, 25, False), (2, 25, True)])
    assert choose("thief", {"holder": holder, "thief": Holding(10.0, [])}) == [("holder", 2)]
    # Even the one that would pay most: the last lease, begun (shuffled readers may).
    holder = Holding(10.0, [(0, 25, True), (1, 25, False)])
    assert choose("thief", {"holder": holder, "thief": Holding(10.0, [])}) == []


def test_a_slow_reader_does_not_take_what_a_fast_one_finishes_sooner() -> None:
    fast = Holding(125.0, [(0, 25, False), (1, 25, True), (2, 25, True)])  # done in 0.6 s
    slow = Holding(40.0, [])  # a partition takes it 0.625 s
    assert choose("slow", {"fast": fast, "slow": slow}) == []
    # With more queued at the fast reader, the slow one takes the last of it.
    fast = Holding(125.0, [(0, 25, False), *((p, 25, True) for p in range(1, 5))])
    assert choose("slow", {"fast": fast, "slow": slow}) == [("fast", 4)]


def test_a_reader_with_seconds_of_work_takes_only_what_it_would_still_finish_first() -> None:
    # The tail of a CI run (issue 13): a fast reader that found todo empty but holds 2.4 s of
    # work, and a slow one holding 4.4 s. Asking back by halves took 5 of the slow reader's 6
    # unstarted leases and re-leased them to it at once; by speed, the fast reader takes the
    # three it would finish sooner, and nothing of an equal reader.
    fast = Holding(125.0, [(p, 25, p > 100) for p in range(100, 112)])
    other_fast = Holding(125.0, [(p, 25, p > 200) for p in range(200, 212)])
    slow = Holding(40.0, [(p, 25, p > 0) for p in range(7)])
    chosen = choose("fast", {"fast": fast, "other": other_fast, "slow": slow})
    assert chosen == [("slow", 6), ("slow", 5), ("slow", 4)]


def test_the_latest_finishing_victim_gives_first_and_incoming_work_counts() -> None:
    a = Holding(10.0, [(p, 10, True) for p in range(4)])  # its last done in 4 s
    b = Holding(10.0, [(p, 10, True) for p in range(10, 12)])  # in 2 s
    assert choose("t", {"a": a, "b": b, "t": Holding(10.0, [])}) == [("a", 3), ("a", 2)]
    # Records already on their way to the thief (outstanding asks) count as its work.
    assert choose("t", {"a": a, "b": b, "t": Holding(10.0, [])}, incoming=20) == [("a", 3)]


def sized(partitions: int, size: int = 25) -> Ledger:
    ledger = Ledger(partitions)
    ledger.sizes = (size,) * partitions
    return ledger


def test_an_ask_is_delivered_once_and_only_for_a_lease_the_holder_lists() -> None:
    ledger, stealing = sized(4), Stealing()
    taken = ledger.lease("holder", 0, 4, 0.0, T).partitions
    held = [(0, p, ledger.token_of(p)) for p in taken]
    asked = stealing.ask(ledger, "thief", 0.0)
    assert [p for _, p in asked] == [taken[3], taken[2]]
    assert stealing.due(ledger, "holder", held[:3]) == [held[2]]  # taken[3] not listed yet
    assert stealing.due(ledger, "holder", held) == [held[3]]
    assert stealing.due(ledger, "holder", held) == []
    assert stealing.due(ledger, "thief", held) == []
    # Outstanding asks count as the thief's: it asks for nothing more.
    assert stealing.ask(ledger, "thief", 0.1) == []


def test_a_lease_the_holder_began_voids_its_ask_and_is_never_asked_for() -> None:
    ledger, stealing = sized(4), Stealing()
    taken = ledger.lease("holder", 0, 4, 0.0, T).partitions
    stealing.ask(ledger, "thief", 0.0)
    assert not stealing.listed(ledger, "holder", [(p, False) for p in taken])
    # The holder's trainer began the last one before the ask reached it.
    assert stealing.listed(ledger, "holder", [(p, p == taken[3]) for p in taken])
    assert set(stealing.asks) == {taken[2]}
    assert [p for _, p in stealing.ask(ledger, "thief", 0.1)] == []  # 25 on its way: enough
    stealing.asks.clear()
    assert taken[3] not in [p for _, p in stealing.ask(ledger, "thief", 0.2)]


def test_a_partition_given_back_waits_for_its_thief_for_a_while() -> None:
    ledger, stealing = sized(4), Stealing()
    taken = ledger.lease("holder", 0, 4, 0.0, T).partitions
    stealing.ask(ledger, "thief", 0.0)
    assert ledger.report_released(0, taken[3], 0, "holder")
    stealing.released("holder", taken[3], 0.5)
    # Another reader asking first gets nothing: the partition is the thief's.
    other = ledger.lease("other", 0, 4, 0.6, T, reserved=stealing.reserved(ledger, 0.6))
    assert other.status is LeaseStatus.WAIT
    mine = ledger.lease("thief", 0, 4, 0.7, T, sharers=3,
                        reserved=stealing.reserved(ledger, 0.7))
    assert mine.partitions == (taken[3],)
    stealing.leased(mine.partitions)
    assert taken[3] not in stealing.asks
    # A reservation its thief does not come for runs out.
    assert ledger.report_released(0, taken[2], 0, "holder")
    stealing.released("holder", taken[2], 1.0)
    assert stealing.reserved(ledger, 1.0 + RESERVE_S / 2) == {taken[2]: "thief"}
    assert stealing.reserved(ledger, 1.0 + RESERVE_S) == {}
    assert ledger.lease("other", 0, 4, 2.0, T).partitions == (taken[2],)


def test_an_unanswered_ask_lapses_and_an_epoch_or_a_leaving_reader_clears_asks() -> None:
    ledger, stealing = sized(4), Stealing()
    taken = ledger.lease("holder", 0, 4, 0.0, T).partitions
    first = stealing.ask(ledger, "thief", 0.0)
    assert stealing.ask(ledger, "thief", ASK_AGAIN_S / 2) == []
    assert stealing.ask(ledger, "thief", ASK_AGAIN_S) == first  # lapsed: asked again
    stealing.forget("thief")
    assert stealing.asks == {}
    stealing.ask(ledger, "thief", 10.0)
    for p in taken:
        ledger.report_done(0, p, "holder")
    assert ledger.lease("holder", 1, 4, 11.0, T).status is LeaseStatus.TASKS  # epoch 1
    assert stealing.reserved(ledger, 11.0) == {} and stealing.asks == {}


def test_a_thief_takes_what_its_measured_rate_finishes_sooner_by_a_margin() -> None:
    ledger, stealing = sized(8), Stealing()
    fast = ledger.lease("fast", 0, 6, 0.0, T).partitions
    for t in (0.0, 0.2, 0.4, 0.6):
        stealing.rates.add("fast", 25, t)  # 125 records/s: its 6 leases take 1.2 s
    assert stealing.rates.rate("fast") == pytest.approx(125.0)
    stealing.rates.add("slow", 25, 0.0)
    stealing.rates.add("slow", 25, 0.5)  # 50 records/s
    # Idle, the slow reader finishes the fast one's last lease (with the margin: 1.5 × 0.5 s)
    # before the fast one would (1.2 s); the one before that (1.0 s), not.
    assert [p for _, p in stealing.ask(ledger, "slow", 1.0)] == [fast[5]]
    # At 30 records/s, not even the last one: 0.83 s, but 1.25 s with the margin.
    stealing.asks.clear()
    stealing.rates.forget("slow")
    stealing.rates.add("slow", 20, 0.0)
    stealing.rates.add("slow", 30, 1.0)
    assert stealing.ask(ledger, "slow", 1.0 + PLAN_S) == []  # (a new plan: the new rate)


def test_thieves_asking_within_one_plan_share_it() -> None:
    ledger, stealing = sized(8), Stealing()
    taken = ledger.lease("holder", 0, 8, 0.0, T).partitions
    # Alike (no rates): the first idle reader takes the last 4 (the holder finishes the last
    # after 200 records, the 4th last after 125; the thief its 4th after 3 × 25 + 1.5 × 25).
    first = stealing.ask(ledger, "a", 0.0)
    assert [p for _, p in first] == [taken[7], taken[6], taken[5], taken[4]]
    # Meanwhile the holder's trainer began taken[3]: the plan (made before) skips it, and the
    # second idle reader takes the next one it may.
    stealing.listed(ledger, "holder", [(p, p == taken[3]) for p in taken])
    second = stealing.ask(ledger, "b", PLAN_S / 2)
    assert [p for _, p in second] == [taken[2]]
    assert stealing.plan is not None and stealing.plan.built_at == 0.0  # one plan for both


# -- boundaries and bookkeeping (what mutation testing found untested) ------------------------
def test_a_rate_needs_its_span_and_spans_its_window_exactly() -> None:
    meter = RateMeter()
    meter.add("a", 1, 10.0)
    meter.add("a", 1, 10.25)  # single records count; a quarter second is not a span yet
    assert meter.rate("a") is None
    meter.add("a", 1, 11.0)
    assert meter.rate("a") == pytest.approx(2 / 1.0)
    # A report after a gap: the window starts at the last report before it...
    gap = RateMeter()
    for t, n in ((0.0, 100), (1.0, 100), (10.0, 10)):
        gap.add("a", n, t)
    assert gap.rate("a") == pytest.approx(10 / 9)
    # ... which stays in while the one after it is exactly a window old.
    edge = RateMeter()
    for t, n in ((0.0, 100), (1.0, 100), (1.0 + RATE_WINDOW_S, 10)):
        edge.add("a", n, t)
    assert edge.rate("a") == pytest.approx(110 / (1.0 + RATE_WINDOW_S))
    # Within the window every report counts, not only the last interval.
    steady = RateMeter()
    for t, n in ((10.0, 10), (11.0, 10), (12.0, 10), (13.0, 40)):
        steady.add("a", n, t)
    assert steady.rate("a") == pytest.approx(60 / 3)


def test_a_rate_keeps_a_bounded_number_of_reports() -> None:
    meter = RateMeter()
    for i in range(10 * MAX_RATE_SAMPLES):
        meter.add("a", 1, i / (10 * MAX_RATE_SAMPLES))
    assert len(meter._samples["a"]) == MAX_RATE_SAMPLES


def test_a_reader_silent_for_exactly_a_minute_is_kept_until_the_next_sweep() -> None:
    meter = RateMeter()
    meter.add("gone", 10, 0.0)
    meter.add("gone", 10, 1.0)
    meter.add("alive", 10, 30.0)
    meter.add("alive", 10, 1.0 + RATE_FORGET_S)
    assert meter.rate("gone") is not None
    meter.add("alive", 10, 2.0 + RATE_FORGET_S + RATE_WINDOW_S)
    assert meter.rate("gone") is None


def test_finishing_at_the_same_moment_is_no_reason_to_steal() -> None:
    # The holder finishes its second lease after 20 records; the thief, 5 records in, would
    # finish it after 5 + 1.5 × 10 = 20: no gain, no ask. One record less ahead, and it asks.
    holder = Holding(1.0, [(0, 10, False), (1, 10, True)])
    assert choose("t", {"h": holder, "t": Holding(1.0, [(9, 5, False)])}) == []
    assert choose("t", {"h": holder, "t": Holding(1.0, [(9, 4, False)])}) == [("h", 1)]
    # A thief that holds nothing and has nothing coming counts from 0.
    holder = Holding(1.0, [(0, 6, False), (1, 10, True)])
    assert choose("t", {"h": holder}) == [("h", 1)]


def test_a_reader_without_a_rate_counts_at_the_mean_of_the_known_ones() -> None:
    # Holders at 10 and 30 records/s: the thief counts at 20, and takes 1.5 × 30 / 20 = 2.25 s
    # for a lease of 30 records. The slow holder's finishes after 3 s: asked for (it would not
    # be at 1 record/s)...
    slow = Holding(10.0, [(1, 30, True)])
    fast = Holding(30.0, [(5, 30, False)])
    assert choose("t", {"slow": slow, "fast": fast}) == [("slow", 1)]
    # ... the fast holder's after 1 s: not (it would be at 80 records/s).
    slow = Holding(10.0, [(1, 0, False)])
    fast = Holding(30.0, [(5, 30, True)])
    assert choose("t", {"slow": slow, "fast": fast}) == []


def test_candidates_are_taken_latest_finishing_first_across_holders() -> None:
    a = Holding(1.0, [(0, 10, True), (1, 10, True), (2, 10, True)])  # finish 10, 20, 30
    b = Holding(1.0, [(5, 15, True)])  # finishes 15
    thief = Holding(10.0, [])
    assert choose("t", {"a": a, "b": b, "t": thief}) == [("a", 2), ("a", 1), ("b", 5), ("a", 0)]


def test_a_thief_that_holds_candidates_itself_takes_others_and_leaves_its_own() -> None:
    plan = Plan({"t": 10.0, "h": 1.0, "u": 100.0},
                [("t", [(0, 100), (1, 100), (2, 100)]),  # finish 10, 20, 30 s
                 ("h", [(5, 5), (6, 15)])])  # finish 5, 20 s
    assert plan.take("t", 0) == [("h", 6), ("h", 5)]
    # Its own stay in the plan for the next thief.
    assert plan.take("u", 0) == [("t", 2), ("t", 1), ("t", 0)]


def ledger_of(holder: list[int], thief: list[int],
              size: int = 10) -> tuple[Ledger, Stealing, tuple[int, ...]]:
    """A ledger whose holder leased len(holder) partitions (returned, in order) and the thief
    len(thief), each with the given records consumed already (reported progress)."""
    ledger = Ledger(len(holder) + len(thief))
    ledger.sizes = (size,) * ledger.num_partitions
    held: dict[str, tuple[int, ...]] = {}
    for worker, consumed in (("holder", holder), ("thief", thief)):
        held[worker] = ledger.lease(worker, 0, len(consumed), 0.0, T).partitions
        for p, n in zip(held[worker], consumed):
            if n:
                ledger.report_progress(0, p, n, worker)
    return ledger, Stealing(), held["holder"]


def test_what_the_thief_holds_and_what_holders_consumed_count() -> None:
    # The holder consumed its first lease (its DONE not in yet): its third finishes after 20
    # records. The thief holds 5 to go: 5 + 15 = 20, no gain.
    ledger, stealing, held = ledger_of([10, 0, 0], [5])
    assert stealing.ask(ledger, "thief", 0.0) == []
    # With 4 to go it asks.
    ledger, stealing, held = ledger_of([10, 0, 0], [6])
    assert [p for _, p in stealing.ask(ledger, "thief", 0.0)] == [held[2]]
    # 14 to go against a third lease finishing after 30: it asks (29 < 30).
    ledger, stealing, held = ledger_of([0, 0, 0], [0, 6])
    assert [p for _, p in stealing.ask(ledger, "thief", 0.0)] == [held[2]]


def test_a_ledger_without_sizes_asks_nothing() -> None:
    ledger, stealing = Ledger(4), Stealing()
    ledger.lease("holder", 0, 4, 0.0, T)
    assert stealing.ask(ledger, "thief", 0.0) == []


def test_a_plan_is_rebuilt_once_it_is_a_plan_interval_old() -> None:
    ledger, stealing = sized(8), Stealing()
    ledger.lease("holder", 0, 8, 0.0, T)
    stealing.ask(ledger, "a", 5.0)
    stealing.ask(ledger, "b", 5.0 + PLAN_S / 2)
    assert stealing.plan is not None and stealing.plan.built_at == 5.0
    stealing = Stealing()
    stealing.ask(ledger, "c", 0.0)  # (times from 0: exact)
    stealing.ask(ledger, "c", PLAN_S)
    assert stealing.plan is not None and stealing.plan.built_at == PLAN_S


def test_an_ask_outstanding_for_less_than_its_time_stays() -> None:
    ledger, stealing = sized(4), Stealing()
    ledger.lease("holder", 0, 4, 0.0, T)
    first = stealing.ask(ledger, "thief", 100.0)
    assert first
    assert stealing.ask(ledger, "thief", 100.0 + ASK_AGAIN_S / 2) == []
    assert {p for _, p in first} <= set(stealing.asks)


def test_releases_and_leases_touch_only_asks_they_answer() -> None:
    ledger, stealing = sized(4), Stealing()
    taken = ledger.lease("holder", 0, 4, 0.0, T).partitions
    asked = [p for _, p in stealing.ask(ledger, "thief", 0.0)]
    stealing.released("someone else", asked[0], 0.1)  # not the holder: no reservation
    stealing.released("holder", taken[0], 0.1)  # never asked for
    stealing.leased([taken[0]])
    assert ledger.report_released(0, asked[0], 0, "holder")
    assert stealing.reserved(ledger, 0.2) == {}
    stealing.released("holder", asked[0], 0.2)
    stealing.released("holder", asked[0], 0.9)  # (a repeat does not extend it)
    assert stealing.reserved(ledger, 0.2 + RESERVE_S - 0.01) == {asked[0]: "thief"}
    assert stealing.reserved(ledger, 0.2 + RESERVE_S) == {}


def test_a_reader_that_leaves_is_forgotten_and_an_epoch_forgets_what_was_begun() -> None:
    ledger, stealing = sized(2), Stealing()
    taken = ledger.lease("holder", 0, 2, 0.0, T).partitions
    stealing.rates.add("holder", 10, 0.0)
    stealing.rates.add("holder", 10, 1.0)
    stealing.listed(ledger, "holder", [(p, True) for p in taken])
    stealing.forget("holder")
    assert stealing.rates.rate("holder") is None and "holder" not in stealing.started
    # Begun in epoch 0; leased again in epoch 1 (not listed yet): it may be asked for.
    stealing.listed(ledger, "holder", [(p, True) for p in taken])
    for p in taken:
        ledger.report_done(0, p, "holder")
    again = ledger.lease("holder", 1, 2, 1.0, T).partitions
    assert [p for _, p in stealing.ask(ledger, "thief", 1.0)] == [again[1]]


def test_the_plan_counts_what_the_ledger_says_remains_of_a_cut_partition() -> None:
    # A synchronous epoch's cut leaves the holder's first lease 2 records (Ledger.limits):
    # its second finishes after 12, and a thief 1 record in would finish it after 16.
    ledger, stealing, held = ledger_of([0, 0], [9])
    ledger.limits[held[0]] = 2
    assert stealing.ask(ledger, "thief", 0.0) == []
    ledger.limits[held[0]] = 8  # after 18: asked
    assert [p for _, p in stealing.ask(ledger, "thief", PLAN_S)] == [held[1]]
