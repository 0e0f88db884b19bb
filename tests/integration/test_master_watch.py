"""Watch over the wire (issue 28): one stream per reader session, authenticated by its secret,
carrying leases taken from the session and the end of an epoch as they happen; and a reader of
another protocol version refused at OpenJob naming both versions."""
from __future__ import annotations

import queue
import threading
from pathlib import Path

import grpc
import pytest
from sample_data import make_image_list

from trainfeed.lease.client import MasterClient
from trainfeed.master.process import MasterProcess
from trainfeed.protocol import PROTOCOL_VERSION
from trainfeed.upload import UploadOptions, upload
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

pytestmark = pytest.mark.integration
PARTITIONS = 8


@pytest.fixture
def master(tmp_path: Path) -> MasterProcess:
    source = make_image_list(tmp_path / "source", PARTITIONS)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=1), progress=False)
    with MasterProcess(storage, extra_args=["--partitions", str(PARTITIONS),
                                            "--lease-timeout", "1"]) as m:
        yield m


def stream(stub: master_pb2_grpc.MasterStub, request: pb.WatchRequest
           ) -> tuple[queue.Queue[pb.WatchEvent | grpc.RpcError], grpc.Future]:
    """The stream's events (or its error) on a queue, read by a thread."""
    events: queue.Queue[pb.WatchEvent | grpc.RpcError] = queue.Queue()
    call = stub.Watch(request, timeout=30)

    def read() -> None:
        try:
            for event in call:
                events.put(event)
        except grpc.RpcError as e:
            events.put(e)
    threading.Thread(target=read, daemon=True).start()
    return events, call


def test_a_watching_session_is_told_of_expired_leases_and_the_epoch_end(
        master: MasterProcess) -> None:
    with MasterClient(master.address, give_up_s=10) as client, \
            grpc.insecure_channel(master.address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        quiet = client.open_job("train", "flowers", seed=0).worker_id
        busy = client.open_job("train", "flowers", seed=0).worker_id
        events, call = stream(stub, pb.WatchRequest(
            job="train", worker_id=quiet, session_secret=client.secret("train", quiet)))
        first = events.get(timeout=10)
        assert isinstance(first, pb.WatchEvent) and first.current_epoch == 0  # open
        mine = client.get_tasks("train", quiet, 0, 2, 0).tasks
        assert mine
        # `quiet` sends no heartbeat: its leases expire after 1 s, and it is told at once.
        event = events.get(timeout=10)
        assert isinstance(event, pb.WatchEvent), event
        assert {(t.partition, t.lease) for t in event.revoked} == {
            (t.partition, t.lease) for t in mine}
        held: list[tuple[int, int, int]] = []
        while True:  # `busy` reads the whole epoch
            reply = client.get_tasks("train", busy, 0, 4, 1000, held=held, reports=[
                pb.TaskReport(epoch=e, partition=p, outcome=pb.TaskReport.DONE, lease=t)
                for e, p, t in held])
            if reply.status == pb.GetTasksResponse.EPOCH_DONE:
                break
            held = [(t.epoch, t.partition, t.lease) for t in reply.tasks]
        event = events.get(timeout=10)
        assert isinstance(event, pb.WatchEvent) and event.epoch_complete == 0, event
        assert not (event.revoked or event.give_back or event.group_broken or event.superseded)
        call.cancel()


def test_a_stream_without_the_session_secret_is_refused(master: MasterProcess) -> None:
    with MasterClient(master.address, give_up_s=10) as client, \
            grpc.insecure_channel(master.address) as channel:
        worker = client.open_job("train", "flowers", seed=0).worker_id
        events, _ = stream(master_pb2_grpc.MasterStub(channel),
                           pb.WatchRequest(job="train", worker_id=worker, session_secret="x"))
        error = events.get(timeout=10)
        assert isinstance(error, grpc.RpcError)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "wrong session secret" in (error.details() or "")


def test_a_reader_of_another_protocol_version_is_refused_naming_both(
        master: MasterProcess) -> None:
    with grpc.insecure_channel(master.address) as channel:
        stub = master_pb2_grpc.MasterStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.OpenJob(pb.OpenJobRequest(job="train", dataset="flowers", worker_name="old",
                                           protocol_version=PROTOCOL_VERSION + 1), timeout=30)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (f"speaks wire protocol {PROTOCOL_VERSION + 1}, this master speaks "
                f"{PROTOCOL_VERSION}") in (caught.value.details() or "")
        opened = stub.OpenJob(pb.OpenJobRequest(job="train", dataset="flowers",
                                                worker_name="new",
                                                protocol_version=PROTOCOL_VERSION), timeout=30)
        assert opened.protocol_version == PROTOCOL_VERSION
