"""The holders a WAIT answer names (trainfeed.master.core.admission.holdings): who but the caller
holds the epoch's partitions still out. Computed for every WAIT answer, they cost a third of the
master's CPU at 1,000 readers (each answer scanned and sorted every reader's leases), so they are
recomputed at most every HOLDINGS_REFRESH_S per job, and at once in a new epoch."""
from __future__ import annotations

from types import SimpleNamespace

from trainfeed.master.core import admission
from trainfeed.master.core.admission import HOLDINGS_REFRESH_S, MAX_HOLDERS
from trainfeed.master.core.ledger import Ledger

T = 30.0


def job_with_holders(readers: int, partitions_each: int = 2) -> SimpleNamespace:
    ledger = Ledger(readers * partitions_each)
    for i in range(readers):
        ledger.lease(f"w{i:04d}", 0, partitions_each, now=0.0, lease_timeout=T)
    return SimpleNamespace(ledger=ledger, workers={f"w{i:04d}": 0.0 for i in range(readers)},
                           holdings_cache=(float("-inf"), -1, []))


def test_the_first_holders_by_id_but_the_caller_are_named() -> None:
    job = job_with_holders(30)
    named = admission.holdings(job, 1.0, caller="w0003")
    assert [h.worker for h in named] == [f"w{i:04d}" for i in range(21) if i != 3]
    assert len(named) == MAX_HOLDERS
    assert all(h.partitions == 2 and h.lease_until == T and h.quiet_s == 1.0 for h in named)


def test_holders_are_reused_within_the_refresh_and_recomputed_after_it() -> None:
    job = job_with_holders(5)
    first = admission.holdings(job, 1.0, caller="")
    job.ledger.release("w0000")  # hands its partitions back
    assert admission.holdings(job, 1.0 + HOLDINGS_REFRESH_S / 2, caller="") == first
    later = admission.holdings(job, 1.0 + HOLDINGS_REFRESH_S, caller="")
    assert [h.worker for h in later] == ["w0001", "w0002", "w0003", "w0004"]
