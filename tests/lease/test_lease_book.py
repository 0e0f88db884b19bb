"""The lease book (trainfeed.lease.book): unit tests of its rules, and a Hypothesis state machine
that drives it through grants, claims, progress, done/failed, revocations, give-backs (answered
or pushed on the Watch stream), synchronous cuts and calls that fail, checking its invariants
after every step."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trainfeed.io.prefetch import TaskRef
from trainfeed.lease.book import (
    COALESCE_S,
    PROGRESS_INTERVAL_S,
    PROGRESS_MIN_RECORDS,
    Answer,
    Lease,
    LeaseBook,
    Outcome,
)

T = 30.0  # lease timeout
HEARTBEAT = T / 3


def task(lease: Lease, records: int = 10, skip: int = 0) -> TaskRef:
    """The task of `lease`: `records` to read after the first `skip` (a resumed partition)."""
    return TaskRef(lease[0], lease[1], "shard", 0, 1, skip + records, skip=skip, lease=lease[2])


def test_a_started_lease_is_never_given_back_and_a_given_back_one_never_starts() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11), (0, 2, 12)])
    assert book.claim((0, 1, 11)) is False
    applied = book.told(Answer(give_back=((0, 1, 11), (0, 2, 12))), now=1.0)
    assert applied.given == 1 and book.lost((0, 2, 12)) and not book.lost((0, 1, 11))
    assert book.claim((0, 2, 12)) is True  # its records come from the thief
    assert [(r.names, r.outcome) for r in book.drain()] == [((0, 2, 12), Outcome.RELEASED)]


def test_a_done_keeps_its_lease_started_until_the_master_confirms_it() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.handed_over()
    book.claim((0, 1, 11))
    assert book.done((0, 1, 11), now=1.0)
    # The DONE is delayed (a master restart); the restarted master asks the lease back.
    assert book.told(Answer(give_back=((0, 1, 11),)), now=2.0).given == 0
    sent = book.drain()
    book.answered(sent, Answer(), called_at=3.0, now=3.1)
    assert not book.held and not book.started


def test_a_revoked_lease_is_not_reported_done_but_a_done_queued_before_still_goes() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11), (0, 2, 12)])
    book.handed_over()
    book.handed_over()
    assert book.done((0, 1, 11), now=1.0)  # queued before the revocation: still goes
    book.answered([], Answer(revoked=((0, 1, 11), (0, 2, 12))), called_at=2.0, now=2.0)
    assert book.done((0, 2, 12), now=3.0) is False
    assert [r.names for r in book.drain() if r.outcome is Outcome.DONE] == [(0, 1, 11)]


def test_a_lease_taken_away_after_its_last_record_went_out_drops_nothing() -> None:
    """The DONE of an epoch's last partition rides one call while another call's (or message's)
    answer, made after the epoch ended, lists the lease as no longer ours: nothing of it was
    undelivered, so it is not among the leases whose records are dropped (nor logged so)."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11), (0, 2, 12)])
    book.handed_over()
    book.claim((0, 1, 11))
    assert book.done((0, 1, 11), now=1.0)
    in_flight = book.drain()
    applied = book.answered([], Answer(revoked=((0, 1, 11), (0, 2, 12))), called_at=2.0,
                            now=2.0)
    assert applied.gone == [(0, 2)]
    book.answered(in_flight, Answer(), called_at=1.5, now=2.5)
    assert not book.held and not book.finishing


def test_only_an_answer_to_our_own_call_renews_the_leases() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.told(Answer(epoch_complete=3), now=40.0)
    assert book.unsure((0, 1, 11), now=40.0) and book.completed_epoch == 3
    book.answered([], Answer(), called_at=40.0, now=40.1)
    assert not book.unsure((0, 1, 11), now=40.1)


def test_a_reader_holding_unstarted_leases_polls_only_without_the_stream() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    assert book.send_in(1.0, fetching=False, heartbeat_s=HEARTBEAT) == HEARTBEAT - 1.0
    assert book.send_in(1.0, fetching=False, heartbeat_s=HEARTBEAT, poll_s=0.25) <= 0
    book.claim((0, 1, 11))  # started: nothing to give back, nothing to poll for
    assert book.send_in(1.0, fetching=False, heartbeat_s=HEARTBEAT, poll_s=0.25) > 0


def test_an_ask_for_a_begun_lease_is_answered_at_once_by_a_report() -> None:
    """The master learns which leases are begun only from our calls: asked back one that the
    trainer began, the reader calls at once (its held list says so) instead of letting the
    master ask again until the next heartbeat (issue 28: the epoch's tail)."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.claim((0, 1, 11))
    book.answered([], Answer(), called_at=1.0, now=1.0)
    assert book.send_in(2.0, fetching=True, heartbeat_s=HEARTBEAT) > 0
    book.told(Answer(give_back=((0, 1, 11),)), now=2.0)
    assert book.send_in(2.0, fetching=True, heartbeat_s=HEARTBEAT) <= 0
    book.answered([], Answer(), called_at=1.5, now=2.1)  # a call from before the ask
    assert book.send_in(2.1, fetching=True, heartbeat_s=HEARTBEAT) <= 0
    book.answered([], Answer(), called_at=2.2, now=2.3)  # it carried the begun lease
    assert book.send_in(2.3, fetching=True, heartbeat_s=HEARTBEAT) > 0


def test_a_heartbeat_is_skipped_while_other_calls_renew_the_leases() -> None:
    book = LeaseBook(T, now=0.0)
    book.answered([], Answer(), called_at=9.0, now=9.0)
    assert book.send_in(10.0, fetching=True, heartbeat_s=HEARTBEAT) == HEARTBEAT - 1.0


def test_reports_wait_for_the_producer_to_carry_them_at_most_the_coalescing_window() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.handed_over()
    book.done((0, 1, 11), now=1.0)
    assert book.send_in(1.0, fetching=True, heartbeat_s=HEARTBEAT) == pytest.approx(COALESCE_S)
    assert book.send_in(1.0 + COALESCE_S, fetching=True, heartbeat_s=HEARTBEAT) <= 0
    assert book.send_in(1.0, fetching=False, heartbeat_s=HEARTBEAT) <= 0


def test_progress_goes_at_least_every_progress_interval_once_enough_records_went() -> None:
    """Progress goes on its own PROGRESS_INTERVAL_S after it was noted, once a partition has
    PROGRESS_MIN_RECORDS records the master was not sent (fewer wait for its DONE, a call, or
    a flush): a crash repeats at most a second of records or PROGRESS_MIN_RECORDS - 1."""
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    assert book.progress.note((0, 1, 11), 3, now=1.0)
    assert not book.progress.note((0, 1, 11), 2, now=1.1)  # not news
    # (Not due: only the heartbeat, HEARTBEAT after the book's start.)
    assert book.send_in(1.0, fetching=True, heartbeat_s=HEARTBEAT) == pytest.approx(HEARTBEAT - 1)
    assert not book.progress.note((0, 1, 11), PROGRESS_MIN_RECORDS, now=1.5)
    due = book.send_in(1.5, fetching=True, heartbeat_s=HEARTBEAT)
    assert due == pytest.approx(PROGRESS_INTERVAL_S - 0.5)  # (from the first noted)
    [report] = book.drain()
    assert (report.outcome, report.consumed, report.lease) == (
        Outcome.PROGRESS, PROGRESS_MIN_RECORDS, 11)
    # Counted from what was sent: a few more wait, PROGRESS_MIN_RECORDS more go.
    assert book.progress.note((0, 1, 11), PROGRESS_MIN_RECORDS + 4, now=3.0)
    assert book.send_in(3.0, fetching=True, heartbeat_s=HEARTBEAT) > PROGRESS_INTERVAL_S
    book.progress.note((0, 1, 11), 2 * PROGRESS_MIN_RECORDS, now=3.2)
    assert book.send_in(3.2, fetching=True, heartbeat_s=HEARTBEAT) == pytest.approx(
        PROGRESS_INTERVAL_S - 0.2)
    # A flush or a call takes it all the same (drain), due or not.
    assert [r.consumed for r in book.drain()] == [2 * PROGRESS_MIN_RECORDS]


def test_a_resumed_partition_counts_its_progress_from_its_skip() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.keep(task((0, 1, 11), records=100), now=0.0)  # skip 0 ...
    resumed = dataclasses.replace(task((0, 2, 12), records=100), skip=50)
    book.granted([(0, 2, 12)])
    book.keep(resumed, now=0.0)
    book.progress.note((0, 2, 12), 53, now=1.0)  # 3 records past its skip: not due
    assert book.send_in(1.0, fetching=True, heartbeat_s=HEARTBEAT) == pytest.approx(HEARTBEAT - 1)


def test_a_synchronous_rank_keeps_its_quota_and_hands_the_rest_back_at_once() -> None:
    book = LeaseBook(T, now=0.0)
    book.begin_pass(quota=15)
    book.granted([(0, 1, 11), (0, 2, 12), (0, 3, 13)])
    kept = [book.keep(task(lease), now=1.0) for lease in [(0, 1, 11), (0, 2, 12), (0, 3, 13)]]
    assert [t.delivers for t in kept[:2]] == [10, 5]
    assert book.lost((0, 3, 13)) and not book.lost((0, 2, 12))  # nothing of it is delivered
    assert [(r.partition, r.outcome, r.consumed) for r in book.drain()] == [
        (2, Outcome.RELEASED, 5), (3, Outcome.RELEASED, 0)]
    assert book.told(Answer(give_back=((0, 1, 11),)), now=2.0).given == 0  # never while sync


def test_a_synchronous_lease_revoked_after_its_last_record_went_out_keeps_its_quota_spent(
) -> None:
    """Its records were delivered, so they count to the pass's quota: the revocation must not
    give them back to `need` (before, the rank leased past its equal share; found by
    tests/master/test_coordinator_model.py's sync machine)."""
    book = LeaseBook(T, now=0.0)
    book.begin_pass(quota=10)
    book.granted([(0, 1, 11)])
    assert book.keep(task((0, 1, 11)), now=1.0).delivers == 10 and book.need == 0
    book.handed_over()
    book.claim((0, 1, 11))
    assert book.done((0, 1, 11), now=2.0)
    book.drain()  # the DONE is in flight
    applied = book.answered([], Answer(revoked=((0, 1, 11),)), called_at=3.0, now=3.0)
    assert applied.gone == []
    assert book.need == 0 and not book.keeps and not book.started


def test_a_failed_call_keeps_its_reports_for_the_next() -> None:
    book = LeaseBook(T, now=0.0)
    book.granted([(0, 1, 11)])
    book.failed((0, 1, 11), "x" * 5000, now=1.0)
    sent = book.drain()
    book.unsent(sent)
    assert book.drain() == sent and len(sent[0].reason) == 2000


class LeaseBookMachine(RuleBasedStateMachine):
    """A reader's book against a master that grants, revokes and asks back at random."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.book = LeaseBook(T, now=self.now)
        self.next_token = 1
        self.granted_all: set[Lease] = set()
        self.handed: set[Lease] = set()  # loaded, handed to the consumer, not yet done
        self.revoked: set[Lease] = set()  # taken away by the master while held
        self.given: set[Lease] = set()
        self.done_after_loss: set[Lease] = set()
        self.sure_until = self.book.sure_until

    def _any(self, data: st.DataObject, pool: set[Lease]) -> Lease:
        return data.draw(st.sampled_from(sorted(pool)))

    @rule(dt=st.floats(0, 20))
    def tick(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: not self.handed)
    @rule(quota=st.none() | st.integers(0, 40))
    def begin_pass(self, quota: int | None) -> None:
        self.book.begin_pass(quota)

    @rule(epoch=st.integers(0, 1), partition=st.integers(0, 5), records=st.integers(1, 12),
          fails=st.booleans())
    def grant(self, epoch: int, partition: int, records: int, fails: bool) -> None:
        if (epoch, partition) in self.book.held:
            return  # the master leases a partition to one holder at a time
        lease = (epoch, partition, self.next_token)
        self.next_token += 1
        self.granted_all.add(lease)
        self.book.granted([lease])
        kept = self.book.keep(task(lease, records), self.now)
        assert kept.delivers <= records
        if fails:
            self.book.failed(lease, "unreadable", self.now)
            return
        if self.book.lost(lease):
            self.given.add(lease)  # a synchronous cut to nothing: handed back at once
        self.book.handed_over()
        self.handed.add(lease)

    @precondition(lambda self: self.handed)
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        lease = self._any(data, self.handed)
        lost = self.book.claim(lease)
        assert lost == (lease in self.revoked or lease in self.given)

    @precondition(lambda self: self.handed)
    @rule(data=st.data(), consumed=st.integers(0, 12))
    def progress(self, data: st.DataObject, consumed: int) -> None:
        self.book.progress.note(self._any(data, self.handed), consumed, self.now)

    @precondition(lambda self: self.handed)
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        lease = self._any(data, self.handed)
        self.handed.discard(lease)
        lost = lease in self.revoked or lease in self.given
        queued = self.book.done(lease, self.now)
        if lost:
            assert not queued, f"a DONE queued for lost lease {lease}"
            self.done_after_loss.add(lease)

    @precondition(lambda self: self.granted_all)
    @rule(data=st.data(), pushed=st.booleans())
    def revoke(self, data: st.DataObject, pushed: bool) -> None:
        lease = self._any(data, self.granted_all)
        if self.book.holds(lease):
            self.revoked.add(lease)
        answer = Answer(revoked=(lease,))
        if pushed:
            self.book.told(answer, self.now)
        else:
            self.book.answered([], answer, self.now, self.now)

    @precondition(lambda self: self.granted_all)
    @rule(data=st.data(), pushed=st.booleans())
    def ask_back(self, data: st.DataObject, pushed: bool) -> None:
        lease = self._any(data, self.granted_all)
        expected = (self.book.holds(lease) and lease not in self.book.started
                    and self.book.need is None)
        answer = Answer(give_back=(lease,))
        applied = (self.book.told(answer, self.now) if pushed
                   else self.book.answered([], answer, self.now, self.now))
        assert applied.given == int(expected)
        if expected:
            self.given.add(lease)

    @rule(fails=st.booleans(), delay=st.floats(0, 5), lag=st.floats(0, 40))
    def call(self, fails: bool, delay: float, lag: float) -> None:
        """A call that started `lag` ago (the producer's and the reporter's calls overlap)
        and is answered `delay` from now."""
        sent = self.book.drain()
        for report in sent:
            assert report.names in self.granted_all, f"{report} names no lease we were granted"
            if report.outcome is Outcome.DONE:
                assert report.names not in self.done_after_loss
        if fails:
            self.book.unsent(sent)
        else:
            self.book.answered(sent, Answer(), called_at=self.now - lag, now=self.now + delay)

    @invariant()
    def never_both_given_back_and_started(self) -> None:
        assert not (self.book.given & self.book.started)

    @invariant()
    def every_queued_report_names_a_granted_lease(self) -> None:
        for report in self.book.reports:
            assert report.names in self.granted_all
            if report.outcome is Outcome.DONE:
                assert report.names not in self.done_after_loss

    @invariant()
    def started_leases_are_held_or_kept_after_a_cut(self) -> None:
        held = {(*key, token) for key, token in self.book.held.items()}
        assert self.book.started <= held | self.book.released

    @invariant()
    def a_finishing_lease_is_held_until_its_done_is_confirmed(self) -> None:
        # (else the set would grow by one lease per partition read: a leak over a long job).
        # Or given back: this machine may call `done` without `claim`, and an unbegun lease whose
        # DONE is queued can still be asked back.
        held = {(*key, token) for key, token in self.book.held.items()}
        assert self.book.finishing <= held | self.book.given

    @invariant()
    def progress_is_kept_only_for_held_partitions(self) -> None:
        assert set(self.book.progress.counts) <= set(self.book.held)
        assert self.book.progress.dirty <= set(self.book.progress.counts)

    @invariant()
    def held_leases_were_granted_and_never_lost(self) -> None:
        for key, token in self.book.held.items():
            lease = (*key, token)
            assert lease in self.granted_all
            assert not self.book.lost(lease)

    @invariant()
    def counts_stay_in_range(self) -> None:
        assert self.book.outstanding == len(self.handed)
        assert self.book.need is None or self.book.need >= 0

    @invariant()
    def leases_are_renewed_only_forward(self) -> None:
        assert self.book.sure_until >= self.sure_until
        self.sure_until = self.book.sure_until


TestLeaseBook = LeaseBookMachine.TestCase
TestLeaseBook.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
