"""Ledger behaviours that mutation testing (tools/mutation.py, issue 17) showed untested:
fencing verdicts after a report, a rewind or an epoch change; who-made-progress bookkeeping; and
restoring version 2 and 3 states."""
from __future__ import annotations

from trainfeed.master.core.ledger import STATE_VERSION, Ledger, Outcome, Verdict

T = 30.0


def test_a_report_for_a_past_epoch_is_refused_even_with_the_current_token() -> None:
    ledger = Ledger(2)
    for p in ledger.lease("a", 0, 2, 0.0, T).partitions:
        ledger.report_done(0, p, "a")
    p = ledger.lease("a", 1, 1, 0.0, T).partitions[0]
    token = ledger.token_of(p)
    assert ledger.check_report("a", 1, p, token, Outcome.DONE) is Verdict.APPLY
    assert ledger.check_report("a", 0, p, token, Outcome.DONE) is Verdict.REFUSE


def test_after_done_or_failed_the_holder_s_reports_are_repeats_after_expiry_they_apply() -> None:
    ledger = Ledger(3, max_failures=1)
    p, q, r = ledger.lease("a", 0, 3, 0.0, T).partitions
    ledger.report_done(0, p, "a")
    assert ledger.check_report("a", 0, p, ledger.token_of(p), Outcome.DONE) is Verdict.REPEAT
    ledger.report_failed(0, q, "bad")
    assert ledger.check_report("a", 0, q, ledger.token_of(q), Outcome.DONE) is Verdict.REPEAT
    ledger.expire(T + 1)  # r back in todo, nobody leased it since
    assert ledger.check_report("a", 0, r, ledger.token_of(r), Outcome.DONE) is Verdict.APPLY
    assert ledger.check_report("a", 0, r, ledger.token_of(r), Outcome.FAILED) is Verdict.REPEAT


def test_a_rewind_fences_the_rewound_holder_out() -> None:
    ledger = Ledger(2)
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    token = ledger.token_of(p)
    assert ledger.rewind(0, "a", keep_done=[], positions={}) == [p]
    assert ledger.check_report("a", 0, p, token, Outcome.DONE) is Verdict.REFUSE


def test_whose_progress_it_is_goes_with_done_failed_and_rewound_partitions() -> None:
    ledger = Ledger(3, max_failures=1)
    p, q, r = ledger.lease("a", 0, 3, 0.0, T).partitions
    for x in (p, q, r):
        ledger.report_progress(0, x, 2, "a")
    ledger.report_done(0, p, "a")
    ledger.report_failed(0, q, "bad")
    assert set(ledger.progress_by) == {r}
    ledger.rewind(0, "a", keep_done=[p], positions={r: 5})  # 5: no partition's id
    assert ledger.progress_by == {} and ledger.skip(r) == 5  # a rewind's progress is nobody's


def test_version_2_and_3_states_restore_with_tokens() -> None:
    v2 = {"version": 2, "num_partitions": 3, "seed": 1, "max_failures": 2, "epoch": 0,
          "todo": [2], "pending": {"1": "b", "0": "a"}, "done": {}, "failed": {},
          "failures": {}, "progress": {}}
    ledger = Ledger.from_state(v2)
    # No tokens saved: pending leases get fresh ones in partition order, from 1.
    assert ledger.leases == {0: ("a", 1), 1: ("b", 2)} and ledger.next_token == 3
    v3 = {**v2, "version": 3, "next_token": 7, "leases": {"0": ["a", 5], "1": ["b", 6]}}
    restored = Ledger.from_state(v3)
    assert restored.leases == {0: ("a", 5), 1: ("b", 6)} and restored.next_token == 7
    assert restored.state()["version"] == STATE_VERSION
    assert restored.keep is None and restored.limits == {} and restored.dropped == 0
