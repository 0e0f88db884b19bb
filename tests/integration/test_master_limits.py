"""What the master refuses before it changes anything: requests over its size limit, and job or
dataset names that no job can have, on every RPC."""
from __future__ import annotations

import grpc
import pytest
from integration.raw_calls import call, open_request, session_open

from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

pytestmark = pytest.mark.integration
LIMIT = 64 << 10  # the smallest limit the master takes


def code_of(stub: master_pb2_grpc.MasterStub, name: str, request: object) -> grpc.StatusCode:
    try:
        call(stub, name, request, timeout=5)
    except grpc.RpcError as e:
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.slow
def test_requests_over_the_configured_size_limit_are_refused_without_a_change(
        storage: str) -> None:
    with MasterProcess(storage, extra_args=["--max-message-bytes", str(LIMIT)]) as master, \
            MasterClient(master.address) as client, \
            grpc.insecure_channel(master.address) as channel:
        worker = client.open_job("j", "flowers", seed=0).worker_id
        leased = client.get_tasks("j", worker, 0, max_tasks=2, wait_ms=0)
        before = client.job_status("j")
        stub = master_pb2_grpc.MasterStub(channel)
        big = "x" * (LIMIT + 1024)  # over the flag's limit, far under the 4 MiB default
        done = [pb.TaskReport(epoch=0, partition=t.partition, outcome=pb.TaskReport.DONE,
                              lease=t.lease)
                for t in leased.tasks]
        assert code_of(stub, "OpenJob", open_request(
            job="k", dataset="flowers", worker_name=big)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert code_of(stub, "Session", (session_open("j", worker, client.secret("j", worker)),
                                         pb.SessionMessage(seq=1, get_tasks=pb.GetTasksRequest(
            epoch=0, max_tasks=1,
            reports=[*done, pb.TaskReport(epoch=0, partition=9, reason=big,
                                          outcome=pb.TaskReport.FAILED)])))
        ) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert client.job_status("j") == before  # the DONE reports were not applied
        assert code_of(stub, "GetJobStatus", pb.GetJobStatusRequest(job="k")) == \
            grpc.StatusCode.NOT_FOUND
        # Under the limit the same kind of request is served (but for the name's own limit,
        # 256 bytes: tests/integration/test_borrowed_identities.py).
        assert code_of(stub, "OpenJob", open_request(
            job="k", dataset="flowers", worker_name="x" * 256)) == grpc.StatusCode.OK


def test_every_rpc_refuses_invalid_job_and_dataset_names(storage: str) -> None:
    with MasterProcess(storage) as master, grpc.insecure_channel(master.address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        for bad in ("", "../x", "a/b", "..", "-lead", "x" * 129, "a b", "ä"):
            requests = {
                "OpenJob": open_request(job=bad, dataset="flowers"),
                "Session": (session_open(bad, "w", "", exchange=False), pb.SessionMessage(
                    seq=1, get_tasks=pb.GetTasksRequest(epoch=-1, max_tasks=1))),
                "LeaveJob": pb.LeaveJobRequest(job=bad, worker_id="w"),
                "GetJobStatus": pb.GetJobStatusRequest(job=bad),
            }
            for name, request in requests.items():
                with pytest.raises(grpc.RpcError) as refusal:
                    call(stub, name, request, timeout=5)
                assert refusal.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, bad)
                assert "invalid job name" in refusal.value.details(), (name, bad)
        # Dataset names are only ever given to OpenJob.
        for bad in ("", "../x", "/abs", "a/b/c", "a\\b", "public/.."):
            with pytest.raises(grpc.RpcError) as refusal:
                stub.OpenJob(open_request(job="j", dataset=bad), timeout=5)
            assert refusal.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
            assert "invalid dataset name" in refusal.value.details(), bad
        with pytest.raises(grpc.RpcError) as refusal:  # nothing was created on the way
            stub.GetJobStatus(pb.GetJobStatusRequest(job="j"), timeout=5)
        assert refusal.value.code() == grpc.StatusCode.NOT_FOUND
