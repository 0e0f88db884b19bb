"""The coordinator's side of the Session stream (issue 28): a message renews the session's
leases and takes its reports like a Report (a DONE only on an answered message; a refused report
is listed, the others apply); progress wakes no long-poll."""
from __future__ import annotations

import pytest
from test_coordinator import core, join, lease, new_job  # noqa: F401 (core: a fixture)

from trainfeed.master.core.coordinator import Coordinator
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
    answer, changed = core.session_message(job, worker, message(1, tasks), 1.0)
    assert changed and answer is not None and answer.answers == 1
    assert job.ledger.progress == {t.partition: 1 for t in tasks}
    assert woken == [], "progress woke the job's long-polls"

    def report(task: pb.Task, outcome: int) -> None:
        core.report(job, pb.ReportRequest(
            job="j", worker_id=worker, session_secret=secret, reports=[pb.TaskReport(
                epoch=0, partition=task.partition, lease=task.lease,
                outcome=outcome)]), 2.0)  # type: ignore[arg-type]
    report(tasks[0], pb.TaskReport.DONE)
    assert woken == [], "a DONE that leaves the epoch open woke the job's long-polls"
    report(tasks[1], pb.TaskReport.RELEASED)  # back in todo: a waiting reader may lease it
    assert woken == ["j"]


def test_a_message_renews_the_leases_and_one_without_seq_gets_no_answer(
        core: Coordinator) -> None:  # noqa: F811
    job = new_job(core)
    worker, secret = join(core, job)
    tasks = list(lease(core, job, worker, secret, 2, 0.0).tasks)
    # (The lease timer ticks every second: a longer gap would be a stall, which grants grace.)
    expired = [t for t in range(1, 25) if core.expire_leases(float(t))]
    answer, _ = core.session_message(job, worker, message(0, tasks, consumed=0), 25.0)
    assert answer is None
    expired += [t for t in range(25, 60) if core.expire_leases(float(t))]
    assert expired == [55], "renewed at 25 s, the leases run out at 55 s"


def test_a_done_rides_only_an_answered_message(core: Coordinator) -> None:  # noqa: F811
    job = new_job(core)
    worker, secret = join(core, job)
    tasks = list(lease(core, job, worker, secret, 1, 0.0).tasks)
    with pytest.raises(InvalidArgument, match="only PROGRESS reports"):
        core.session_message(job, worker, message(0, tasks, pb.TaskReport.DONE), 1.0)
    assert not job.ledger.done
    answer, changed = core.session_message(job, worker, message(1, tasks, pb.TaskReport.DONE),
                                           1.0)
    assert changed and answer is not None and not answer.refused
    assert set(job.ledger.done) == {tasks[0].partition}


def test_a_refused_report_is_listed_and_the_others_apply(core: Coordinator) -> None:  # noqa: F811
    job = new_job(core)
    worker, secret = join(core, job)
    tasks = list(lease(core, job, worker, secret, 2, 0.0).tasks)
    stale = pb.Task(epoch=0, partition=tasks[1].partition, lease=tasks[1].lease + 1)
    answer, _ = core.session_message(
        job, worker, message(1, [tasks[0], stale], pb.TaskReport.DONE), 1.0)
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
    core.report(job, pb.ReportRequest(
        job="j", worker_id=worker, session_secret=secret, reports=[pb.TaskReport(
            epoch=0, partition=t.partition, lease=t.lease, outcome=pb.TaskReport.DONE)
            for t in tasks]), 1.0)
    assert job.ledger.complete and woken == ["j"]
