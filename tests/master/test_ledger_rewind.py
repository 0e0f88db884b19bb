"""Ledger.rewind undoes a restored worker's progress made after its checkpoint, also on
partitions that went back to todo unfinished when that worker left (or its leases expired)."""
from __future__ import annotations

import json

from trainfeed.master.core.ledger import Ledger

T = 30.0


def test_rewind_resets_progress_the_worker_reported_on_partitions_it_handed_back() -> None:
    ledger = Ledger(6)
    p0, p1, p2 = ledger.lease("a", 0, 3, 0.0, T).partitions
    other = ledger.lease("b", 0, 1, 0.0, T).partitions[0]
    ledger.report_progress(0, other, 1, "b")  # progress of another worker stays
    ledger.report_progress(0, p0, 4, "a")  # checkpoint: p0 at 4 records, p1 and p2 untouched
    ledger.report_progress(0, p0, 6, "a")  # ... the trainer went on: p0 at 6, p1 at 2
    ledger.report_progress(0, p1, 2, "a")
    assert sorted(ledger.release("a")) == sorted([p0, p1, p2])  # a left, handing them back
    assert ledger.skip(p1) == 2  # another holder would skip what a's trainer had
    back = ledger.rewind(0, "a", keep_done=[], positions={p0: 4})
    assert p0 in back and p1 in back
    assert ledger.skip(p0) == 4 and ledger.skip(p1) == 0
    assert ledger.skip(other) == 1


def test_who_reported_progress_survives_a_snapshot_and_the_journal() -> None:
    ledger = Ledger(4)
    base = ledger.state()
    ledger.take_journal()
    p = ledger.lease("a", 0, 1, 0.0, T).partitions[0]
    ledger.report_progress(0, p, 3, "a")
    assert Ledger.from_state(json.loads(json.dumps(ledger.state()))).progress_by == {p: "a"}
    replayed = Ledger.from_state(base)
    replayed.replay(json.loads(json.dumps(ledger.take_journal())))
    assert replayed.progress_by == {p: "a"} and replayed.state() == ledger.state()
