"""A synchronous rank's cut in its lease book (trainfeed.lease.book): the lease it hands back
with RELEASED stays listed as held until the master confirmed that report, as a DONE does, so
that a call overtaking the RELEASED cannot orphan it (tests/master/test_sync_quota.py has the
hang this caused)."""
from __future__ import annotations

from trainfeed.io.prefetch import TaskRef
from trainfeed.lease.book import Answer, LeaseBook, Outcome

T = 30.0


def task(partition: int, token: int, records: int = 10) -> TaskRef:
    return TaskRef(0, partition, "shard", 0, 1, records, lease=token)


def test_a_cut_lease_is_listed_until_its_released_is_confirmed() -> None:
    book = LeaseBook(T, now=0.0)
    book.begin_pass(quota=15)
    book.granted([(0, 1, 11), (0, 2, 12)])
    kept = [book.keep(task(1, 11), 1.0), book.keep(task(2, 12), 1.0)]
    assert [k.delivers for k in kept] == [10, 5] and book.need == 0
    assert (0, 2) not in book.held  # not ours to report DONE, progress or lose...
    assert book.held_now()[0] == [(0, 1, 11), (0, 2, 12)]  # ...but listed
    released = book.drain()
    assert [(r.partition, r.outcome, r.consumed) for r in released] == [
        (2, Outcome.RELEASED, 5)]
    # A call that did not carry it (the next GetTasks) is answered, revoking it (the master
    # took the RELEASED first): the cut is kept, its records still delivered, nothing re-needed.
    applied = book.answered([], Answer(revoked=((0, 2, 12),)), 2.0, 2.0)
    assert applied.gone == [] and not book.lost((0, 2, 12)) and book.need == 0
    assert book.held_now()[0] == [(0, 1, 11), (0, 2, 12)]
    book.unsent(released)  # the call carrying it failed: it goes again, still listed
    again = book.drain()
    assert again == released and (0, 2, 12) in book.held_now()[0]
    book.answered(again, Answer(), 3.0, 3.0)  # confirmed: no longer listed
    assert book.held_now()[0] == [(0, 1, 11)]


def test_leaving_the_job_forgets_cuts_not_yet_confirmed() -> None:
    book = LeaseBook(T, now=0.0)
    book.begin_pass(quota=4)
    book.granted([(0, 3, 7)])
    book.keep(task(3, 7), 1.0)
    assert book.held_now()[0] == [(0, 3, 7)]
    book.left()
    assert book.held_now()[0] == []
