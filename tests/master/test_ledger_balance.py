"""The ledger's side of issue 13: leases handed back (work stealing), record budgets and the cut
of a synchronous epoch."""
from __future__ import annotations

import pytest

from trainfeed.master.core.ledger import LeaseStatus, Ledger, Outcome, Verdict
from trainfeed.planning.order import epoch_order

T = 30.0


def sized(sizes: list[int], seed: int = 0) -> Ledger:
    ledger = Ledger(len(sizes), seed=seed)
    ledger.sizes = tuple(sizes)
    return ledger


def test_a_released_lease_goes_to_the_front_of_todo_for_another_reader() -> None:
    ledger = Ledger(6)
    taken = ledger.lease("a", 0, 4, 0.0, T).partitions
    assert ledger.unstarted("a") == list(taken)
    ledger.report_progress(0, taken[0], 2, "a")
    assert ledger.unstarted("a") == list(taken[1:])  # started: never asked back
    token = ledger.token_of(taken[3])
    assert ledger.check_report("a", 0, taken[3], token, Outcome.RELEASED) is Verdict.APPLY
    assert ledger.report_released(0, taken[3], 0, "a")
    assert ledger.todo[0] == taken[3] and taken[3] not in ledger.pending
    assert ledger.held_by("a") == list(taken[:3])
    # The same report again is a repeat; from anyone else, or once leased again, refused.
    assert ledger.check_report("a", 0, taken[3], token, Outcome.RELEASED) is Verdict.REPEAT
    assert not ledger.report_released(0, taken[3], 0, "a")
    assert ledger.lease("b", 0, 1, 0.0, T).partitions == (taken[3],)
    assert ledger.check_report("a", 0, taken[3], token, Outcome.RELEASED) is Verdict.REFUSE
    assert not ledger.report_released(0, taken[3], 0, "a")  # not a's lease any more
    assert ledger.held_by("b") == [taken[3]]


def test_a_release_keeps_what_the_holder_delivers_as_progress() -> None:
    ledger = sized([10, 10, 10])
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    assert ledger.report_released(0, p, 4, "a")
    assert ledger.skip(p) == 4 and ledger.progress_by[p] == "a"
    assert ledger.remaining(p) == 6
    # A smaller count than what is known changes no progress.
    ledger.lease("b", 0, 1, 0.0, T)
    assert ledger.report_released(0, p, 2, "b")
    assert ledger.skip(p) == 4 and ledger.progress_by[p] == "a"
    assert not ledger.report_released(1, p, 9, "b")  # another epoch: nothing
    assert not ledger.report_released(0, p, 9, "")  # nobody: nothing


def test_a_record_budget_leases_partitions_until_it_is_covered() -> None:
    ledger = sized([5, 7, 3, 9, 4])
    order = list(ledger.todo)
    sizes = ledger.sizes
    assert sizes is not None
    got = ledger.lease("a", 0, 10, 0.0, T, max_records=sizes[order[0]] + 1).partitions
    assert got == tuple(order[:2])  # the second one covers the rest (and more)
    got = ledger.lease("b", 0, 10, 0.0, T, max_records=1).partitions
    assert got == (order[2],)
    # Without a budget, max_tasks alone counts.
    assert ledger.lease("c", 0, 10, 0.0, T).partitions == tuple(order[3:])


def test_a_budget_counts_what_is_left_of_a_partition() -> None:
    ledger = sized([10, 10])
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    ledger.report_released(0, p, 8, "a")  # 2 records of p left
    got = ledger.lease("b", 0, 5, 0.0, T, max_records=3).partitions
    assert got == (p, ledger.todo[0] if ledger.todo else got[1])[:len(got)]
    assert len(got) == 2  # p covers 2 of the 3: one more partition is needed


@pytest.mark.parametrize("sizes,world,batch", [
    ([10, 10, 10, 10], 2, 4),    # 40 records, keep 32: the cut falls inside a partition
    ([7, 5, 9, 3, 6], 3, 2),     # 30 records, keep 30: nothing dropped
    ([10, 10, 10], 1, 7),        # 30 records, keep 28
    ([1, 1, 1, 1, 1, 20], 2, 3),  # a whole tail of partitions past the cut
    ([5, 5, 5, 5, 5, 5], 4, 2),  # 30 records, keep 24: a partition cut and one dropped whole
])
def test_a_synchronous_epoch_keeps_whole_steps_for_every_rank(sizes: list[int], world: int,
                                                             batch: int) -> None:
    ledger = sized(sizes, seed=3)
    ledger.set_group((world, batch))
    total = sum(sizes)
    keep = total // (world * batch) * world * batch
    assert ledger.keep == keep and ledger.dropped == total - keep < world * batch
    order = epoch_order(len(sizes), 3, 0)
    deliverable = sum(ledger.deliverable(p) for p in order if ledger.done.get(p) != "")
    assert deliverable == keep
    # What is dropped is the end of the epoch's order: every partition before the cut whole.
    seen = 0
    for p in order:
        if seen + sizes[p] <= keep:
            assert ledger.deliverable(p) == sizes[p] and p not in ledger.done
            assert p not in ledger.limits  # a partition that ends at the cut is whole
        elif seen < keep:
            assert ledger.limits[p] == keep - seen
        else:
            assert ledger.done[p] == ""  # dropped at once: done, by nobody
        seen += sizes[p]
    # Every rank leasing its quota by records gets exactly it.
    quota = keep // world
    for rank in range(world):
        need = quota
        while need > 0:
            result = ledger.lease(f"r{rank}", 0, 100, 0.0, T, max_records=need)
            assert result.status is LeaseStatus.TASKS
            for p in result.partitions:
                kept = min(ledger.remaining(p), need)
                need -= kept
                if kept < ledger.remaining(p):
                    ledger.report_released(0, p, ledger.skip(p) + kept, f"r{rank}")
                else:
                    ledger.report_done(0, p, f"r{rank}")
    assert ledger.complete


def test_a_group_cuts_the_current_epoch_only_while_nobody_touched_it() -> None:
    ledger = sized([10, 10, 10])
    assert ledger.set_group((2, 4))  # untouched: cut now
    assert ledger.keep == 24 and ledger.journal[-1] == ["E", 0, 24]
    assert not ledger.set_group((2, 4))  # the same group: nothing
    ledger.lease("a", 0, 1, 0.0, T)
    assert ledger.set_group((1, 4))  # touched: from the next epoch on
    assert ledger.keep == 24
    while not ledger.complete:
        for p in ledger.lease("a", 0, 9, 0.0, T).partitions or ledger.held_by("a"):
            ledger.report_done(0, p, "a")
    ledger.lease("a", 1, 1, 0.0, T)
    assert ledger.epoch == 1 and ledger.keep == 28


def test_synchronous_cuts_replay_and_restore_exactly() -> None:
    ledger = sized([6, 6, 6, 7, 6], seed=1)
    snapshot = ledger.state()
    ledger.set_group((3, 2))  # 31 records: keep 30, one cut
    assert ledger.limits and ledger.dropped == 1
    ledger.lease("a", 0, 9, 0.0, T, max_records=3)
    ops = ledger.take_journal()
    replayed = Ledger.from_state(snapshot)
    replayed.sizes = ledger.sizes
    replayed.replay(ops)
    assert replayed.state() == ledger.state()
    restored = Ledger.from_state(ledger.state())
    assert restored.state() == ledger.state()
    assert restored.limits == ledger.limits and restored.keep == ledger.keep


def test_a_group_without_sizes_keeps_everything() -> None:
    ledger = Ledger(3)
    assert ledger.keep_for((2, 2)) is None
    assert ledger.lease("a", 0, 5, 0.0, T, max_records=1).status is LeaseStatus.TASKS


def test_released_progress_counts_from_zero_and_only_moves_forward() -> None:
    ledger = sized([10, 10])
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    assert ledger.report_released(0, p, 1, "a")
    assert ledger.skip(p) == 1  # one record is progress, from a partition with none
    ledger.lease("b", 0, 1, 0.0, T)
    assert ledger.report_released(0, p, 1, "b")  # the same count: not b's progress
    assert ledger.progress_by[p] == "a"
    ledger.lease("c", 0, 1, 0.0, T)
    assert ledger.report_released(0, p, 10, "c")
    assert ledger.remaining(p) == 0


def test_budgets_stop_at_the_task_cap_and_at_an_exact_cover() -> None:
    ledger = sized([4, 4, 4, 4, 4])
    assert len(ledger.lease("a", 0, 2, 0.0, T, max_records=1000).partitions) == 2
    assert len(ledger.lease("b", 0, 9, 0.0, T, max_records=4).partitions) == 1
    assert len(ledger.lease("c", 0, 9, 0.0, T, max_records=5).partitions) == 2


def test_without_sizes_nothing_is_deliverable_and_nobody_holds_nothing() -> None:
    ledger = Ledger(3)
    assert ledger.deliverable(0) == 0 and ledger.remaining(0) == 0
    assert ledger.unstarted("nobody") == []
    assert not ledger.set_group(None)  # already not synchronous


def test_an_asynchronous_rollover_journals_a_plain_epoch_op() -> None:
    ledger = sized([2, 2])
    for p in ledger.lease("a", 0, 2, 0.0, T).partitions:
        ledger.report_done(0, p, "a")
    ledger.take_journal()
    ledger.lease("a", 1, 1, 0.0, T)
    assert ledger.take_journal()[0] == ["E", 1]
    assert ledger.keep is None and ledger.limits == {}


def test_partitions_reserved_for_a_reader_go_to_it_first_and_beyond_its_fair_share() -> None:
    ledger = Ledger(9)
    order = list(ledger.todo)
    reserved = {order[4]: "thief", order[7]: "thief", order[8]: "someone"}
    # Another reader gets its fair share (6 free of 9, 3 sharers: 2) of what nobody reserved.
    assert ledger.lease("other", 0, 9, 0.0, T, sharers=3,
                        reserved=reserved).partitions == (order[0], order[1])
    # The thief gets its own first, then its share of the rest (4 left: 2).
    assert ledger.lease("thief", 0, 9, 0.0, T, sharers=3,
                        reserved=reserved).partitions == (order[4], order[7], order[2], order[3])
    assert ledger.lease("other", 0, 9, 0.0, T, sharers=3,
                        reserved=reserved).partitions == (order[5],)
    assert ledger.lease("other", 0, 9, 0.0, T, sharers=3,
                        reserved=reserved).partitions == (order[6],)
    assert ledger.lease("other", 0, 9, 0.0, T, reserved=reserved).status is LeaseStatus.WAIT
    assert ledger.lease("someone", 0, 9, 0.0, T, reserved=reserved).partitions == (order[8],)
