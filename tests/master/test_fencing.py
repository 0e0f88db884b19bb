"""Fencing tokens in the ledger (issue 14): each lease gets a fresh token; a report counts only
from the partition's latest holder with that token; tokens survive a snapshot and a replay."""
from __future__ import annotations

import hashlib
import hmac
import json

from trainfeed.master.core.ledger import LeaseStatus, Ledger, Outcome, Verdict, lease_token

T = 10.0
DONE, FAILED, PROGRESS, RELEASED = (Outcome.DONE, Outcome.FAILED, Outcome.PROGRESS,
                                    Outcome.RELEASED)


def leased(ledger: Ledger, worker: str, n: int, now: float = 0.0) -> list[int]:
    result = ledger.lease(worker, ledger.epoch, n, now, T)
    assert result.status is LeaseStatus.TASKS
    return list(result.partitions)


def test_every_lease_gets_a_new_token_and_a_re_lease_fences_the_old_holder_out() -> None:
    ledger = Ledger(4)
    (p,) = leased(ledger, "a", 1)
    old = ledger.token_of(p)
    assert old > 0
    assert ledger.check_report("a", 0, p, old, PROGRESS) is Verdict.APPLY
    ledger.expire(T + 1)  # "a" froze past its lease; p goes to "b"
    assert leased(ledger, "b", 1, now=T + 1) == [p]
    new = ledger.token_of(p)
    assert new > old
    for outcome in Outcome:
        assert ledger.check_report("a", 0, p, old, outcome) is Verdict.REFUSE
        assert ledger.check_report("b", 0, p, old, outcome) is Verdict.REFUSE  # right worker,
        assert ledger.check_report("a", 0, p, new, outcome) is Verdict.REFUSE  # or token alone
    assert ledger.check_report("b", 0, p, new, DONE) is Verdict.APPLY
    assert ledger.revoked("a", [(0, p, old)]) == [(0, p, old)]
    assert ledger.revoked("b", [(0, p, new)]) == []


def test_reports_never_leased_from_strangers_or_without_a_token_are_refused() -> None:
    ledger = Ledger(4)
    (p,) = leased(ledger, "a", 1)
    token = ledger.token_of(p)
    others = [q for q in range(4) if q != p]
    assert ledger.check_report("a", 0, others[0], token, DONE) is Verdict.REFUSE  # never leased
    assert ledger.check_report("intruder", 0, p, token, DONE) is Verdict.REFUSE
    assert ledger.check_report("a", 0, p, 0, DONE) is Verdict.REFUSE


def test_impossible_partitions_and_epochs_are_invalid() -> None:
    ledger = Ledger(4)
    (p,) = leased(ledger, "a", 1)
    token = ledger.token_of(p)
    for partition in (-1, 4, 2**32 - 1):
        assert ledger.check_report("a", 0, partition, token, DONE) is Verdict.INVALID
    for epoch in (-1, 1, 2**63 - 1):
        assert ledger.check_report("a", epoch, p, token, DONE) is Verdict.INVALID


def test_a_late_report_of_an_expired_lease_counts_while_nobody_took_the_partition() -> None:
    ledger = Ledger(4)
    (p,) = leased(ledger, "a", 1)
    token = ledger.token_of(p)
    ledger.expire(T + 1)
    assert p in ledger.todo
    assert ledger.check_report("a", 0, p, token, FAILED) is Verdict.REPEAT  # it is back already
    assert ledger.check_report("a", 0, p, token, PROGRESS) is Verdict.APPLY
    assert ledger.check_report("a", 0, p, token, DONE) is Verdict.APPLY
    assert ledger.revoked("a", [(0, p, token)]) == [(0, p, token)]  # but it is not "a"'s now
    assert ledger.report_done(0, p, "a")
    # A retried call repeats the report: accepted, and nothing changes.
    assert ledger.check_report("a", 0, p, token, DONE) is Verdict.REPEAT


def test_a_late_hand_back_of_an_expired_lease_counts_only_past_the_progress() -> None:
    """A RELEASED after the lease went back to todo APPLYs only when its `consumed` goes past
    the partition's progress (a synchronous rank's kept records); otherwise it is a REPEAT.
    Pins the comparison against this partition's progress and the default `consumed` of 0
    (`Ledger.check_report`'s: `Fencing.check_report` takes it from there)."""
    ledger = Ledger(4)
    p, q = leased(ledger, "a", 2)
    tp, tq = ledger.token_of(p), ledger.token_of(q)
    assert ledger.report_progress(0, q, 5, "a")
    ledger.expire(T + 1)
    assert p in ledger.todo and q in ledger.todo
    assert ledger.check_report("a", 0, p, tp, RELEASED) is Verdict.REPEAT  # consumed 0: nothing
    assert ledger.check_report("a", 0, p, tp, RELEASED, consumed=1) is Verdict.APPLY
    assert ledger.check_report("a", 0, q, tq, RELEASED, consumed=3) is Verdict.REPEAT
    assert ledger.check_report("a", 0, q, tq, RELEASED, consumed=5) is Verdict.REPEAT
    assert ledger.check_report("a", 0, q, tq, RELEASED, consumed=6) is Verdict.APPLY


def test_a_keyed_token_is_the_hmac_of_the_big_endian_counter_cut_to_63_bits() -> None:
    """The token an independent HMAC-SHA256 gives: any reader of the saved form (a store, a
    restarted master of the same release) derives the same tokens from the key and counter."""
    key = bytes(range(32))
    for counter in (1, 2, 255, 1 << 40):
        digest = hmac.new(key, counter.to_bytes(8, "big"), hashlib.sha256).digest()
        assert lease_token(key, counter) == int.from_bytes(digest[:8], "big") >> 1


def test_a_past_epoch_is_refused_and_a_rewind_fences_the_checkpointed_reader_out() -> None:
    ledger = Ledger(2)
    for p in leased(ledger, "a", 2):
        token = ledger.token_of(p)
        ledger.report_done(0, p, "a")
    assert ledger.lease("a", 1, 1, 0.0, T).status is LeaseStatus.TASKS
    assert ledger.check_report("a", 0, p, token, DONE) is Verdict.REFUSE  # epoch 0 is over
    (q,) = ledger.held_by("a")
    stale = ledger.token_of(q)
    ledger.rewind(1, "a", keep_done=[], positions={})
    assert ledger.check_report("a", 1, q, stale, DONE) is Verdict.REFUSE


def test_tokens_survive_a_snapshot_and_the_journal_replays_them_exactly() -> None:
    ledger = Ledger(8, seed=5)
    base = ledger.state()
    leased(ledger, "a", 3)
    ledger.expire(T + 1)
    leased(ledger, "b", 2, now=T + 1)
    replayed = Ledger.from_state(json.loads(json.dumps(base)))
    replayed.replay(json.loads(json.dumps(ledger.take_journal())))
    assert replayed.state() == ledger.state()
    restored = Ledger.from_state(json.loads(json.dumps(ledger.state())))
    assert restored.leases == ledger.leases and restored.next_token == ledger.next_token


def test_a_version_2_state_gets_tokens_for_its_pending_leases() -> None:
    ledger = Ledger(4)
    leased(ledger, "a", 2)
    state = ledger.state()
    state["version"] = 2
    del state["leases"], state["next_token"]
    restored = Ledger.from_state(state)
    assert sorted(restored.leases) == sorted(ledger.pending)
    assert len({t for _, t in restored.leases.values()}) == 2
    assert restored.next_token == 3
