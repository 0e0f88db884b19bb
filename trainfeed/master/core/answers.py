"""The answers the coordinator builds for a reader's messages: a grant (what a `get_tasks`
leased, or why it leased nothing) and the news of the leases a message lists.

Pure: functions of the job and the time passed in.
"""
from __future__ import annotations

from collections.abc import Sequence

from trainfeed.master.core import admission
from trainfeed.master.core.jobs import Job
from trainfeed.master.core.ledger import LeaseResult, LeaseStatus
from trainfeed.master.core.messages import FailedPartition, Grant, HeldTask, Task
from trainfeed.master.core.reports import Held


def task(job: Job, epoch: int, partition: int) -> Task:
    """The task of a partition as leased now (its skip, token and stop)."""
    p = job.partitions[partition]
    return Task(epoch=epoch, partition=partition, shard=p.shard,
                row_group_start=p.row_group_start, row_group_stop=p.row_group_stop,
                num_records=p.num_records, skip_records=job.ledger.skip(partition),
                lease=job.ledger.token_of(partition),
                stop_records=job.ledger.limits.get(partition, 0), row_start=p.row_start)


def asked_back(job: Job, worker: str, held: Held) -> list[HeldTask]:
    """What `worker` is asked to give back, once, of the leases its message lists."""
    return [HeldTask(e, p, t) for e, p, t in job.stealing.due(job.ledger, worker, held.triples)]


def stopped(job: Job, revoked: Sequence[HeldTask], group_broken: str, why: str) -> Grant:
    """The grant of a reader that may lease nothing: its group broke, or it was superseded."""
    return Grant(status=LeaseStatus.WAIT, epoch=job.ledger.epoch, revoked=revoked,
                 group_broken=group_broken, revoked_why=why, superseded=why)


def grant(job: Job, worker: str, held: Held, revoked: Sequence[HeldTask], result: LeaseResult,
          epoch: int, now: float) -> Grant:
    """The grant of a `get_tasks` (for `epoch`) whose lease attempts ended with `result`."""
    failed: list[FailedPartition] = []
    failed_known = False
    if result.status is LeaseStatus.EPOCH_DONE:
        lost = job.ledger.failed_in(epoch)  # the epoch the reader asked for
        failed_known = lost is not None
        failed = [FailedPartition(partition=p, reason=r,
                                  num_records=job.partitions[p].num_records)
                  for p, r in sorted((lost or {}).items())]
    return Grant(
        status=result.status, epoch=result.epoch, todo_left=len(job.ledger.todo),
        tasks=[task(job, result.epoch, p) for p in result.partitions], revoked=revoked,
        failed=failed, failed_known=failed_known, give_back=asked_back(job, worker, held),
        group_broken=admission.on_call(job, worker, None, now),
        holders=(admission.holdings(job, now, worker)
                 if result.status is LeaseStatus.WAIT else ()),
        revoked_why=admission.revoked_why(job, worker))
