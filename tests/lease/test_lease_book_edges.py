"""The lease book's (trainfeed.lease.book) rules at their edges: how deep a reader leases, what a
checkpoint's positions, a done, a failure, a give-back and a broken stream's resend change, each
read through what the book sends (its reports, `held_now`, `send_in`) or hands the reader.

tests/lease/test_lease_book.py has the rules' main cases and the state machine; these pin the
boundaries it does not reach (issue 36: `python tools/mutation.py lease/book.py`)."""
from __future__ import annotations

import pytest
from test_lease_book import HEARTBEAT, T, task

from trainfeed.lease.book import (
    COALESCE_S,
    LEASE_HORIZON_S,
    LEASE_RATE_WINDOW,
    MAX_REASON_CHARS,
    MIN_LEASES,
    PROGRESS_INTERVAL_S,
    PROGRESS_MIN_RECORDS,
    Answer,
    LeaseBook,
    Outcome,
    Report,
)


def finish_at(book: LeaseBook, times: list[float]) -> None:
    """The trainer finishes one partition at each of `times` (a new lease each)."""
    for i, now in enumerate(times):
        lease = (0, 1000 + i, 1)
        book.granted([lease])
        book.handed_over()
        assert book.done(lease, now)


# -- lease depth --------------------------------------------------------------------------------
@pytest.mark.parametrize(("window", "depth"), [(10, 2 * MIN_LEASES), (3, 3), (1, MIN_LEASES)])
def test_until_a_rate_is_known_the_depth_is_twice_the_minimum_within_the_window(
        window: int, depth: int) -> None:
    book = LeaseBook(T, now=0.0)
    assert book.lease_depth(window) == depth
    finish_at(book, [5.0])  # one finish: no rate yet
    assert book.lease_depth(window) == depth
    finish_at(book, [5.0])  # two at the same instant: no span to measure a rate over
    assert book.lease_depth(window) == depth


def test_the_depth_covers_the_lease_horizon_at_the_trainers_rate() -> None:
    book = LeaseBook(T, now=0.0)
    finish_at(book, [0.0, 0.5, 1.0, 2.5])  # 3 partitions in 2.5 s: 1.2 a second
    assert LEASE_HORIZON_S == 2.0
    assert book.lease_depth(64) == 3  # ceil(1.2 * 2.0 = 2.4): rounded up, never down
    finish_at(book, [2.625 + 0.125 * i for i in range(10)])  # faster: 13 in 3.75 s
    assert book.lease_depth(64) == 7  # ceil(13 / 3.75 * 2.0 = 6.93)
    assert book.lease_depth(5) == 5  # never above the window


def test_a_slow_trainer_still_holds_the_minimum_depth() -> None:
    book = LeaseBook(T, now=0.0)
    finish_at(book, [0.0, 50.0, 100.0])  # 0.02 partitions a second: 0.04 over the horizon
    assert book.lease_depth(64) == MIN_LEASES
    assert book.lease_depth(1) == MIN_LEASES  # above a window smaller than the minimum


def test_the_rate_is_measured_over_the_last_partitions_only() -> None:
    book = LeaseBook(T, now=0.0)
    finish_at(book, [0.0])  # long ago: out of the window once LEASE_RATE_WINDOW more finished
    finish_at(book, [100.0 + 0.125 * i for i in range(LEASE_RATE_WINDOW)])  # 8 a second
    assert book.lease_depth(64) == 8 * LEASE_HORIZON_S == 16


def test_a_lost_lease_done_counts_no_finish_for_the_rate() -> None:
    """The consumer drops a revoked lease's records: its `done` says nothing of the trainer's
    speed, so it neither counts as a finish nor queues a DONE."""
    book = LeaseBook(T, now=0.0)
    finish_at(book, [0.0])
    book.granted([(0, 1, 5)])
    book.handed_over()
    book.answered([], Answer(revoked=((0, 1, 5),)), called_at=10.0, now=10.0)
    assert book.done((0, 1, 5), now=10.0) is False
    assert book.lease_depth(64) == 2 * MIN_LEASES  # one finish: no rate (not 0.1 a second)
    assert book.outstanding == 0
    assert [(r.names, r.outcome) for r in book.drain()] == [((0, 1000, 1), Outcome.DONE)]


# -- a checkpoint's positions -------------------------------------------------------------------
def test_positions_ahead_of_the_progress_of_held_leases_go_as_progress() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11), (0, 2, 12), (1, 1, 13)])
    book.progress.note((0, 1, 11), 5, now=1.0)
    book.drain()  # sent: 5 for (0, 1)
    book.progress.note_positions(0, {1: 5, 2: 1, 3: 9})  # (0, 1) not ahead; (0, 3) not held
    assert [(r.names, r.outcome, r.consumed) for r in book.drain()] == [
        ((0, 2, 12), Outcome.PROGRESS, 1)]
    book.progress.note_positions(0, {1: 4, 2: 0})  # behind: nothing
    assert book.drain() == []
    book.progress.note_positions(0, {1: 7, 2: 3})
    assert [(r.names, r.consumed) for r in book.drain()] == [((0, 1, 11), 7), ((0, 2, 12), 3)]
    book.progress.note_positions(1, {1: 2})  # another epoch's partition 1
    assert [(r.names, r.consumed) for r in book.drain()] == [((1, 1, 13), 2)]


def test_a_position_of_zero_records_is_no_news() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.progress.note_positions(0, {1: 0})
    assert not book.owes() and book.drain() == []


def test_positions_count_towards_the_progress_that_is_due() -> None:
    """A checkpoint's positions are progress like any other: PROGRESS_MIN_RECORDS of them make
    it due PROGRESS_INTERVAL_S after the progress first noted."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.progress.note((0, 1, 11), 1, now=2.0)
    book.progress.note_positions(0, {1: PROGRESS_MIN_RECORDS})
    assert book.send_in(2.5, fetching=True, heartbeat_s=HEARTBEAT) == pytest.approx(
        PROGRESS_INTERVAL_S - 0.5)


# -- done ---------------------------------------------------------------------------------------
def test_a_done_forgets_the_partitions_progress_and_queues_exactly_one_done() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.handed_over()
    book.keep(task((0, 1, 11), records=100), now=0.0)
    book.progress.note((0, 1, 11), 40, now=1.0)
    assert book.done((0, 1, 11), now=2.0) is True
    assert book.drain() == [Report(0, 1, Outcome.DONE, 11)]  # no PROGRESS beside it
    assert book.outstanding == 0
    # Leased again (a new lease of the same partition, say after a rewind): counted afresh.
    book.granted([(0, 1, 12)])
    assert book.progress.note((0, 1, 12), 3, now=3.0)


def test_a_cut_leases_done_sends_nothing_and_frees_its_start() -> None:
    """A synchronous rank's cut lease went back with its RELEASED: its `done` (the kept records
    delivered) queues no DONE, counts as a finish, and leaves nothing started."""
    book = LeaseBook(T, now=0.0)
    book.begin_pass(quota=4)
    book.granted([(0, 1, 11)])
    book.handed_over()
    cut = book.keep(task((0, 1, 11)), now=0.0)
    assert cut.delivers == 4
    [released] = book.drain()
    assert (released.outcome, released.consumed) == (Outcome.RELEASED, 4)
    assert book.claim((0, 1, 11)) is False
    assert book.done((0, 1, 11), now=1.0) is False
    assert not book.started and book.outstanding == 0 and not book.owes()
    assert not book.released  # (else the set grows by one lease per cut: a leak over a job)
    finish_at(book, [2.0])
    assert book.lease_depth(64) == MIN_LEASES  # 2 finishes, 1 a second: ceil(2.0)


def test_a_done_keeps_its_lease_listed_as_held_and_begun_until_confirmed() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.handed_over()
    book.claim((0, 1, 11))
    book.done((0, 1, 11), now=1.0)
    assert book.held_now() == ([(0, 1, 11)], {(0, 1, 11)})
    sent = book.drain()
    book.answered(sent, Answer(), called_at=1.5, now=1.6)
    assert book.held_now() == ([], set())


# -- failed -------------------------------------------------------------------------------------
def test_a_failure_reports_its_lease_and_a_sync_pass_leases_its_records_elsewhere() -> None:
    book = LeaseBook(T, now=0.0)
    book.begin_pass(quota=25)
    book.granted([(0, 1, 11), (0, 2, 12)])
    book.keep(task((0, 1, 11)), now=0.0)
    book.keep(task((0, 2, 12)), now=0.0)
    assert book.need == 5
    book.claim((0, 2, 12))
    book.failed((0, 2, 12), "unreadable", now=1.0)
    assert book.need == 15  # its 10 kept records are needed again
    assert (0, 2, 12) not in book.started
    assert book.drain() == [Report(0, 2, Outcome.FAILED, 12, reason="unreadable")]
    book.failed((0, 2, 12), "again", now=2.0)  # nothing kept of it any more: need unchanged
    assert book.need == 15


def test_a_failures_reason_is_cut_to_exactly_the_masters_limit() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    reason = "".join(chr(ord("a") + i % 26) for i in range(MAX_REASON_CHARS + 1))
    book.failed((0, 1, 11), reason, now=1.0)
    book.failed((0, 1, 11), "short", now=1.0)
    assert [r.reason for r in book.drain()] == [reason[:MAX_REASON_CHARS], "short"]


def test_a_failure_starts_the_coalescing_window_of_the_reports() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.failed((0, 1, 11), "x", now=4.0)
    assert book.send_in(4.0, fetching=True, heartbeat_s=HEARTBEAT) > 0
    assert book.send_in(4.0, fetching=False, heartbeat_s=HEARTBEAT) <= 0


# -- give-backs ---------------------------------------------------------------------------------
def test_every_unbegun_lease_asked_back_goes_back_with_a_released_report() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11), (0, 2, 12), (0, 3, 13)])
    book.progress.note((0, 2, 12), 3, now=0.5)
    # A stale ask first (another token of partition 1): skipped, the rest still go.
    applied = book.told(Answer(give_back=((0, 1, 99), (0, 2, 12), (0, 3, 13))), now=1.0)
    assert applied.given == 2
    assert book.drain() == [Report(0, 2, Outcome.RELEASED, 12), Report(0, 3, Outcome.RELEASED, 13)]
    assert book.held_now() == ([(0, 1, 11)], set())
    assert book.lost((0, 2, 12)) and book.lost((0, 3, 13)) and not book.lost((0, 1, 11))


def test_a_give_back_queues_at_the_ask_and_waits_at_most_the_coalescing_window() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.answered([], Answer(give_back=((0, 1, 11),)), called_at=5.0, now=5.0)
    assert book.send_in(5.0, fetching=True, heartbeat_s=HEARTBEAT) == pytest.approx(COALESCE_S)


def test_a_second_ask_for_a_begun_lease_does_not_move_the_first_asks_time() -> None:
    """The reader owes the master a call that lists its begun leases, made after the FIRST ask:
    a call made between the two asks already told it."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.claim((0, 1, 11))
    book.told(Answer(give_back=((0, 1, 11),)), now=2.0)
    book.told(Answer(give_back=((0, 1, 11),)), now=4.0)
    assert book.needs_answer(4.0, HEARTBEAT)
    book.answered([], Answer(), called_at=3.0, now=4.5)
    assert not book.needs_answer(4.5, HEARTBEAT)
    assert book.send_in(4.5, fetching=True, heartbeat_s=HEARTBEAT) > 0


# -- a broken stream's resend -------------------------------------------------------------------
def test_a_broken_streams_progress_goes_again_for_the_held_leases_only() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11), (0, 2, 12), (0, 3, 13)])
    book.progress.note((0, 1, 11), PROGRESS_MIN_RECORDS, now=1.0)
    book.progress.note((0, 2, 12), 2, now=1.0)
    book.progress.note((0, 3, 13), 4, now=1.0)
    assert len(book.drain_progress()) == 3  # sent on the stream, never acknowledged
    book.answered([], Answer(revoked=((0, 3, 13),)), called_at=1.5, now=1.5)
    book.progress.resend()
    assert [(r.names, r.consumed) for r in book.drain_progress()] == [
        ((0, 1, 11), PROGRESS_MIN_RECORDS), ((0, 2, 12), 2)]


def test_a_resend_counts_the_progress_as_unsent_from_the_start() -> None:
    """What the master has of a resent count is not known: measured from nothing, the count is
    due (PROGRESS_MIN_RECORDS or more) and goes within PROGRESS_INTERVAL_S, not a heartbeat."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.progress.note((0, 1, 11), PROGRESS_MIN_RECORDS, now=1.0)
    book.drain_progress()
    assert not book.owes()
    book.progress.resend()
    assert book.owes()
    assert book.send_in(1.25, fetching=True, heartbeat_s=HEARTBEAT) == pytest.approx(
        PROGRESS_INTERVAL_S - 0.25)


# -- news ---------------------------------------------------------------------------------------
def test_a_broken_group_and_a_supersession_are_news_once_each() -> None:
    """The first word of a broken group or a supersession is news (the shell raises and logs
    it); the same told again, by a call's answer or the stream, changes nothing, and the book
    keeps the first reason."""
    book = LeaseBook(T, now=0.0)
    assert (book.broken, book.superseded) == ("", "")
    nothing = book.told(Answer(), now=1.0)
    assert (nothing.broke, nothing.superseded) == (False, False)
    assert (book.broken, book.superseded) == ("", "")
    broke = book.told(Answer(group_broken="rank 2 left"), now=1.0)
    assert (broke.broke, broke.superseded) == (True, False)
    again = book.answered([], Answer(group_broken="rank 3 left", superseded="reader b"),
                          called_at=2.0, now=2.0)
    assert (again.broke, again.superseded) == (False, True)
    last = book.told(Answer(group_broken="rank 4 left", superseded="reader c"), now=3.0)
    assert (last.broke, last.superseded) == (False, False)
    assert (book.broken, book.superseded) == ("rank 2 left", "reader b")


def test_the_stream_announces_epochs_complete_and_never_goes_back() -> None:
    book = LeaseBook(T, now=0.0)
    assert book.completed_epoch < 0  # no epoch, not even the first, is complete yet
    book.told(Answer(epoch_complete=0), now=1.0)
    assert book.completed_epoch == 0
    book.told(Answer(epoch_complete=2), now=2.0)
    book.told(Answer(epoch_complete=1), now=3.0)  # late news of an older epoch
    assert book.completed_epoch == 2


def test_progress_of_a_lease_whose_failure_was_confirmed_goes_under_no_lease() -> None:
    """Records the trainer had before a failure, noted after the FAILED went out: once the
    master confirmed the FAILED the lease is nobody's, and the count goes under token 0 (no
    lease: the master refuses it), never under a token the reader does not hold."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.failed((0, 1, 11), "unreadable", now=1.0)
    sent = book.drain()
    assert book.progress.note((0, 1, 11), 3, now=1.5)  # still held: the FAILED is in flight
    book.answered(sent, Answer(), called_at=1.0, now=2.0)
    assert book.held_now() == ([], set())
    assert book.drain_progress() == [Report(0, 1, Outcome.PROGRESS, 0, consumed=3)]


# -- when the reporter sends ----------------------------------------------------------------------
def test_an_answer_is_needed_from_exactly_a_heartbeat_after_the_last_contact() -> None:
    book = LeaseBook(T, now=100.0)
    assert not book.needs_answer(100.0 + HEARTBEAT / 2, HEARTBEAT)
    assert book.needs_answer(100.0 + HEARTBEAT, HEARTBEAT)
    book.answered([], Answer(), called_at=104.0, now=105.0)
    assert not book.needs_answer(100.0 + HEARTBEAT, HEARTBEAT)
    assert book.needs_answer(105.0 + HEARTBEAT, HEARTBEAT)


def test_reports_put_back_on_a_fresh_book_wait_no_coalescing_window() -> None:
    """Progress drained into a call that failed comes back as plain reports (`unsent`); nothing
    was queued before, so the reports count as waiting since the book opened."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.progress.note((0, 1, 11), 3, now=0.0)
    reports = book.drain()
    book.unsent(reports)
    assert book.drain() == reports  # first, and once
    book.unsent(reports)
    assert book.send_in(COALESCE_S + 0.01, fetching=True, heartbeat_s=HEARTBEAT) == 0.0


def test_an_overdue_heartbeat_is_not_put_off_by_the_coalescing_window() -> None:
    """A report queued while the producer fetches may wait COALESCE_S for a call to carry it,
    but not when a heartbeat is already overdue: then the reporter sends at once."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.failed((0, 1, 11), "x", now=2 * HEARTBEAT)
    assert book.send_in(2 * HEARTBEAT, fetching=True, heartbeat_s=HEARTBEAT) <= 0


def test_reports_put_back_go_before_the_ones_queued_since() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11), (0, 2, 12)])
    book.progress.note((0, 1, 11), 3, now=0.0)
    failed_call = book.drain()
    book.failed((0, 2, 12), "x", now=1.0)
    book.unsent(failed_call)
    assert book.drain() == [*failed_call, Report(0, 2, Outcome.FAILED, 12, reason="x")]


def test_a_lease_is_sure_up_to_and_including_a_lease_timeout_after_the_open() -> None:
    book = LeaseBook(T, now=5.0)
    book.granted([(0, 1, 11)])
    assert not book.unsure((0, 1, 11), now=5.0 + T)
    assert book.unsure((0, 1, 11), now=5.0 + T + 0.5)
    assert not book.unsure((0, 2, 11), now=5.0 + T + 0.5)  # not held: nothing to confirm


def test_a_cut_starts_the_coalescing_window_of_its_released_report() -> None:
    book = LeaseBook(T, now=0.0)
    book.begin_pass(quota=4)
    book.granted([(0, 1, 11)])
    book.keep(task((0, 1, 11)), now=5.0)
    assert book.send_in(5.0, fetching=True, heartbeat_s=HEARTBEAT) == pytest.approx(COALESCE_S)


def test_a_lease_taken_away_before_the_pass_kept_it_is_still_cut() -> None:
    """The stream may revoke a granted lease before the pass took the task (`keep` is its own
    step under the shell's lock): the cut still goes out (the master refuses it) and the book
    does not fail on the lease it no longer holds."""
    book = LeaseBook(T, now=0.0)
    book.begin_pass(quota=4)
    book.granted([(0, 1, 11)])
    book.told(Answer(revoked=((0, 1, 11),)), now=1.0)
    assert book.keep(task((0, 1, 11)), now=1.0).delivers == 4
    assert book.drain() == [Report(0, 1, Outcome.RELEASED, 11, consumed=4)]
    assert book.held_now() == ([(0, 1, 11)], set())  # listed until the master confirms the cut


def test_finishes_at_one_instant_then_later_give_a_rate() -> None:
    """Two finishes at the same instant and a third half a second later: 4 a second over the
    horizon, not the default depth."""
    book = LeaseBook(T, now=0.0)
    finish_at(book, [5.0, 5.0, 5.5])
    assert book.lease_depth(64) == 8 != 2 * MIN_LEASES


def test_a_call_started_at_the_instant_of_the_ask_answers_it() -> None:
    """A call that started when a begun lease was asked back listed it (the book lists its begun
    leases with every call): no further call is owed."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.claim((0, 1, 11))
    book.told(Answer(give_back=((0, 1, 11),)), now=2.0)
    book.answered([], Answer(), called_at=2.0, now=2.5)
    assert not book.needs_answer(2.5, HEARTBEAT)


def test_a_stale_revocation_does_not_stop_the_ones_after_it() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11), (0, 2, 12)])
    applied = book.told(Answer(revoked=((0, 1, 99), (0, 2, 12))), now=1.0)
    assert applied.gone == [(0, 2)]
    assert book.held_now() == ([(0, 1, 11)], set())
    assert book.lost((0, 2, 12)) and not book.lost((0, 1, 11))


def test_a_checkpoints_positions_alone_are_due_at_once() -> None:
    """Positions start no PROGRESS_INTERVAL_S clock of their own: they count from the last one
    started (none here since the book opened), so enough of them are due at once, not an
    interval after the checkpoint's flush."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.progress.note_positions(0, {1: PROGRESS_MIN_RECORDS})
    assert book.send_in(1.5, fetching=True, heartbeat_s=HEARTBEAT) <= 0
