"""The coordinator's side of the Session stream (issues 28, 36): a message renews the session's
leases and takes its reports (a DONE only on an answered message; a refused report is listed, the
others apply, in a heartbeat and in a `get_tasks` alike); progress wakes no long-poll."""
from __future__ import annotations

import pytest
from test_coordinator import (  # noqa: F401 (core: a fixture)
    core,
    join,
    lease,
    new_job,
    report,
    send,
)

from trainfeed.master.core.coordinator import Ask, Coordinator
from trainfeed.master.core.jobs import InvalidArgument
from trainfeed.v1 import master_pb2 as pb

TIMEOUT = 30.0


def message(seq: int, tasks: list[pb.Task], outcome: int = pb.TaskReport.PROGRESS,
            consumed: int = 1) -> pb.SessionMessage:
    return pb.SessionMessage(seq=seq, report=pb.ReportRequest(
        reports=[pb.TaskReport(epoch=t.epoch, partition=t.partition, lease=t.lease,
                               outcome=outcome, consumed=consumed) for t in tasks],  # type: ignore[arg-type]
        held=[pb.HeldTask(epoch=t.epoch, partition=t.partition, lease=t.lease)
              for t in tasks]))


def test_progress_and_a_done_wake_no_long_poll_and_a_hand_back_does(core: Coordinator) -> None:  # noqa: F811
    job = new_job(core)
    worker, secret = join(core, job)
    tasks = list(lease(core, job, worker, secret, 2, 0.0).tasks)
    woken: list[str] = []
    core.on_change = woken.append
    answer, changed = send(core, job, worker, message(1, tasks), 1.0)
    assert changed and answer is not None and answer.answers == 1
    assert job.ledger.progress == {t.partition: 1 for t in tasks}
    assert woken == [], "progress woke the job's long-polls"

    def report_one(task: pb.Task, outcome: int) -> None:
        report(core, job, worker, 2.0, reports=[pb.TaskReport(
            epoch=0, partition=task.partition, lease=task.lease,
            outcome=outcome)])  # type: ignore[arg-type]
    report_one(tasks[0], pb.TaskReport.DONE)
    assert woken == [], "a DONE that leaves the epoch open woke the job's long-polls"
    report_one(tasks[1], pb.TaskReport.RELEASED)  # back in todo: a waiting reader may lease it
    assert woken == ["j"]


def test_a_message_renews_the_leases_and_one_without_seq_gets_no_answer(
        core: Coordinator) -> None:  # noqa: F811
    job = new_job(core)
    worker, secret = join(core, job)
    tasks = list(lease(core, job, worker, secret, 2, 0.0).tasks)
    # (The lease timer ticks every second: a longer gap would be a stall, which grants grace.)
    expired = [t for t in range(1, 25) if core.expire_leases(float(t))]
    answer, _ = send(core, job, worker, message(0, tasks, consumed=0), 25.0)
    assert answer is None
    expired += [t for t in range(25, 60) if core.expire_leases(float(t))]
    assert expired == [55], "renewed at 25 s, the leases run out at 55 s"


def test_a_done_rides_only_an_answered_message(core: Coordinator) -> None:  # noqa: F811
    job = new_job(core)
    worker, secret = join(core, job)
    tasks = list(lease(core, job, worker, secret, 1, 0.0).tasks)
    with pytest.raises(InvalidArgument, match="only PROGRESS reports"):
        send(core, job, worker, message(0, tasks, pb.TaskReport.DONE), 1.0)
    assert not job.ledger.done
    answer, changed = send(core, job, worker, message(1, tasks, pb.TaskReport.DONE),
                                           1.0)
    assert changed and answer is not None and not answer.refused
    assert set(job.ledger.done) == {tasks[0].partition}


def test_a_refused_report_is_listed_and_the_others_apply(core: Coordinator) -> None:  # noqa: F811
    job = new_job(core)
    worker, secret = join(core, job)
    tasks = list(lease(core, job, worker, secret, 2, 0.0).tasks)
    stale = pb.Task(epoch=0, partition=tasks[1].partition, lease=tasks[1].lease + 1)
    answer, _ = send(
        core, job, worker, message(1, [tasks[0], stale], pb.TaskReport.DONE), 1.0)
    assert answer is not None
    assert [(t.partition, t.lease) for t in answer.refused] == [(stale.partition, stale.lease)]
    assert set(job.ledger.done) == {tasks[0].partition}
    assert core.metrics["j"].reports_refused == 1  # (a refused DONE counts; stale progress not)


def test_the_done_that_completes_the_epoch_wakes_the_long_polls(
        core: Coordinator) -> None:  # noqa: F811
    job = new_job(core)
    worker, secret = join(core, job)
    tasks: list[pb.Task] = []
    while len(tasks) < job.ledger.num_partitions:
        tasks += lease(core, job, worker, secret, 8, 0.0).tasks
    woken: list[str] = []
    core.on_change = woken.append
    report(core, job, worker, 1.0, reports=[pb.TaskReport(
        epoch=0, partition=t.partition, lease=t.lease, outcome=pb.TaskReport.DONE)
        for t in tasks])
    assert job.ledger.complete and woken == ["j"]


def test_a_refused_report_in_a_get_tasks_is_listed_and_the_others_apply(
        core: Coordinator) -> None:  # noqa: F811
    """Protocol 3: no GetTasks call to retry without the refused reports, so a `get_tasks`
    applies the others and leases, and lists the refused ones (in `refused` and, as the
    client's retry did, in its grant's `revoked`)."""
    job = new_job(core)
    worker, secret = join(core, job)
    tasks = list(lease(core, job, worker, secret, 2, 0.0).tasks)
    stale = pb.HeldTask(epoch=0, partition=tasks[1].partition, lease=tasks[1].lease + 1)
    done = [pb.TaskReport(epoch=0, partition=t.partition, lease=t.lease,
                          outcome=pb.TaskReport.DONE) for t in (tasks[0], stale)]
    answer, changed = send(core, job, worker, pb.SessionMessage(seq=7, get_tasks=pb.GetTasksRequest(
        epoch=0, max_tasks=1, reports=done)), 1.0)
    assert isinstance(answer, pb.WatchEvent) and answer.answers == 7 and changed
    assert [(t.partition, t.lease) for t in answer.refused] == [(stale.partition, stale.lease)]
    assert answer.refused_count == 1
    assert [(t.partition, t.lease) for t in answer.grant.revoked] == [
        (stale.partition, stale.lease)]
    assert answer.grant.status == pb.GetTasksResponse.TASKS and len(answer.grant.tasks) == 1
    assert set(job.ledger.done) == {tasks[0].partition}
    assert tasks[1].partition in job.ledger.pending  # the stale report changed nothing
    assert core.metrics["j"].reports_refused == 1


def test_a_get_tasks_that_may_wait_is_handed_back_until_its_last_attempt(
        core: Coordinator) -> None:  # noqa: F811
    """The long-poll stays in the shell: a `get_tasks` with a wait that finds nothing to lease
    comes back as an Ask, which the shell hands back; the last attempt answers WAIT."""
    job = new_job(core)
    a, a_secret = join(core, job)
    b, _ = join(core, job)
    mine = []
    while len(mine) < job.ledger.num_partitions:
        mine += lease(core, job, a, a_secret, 8, 0.0).tasks
    ask, _ = send(core, job, b, pb.SessionMessage(seq=3, get_tasks=pb.GetTasksRequest(
        epoch=0, max_tasks=1, wait_ms=1000)), 1.0)
    assert isinstance(ask, Ask)
    again, _ = send(core, job, b, ask, 1.5)
    assert again is ask  # (nothing freed meanwhile)
    ask.last = True
    answer, _ = send(core, job, b, ask, 2.0)
    assert isinstance(answer, pb.WatchEvent) and answer.answers == 3
    assert answer.grant.status == pb.GetTasksResponse.WAIT and not answer.grant.tasks


def test_a_streams_end_is_not_the_reader_leaving(core: Coordinator) -> None:  # noqa: F811
    """A reader reconnects a broken stream with the same secret: its leases run on until they
    time out, and the session is not forgotten."""
    job = new_job(core)
    worker, secret = join(core, job)
    key = core.open_stream(job, worker, secret, exchange=False)
    tasks = lease(core, job, worker, secret, 2, 0.0).tasks
    core.close_stream(key)
    assert {t.partition for t in tasks} <= set(job.ledger.pending)
    assert worker in job.workers
    # (The lease timer ticks every second: a longer gap would be a stall, which grants grace.)
    expired = [t for t in range(1, int(TIMEOUT) + 5) if core.expire_leases(float(t))]
    assert expired and expired[0] >= TIMEOUT, expired
