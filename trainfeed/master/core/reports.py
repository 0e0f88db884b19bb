"""A reader's reports and held leases, as the coordinator checks and applies them.

A report counts only from the partition's current lease holder with the lease's fencing token
(Ledger.check_report): any other is REFUSE, changes nothing, and its message's answer lists it.
Partitions and epochs that cannot exist are INVALID_ARGUMENT, raised before anything changed.

Pure: functions of a job, its ledger and the time passed in; the coordinator counts, logs and
tells what they decide.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainfeed.master.core.jobs import InvalidArgument, Job, JobMetrics, max_delivered
from trainfeed.master.core.ledger import Outcome, Verdict
from trainfeed.master.core.messages import HeldTask, Report
from trainfeed.master.core.sessions import clip

logger = logging.getLogger(__name__)

# An answer's `refused` (with `refused_count`) and `revoked` list at most this many leases (a
# HeldTask takes at most ~25 bytes): an answer's size does not grow with what a message lists (a
# reader holds and reports far fewer leases than this at once; it learns the rest next time).
MAX_REFUSED_LISTED = 512
# A FAILED report's reason is kept in the ledger (and its state) and shown by status: this much.
MAX_REASON_CHARS = 2000


@dataclass(frozen=True)
class Held:
    """A message's held leases, as (epoch, partition, lease) triples."""

    triples: list[tuple[int, int, int]]


def out_of_range(job: Job, what: str) -> str:
    return (f"job {job.name!r}: {what}: partitions are 0..{len(job.partitions) - 1} and "
            f"reports name an epoch from 0 to the current one, {job.ledger.epoch}")


def check_held(job: Job, held: Iterable[HeldTask]) -> Held:
    """The (epoch, partition, lease) triples a message says it holds; INVALID_ARGUMENT for a
    partition that cannot exist."""
    triples = [(t.epoch, t.partition, t.lease) for t in held]
    for _, p, _ in triples:
        if p >= len(job.partitions):
            raise InvalidArgument(out_of_range(job, f"held task on partition {p}"))
    return Held(triples)


def verdicts(job: Job, worker: str, reports: Sequence[Report]) -> list[Verdict]:
    """Each report's verdict (REFUSE: not from the holder with its token). Raises, before
    anything changed, INVALID_ARGUMENT if a report names what cannot exist."""
    found: list[Verdict] = []
    for r in reports:
        outcome = r.outcome
        if not isinstance(outcome, Outcome):
            raise InvalidArgument(f"report on partition {r.partition}: outcome {r.outcome} "
                                  f"is not DONE, FAILED, PROGRESS or RELEASED")
        verdict = job.ledger.check_report(worker, r.epoch, r.partition, r.lease, outcome,
                                          r.consumed)
        if verdict is Verdict.INVALID:
            raise InvalidArgument(out_of_range(
                job, f"report on partition {r.partition} of epoch {r.epoch}"))
        if (outcome in (Outcome.PROGRESS, Outcome.RELEASED)
                and r.consumed > max_delivered(job, r.partition)):
            raise InvalidArgument(
                f"job {job.name!r}: report on partition {r.partition}: {r.consumed} records "
                f"consumed of {job.partitions[r.partition].num_records}")
        found.append(verdict)
    return found


def check_unanswered(job: Job, reports: Sequence[Report]) -> None:
    """INVALID_ARGUMENT unless every report of a message nobody waits for (no `seq`) is
    PROGRESS: a DONE must be confirmed."""
    for r in reports:
        if r.outcome is not Outcome.PROGRESS:
            outcome = (r.outcome.name if isinstance(r.outcome, Outcome)
                       else "OUTCOME_UNSPECIFIED" if r.outcome == 0 else f"outcome {r.outcome}")
            raise InvalidArgument(
                f"job {job.name!r}: a Session message without seq carries only PROGRESS "
                f"reports; the {outcome} report on partition {r.partition} needs an answer "
                f"(give the message a seq)")


def apply(job: Job, worker: str, report: Report, now: float, metrics: JobMetrics) -> bool:
    """Applies one report checked APPLY; returns whether the ledger changed."""
    ledger = job.ledger
    current = report.epoch == ledger.epoch
    if report.outcome is Outcome.DONE:
        left = ledger.remaining(report.partition) if current else 0
        if not ledger.report_done(report.epoch, report.partition, worker):
            return False
        job.stealing.rates.add(worker, left, now)
        served = job.partitions[report.partition]
        metrics.records_served += served.num_records
        metrics.bytes_served += served.num_bytes
        return True
    if report.outcome is Outcome.PROGRESS:
        had = ledger.progress.get(report.partition, 0) if current else report.consumed
        if not ledger.report_progress(report.epoch, report.partition, report.consumed, worker):
            return False
        job.stealing.rates.add(worker, report.consumed - had, now)
        return True
    if report.outcome is Outcome.RELEASED:
        if not ledger.report_released(report.epoch, report.partition, report.consumed, worker):
            return False
        job.stealing.released(worker, report.partition, now)
        return True
    reason = clip(report.reason, MAX_REASON_CHARS)  # FAILED
    if not ledger.report_failed(report.epoch, report.partition, reason):
        return False
    failed = report.partition in ledger.failed
    logger.warning("job %r: worker %s failed partition %d (epoch %d)%s: %s", job.name,
                   worker, report.partition, report.epoch,
                   "; giving up on it this epoch" if failed else "", clip(reason, 500))
    return True


def frees(report: Report) -> bool:
    """Whether an applied report may put a partition back in todo (FAILED, RELEASED)."""
    return report.outcome is not Outcome.PROGRESS and report.outcome is not Outcome.DONE


def revoked(job: Job, worker: str, held: Held, reports: Iterable[Report]) -> list[HeldTask]:
    """Of `held`, the leases no longer `worker`'s, but for those the message reported: the
    first MAX_REFUSED_LISTED (the reader learns the rest with its next message)."""
    reported = {(r.epoch, r.partition) for r in reports if r.outcome is not Outcome.PROGRESS}
    gone = (t for t in job.ledger.revoked(worker, held.triples) if t[:2] not in reported)
    return [HeldTask(e, p, t) for e, p, t in itertools.islice(gone, MAX_REFUSED_LISTED)]


def refused(reports: Sequence[Report], found: list[Verdict]) -> list[Report]:
    """The reports whose verdict is REFUSE."""
    return [r for r, v in zip(reports, found) if v is Verdict.REFUSE]


def listed(reports: list[Report]) -> list[HeldTask]:
    """The leases of `reports`, the first MAX_REFUSED_LISTED (an answer's `refused`)."""
    return [HeldTask(r.epoch, r.partition, r.lease) for r in reports[:MAX_REFUSED_LISTED]]
