"""Hostile messages against a real master process with the generated stubs (issue 14): reports
from a worker that never opened the job, for another worker's partitions, with wrong or stale
fencing tokens, for partitions and epochs that cannot exist. A session without its secret gets no
stream (PERMISSION_DENIED); a report not from the lease holder with its token is refused (protocol
3: listed in the answer's `refused`, the message's other parts served) and changes nothing (the
job status is identical before and after, but for what a grant leased), refusals are counted in
the metrics and logged with a rate limit; what cannot exist is INVALID_ARGUMENT and ends the
stream; an honest reader carries on. (Calls as a worker without its session secret:
tests/integration/test_borrowed_identities.py.)"""
from __future__ import annotations

import time

import grpc
import pytest
from integration.raw_calls import exchange, open_request, session_open
from test_master_metrics import scrape, value

from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

pytestmark = pytest.mark.integration
PARTITIONS = 10  # the `storage` fixture: 100 records, 10 partitions of 10
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


def after_grant(status: pb.JobStatus, n: int) -> pb.JobStatus:
    """`status` (but for the refusal counter) after a grant of `n` more partitions."""
    copy = unchanged(status)
    copy.todo -= n
    copy.pending += n
    return copy


def triples(tasks: object) -> list[tuple[int, int, int]]:
    return [(t.epoch, t.partition, t.lease) for t in tasks]  # type: ignore[attr-defined]


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
            ("another partition's", owner, [pb.TaskReport(
                epoch=0, partition=never[0], outcome=DONE, lease=mine[1].lease)]),
            # PROGRESS on partitions the sender does not hold (all their records: the next
            # holder would skip them all).
            ("progress", other, [pb.TaskReport(epoch=0, partition=p, outcome=PROGRESS,
                                               consumed=10, lease=1) for p in range(10)]),
        ]
        refused = 0  # (counted: all but progress, which may race another message's DONE)
        for what, worker, reports in hostile:
            opening = session_open("j", worker, client.secret("j", worker))  # (stranger: none)
            for message in (pb.SessionMessage(seq=1, report=pb.ReportRequest(reports=reports)),
                            pb.SessionMessage(seq=2, get_tasks=pb.GetTasksRequest(
                                epoch=0, max_tasks=1, reports=reports))):
                if not opening.session_secret:  # a worker id no OpenJob gave: no stream
                    with pytest.raises(grpc.RpcError) as caught:
                        exchange(stub, opening, message)
                    error = caught.value
                    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (what, error)
                    assert unchanged(client.job_status("j")) == unchanged(before), what
                    continue
                answer = exchange(stub, opening, message)
                assert answer.refused_count == len(reports), (what, answer)
                assert triples(answer.refused) == triples(reports), what
                refused += sum(r.outcome != PROGRESS for r in reports)
                granted = len(answer.grant.tasks)
                if message.HasField("get_tasks"):  # the grant lists them as revoked too
                    assert triples(answer.grant.revoked) == triples(reports), what
                    assert not answer.grant_refused and granted == 1, (what, answer)
                after = client.job_status("j")
                assert unchanged(after) == after_grant(before, granted), what
                before = after
        # One message carrying 100,000 such reports (the issue's: the next epoch delivered 0).
        flood = [pb.TaskReport(epoch=0, partition=i % PARTITIONS, outcome=PROGRESS,
                               consumed=10, lease=i + 7) for i in range(100_000)]
        answer = exchange(stub, session_open("j", owner, client.secret("j", owner)),
                          pb.SessionMessage(seq=1, report=pb.ReportRequest(reports=flood)))
        assert answer.refused_count == len(flood)
        assert 0 < len(answer.refused) < len(flood)  # the answer lists the first ones
        after = client.job_status("j")
        assert unchanged(after) == unchanged(before)
        assert after.reports_refused == refused >= 10
        assert value(scrape(master), "trainfeed_reports_refused_total", job="j") == refused

        # The honest client, with a valid DONE beside a refused one: the DONE is taken, and the
        # refused report's lease comes back as revoked.
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
        messages: list[pb.SessionMessage] = []
        for r in bad_reports:
            messages += [pb.SessionMessage(seq=1, report=pb.ReportRequest(reports=[r])),
                         pb.SessionMessage(seq=1, get_tasks=pb.GetTasksRequest(
                             epoch=1, max_tasks=1, reports=[r]))]
        for epoch in (2**63 - 1, 2, -2, -(2**63)):
            messages.append(pb.SessionMessage(seq=1, get_tasks=pb.GetTasksRequest(
                epoch=epoch, max_tasks=1)))
        messages.append(pb.SessionMessage(seq=1, report=pb.ReportRequest(held=[
            pb.HeldTask(epoch=0, partition=2**32 - 1, lease=1)])))
        opening = session_open("j", worker, client.secret("j", worker))
        for message in messages:
            # A refused `get_tasks` is answered `grant_refused`; any other refusal ends the
            # stream with its status.
            try:
                answer = exchange(stub, opening, message)
                code, text = answer.grant_refused.split(": ", 1)
            except grpc.RpcError as e:
                code, text = e.code().name, e.details() or ""
            assert code == "INVALID_ARGUMENT", (message, code, text)
            assert "Traceback" not in text
            assert client.job_status("j") == before, message
        requests: list[tuple[grpc.UnaryUnaryMultiCallable, object]] = []
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
