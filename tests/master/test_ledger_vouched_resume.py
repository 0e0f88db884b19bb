"""What of a checkpoint the ledger vouches for (Ledger.vouched_resume), and keyed lease tokens
(issue 25): a resume may re-deliver records, never mark as consumed one no fenced report showed
consumed, and never touch a partition its session did not hold."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainfeed.master.core.ledger import TOKEN_BITS, Ledger, lease_token

T = 30.0


def sized(n: int, size: int = 10, key: bytes | None = None) -> Ledger:
    ledger = Ledger(n, token_key=key)
    ledger.sizes = (size,) * n
    return ledger


def test_positions_are_cut_to_what_reports_showed() -> None:
    ledger = sized(4)
    p, q = ledger.lease("a", 0, 2, 0.0, T).partitions
    ledger.report_progress(0, p, 4, "a")
    keep, positions, cut = ledger.vouched_resume(0, "a", [], {p: 7, q: 10})
    assert (keep, positions, cut) == ([], {p: 4, q: 0}, sorted([p, q]))
    assert ledger.vouched_resume(0, "a", [], {p: 3}) == ([], {p: 3}, [])  # a rewind: as is


def test_a_partition_kept_done_must_be_done() -> None:
    ledger = sized(4)
    p, q = ledger.lease("a", 0, 2, 0.0, T).partitions
    ledger.report_done(0, p, "a")
    ledger.report_progress(0, q, 6, "a")
    keep, positions, cut = ledger.vouched_resume(0, "a", [p, q], {})
    assert keep == [p] and positions == {q: 6} and cut == [q]


def test_partitions_the_session_never_held_are_not_touched() -> None:
    ledger = sized(4)
    mine = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    theirs = ledger.lease("b", 0, 1, 0.0, T).partitions[0]
    ledger.report_progress(0, theirs, 5, "b")
    keep, positions, cut = ledger.vouched_resume(0, "a", [theirs], {theirs: 5, mine: 0})
    assert keep == [] and positions == {mine: 0} and cut == [theirs]
    assert ledger.rewind(0, "a", keep, positions) == [mine]
    assert ledger.pending.get(theirs) == "b"  # b keeps reading it


def test_a_partition_held_before_is_still_its_own_to_rewind() -> None:
    """Leased by a, expired, leased by b: a's checkpoint may still rewind it (a's trainer had its
    first records), to what was reported."""
    ledger = sized(2)
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    ledger.report_progress(0, p, 3, "a")
    ledger.expire(T + 1)
    assert ledger.lease("b", 0, 2, T + 1, T).partitions[0] == p
    ledger.report_progress(0, p, 8, "b")
    assert ledger.vouched_resume(0, "a", [], {p: 5}) == ([], {p: 5}, [])
    restored = Ledger.from_state(ledger.state())
    assert restored.vouched_resume(0, "a", [], {p: 5}) == ([], {p: 5}, [])


def test_another_epoch_vouches_for_nothing() -> None:
    ledger = sized(2)
    ledger.lease("a", 0, 1, 0.0, T)
    assert ledger.vouched_resume(1, "a", [0, 1], {0: 1}) == ([], {}, [])


@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 5), st.integers(0, 12)),
                max_size=30),
       st.sets(st.integers(0, 5)), st.dictionaries(st.integers(0, 5), st.integers(0, 40)))
def test_a_vouched_resume_never_skips_a_record_no_report_showed(
        steps: list[tuple[str, int, int]], done: set[int], claimed: dict[int, int]) -> None:
    """Whatever the history and the claim: after the rewind every partition not done starts at
    or before where fenced reports had taken it, and nothing is done that was not."""
    ledger = sized(6, size=12)
    for worker, p, n in steps:
        ledger.lease(worker, 0, 1, 0.0, T)
        if ledger.pending.get(p) == worker:
            if n == 12:
                ledger.report_done(0, p, worker)
            else:
                ledger.report_progress(0, p, n, worker)
    reported = dict(ledger.progress)
    was_done = set(ledger.done)
    keep, positions, _ = ledger.vouched_resume(0, "a", done, claimed)
    ledger.rewind(0, "a", keep, positions)
    assert set(ledger.done) <= was_done
    for p, n in ledger.progress.items():
        assert p in was_done or n <= reported.get(p, 0)


def test_keyed_tokens_are_63_bits_deterministic_and_distinct() -> None:
    key = bytes(range(32))
    tokens = [lease_token(key, n) for n in range(1, 2000)]
    assert all(0 < t < 1 << TOKEN_BITS for t in tokens)
    assert len(set(tokens)) == len(tokens)
    assert sum(t > 1 << 32 for t in tokens) > 1990  # not small counters
    assert tokens == [lease_token(key, n) for n in range(1, 2000)]
    assert lease_token(None, 5) == 5  # no key: the counter (tests, old states)


def test_a_replayed_journal_gives_the_keyed_tokens_again() -> None:
    key = b"k" * 32
    ledger = sized(4, key=key)
    snapshot = ledger.state()
    ledger.lease("a", 0, 2, 0.0, T)
    ledger.expire(T + 1)
    ledger.lease("b", 0, 3, T + 1, T)
    replayed = Ledger.from_state(snapshot)
    replayed.replay(ledger.take_journal())
    assert replayed.leases == ledger.leases and replayed.token_key == key
    assert all(t > 1 << 20 for _, t in ledger.leases.values())
