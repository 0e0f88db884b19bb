"""The lease book's words in the wire's (pure): reports as TaskReport messages, and what an event
of the Session stream says as the book's `Answer`.

One shape comes back from the master (issue 36): a `WatchEvent`, pushed on its own or answering a
message of the reader. A grant's answer carries the news of the request for tasks it answers in
its `grant` (as the GetTasks call did); every other event carries it in its own fields.
"""
from __future__ import annotations

from collections.abc import Sequence

from trainfeed.io.prefetch import TaskRef
from trainfeed.lease.book import Answer, Lease, Outcome, Report
from trainfeed.v1 import master_pb2 as pb

_OUTCOMES = {Outcome.DONE: pb.TaskReport.DONE, Outcome.FAILED: pb.TaskReport.FAILED,
             Outcome.RELEASED: pb.TaskReport.RELEASED, Outcome.PROGRESS: pb.TaskReport.PROGRESS}


def to_message(report: Report) -> pb.TaskReport:
    return pb.TaskReport(epoch=report.epoch, partition=report.partition,
                         outcome=_OUTCOMES[report.outcome], lease=report.lease,
                         consumed=report.consumed, reason=report.reason)


def leases(tasks: Sequence[pb.HeldTask] | Sequence[pb.Task]) -> tuple[Lease, ...]:
    return tuple((t.epoch, t.partition, t.lease) for t in tasks)


def lease_of(task: TaskRef) -> Lease:
    return (task.epoch, task.partition, task.lease)


def answer_of(event: pb.WatchEvent) -> Answer:
    """What `event` tells the lease book. The reports the master refused (`refused`: not from
    the partition's holder with its token) are dropped like revoked leases. `epoch_complete` is
    "0 if none" (the proto): an announcement of epoch 0's end is not told apart from none."""
    news: pb.WatchEvent | pb.GetTasksResponse = event.grant if event.HasField("grant") else event
    return Answer(leases(news.revoked) + leases(event.refused), leases(news.give_back),
                  news.revoked_why, news.group_broken, news.superseded,
                  event.epoch_complete if event.epoch_complete > 0 else None)

