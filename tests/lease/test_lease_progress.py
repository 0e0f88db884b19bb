"""Progress within partitions (trainfeed.lease.progress), on its own: what it counts, what it
takes to send, when it is due, and what a broken stream, a lost lease and a finish change.

The book's tests (tests/lease/test_lease_book*.py) drive it through `LeaseBook`; these pin its
own rules at their boundaries (issue 36: `python tools/mutation.py lease/progress.py`)."""
from __future__ import annotations

from trainfeed.lease.progress import PROGRESS_MIN_RECORDS, Progress


def test_only_news_of_a_held_lease_under_its_token_is_counted() -> None:
    held = {(0, 1): 11}
    progress = Progress(held)
    assert not progress.note((0, 1, 12), 5, now=1.0)  # another token: not ours
    assert not progress.note((0, 2, 11), 5, now=1.0)  # not held at all
    assert progress.counts == {} and not progress.dirty
    assert progress.note((0, 1, 11), 5, now=2.0)  # the first change starts the clock
    assert progress.oldest == 2.0
    assert not progress.note((0, 1, 11), 5, now=3.0)  # the same count: not news
    assert not progress.note((0, 1, 11), 7, now=4.0)  # news, but the clock already runs
    assert progress.oldest == 2.0 and progress.counts == {(0, 1): 7}
    held[(0, 2)] = 12  # read live: a lease granted after the tracker was made counts
    assert not progress.note((0, 2, 12), 1, now=5.0)
    assert progress.counts == {(0, 1): 7, (0, 2): 1}


def test_take_hands_over_the_changed_counts_in_key_order_once() -> None:
    progress = Progress({(1, 0): 3, (0, 9): 4, (0, 2): 5})
    for key, n in (((1, 0), 2), ((0, 9), 4), ((0, 2), 6)):
        progress.note((*key, progress.held[key]), n, now=1.0)
    assert progress.take() == [((0, 2), 6), ((0, 9), 4), ((1, 0), 2)]
    assert progress.take() == [] and not progress.dirty
    assert progress.reported == {(0, 2): 6, (0, 9): 4, (1, 0): 2}


def test_progress_is_due_from_the_minimum_records_past_what_was_sent() -> None:
    progress = Progress({(0, 1): 11})
    progress.start((0, 1), 100)  # the task starts at record 100: the master knows that much
    progress.note((0, 1, 11), 100 + PROGRESS_MIN_RECORDS - 1, now=1.0)
    assert not progress.due()
    progress.note((0, 1, 11), 100 + PROGRESS_MIN_RECORDS, now=1.0)
    assert progress.due()
    progress.take()
    assert not progress.due()  # nothing changed since
    progress.note((0, 1, 11), 100 + 2 * PROGRESS_MIN_RECORDS - 1, now=2.0)
    assert not progress.due()  # counted from what was sent, not from the start


def test_a_resend_sends_every_held_count_again_and_from_nothing_sent() -> None:
    held = {(0, 1): 11, (0, 2): 12}
    progress = Progress(held)
    progress.note((0, 1, 11), PROGRESS_MIN_RECORDS, now=1.0)
    progress.note((0, 2, 12), 1, now=1.0)
    progress.take()
    del held[(0, 2)]  # given back meanwhile, its count not yet dropped
    progress.resend()
    assert progress.dirty == {(0, 1)} and (0, 1) not in progress.reported
    assert progress.reported == {(0, 2): 1}
    assert progress.due()  # the whole count again: the master may have none of it


def test_drop_forgets_the_count_and_finish_forgets_what_was_sent_too() -> None:
    progress = Progress({(0, 1): 11, (0, 2): 12})
    progress.start((0, 1), 3)
    progress.start((0, 2), 4)
    progress.note((0, 1, 11), 9, now=1.0)
    progress.note((0, 2, 12), 9, now=1.0)
    progress.drop((0, 1))
    assert (0, 1) not in progress.counts and (0, 1) not in progress.dirty
    assert progress.reported[(0, 1)] == 3  # what the master was told stays
    progress.finish((0, 2))
    assert progress.counts == {} and not progress.dirty
    assert progress.reported == {(0, 1): 3}
    progress.clear()
    assert progress.reported == {}


def test_the_count_already_sent_is_no_news() -> None:
    progress = Progress({(0, 1): 11})
    progress.note((0, 1, 11), 5, now=1.0)
    progress.take()
    assert not progress.note((0, 1, 11), 5, now=2.0)
    assert not progress.dirty and progress.take() == []


def test_a_resend_also_sends_a_count_that_never_went() -> None:
    progress = Progress({(0, 1): 11, (0, 2): 12})
    progress.note((0, 1, 11), 4, now=1.0)
    progress.take()
    progress.note((0, 2, 12), 2, now=1.5)  # noted after the stream broke: never sent
    progress.resend()
    assert progress.take() == [((0, 1), 4), ((0, 2), 2)]
