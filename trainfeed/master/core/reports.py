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
from dataclasses import dataclass
from typing import Any

from trainfeed.master.core.jobs import InvalidArgument, Job, JobMetrics, max_delivered
from trainfeed.master.core.ledger import Outcome, Verdict
from trainfeed.master.core.sessions import clip
from trainfeed.v1 import master_pb2 as pb

logger = logging.getLogger(__name__)

# An answer's `refused` (with `refused_count`) and `revoked` list at most this many leases (a
# HeldTask takes at most ~25 bytes): an answer's size does not grow with what a message lists (a
# reader holds and reports far fewer leases than this at once; it learns the rest next time).
MAX_REFUSED_LISTED = 512
# A FAILED report's reason is kept in the ledger (and its state) and shown by status: this much.
MAX_REASON_CHARS = 2000
OUTCOMES = {pb.TaskReport.DONE: Outcome.DONE, pb.TaskReport.FAILED: Outcome.FAILED,
            pb.TaskReport.PROGRESS: Outcome.PROGRESS, pb.TaskReport.RELEASED: Outcome.RELEASED}


@dataclass(frozen=True)
class Held:
    """A message's held leases, as (epoch, partition, lease) triples."""

    triples: list[tuple[int, int, int]]


def out_of_range(job: Job, what: str) -> str:
    return (f"job {job.name!r}: {what}: partitions are 0..{len(job.partitions) - 1} and "
            f"reports name an epoch from 0 to the current one, {job.ledger.epoch}")


def check_held(job: Job, held: Any) -> Held:
    """The (epoch, partition, lease) triples a message says it holds; INVALID_ARGUMENT for a
    partition that cannot exist."""
    triples = [(t.epoch, t.partition, t.lease) for t in held]
    for _, p, _ in triples:
        if p >= len(job.partitions):
            raise InvalidArgument(out_of_range(job, f"held task on partition {p}"))
    return Held(triples)


def verdicts(job: Job, worker: str, reports: Any) -> list[Verdict]:
    """Each report's verdict (REFUSE: not from the holder with its token). Raises, before
    anything changed, INVALID_ARGUMENT if a report names what cannot exist."""
    found: list[Verdict] = []
    for r in reports:
        outcome = OUTCOMES.get(r.outcome)
        if outcome is None:
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


def check_unanswered(job: Job, reports: Any) -> None:
    """INVALID_ARGUMENT unless every report of a message nobody waits for (no `seq`) is
    PROGRESS: a DONE must be confirmed."""
    for r in reports:
        if r.outcome != pb.TaskReport.PROGRESS:
            # (an outcome no enum value names was a ValueError, which ended the stream)
            outcome = (pb.TaskReport.Outcome.Name(r.outcome)
                       if r.outcome in pb.TaskReport.Outcome.values()
                       else f"outcome {r.outcome}")
            raise InvalidArgument(
                f"job {job.name!r}: a Session message without seq carries only PROGRESS "
                f"reports; the {outcome} report on partition {r.partition} needs an answer "
                f"(give the message a seq)")


def apply(job: Job, worker: str, report: Any, now: float, metrics: JobMetrics) -> bool:
    """Applies one report checked APPLY; returns whether the ledger changed."""
    ledger = job.ledger
    current = report.epoch == ledger.epoch
    if report.outcome == pb.TaskReport.DONE:
        left = ledger.remaining(report.partition) if current else 0
        if not ledger.report_done(report.epoch, report.partition, worker):
            return False
        job.stealing.rates.add(worker, left, now)
        served = job.partitions[report.partition]
        metrics.records_served += served.num_records
        metrics.bytes_served += served.num_bytes
        return True
    if report.outcome == pb.TaskReport.PROGRESS:
        had = ledger.progress.get(report.partition, 0) if current else report.consumed
        if not ledger.report_progress(report.epoch, report.partition, report.consumed, worker):
            return False
        job.stealing.rates.add(worker, report.consumed - had, now)
        return True
    if report.outcome == pb.TaskReport.RELEASED:
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


def frees(report: Any) -> bool:
    """Whether an applied report may put a partition back in todo (FAILED, RELEASED)."""
    return report.outcome not in (pb.TaskReport.PROGRESS, pb.TaskReport.DONE)


def revoked(job: Job, worker: str, held: Held, reports: Any) -> list[pb.HeldTask]:
    """Of `held`, the leases no longer `worker`'s, but for those the message reported: the
    first MAX_REFUSED_LISTED (the reader learns the rest with its next message)."""
    reported = {(r.epoch, r.partition) for r in reports if r.outcome != pb.TaskReport.PROGRESS}
    gone = (t for t in job.ledger.revoked(worker, held.triples) if t[:2] not in reported)
    return [pb.HeldTask(epoch=e, partition=p, lease=t)
            for e, p, t in itertools.islice(gone, MAX_REFUSED_LISTED)]


def refused(reports: Any, found: list[Verdict]) -> list[Any]:
    """The reports whose verdict is REFUSE."""
    return [r for r, v in zip(reports, found) if v is Verdict.REFUSE]


def listed(reports: list[Any]) -> list[pb.HeldTask]:
    """The leases of `reports`, the first MAX_REFUSED_LISTED (an answer's `refused`)."""
    return [pb.HeldTask(epoch=r.epoch, partition=r.partition, lease=r.lease)
            for r in reports[:MAX_REFUSED_LISTED]]
