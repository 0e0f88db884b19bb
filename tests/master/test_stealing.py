"""Work stealing's choices (trainfeed.master.stealing): what an idle reader asks back, from whom,
and what happens to an ask until it is answered. The integration tests run it in a master
process (test_give_back_*.py, and the timing test in test_training_together.py)."""
from __future__ import annotations

import pytest

from trainfeed.master.ledger import LeaseStatus, Ledger
from trainfeed.master.stealing import (
    ASK_AGAIN_S,
    MIN_RATE_SPAN_S,
    PLAN_S,
    RATE_FORGET_S,
    RATE_WINDOW_S,
    RESERVE_S,
    Holding,
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
