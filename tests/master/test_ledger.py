"""The task ledger: unit tests of each behaviour, and a Hypothesis state machine.

Equivalent mutants (mutmut, tools/mutation.py), left alive on purpose:
- `LedgerState.replay`: `_apply(op, record=False)` → `_apply(op, record=None)`: both are false.
- `LedgerState._apply` ("L") and `ledger_saved.restore`: `…[partition] = None` → `= ""` in
  `by_worker` (two mutants): its values are never read (each worker's dict is an
  insertion-ordered set).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trainfeed.master.core.ledger import (
    STATE_VERSION,
    LeaseResult,
    LeaseStatus,
    Ledger,
)
from trainfeed.planning.order import epoch_order

T = 10.0  # lease timeout


def test_an_epoch_hands_out_every_partition_once_in_the_seeded_order() -> None:
    ledger = Ledger(6, seed=3)
    got = []
    while (r := ledger.lease("w", 0, 4, now=0.0, lease_timeout=T)).status is LeaseStatus.TASKS:
        got.extend(r.partitions)
        for p in r.partitions:
            assert ledger.report_done(0, p)
    assert got == epoch_order(6, 3, 0)
    assert r.status is LeaseStatus.EPOCH_DONE and ledger.complete


def test_shuffle_differs_per_epoch_and_seed_but_is_reproducible() -> None:
    assert epoch_order(50, 0, 0) == epoch_order(50, 0, 0)
    assert epoch_order(50, 0, 0) != epoch_order(50, 0, 1)
    assert epoch_order(50, 0, 0) != epoch_order(50, 1, 0)
    assert sorted(epoch_order(50, 7, 3)) == list(range(50))


def test_golden_partition_order() -> None:
    # Pins numpy's PCG64 permutation for (seed, epoch): a change here changes every job's order
    # after an upgrade. Update only on purpose, with a note in the changelog.
    assert epoch_order(10, 0, 0) == [4, 6, 2, 7, 3, 5, 9, 0, 8, 1]


def test_a_call_takes_at_most_its_fair_share_of_todo() -> None:
    ledger = Ledger(19)
    sizes = [len(ledger.lease(w, 0, 32, 0.0, T, sharers=3).partitions) for w in "abcabc"]
    assert sizes == [7, 4, 3, 2, 1, 1]  # ceil(19/3), ceil(12/3), … of what is left
    assert len(Ledger(19).lease("a", 0, 32, 0.0, T).partitions) == 19  # alone: all it asks


def test_expired_lease_goes_back_to_todo_and_to_another_worker() -> None:
    ledger = Ledger(2, seed=0)
    first = ledger.lease("a", 0, 1, now=0.0, lease_timeout=T).partitions
    ledger.lease("b", 0, 1, now=0.0, lease_timeout=T)
    assert ledger.lease("b", 0, 1, now=5.0, lease_timeout=T).status is LeaseStatus.WAIT
    ledger.renew("b", now=5.0, lease_timeout=T)
    again = ledger.lease("b", 0, 1, now=10.0, lease_timeout=T)  # a's lease ran out at 10
    assert again.status is LeaseStatus.TASKS and again.partitions == first
    assert ledger.held_by("a") == []


def test_heartbeat_keeps_a_lease_alive() -> None:
    ledger = Ledger(1)
    ledger.lease("a", 0, 1, now=0.0, lease_timeout=T)
    for now in (6.0, 12.0, 18.0):
        assert ledger.renew("a", now, T) == 1
        assert ledger.expire(now + 1) == []
    assert ledger.expire(28.0) == [0]


def test_failure_cap_marks_partition_failed_without_stopping_the_epoch() -> None:
    ledger = Ledger(2, max_failures=2)
    order = epoch_order(2, 0, 0)
    bad = order[0]
    for _ in range(2):
        r = ledger.lease("w", 0, 1, now=0.0, lease_timeout=T)
        assert r.partitions == (bad,)  # a failed partition is retried first
        assert ledger.report_failed(0, bad, "decode error")
    assert ledger.failed == {bad: "decode error"}
    r = ledger.lease("w", 0, 1, now=0.0, lease_timeout=T)
    assert r.partitions == (order[1],)
    ledger.report_done(0, order[1])
    assert ledger.complete
    assert ledger.lease("w", 0, 1, 0.0, T).status is LeaseStatus.EPOCH_DONE


def test_epoch_rolls_over_only_when_complete_and_resets_queues() -> None:
    ledger = Ledger(2)
    r = ledger.lease("a", 0, 2, 0.0, T)
    assert ledger.lease("b", 1, 2, 0.0, T).status is LeaseStatus.WAIT  # epoch 0 still running
    ledger.report_done(0, r.partitions[0])
    ledger.report_done(0, r.partitions[1])
    assert ledger.join_epoch() == 1
    r1 = ledger.lease("b", 1, 2, 0.0, T)
    assert (r1.status, r1.epoch) == (LeaseStatus.TASKS, 1)
    assert not ledger.done and ledger.epoch == 1
    assert ledger.lease("a", 0, 1, 0.0, T).status is LeaseStatus.EPOCH_DONE  # behind: pass ends
    assert not ledger.report_done(0, r1.partitions[0])  # stale report of an old epoch is ignored


def test_release_hands_back_at_once_and_reports_are_idempotent() -> None:
    ledger = Ledger(3)
    held = ledger.lease("a", 0, 2, 0.0, T).partitions
    assert sorted(ledger.release("a")) == sorted(held)
    assert ledger.release("a") == []
    assert ledger.lease("b", 0, 3, 0.0, T).partitions[:2] == held
    assert ledger.report_done(0, held[0]) and not ledger.report_done(0, held[0])


def test_late_done_of_an_expired_lease_still_counts() -> None:
    ledger = Ledger(1)
    ledger.lease("a", 0, 1, 0.0, T)
    ledger.expire(100.0)
    assert ledger.counts() == {"todo": 1, "pending": 0, "done": 0, "failed": 0}
    assert ledger.report_done(0, 0) and ledger.complete


def test_progress_is_monotonic_survives_expiry_and_is_dropped_when_done() -> None:
    ledger = Ledger(2)
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    assert ledger.report_progress(0, p, 40)
    assert not ledger.report_progress(0, p, 30)  # late, smaller: ignored
    ledger.expire(100.0)
    assert ledger.lease("b", 0, 1, 100.0, T).partitions == (p,)
    assert ledger.skip(p) == 40  # b starts after what a's trainer already got
    restored = Ledger.from_state(ledger.state())
    assert restored.skip(p) == 40
    ledger.report_done(0, p)
    assert ledger.skip(p) == 0 and not ledger.report_progress(0, p, 50)


def test_the_journal_replayed_on_a_snapshot_rebuilds_the_ledger() -> None:
    ledger = Ledger(5, seed=2)
    base = ledger.state()
    ledger.take_journal()
    a = ledger.lease("a", 0, 2, 0.0, T).partitions
    ledger.lease("b", 0, 2, 0.0, T)
    ledger.report_done(0, a[0], "a")
    ledger.report_progress(0, a[1], 7)
    ledger.expire(100.0)  # a's and b's leases come back
    ops = ledger.take_journal()
    assert [op[0] for op in ops] == ["L", "L", "D", "P", "B"]
    rebuilt = Ledger.from_state(json.loads(json.dumps(base)))
    rebuilt.replay(json.loads(json.dumps(ops)))
    assert rebuilt.state() == ledger.state() and not rebuilt.journal


def test_expiry_is_per_worker_and_a_heartbeat_renews_all_its_leases() -> None:
    ledger = Ledger(6)
    a = ledger.lease("a", 0, 2, 0.0, T).partitions
    b = ledger.lease("b", 0, 2, 5.0, T).partitions
    assert ledger.renew("a", 8.0, T) == 2 and ledger.renew("nobody", 8.0, T) == 0
    assert ledger.expire(15.0) == list(b)  # b's deadline (15) passed, a's (18) not
    assert ledger.expire(18.0) == list(a)
    assert ledger.held_by("a") == [] and ledger.counts()["pending"] == 0


def test_rewind_puts_back_what_a_restored_reader_consumed_after_its_checkpoint() -> None:
    ledger = Ledger(6)
    p0, p1, p2 = ledger.lease("a", 0, 3, 0.0, T).partitions
    ledger.report_done(0, p0, "a")  # done before the checkpoint
    ledger.report_progress(0, p1, 5)  # checkpoint: p0 done, p1 at 5 records
    ledger.report_progress(0, p1, 9)  # … then the trainer went on and crashed
    ledger.report_done(0, p1, "a")
    ledger.report_progress(0, p2, 3)
    p3 = ledger.lease("a", 0, 1, 0.0, T).partitions[0]  # consumed before the checkpoint, but
    other = ledger.lease("b", 0, 1, 0.0, T).partitions[0]  # its DONE never reached the master
    ledger.report_done(0, other, "b")
    back = ledger.rewind(0, "a", keep_done=[p0, p3], positions={p1: 5})
    assert sorted(back) == sorted([p1, p2])
    assert ledger.skip(p1) == 5 and ledger.skip(p2) == 0
    assert set(ledger.done) == {p0, p3, other} and not ledger.held_by("a")
    assert list(ledger.todo)[:2] == back
    assert ledger.rewind(1, "a", [], {}) == []  # another epoch: nothing to rewind


def test_reconcile_hands_back_leases_the_worker_does_not_know_of() -> None:
    ledger = Ledger(6)
    known = ledger.lease("a", 0, 2, 0.0, T).partitions
    orphans = ledger.lease("a", 0, 2, 0.0, T).partitions  # an answer that never arrived
    assert ledger.reconcile("a", [(0, p) for p in known] + [(7, 1)]) == list(orphans)
    assert ledger.held_by("a") == list(known) and list(ledger.todo)[:2] == list(orphans)
    assert ledger.reconcile("a", [(0, p) for p in known]) == []


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        Ledger(0)
    with pytest.raises(ValueError, match="out of range"):
        Ledger(2).report_done(0, 5)


def test_restored_leases_get_fresh_deadlines_from_the_restart() -> None:
    """Deadlines are not saved: a restored lease has none until `refresh_deadlines`, which runs
    from the restart's clock (a sign flip would expire every restored lease at once)."""
    ledger = Ledger(4)
    a = ledger.lease("a", 0, 2, now=0.0, lease_timeout=T).partitions
    b = ledger.lease("b", 0, 2, now=0.0, lease_timeout=T).partitions
    restored = Ledger.from_state(json.loads(json.dumps(ledger.state())))
    assert restored.deadlines == {} and restored.expire(1e9) == []
    restored.refresh_deadlines(now=100.0, lease_timeout=T)
    assert restored.deadlines == {"a": 100.0 + T, "b": 100.0 + T}
    assert restored.expire(100.0 + T - 0.5) == []
    assert sorted(restored.expire(100.0 + T)) == sorted(a + b)
    assert restored.expired_leases == 4


def test_refresh_deadlines_can_be_limited_to_some_workers() -> None:
    ledger = Ledger(4)
    a = ledger.lease("reader-a", 0, 2, 0.0, T).partitions
    b = ledger.lease("reader-b", 0, 2, 0.0, T).partitions
    restored = Ledger.from_state(ledger.state())
    assert restored.held_by("reader-a") == list(a) and restored.held_by("reader-b") == list(b)
    restored.refresh_deadlines(50.0, T, workers=["reader-a", "ghost"])  # ghost holds nothing
    assert restored.deadlines == {"reader-a": 50.0 + T}
    assert restored.expire(1e9) == list(a)  # b has no deadline yet
    restored.refresh_deadlines(60.0, T, workers=iter(["reader-b"]))
    assert restored.deadlines == {"reader-b": 60.0 + T}


def test_a_late_failure_report_for_a_partition_no_longer_pending_changes_nothing() -> None:
    ledger = Ledger(4, max_failures=2)
    p, q, r = ledger.lease("a", 0, 3, 0.0, T).partitions
    assert ledger.expire(100.0) == [p, q, r]  # all three back in todo
    ledger.take_journal()
    before = ledger.state()
    assert not ledger.report_failed(0, p, "late")  # in todo: no second copy there
    assert ledger.state() == before and list(ledger.todo).count(p) == 1
    assert ledger.lease("b", 0, 4, 100.0, T).partitions[:3] == (p, q, r)
    assert ledger.report_done(0, q, "b")
    assert ledger.report_failed(0, r, "io") and ledger.report_failed(0, p, "io")
    assert ledger.lease("b", 0, 4, 100.0, T).partitions[:2] == (p, r)  # retried first
    assert ledger.report_failed(0, r, "io again") and ledger.failed == {r: "io again"}
    ledger.take_journal()
    before = ledger.state()
    assert not ledger.report_failed(0, q, "late")  # done
    assert not ledger.report_failed(0, r, "late")  # failed already
    assert not ledger.report_failed(1, p, "late")  # another epoch
    assert not ledger.report_failed(0, 9, "late")  # not a partition at all
    assert ledger.state() == before and ledger.take_journal() == []
    assert ledger.failures == {r: 2, p: 1}


def test_a_reader_joining_mid_epoch_joins_the_current_one() -> None:
    ledger = Ledger(3)
    assert ledger.join_epoch() == 0
    first = ledger.lease("a", 0, 1, 0.0, T).partitions
    assert ledger.join_epoch() == 0  # todo left
    rest = ledger.lease("a", 0, 2, 0.0, T).partitions
    assert not ledger.todo and ledger.join_epoch() == 0  # leases out: they may come back
    for p in first + rest[:1]:
        ledger.report_done(0, p)
    assert ledger.join_epoch() == 0
    ledger.report_done(0, rest[1])
    assert ledger.join_epoch() == 1  # complete: a newcomer starts the next epoch
    assert ledger.lease("b", 1, 1, 0.0, T).status is LeaseStatus.TASKS
    assert ledger.join_epoch() == 1


def test_a_version_1_snapshot_restores() -> None:
    # What a master before the journal saved: pending as [worker, deadline], done as a list.
    v1 = {"version": 1, "num_partitions": 5, "seed": 5, "max_failures": 2, "epoch": 3,
          "todo": [2, 4], "pending": {"1": ["reader-a", 123.5]}, "done": [0],
          "failed": {"3": "bad"}, "failures": {"3": 2, "4": 1}, "progress": {"1": 6}}
    ledger = Ledger.from_state(v1)
    assert (ledger.num_partitions, ledger.seed, ledger.max_failures, ledger.epoch) == (5, 5, 2, 3)
    assert list(ledger.todo) == [2, 4] and ledger.pending == {1: "reader-a"}
    assert ledger.held_by("reader-a") == [1] and ledger.done == {0: ""}
    assert ledger.failed == {3: "bad"} and ledger.failures == {3: 2, 4: 1}
    assert ledger.skip(1) == 6
    assert ledger.deadlines == {}  # the old deadline (another clock) is not trusted
    ledger.refresh_deadlines(0.0, T)
    assert ledger.expire(T) == [1]
    assert ledger.state()["version"] == STATE_VERSION == 4  # fencing 3, synchronous cuts 4
    assert Ledger.from_state(ledger.state()).state() == ledger.state()
    older = {k: v for k, v in v1.items() if k != "progress"}  # the first v1 had no progress
    assert Ledger.from_state(older).progress == {}
    with pytest.raises(ValueError, match=r"ledger state version 5, expected 4"):
        Ledger.from_state({**v1, "version": 5})
    with pytest.raises(ValueError, match=r"ledger state version None"):
        Ledger.from_state({k: v for k, v in v1.items() if k != "version"})


def test_a_snapshot_keeps_failed_partitions_and_failure_counts() -> None:
    ledger = Ledger(3, max_failures=2)
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    ledger.report_failed(0, p, "x")
    assert ledger.lease("a", 0, 1, 0.0, T).partitions == (p,)
    ledger.report_failed(0, p, "decode error")
    q = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    ledger.report_failed(0, q, "io")
    state = json.loads(json.dumps(ledger.state()))
    assert state["failed"] == {str(p): "decode error"}
    assert state["failures"] == {str(p): 2, str(q): 1}
    restored = Ledger.from_state(state)
    assert restored.failed == {p: "decode error"} and restored.failures == {p: 2, q: 1}
    assert restored.state() == ledger.state()
    assert restored.lease("b", 0, 1, 0.0, T).partitions == (q,)  # q's retry comes first
    assert restored.report_failed(0, q, "io again")  # its second failure: given up
    assert restored.failed == {p: "decode error", q: "io again"}


def test_rewind_keeps_partition_0_and_ignores_ids_out_of_range() -> None:
    ledger = Ledger(4)
    ledger.lease("a", 0, 4, 0.0, T)
    back = ledger.rewind(0, "a", keep_done=[0, -1, 4, 99], positions={-1: 3, 4: 2, 1: 7})
    assert ledger.done == {0: "a"}
    assert sorted(back) == [1, 2, 3] and list(ledger.todo) == back
    assert ledger.skip(1) == 7 and ledger.skip(2) == ledger.skip(3) == 0
    assert ledger.held_by("a") == [] and not ledger.pending


def test_rewind_of_partitions_known_only_from_positions() -> None:
    """A partition in the trainer's hands at checkpoint time that the master has since handed
    back (in todo) restarts after the checkpoint's records; done and failed ones stay."""
    ledger = Ledger(6, max_failures=1)
    order = list(ledger.todo)
    done, failed = ledger.lease("b", 0, 2, 0.0, T).partitions
    ledger.report_done(0, done, "b")
    ledger.report_failed(0, failed, "bad")
    waiting = order[4]  # still in todo, held by no one
    back = ledger.rewind(0, "a", keep_done=[], positions={waiting: 4, done: 9, failed: 2,
                                                          order[5]: -3})
    assert back == [waiting, order[5]]
    assert list(ledger.todo)[:2] == back and sorted(ledger.todo) == sorted(order[2:])
    assert ledger.skip(waiting) == 4 and ledger.skip(order[5]) == 0  # a negative figure: 0
    assert ledger.done == {done: "b"} and ledger.failed == {failed: "bad"}
    assert ledger.rewind(0, "a", keep_done=[], positions={}) == []  # nothing of a's: nothing


def test_rewind_marks_kept_partitions_done_from_todo_too() -> None:
    ledger = Ledger(3)
    p = ledger.todo[1]  # never leased: its DONE was consumed before a checkpoint elsewhere
    assert ledger.rewind(0, "a", keep_done=[p], positions={}) == []
    assert ledger.done == {p: "a"} and p not in ledger.todo


def test_progress_of_exactly_one_record() -> None:
    ledger = Ledger(3, max_failures=1)
    p, f = ledger.lease("a", 0, 2, 0.0, T).partitions
    assert not ledger.report_progress(0, p, 0)  # nothing consumed: nothing to record
    assert ledger.report_progress(0, p, 1) and ledger.skip(p) == 1
    assert not ledger.report_progress(0, p, 1)  # the same figure again
    assert ledger.report_progress(0, p, 2) and ledger.skip(p) == 2
    assert not ledger.report_progress(1, p, 5)  # another epoch
    ledger.report_failed(0, f, "bad")
    assert not ledger.report_progress(0, f, 3) and ledger.skip(f) == 0  # failed: ignored
    with pytest.raises(ValueError, match=r"partition 3 out of range \[0, 3\)"):
        ledger.report_progress(0, 3, 1)
    with pytest.raises(ValueError, match="out of range"):
        ledger.report_progress(0, -1, 1)


def test_max_failures_1_gives_up_at_the_first_failure() -> None:
    ledger = Ledger(2, max_failures=1)
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    assert ledger.report_failed(0, p, "bad")
    assert ledger.failed == {p: "bad"} and p not in ledger.todo and ledger.skip(p) == 0
    assert ledger.counts() == {"todo": 1, "pending": 0, "done": 0, "failed": 1}
    with pytest.raises(ValueError, match="max_failures must be ≥ 1, got 0"):
        Ledger(2, max_failures=0)


def test_the_expired_leases_counter_counts_partitions_not_workers_or_releases() -> None:
    ledger = Ledger(6)
    ledger.lease("a", 0, 2, 0.0, T)
    ledger.lease("b", 0, 1, 0.0, T)
    ledger.release("b")  # a clean leave is not an expiry
    assert ledger.expired_leases == 0
    ledger.expire(T)
    assert ledger.expired_leases == 2
    ledger.lease("c", 0, 3, T, T)
    ledger.expire(2 * T - 1)
    assert ledger.expired_leases == 2
    ledger.expire(2 * T)
    assert ledger.expired_leases == 5
    assert Ledger.from_state(ledger.state()).expired_leases == 0  # a metric, not state


def test_lease_results_name_the_current_epoch() -> None:
    ledger = Ledger(2)
    assert ledger.lease("a", 1, 1, 0.0, T) == LeaseResult(LeaseStatus.WAIT, 0)  # ahead
    p = ledger.lease("a", 0, 1, 0.0, T).partitions
    q = ledger.lease("b", 0, 1, 0.0, T).partitions
    assert ledger.lease("c", 0, 1, 0.0, T) == LeaseResult(LeaseStatus.WAIT, 0)  # all out
    ledger.report_done(0, p[0])
    ledger.report_done(0, q[0])
    assert ledger.done == {p[0]: "", q[0]: ""}  # no worker named: an anonymous report
    assert ledger.lease("c", 0, 1, 0.0, T) == LeaseResult(LeaseStatus.EPOCH_DONE, 0)
    assert ledger.lease("c", 2, 1, 0.0, T) == LeaseResult(LeaseStatus.TASKS, 2,
                                                         (epoch_order(2, 0, 2)[0],))
    assert ledger.lease("c", 1, 1, 0.0, T) == LeaseResult(LeaseStatus.EPOCH_DONE, 2)


def test_a_lease_takes_at_least_one_partition_whatever_it_asks() -> None:
    ledger = Ledger(4)
    assert len(ledger.lease("a", 0, 0, 0.0, T).partitions) == 1  # max_tasks 0
    assert len(ledger.lease("b", 0, 8, 0.0, T, sharers=0).partitions) == 3  # no sharers: alone


def test_the_state_is_json_as_it_is() -> None:
    ledger = Ledger(4, max_failures=2)
    p, q, r = ledger.lease("a", 0, 3, 0.0, T).partitions
    ledger.report_done(0, p, "a")
    ledger.report_progress(0, q, 3)
    ledger.report_failed(0, r, "x")
    state = ledger.state()
    assert json.loads(json.dumps(state)) == state  # no int keys that JSON would turn to str
    assert state == {
        "version": 4, "num_partitions": 4, "seed": 0, "max_failures": 2, "epoch": 0,
        "todo": [r, epoch_order(4, 0, 0)[3]], "pending": {str(q): "a"}, "done": {str(p): "a"},
        "failed": {}, "previous_failed": {}, "failures": {str(r): 1},
        "progress": {str(q): 3}, "progress_by": {},
        # Fencing: tokens 1-3 in lease order (no key: the counter itself); a lease stays known
        # until the next one; who held each partition this epoch (whose checkpoint may rewind it).
        "next_token": 4, "token_key": None,
        "leases": {str(p): ["a", 1], str(q): ["a", 2], str(r): ["a", 3]},
        "holders": {str(p): ["a"], str(q): ["a"], str(r): ["a"]},
        # Not a synchronous epoch: no cut.
        "keep": None, "limits": {}, "dropped": 0}


def test_replay_refuses_an_unknown_op() -> None:
    with pytest.raises(ValueError, match=r"unknown ledger op \['Z', 1\]"):
        Ledger(2).replay([["Z", 1]])


def test_a_failed_partition_drops_its_progress() -> None:
    ledger = Ledger(2, max_failures=1)
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    ledger.report_progress(0, p, 5)
    ledger.report_failed(0, p, "bad")
    assert ledger.skip(p) == 0 and ledger.progress == {}


class LedgerMachine(RuleBasedStateMachine):
    """Random interleavings of lease, join, expiry, report (of pending partitions and of
    partitions that are not), release, reconcile, rewind and restore (state round trip).

    Rules include work stealing's RELEASED hand-backs (issue 13).

    Invariants: every partition of the current epoch is in exactly one of todo / pending / done /
    failed; nothing completes twice; a complete epoch accounts for every partition; every worker
    holding leases has one deadline, later than now and at most a lease timeout away (after a
    restart too); join_epoch is the current epoch until it is complete; failure counts agree
    with the failed set; progress is only kept for partitions still to read.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(7, seed=1, max_failures=2)
        self.now = 0.0
        self.completions: dict[int, list[int]] = {}
        # What a state store would hold: a snapshot and the ops journaled since.
        self.snapshot = self.ledger.state()
        self.ops: list[list[object]] = []

    @rule(worker=st.sampled_from("abc"), n=st.integers(1, 3), ahead=st.booleans(),
          sharers=st.integers(1, 4))
    def lease(self, worker: str, n: int, ahead: bool, sharers: int) -> None:
        epoch = self.ledger.epoch + (1 if ahead else 0)
        self.ledger.lease(worker, epoch, n, self.now, T, sharers)

    @rule(dt=st.floats(0, 2 * T))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.ledger.expire(self.now)

    @precondition(lambda self: self.ledger.pending)
    @rule(data=st.data(), fail=st.booleans())
    def report(self, data: st.DataObject, fail: bool) -> None:
        partition = data.draw(st.sampled_from(sorted(self.ledger.pending)))
        if fail:
            self.ledger.report_failed(self.ledger.epoch, partition, "boom")
        elif self.ledger.report_done(self.ledger.epoch, partition, "x"):
            self.completions.setdefault(self.ledger.epoch, []).append(partition)

    @rule(worker=st.sampled_from("abcd"), n=st.integers(1, 3))
    def join(self, worker: str, n: int) -> None:
        """A reader arriving now asks for join_epoch(): it never finds that epoch over."""
        epoch = self.ledger.join_epoch()
        result = self.ledger.lease(worker, epoch, n, self.now, T)
        assert result.status is not LeaseStatus.EPOCH_DONE
        assert result.epoch == epoch == self.ledger.epoch

    @rule(partition=st.integers(0, 6), next_epoch=st.booleans())
    def late_failure(self, partition: int, next_epoch: bool) -> None:
        """A FAILED report for a partition that is not pending (expired, done, failed) or of
        another epoch changes nothing at all."""
        if partition in self.ledger.pending and not next_epoch:
            return
        self.ops.extend(self.ledger.take_journal())
        before = self.ledger.state()
        assert not self.ledger.report_failed(self.ledger.epoch + next_epoch, partition, "late")
        assert self.ledger.state() == before and not self.ledger.journal

    @rule(partition=st.integers(0, 6))
    def late_report(self, partition: int) -> None:
        if self.ledger.report_done(self.ledger.epoch, partition):
            self.completions.setdefault(self.ledger.epoch, []).append(partition)

    @rule(partition=st.integers(0, 6), consumed=st.integers(0, 50))
    def progress(self, partition: int, consumed: int) -> None:
        before = self.ledger.skip(partition)
        self.ledger.report_progress(self.ledger.epoch, partition, consumed)
        assert self.ledger.skip(partition) >= before  # never goes back

    @rule(worker=st.sampled_from("abc"))
    def release(self, worker: str) -> None:
        self.ledger.release(worker)

    @rule(worker=st.sampled_from("abc"), data=st.data(), consumed=st.integers(0, 5))
    def give_back(self, worker: str, data: st.DataObject, consumed: int) -> None:
        """Work stealing (issue 13): a holder hands one lease back with RELEASED; it goes to
        the front of todo, keeping (monotonic) progress; from anyone else it changes nothing."""
        l = self.ledger
        held = l.held_by(worker)
        if not held:
            partition = data.draw(st.integers(0, 6))
            before, state = l.skip(partition), l.state()
            if l.report_released(l.epoch, partition, consumed, worker):
                # A late hand-back: its lease went back to todo (released, expired) and nobody
                # leased it since; its `consumed` counts, as a late PROGRESS does, and nothing
                # else changes (Ledger.report_released).
                assert l.leases.get(partition, ("",))[0] == worker
                assert partition not in l.pending and partition not in l.done
                assert l.skip(partition) == consumed > before
            else:
                assert l.state() == state
            return
        partition = data.draw(st.sampled_from(held))
        before = l.skip(partition)
        assert l.report_released(l.epoch, partition, consumed, worker)
        assert l.todo[0] == partition and partition not in l.pending
        assert l.skip(partition) == max(before, consumed)
        assert not l.report_released(l.epoch, partition, consumed, worker)  # not its lease now

    @rule(worker=st.sampled_from("abc"), keep=st.sets(st.integers(0, 6)))
    def reconcile(self, worker: str, keep: set[int]) -> None:
        self.ledger.reconcile(worker, [(self.ledger.epoch, p) for p in keep])

    @rule(worker=st.sampled_from("abc"), keep=st.sets(st.integers(-1, 7)),
          positions=st.dictionaries(st.integers(-1, 7), st.integers(-3, 20)))
    def rewind(self, worker: str, keep: set[int], positions: dict[int, int]) -> None:
        l = self.ledger
        before = set(l.done)
        done_by_others = {p for p, w in l.done.items() if w != worker}
        failed = set(l.failed)
        back = l.rewind(l.epoch, worker, keep, positions)
        # Its semantics: kept partitions are done (unless failed); what the worker completed
        # or held after the checkpoint, and what the checkpoint had in the trainer's hands,
        # goes to the front of todo, restarting after the checkpoint's records; nothing else
        # moves.
        assert {p for p in keep if 0 <= p < 7} - failed <= set(l.done)
        assert len(back) == len(set(back)) and list(l.todo)[:len(back)] == back
        assert not set(back) & (keep | done_by_others | failed)
        assert not l.held_by(worker) and set(l.failed) == failed
        assert done_by_others <= set(l.done)
        for p in back:
            assert l.skip(p) == max(0, positions.get(p, 0))
        done = self.completions.setdefault(self.ledger.epoch, [])
        done.extend(sorted(set(self.ledger.done) - before))  # kept: consumed before the ckpt
        for partition in back:  # a rewound completion may legitimately complete again
            if partition in done:
                done.remove(partition)

    @rule(compact=st.booleans(), first=st.sets(st.sampled_from("abcd")))
    def restart(self, compact: bool, first: set[str]) -> None:
        """A master restart: from the store's snapshot + journal; sometimes a fresh snapshot.
        Deadlines are refreshed for some workers first (as they reconnect), then the rest."""
        self.ops.extend(self.ledger.take_journal())
        restored = Ledger.from_state(json.loads(json.dumps(self.snapshot)))
        restored.replay(json.loads(json.dumps(self.ops)))
        assert restored.state() == self.ledger.state()
        assert restored.deadlines == {}  # none survives: the old clock is not trusted
        holders = set(restored.by_worker)
        restored.refresh_deadlines(self.now, T, workers=sorted(first) + ["ghost"])
        assert restored.deadlines == {w: self.now + T for w in first & holders}
        restored.refresh_deadlines(self.now, T, workers=sorted(holders - first))
        self.ledger = restored
        if compact:
            self.snapshot, self.ops = self.ledger.state(), []

    @invariant()
    def partitions_are_in_exactly_one_place(self) -> None:
        l = self.ledger
        places = list(l.todo) + list(l.pending) + list(l.done) + list(l.failed)
        assert sorted(places) == list(range(7))

    @invariant()
    def the_journal_rebuilds_the_ledger(self) -> None:
        self.ops.extend(self.ledger.take_journal())
        restored = Ledger.from_state(self.snapshot)
        restored.replay(self.ops)
        assert restored.state() == self.ledger.state()

    @invariant()
    def every_lease_has_a_live_deadline(self) -> None:
        l = self.ledger
        assert set(l.deadlines) == set(l.by_worker)
        for deadline in l.deadlines.values():
            assert self.now < deadline <= self.now + T

    @invariant()
    def join_epoch_is_the_current_one_until_it_is_complete(self) -> None:
        l = self.ledger
        assert l.join_epoch() == (l.epoch + 1 if not l.todo and not l.pending else l.epoch)

    @invariant()
    def failure_counts_agree_with_the_failed_set(self) -> None:
        l = self.ledger
        assert all(l.failures.get(p, 0) >= l.max_failures for p in l.failed)
        assert all(l.failures.get(p, 0) < l.max_failures for p in list(l.todo) + list(l.pending))
        assert not set(l.progress) & (set(l.done) | set(l.failed))

    @invariant()
    def unstarted_leases_are_held_and_have_no_progress(self) -> None:
        l = self.ledger
        for worker in l.by_worker:
            unstarted = l.unstarted(worker)
            assert set(unstarted) <= set(l.held_by(worker))
            assert not set(unstarted) & set(l.progress)

    @invariant()
    def nothing_completes_twice(self) -> None:
        for done in self.completions.values():
            assert len(done) == len(set(done))
        assert sorted(self.completions.get(self.ledger.epoch, [])) == sorted(self.ledger.done)


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_failed_in_keeps_the_previous_epochs_give_ups_and_forgets_older_ones() -> None:
    """A reader whose pass of epoch e ends after another reader started e+1 is still told
    what e gave up on (issue 14); e-1 and older are no longer known (None)."""
    ledger = Ledger(2, max_failures=1)
    p, q = ledger.lease("a", 0, 2, 0.0, T).partitions
    ledger.report_failed(0, p, "bad page")
    ledger.report_done(0, q, "a")
    assert ledger.failed_in(0) == {p: "bad page"} and ledger.failed_in(1) is None
    ledger.lease("a", 1, 2, 0.0, T)  # starts epoch 1
    assert ledger.failed_in(1) == {} and ledger.failed_in(0) == {p: "bad page"}
    assert ledger.failed_in(-1) is None
    again = Ledger.from_state(ledger.state())
    assert again.failed_in(0) == {p: "bad page"}
    for partition in list(ledger.pending):
        ledger.report_done(1, partition, "a")
    ledger.lease("a", 2, 1, 0.0, T)  # epoch 2: epoch 0 is forgotten, 1 lost nothing
    assert ledger.failed_in(0) is None and ledger.failed_in(1) == {}
    jumped = Ledger(1, max_failures=1)
    jumped.report_failed(0, jumped.lease("a", 0, 1, 0.0, T).partitions[0], "x")
    jumped.lease("a", 3, 1, 0.0, T)  # not the next epoch: nothing carried over
    assert jumped.failed_in(2) == {} and jumped.previous_failed == {}


def test_token_of_names_the_latest_lease_of_a_partition() -> None:
    ledger = Ledger(3)
    assert [ledger.token_of(p) for p in range(3)] == [0, 0, 0]  # never leased
    first = ledger.lease("a", 0, 2, 0.0, T).partitions
    tokens = [ledger.token_of(p) for p in first]
    assert tokens == [1, 2] and ledger.token_of(3 - sum(first)) == 0
    ledger.expire(T + 1)  # both leases expire: the tokens stay until the next lease
    assert [ledger.token_of(p) for p in first] == tokens
    again = ledger.lease("b", 0, 1, T + 1, T).partitions[0]
    assert ledger.token_of(again) == 3
