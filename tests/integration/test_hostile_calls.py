"""Hostile calls against a real master process with the generated stubs (issue 14): reports
from a worker that never opened the job, for another worker's partitions, with wrong or stale
fencing tokens, for partitions and epochs that cannot exist. Each is refused with the status the
protocol names and changes nothing (the job status is identical before and after), refusals are
counted in the metrics and logged with a rate limit; an honest reader carries on. (Calls as a
worker without its session secret: tests/integration/test_borrowed_identities.py.)"""
from __future__ import annotations

import time

import grpc
import pytest
from integration.raw_calls import open_request
from test_master_metrics import scrape, value

from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

pytestmark = pytest.mark.integration
PARTITIONS = 10  # the `storage` fixture: 100 records, 10 partitions of 10
REFUSED_TRAILER = "trainfeed-refused-bin"
DONE, FAILED, PROGRESS = pb.TaskReport.DONE, pb.TaskReport.FAILED, pb.TaskReport.PROGRESS


def unchanged(status: pb.JobStatus) -> pb.JobStatus:
    """The job status but for the refusal counter (which a refusal is meant to move)."""
    copy = pb.JobStatus()
    copy.CopyFrom(status)
    copy.reports_refused = 0
    return copy


def refusal(call: grpc.UnaryUnaryMultiCallable, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    return caught.value


def refused_in(error: grpc.RpcError) -> list[tuple[int, int, int]]:
    for key, data in error.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == REFUSED_TRAILER:
            return [(t.epoch, t.partition, t.lease)
                    for t in pb.RefusedReports.FromString(data).reports]
    return []


def test_reports_not_from_the_lease_holder_are_refused_and_change_nothing(storage: str) -> None:
    started = time.monotonic()
    with MasterProcess(storage, extra_args=["--lease-timeout", "60"]) as master, \
            MasterClient(master.address, give_up_s=10) as client, \
            grpc.insecure_channel(master.address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        owner = client.open_job("j", "flowers", seed=0).worker_id
        other = client.open_job("j", "flowers", seed=0).worker_id
        mine = client.get_tasks("j", owner, 0, max_tasks=3, wait_ms=0).tasks
        assert len(mine) == 3
        leased = {t.partition for t in mine}
        never = [p for p in range(PARTITIONS) if p not in leased]
        before = client.job_status("j")

        def done(t: pb.Task) -> pb.TaskReport:
            return pb.TaskReport(epoch=0, partition=t.partition, outcome=DONE, lease=t.lease)

        hostile: list[tuple[str, str, list[pb.TaskReport]]] = [
            # DONE for partitions never leased, from a worker id that never opened the job.
            ("stranger", "intruder-0", [pb.TaskReport(epoch=0, partition=p, outcome=DONE,
                                                      lease=1) for p in never]),
            # FAILED for the owner's partitions, by another worker (even with the right tokens).
            ("another's", other, [pb.TaskReport(epoch=0, partition=t.partition, outcome=FAILED,
                                                lease=t.lease, reason="x") for t in mine]),
            # The owner itself, with no token, a wrong one, and another partition's.
            ("no token", owner, [pb.TaskReport(epoch=0, partition=t.partition, outcome=DONE)
                                 for t in mine]),
            ("wrong token", owner, [pb.TaskReport(epoch=0, partition=t.partition, outcome=DONE,
                                                  lease=t.lease + 1000) for t in mine]),
            # PROGRESS on partitions the sender does not hold (all their records: the next
            # holder would skip them all).
            ("progress", other, [pb.TaskReport(epoch=0, partition=p, outcome=PROGRESS,
                                               consumed=10, lease=1) for p in range(10)]),
            # One valid DONE among hostile ones: the call is refused whole.
            ("mixed", owner, [done(mine[0]), pb.TaskReport(epoch=0, partition=never[0],
                                                           outcome=DONE, lease=mine[1].lease)]),
        ]
        refused = 0
        for what, worker, reports in hostile:
            secret = client.secret("j", worker)  # (the stranger has none)
            for call, request in ((stub.Report, pb.ReportRequest(
                    job="j", worker_id=worker, reports=reports, session_secret=secret)),
                    (stub.GetTasks, pb.GetTasksRequest(job="j", worker_id=worker, epoch=0,
                                                       max_tasks=5, reports=reports,
                                                       session_secret=secret))):
                error = refusal(call, request)
                if not secret:  # a worker id no OpenJob gave: refused before any report
                    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (what, error)
                    assert unchanged(client.job_status("j")) == unchanged(before), what
                    continue
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, (what, error)
                listed = refused_in(error)
                assert listed and set(listed) <= {(r.epoch, r.partition, r.lease)
                                                  for r in reports}, what
                refused += len(listed)
                assert unchanged(client.job_status("j")) == unchanged(before), what
        # One call carrying 100,000 such reports (the issue's: the next epoch delivered 0).
        flood = [pb.TaskReport(epoch=0, partition=i % PARTITIONS, outcome=PROGRESS,
                               consumed=10, lease=i + 7) for i in range(100_000)]
        error = refusal(stub.Report, pb.ReportRequest(job="j", worker_id=owner, reports=flood,
                                                      session_secret=client.secret("j", owner)))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert 0 < len(refused_in(error)) < len(flood)  # the trailer lists the first ones
        refused += len(flood)
        after = client.job_status("j")
        assert unchanged(after) == unchanged(before)
        assert after.reports_refused == refused > 100_000
        assert value(scrape(master), "trainfeed_reports_refused_total", job="j") == refused

        # The honest client, in the same mixed situation, drops the refused report, retries
        # the rest at once and learns it as revoked.
        stale = pb.TaskReport(epoch=0, partition=never[0], outcome=DONE, lease=mine[1].lease)
        answer = client.report("j", owner, [done(mine[0]), stale],
                               held=[(0, t.partition, t.lease) for t in mine[1:]])
        assert [(t.partition, t.lease) for t in answer.revoked] == [(never[0], mine[1].lease)]
        assert client.job_status("j").done == 1
    log = "".join(master.log)
    # Logged with a rate limit (5 lines per 10 s), not once per call (over 100,000); never a
    # token.
    windows = 1 + int(time.monotonic() - started) // 10
    logged = [line for line in master.log if "which does not hold" in line
              or "session secret" in line]
    assert 1 <= len(logged) <= 5 * windows, log[-3000:]
    assert not any(f"lease {t.lease}" in log or str(t.lease) in log for t in mine)


def test_partitions_and_epochs_that_cannot_exist_are_invalid_arguments(storage: str) -> None:
    with MasterProcess(storage, extra_args=["--lease-timeout", "60"]) as master, \
            MasterClient(master.address, give_up_s=10) as client, \
            grpc.insecure_channel(master.address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        opened = client.open_job("j", "flowers", seed=0)
        worker = opened.worker_id
        # Read epoch 0 to its end: the case where GetTasks(2^63 - 1) used to move the job there.
        tasks: list[pb.Task] = []
        while (got := client.get_tasks("j", worker, 0, 4, 0, reports=[
                pb.TaskReport(epoch=0, partition=t.partition, outcome=DONE, lease=t.lease)
                for t in tasks])).status == pb.GetTasksResponse.TASKS:
            tasks = list(got.tasks)
        assert got.status == pb.GetTasksResponse.EPOCH_DONE
        before = client.job_status("j")
        assert (before.epoch, before.done) == (0, PARTITIONS)
        bad_reports = [
            # PROGRESS of 10^9 records of a 10-record partition, even from its holder.
            pb.TaskReport(epoch=0, partition=tasks[0].partition, outcome=PROGRESS,
                          consumed=10**9, lease=tasks[0].lease),
            pb.TaskReport(epoch=0, partition=2**32 - 1, outcome=DONE, lease=1),
            pb.TaskReport(epoch=0, partition=PARTITIONS, outcome=PROGRESS, consumed=1, lease=1),
            pb.TaskReport(epoch=2**63 - 1, partition=0, outcome=DONE, lease=1),
            pb.TaskReport(epoch=-1, partition=0, outcome=DONE, lease=1),
            pb.TaskReport(epoch=0, partition=0, lease=1),  # no outcome
        ]
        requests: list[tuple[grpc.UnaryUnaryMultiCallable, object]] = []
        secret = client.secret("j", worker)
        for r in bad_reports:
            requests += [(stub.Report, pb.ReportRequest(job="j", worker_id=worker, reports=[r],
                                                        session_secret=secret)),
                         (stub.GetTasks, pb.GetTasksRequest(job="j", worker_id=worker, epoch=1,
                                                            max_tasks=1, reports=[r],
                                                            session_secret=secret))]
        for epoch in (2**63 - 1, 2, -2, -(2**63)):
            requests.append((stub.GetTasks, pb.GetTasksRequest(job="j", worker_id=worker,
                                                               epoch=epoch, max_tasks=1,
                                                               session_secret=secret)))
        requests.append((stub.Report, pb.ReportRequest(job="j", worker_id=worker, held=[
            pb.HeldTask(epoch=0, partition=2**32 - 1, lease=1)], session_secret=secret)))
        credential = opened.resume_credential
        for resume in (pb.ResumePosition(epoch=0, worker_id=worker, done=[2**32 - 1],
                                         credential=credential),
                       pb.ResumePosition(epoch=0, worker_id=worker, positions={2**32 - 1: 1},
                                         credential=credential),
                       pb.ResumePosition(epoch=0, worker_id=worker, positions={0: 10**9},
                                         credential=credential)):
            requests.append((stub.OpenJob, open_request(job="j", dataset="flowers",
                                                             resume=resume)))
        for call, request in requests:
            error = refusal(call, request)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (request, error)
            assert "Traceback" not in (error.details() or "")
            assert client.job_status("j") == before, request
        # The job is where it was: the next reader reads epoch 1 as usual.
        got = client.get_tasks("j", worker, -1, 2, 0)
        assert got.status == pb.GetTasksResponse.TASKS and got.current_epoch == 1
    assert "Unexpected" not in "".join(master.log)
