"""The Session stream over the wire (issues 28, 36): one stream per reader session, authenticated
by its secret, carrying leases taken from the session and the end of an epoch as they happen; and
a reader of another protocol version refused at OpenJob naming both versions. The reader's
heartbeats and progress are messages of it, which renew its leases as they arrive (the stream's
mere liveness renews nothing); its end is not the reader leaving (a reconnect finds its leases)."""
from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from sample_data import make_image_list
from test_push_watch import calls
from test_stream_grants import read_events

from trainfeed.lease.client import MasterClient, SessionStream, session_message, tasks_request
from trainfeed.master.serve.process import MasterProcess
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
           ) -> tuple[queue.Queue[pb.WatchEvent | grpc.RpcError], SessionStream]:
    """A Session stream opened with `request` on a bare stub: its events (or its error) on a
    queue, read by a thread."""
    call = SessionStream(stub, None, request, timeout=30)
    return read_events(call), call


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


# -- Session: Watch plus the reader's heartbeats and progress as stream messages -----------------
def session_stream(client: MasterClient, worker: str
                   ) -> tuple[queue.Queue[pb.WatchEvent | grpc.RpcError], Any]:
    """The session's Session stream (client.session), its events on a queue read by a thread."""
    call = client.session("train", worker)
    return read_events(call), call


def heartbeat(seq: int, held: list[pb.Task], consumed: int = 0) -> pb.SessionMessage:
    return session_message(
        seq, [pb.TaskReport(epoch=t.epoch, partition=t.partition, lease=t.lease,
                            outcome=pb.TaskReport.PROGRESS, consumed=consumed)
              for t in held if consumed],
        [(t.epoch, t.partition, t.lease) for t in held], (), None, None)


def answer(events: queue.Queue[pb.WatchEvent | grpc.RpcError], seq: int) -> pb.WatchEvent:
    while True:
        event = events.get(timeout=10)
        assert isinstance(event, pb.WatchEvent), event
        if event.answers == seq:
            return event
        assert not event.revoked, f"leases taken before the answer to {seq}: {event}"


def test_session_messages_renew_the_leases_and_a_silent_open_stream_does_not(
        master: MasterProcess) -> None:
    """Heartbeats sent as messages keep a session's leases past the lease timeout (1 s) without
    a Report call; once the reader stops sending (a frozen process) its leases expire although
    its stream stays open: liveness of the stream is no heartbeat."""
    with MasterClient(master.address, give_up_s=10) as client:
        worker = client.open_job("train", "flowers", seed=0).worker_id
        events, call = session_stream(client, worker)
        try:
            assert isinstance(events.get(timeout=10), pb.WatchEvent)  # open
            mine = list(client.get_tasks("train", worker, 0, 2, 0).tasks)
            assert mine
            reports_before = calls(master).get("Report", 0)
            for seq in range(1, 9):  # 2.4 s of heartbeats every 0.3 s, all answered
                call.send(heartbeat(seq, mine, consumed=seq % 2))
                got = answer(events, seq)
                silent = time.monotonic()  # (the master renewed them before it answered)
                assert not got.revoked and not got.refused, got
                time.sleep(0.3)
            assert calls(master).get("Report", 0) == reports_before
            # Silent from now on, the stream open: the leases go after the lease timeout.
            event = events.get(timeout=10)
            assert isinstance(event, pb.WatchEvent), event
            assert {(t.partition, t.lease) for t in event.revoked} == {
                (t.partition, t.lease) for t in mine}
            assert time.monotonic() - silent >= 0.7
        finally:
            call.cancel()


def test_an_unanswered_session_message_with_a_done_is_refused_and_stale_progress_listed(
        master: MasterProcess) -> None:
    with MasterClient(master.address, give_up_s=10) as client:
        worker = client.open_job("train", "flowers", seed=0).worker_id
        events, call = session_stream(client, worker)
        try:
            assert isinstance(events.get(timeout=10), pb.WatchEvent)
            [task] = client.get_tasks("train", worker, 0, 1, 0).tasks
            # Progress on a lease that is not the session's (a stale token: the partition went
            # to another reader since): dropped and listed, the call not refused.
            stale = pb.Task(epoch=0, partition=task.partition, lease=task.lease + 1)
            call.send(heartbeat(1, [stale], consumed=1))
            assert [(t.partition, t.lease) for t in answer(events, 1).refused] == [
                (task.partition, task.lease + 1)]
            # Its own progress counts (the answer renews; nothing refused).
            call.send(heartbeat(2, [task], consumed=1))
            assert not answer(events, 2).refused
            # A DONE on a message nobody waits for: refused (a DONE must be confirmed).
            call.send(session_message(0, [pb.TaskReport(
                epoch=0, partition=task.partition, lease=task.lease,
                outcome=pb.TaskReport.DONE)], [], (), None, None))
            while True:
                error = events.get(timeout=10)
                if isinstance(error, grpc.RpcError):
                    break
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "only PROGRESS reports" in (error.details() or "")
        finally:
            call.cancel()


def test_a_session_stream_without_the_session_secret_is_refused(master: MasterProcess) -> None:
    with MasterClient(master.address, give_up_s=10) as client:
        worker = client.open_job("train", "flowers", seed=0).worker_id
        client._secrets[("train", worker)] = "x"  # (what a caller without the secret sends)
        events, call = session_stream(client, worker)
        error = events.get(timeout=10)
        assert isinstance(error, grpc.RpcError)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        call.cancel()


def test_a_streams_end_is_not_the_reader_leaving(master: MasterProcess) -> None:
    """A reader whose stream broke reconnects with the same secret: its leases are still its
    own (a heartbeat on the new stream lists them and nothing is revoked), until they time
    out."""
    with MasterClient(master.address, give_up_s=10) as client:
        worker = client.open_job("train", "flowers", seed=0).worker_id
        events, call = session_stream(client, worker)
        assert isinstance(events.get(timeout=10), pb.WatchEvent)  # open
        call.send(pb.SessionMessage(seq=1, get_tasks=tasks_request(
            0, 2, 0, [], [], 0, (), None, None)))
        mine = list(answer(events, 1).grant.tasks)
        assert len(mine) == 2
        call.cancel()  # the stream breaks
        events, call = session_stream(client, worker)
        try:
            assert isinstance(events.get(timeout=10), pb.WatchEvent)  # open again
            call.send(heartbeat(1, mine))
            renewed = answer(events, 1)
            assert not renewed.revoked and not renewed.refused, renewed
            status = client.job_status("train")
            assert status.pending == 2 and status.todo == PARTITIONS - 2, status
        finally:
            call.cancel()

