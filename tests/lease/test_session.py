"""The session's I/O shell (trainfeed.lease.session): when it connects, what rides on its calls,
and how it uses the Watch stream.

Opening is tested against the real master process. The Watch stream's use is tested against a
tiny in-test master (`FakeMaster`: real gRPC, a scripted Watch stream, counted calls), since the
real master's Watch comes with the fleet work (issue 28; the end-to-end test is
tests/integration/test_push_watch.py)."""
from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from sample_data import make_image_list

from trainfeed import (
    JobError,
    MasterSource,
    ProtocolVersionError,
    SupersededError,
    SyncGroupBrokenError,
    dist,
)
from trainfeed.io.prefetch import TaskRef
from trainfeed.lease import session as session_module
from trainfeed.lease import shutdown
from trainfeed.lease.client import PROTOCOL_VERSION, MasterClient
from trainfeed.lease.session import STEAL_POLL_S, WATCH_SINCE_VERSION, WorkerSession
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

LEASE_TIMEOUT_S = 30.0  # heartbeats every 10 s: none within these tests' windows
_CLOSE = object()


class FakeMaster(master_pb2_grpc.MasterServicer):
    """A master that grants every GetTasks the partitions it is told to, answers Report, and
    streams Watch events the test puts in `events` (`_CLOSE` ends the stream). Counts calls by
    method and keeps every request."""

    def __init__(self, watch: bool = True, refuse_version: bool = False,
                 version: int = PROTOCOL_VERSION):
        self.watch = watch
        self.version = version
        self.refuse_version = refuse_version
        self.calls: Counter[str] = Counter()
        self.requests: list[object] = []
        self.events: queue.Queue[object] = queue.Queue()
        self.grant: list[pb.Task] = []
        self.lock = threading.Lock()

    def _count(self, method: str, request: object) -> None:
        with self.lock:
            self.calls[method] += 1
            self.requests.append(request)

    def OpenJob(self, request: pb.OpenJobRequest, context: grpc.ServicerContext
                ) -> pb.OpenJobResponse:
        self._count("OpenJob", request)
        if self.refuse_version:
            # (The wording of trainfeed.master's refusal.)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"job 'j': the reader speaks wire protocol {request.protocol_version}, "
                          f"this master speaks 7; run readers and master of the same trainfeed "
                          f"release (pip show trainfeed on both sides)")
        return pb.OpenJobResponse(worker_id="w1", job=request.job, dataset=request.dataset,
                                  dataset_url="file:///nowhere", lease_timeout_s=LEASE_TIMEOUT_S,
                                  session_secret="s" * 32, num_partitions=8, num_records=64,
                                  protocol_version=self.version)

    def GetTasks(self, request: pb.GetTasksRequest, context: grpc.ServicerContext
                 ) -> pb.GetTasksResponse:
        self._count("GetTasks", request)
        with self.lock:
            tasks, self.grant = self.grant, []
        return pb.GetTasksResponse(status=pb.GetTasksResponse.TASKS, tasks=tasks, todo_left=1)

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext
               ) -> pb.ReportResponse:
        self._count("Report", request)
        return pb.ReportResponse()

    def LeaveJob(self, request: pb.LeaveJobRequest, context: grpc.ServicerContext
                 ) -> pb.LeaveJobResponse:
        self._count("LeaveJob", request)
        return pb.LeaveJobResponse()

    def Watch(self, request: pb.WatchRequest, context: grpc.ServicerContext
              ) -> Iterator[pb.WatchEvent]:
        self._count("Watch", request)
        if not self.watch:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        context.send_initial_metadata(())
        while context.is_active():
            try:
                event = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if event is _CLOSE:
                return
            assert isinstance(event, pb.WatchEvent)
            yield event

    def reports(self) -> list[pb.TaskReport]:
        with self.lock:
            return [r for q in self.requests if isinstance(q, (pb.ReportRequest,
                                                               pb.GetTasksRequest))
                    for r in q.reports]


@pytest.fixture
def fake() -> Iterator[tuple[FakeMaster, str]]:
    servicer = FakeMaster()
    server = grpc.server(futures.ThreadPoolExecutor(8))
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def lease_two(session: WorkerSession, fake: FakeMaster) -> None:
    """Has `session` lease two partitions it does not start."""
    fake.grant = [pb.Task(epoch=0, partition=p, lease=10 + p, num_records=8) for p in (1, 2)]
    session.get_tasks(0, 2, 0, 0)
    assert session.held() == {(0, 1): 11, (0, 2): 12}


def wait_until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def ours() -> int:
    """Threads that trainfeed started (named trainfeed-...)."""
    return sum(1 for t in threading.enumerate() if t.name.startswith("trainfeed-"))


def test_building_a_session_or_reader_connects_nothing(tmp_path: Path) -> None:
    source = make_image_list(tmp_path / "source", 16)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    with MasterProcess(storage) as master, MasterClient(master.address) as client:
        threads = ours()
        session = WorkerSession(client, "j", "flowers", seed=0)
        reader = dist.reader("flowers", source=MasterSource(master.address, "j"))
        assert reader.epoch is None  # it used to join the job
        reader.state_dict()
        assert ours() == threads, "a thread started"
        assert session not in shutdown._SESSIONS
        assert not session.is_open
        with pytest.raises(JobError, match="no job 'j'"):  # nobody joined, nor created it
            client.job_status("j")
        session.open()
        assert client.job_status("j").workers == 1
        assert session in shutdown._SESSIONS
        # The reporter, and the watcher if the master speaks a protocol with Watch (gRPC may
        # start a thread of its own for the stream: only trainfeed's are counted).
        watcher = session.opened.protocol_version >= WATCH_SINCE_VERSION
        assert ours() == threads + 1 + watcher
        session.close()
        reader.close()
        assert ours() == threads


def test_a_master_of_another_protocol_version_is_named() -> None:
    servicer = FakeMaster(refuse_version=True)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with MasterClient(f"127.0.0.1:{port}") as client:
            with pytest.raises(ProtocolVersionError, match=rf"speaks version {PROTOCOL_VERSION}"
                               r", the master speaks version 7"):
                client.open_job("j", "flowers", 0)
        [request] = servicer.requests
        assert isinstance(request, pb.OpenJobRequest)
        assert request.protocol_version == PROTOCOL_VERSION == 3
    finally:
        server.stop(0)


def test_a_watching_reader_with_unstarted_leases_makes_no_calls(
        fake: tuple[FakeMaster, str]) -> None:
    servicer, address = fake
    with MasterClient(address) as client:
        session = WorkerSession(client, "j", "flowers", seed=0).open()
        try:
            wait_until(lambda: session.watching)
            lease_two(session, servicer)
            before = servicer.calls.copy()
            time.sleep(1.5)  # six polls' worth without the stream
            assert servicer.calls == before
            # A give-back reaches the idle reader through the stream; its RELEASED goes at once.
            servicer.events.put(pb.WatchEvent(give_back=[pb.HeldTask(epoch=0, partition=2,
                                                                     lease=12)]))
            wait_until(lambda: any(r.outcome == pb.TaskReport.RELEASED
                                   for r in servicer.reports()), timeout=2.0)
            assert session.held() == {(0, 1): 11}
            # A revocation pushed on the stream drops the lease, and renews nothing.
            servicer.events.put(pb.WatchEvent(revoked=[pb.HeldTask(epoch=0, partition=1,
                                                                   lease=11)]))
            wait_until(lambda: not session.held())
        finally:
            session.close()


def test_without_watch_the_reader_polls_while_it_holds_unstarted_leases() -> None:
    servicer = FakeMaster(watch=False)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with MasterClient(f"127.0.0.1:{port}") as client:
            session = WorkerSession(client, "j", "flowers", seed=0).open()
            try:
                wait_until(lambda: servicer.calls["Watch"] >= 1)
                lease_two(session, servicer)
                before = servicer.calls["Report"]
                watches = servicer.calls["Watch"]
                for _ in range(50):  # wake-ups of the session (reports, passes) ...
                    session.set_fetching(False)
                    time.sleep(0.02)
                polls = servicer.calls["Report"] - before
                assert polls >= 0.5 / STEAL_POLL_S, f"{polls} polls in 1 s"
                assert not session.watching
                # ... do not cut the Watch backoff short (0.1, 0.2, 0.4 s, ...: a few calls)
                assert servicer.calls["Watch"] - watches <= 4, servicer.calls
            finally:
                session.close()
    finally:
        server.stop(0)


def test_a_broken_stream_falls_back_to_polling_and_is_reopened(
        fake: tuple[FakeMaster, str]) -> None:
    servicer, address = fake
    with MasterClient(address) as client:
        session = WorkerSession(client, "j", "flowers", seed=0).open()
        try:
            wait_until(lambda: session.watching)
            lease_two(session, servicer)
            servicer.events.put(_CLOSE)  # the master ends the stream (a restart)
            wait_until(lambda: servicer.calls["Watch"] >= 2, timeout=5.0)  # reopened
            wait_until(lambda: session.watching)
            before = servicer.calls.copy()
            time.sleep(1.0)
            assert servicer.calls == before  # watching again: quiet again
        finally:
            session.close()


def test_stats_ride_on_every_get_tasks_and_report(fake: tuple[FakeMaster, str]) -> None:
    servicer, address = fake
    figures = iter(range(1, 1000))
    with MasterClient(address) as client:
        session = WorkerSession(client, "j", "flowers", seed=0,
                                stats=lambda: pb.ReaderStats(batches=next(figures))).open()
        try:
            lease_two(session, servicer)
            session.send()
        finally:
            session.close()
    sent = [r for r in servicer.requests
            if isinstance(r, (pb.GetTasksRequest, pb.ReportRequest))]
    assert len(sent) >= 3  # GetTasks, Report, and close()'s Report
    assert all(r.HasField("stats") and r.stats.batches > 0 for r in sent)
    batches = [r.stats.batches for r in sent]
    assert batches == sorted(batches) and len(set(batches)) == len(batches)  # asked each time


def test_a_broken_group_or_a_supersession_pushed_on_the_stream_ends_the_passes(
        fake: tuple[FakeMaster, str]) -> None:
    servicer, address = fake
    with MasterClient(address) as client:
        session = WorkerSession(client, "j", "flowers", seed=0).open()
        try:
            wait_until(lambda: session.watching)
            servicer.events.put(pb.WatchEvent(superseded="reader w2 restored from w1"))
            wait_until(lambda: session.error is not None)
            with pytest.raises(SupersededError, match="reader w2 restored from w1"):
                session.check()
            servicer.events.put(pb.WatchEvent(group_broken="rank 1 of 2 left"))
            wait_until(lambda: session.broken is not None)
            with pytest.raises(SyncGroupBrokenError, match="rank 1 of 2 left"):
                session.check()
        finally:
            session.close()


def test_a_master_of_an_older_protocol_gets_no_watch_calls() -> None:
    servicer = FakeMaster(version=0)  # a master from before versioning
    server = grpc.server(futures.ThreadPoolExecutor(4))
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with MasterClient(f"127.0.0.1:{port}") as client:
            session = WorkerSession(client, "j", "flowers", seed=0).open()
            try:
                lease_two(session, servicer)
                time.sleep(0.6)
                assert servicer.calls["Watch"] == 0
                assert servicer.calls["Report"] >= 1  # it polls, as readers before Watch did
            finally:
                session.close()
    finally:
        server.stop(0)


class MuteSessionMaster(FakeMaster):
    """A FakeMaster whose Session stream opens (and says so) but never answers a message: a
    master cut off or stalled on the stream's path."""

    def Session(self, request_iterator: Iterator[pb.SessionMessage],
                context: grpc.ServicerContext) -> Iterator[pb.WatchEvent]:
        self._count("Session", next(request_iterator))
        yield pb.WatchEvent(current_epoch=0)
        for message in request_iterator:
            self._count("SessionMessage", message)


def done_task(session: WorkerSession, partition: int, lease: int) -> TaskRef:
    task = TaskRef(0, partition, "s", 0, 1, 8, lease=lease)
    session.handed_over()
    assert session.claim(task) is False
    return task


def test_without_session_a_reader_watches_and_reports_by_calls(
        fake: tuple[FakeMaster, str]) -> None:
    servicer, address = fake  # (a master before Session: UNIMPLEMENTED)
    with MasterClient(address) as client:
        session = WorkerSession(client, "j", "flowers", seed=0).open()
        try:
            wait_until(lambda: session.watching)
            assert servicer.calls["Watch"] == 1 and not session._session_rpc
            lease_two(session, servicer)
            session.set_fetching(False)
            session.report_done(done_task(session, 1, 11))
            wait_until(lambda: any(r.outcome == pb.TaskReport.DONE for r in servicer.reports()))
            assert servicer.calls["Report"] >= 1
        finally:
            session.close()


def test_an_unanswered_session_message_falls_back_to_a_report_call(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A DONE sent on the Session stream whose answer does not come: after ANSWER_TIMEOUT_S it
    goes again by a Report call (logged), and the stream is reopened; nothing waits silently."""
    monkeypatch.setattr(session_module, "ANSWER_TIMEOUT_S", 0.5)
    servicer = MuteSessionMaster()
    server = grpc.server(futures.ThreadPoolExecutor(8))
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with MasterClient(f"127.0.0.1:{port}") as client:
            session = WorkerSession(client, "j", "flowers", seed=0).open()
            try:
                wait_until(lambda: session._carrier is not None)
                lease_two(session, servicer)
                session.set_fetching(False)
                session.report_done(done_task(session, 1, 11))
                wait_until(lambda: servicer.calls["SessionMessage"] >= 1, timeout=5.0)
                sent_at = time.monotonic()
                wait_until(lambda: any(r.outcome == pb.TaskReport.DONE
                                       for q in servicer.requests
                                       if isinstance(q, pb.ReportRequest) for r in q.reports),
                           timeout=5.0)
                assert time.monotonic() - sent_at < 3.0
                assert "did not answer" in caplog.text
                wait_until(lambda: servicer.calls["Session"] >= 2, timeout=5.0)  # reopened
                assert session.held() == {(0, 2): 12}  # the Report's answer confirmed the DONE
            finally:
                session.close()
    finally:
        server.stop(0)


class ClosingSessionMaster(FakeMaster):
    """A FakeMaster whose Session streams end right after their opening event (a master that
    keeps dropping them)."""

    def Session(self, request_iterator: Iterator[pb.SessionMessage],
                context: grpc.ServicerContext) -> Iterator[pb.WatchEvent]:
        self._count("Session", next(request_iterator))
        yield pb.WatchEvent(current_epoch=0)


def test_reopened_session_streams_leave_no_thread_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC feeds a stream's messages from a thread of its own, blocked on the session's queue
    until told the stream is over: a reader whose stream broke 70 times had 70 more threads."""
    monkeypatch.setattr(session_module, "WATCH_RETRY_MIN_S", 0.01)
    monkeypatch.setattr(session_module, "WATCH_RETRY_MAX_S", 0.05)
    servicer = ClosingSessionMaster()
    server = grpc.server(futures.ThreadPoolExecutor(8))
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with MasterClient(f"127.0.0.1:{port}") as client:
            session = WorkerSession(client, "j", "flowers", seed=0).open()
            try:
                wait_until(lambda: servicer.calls["Session"] >= 5)
                threads = threading.active_count()
                opened = servicer.calls["Session"]
                wait_until(lambda: servicer.calls["Session"] >= opened + 30)
                assert threading.active_count() <= threads + 3
            finally:
                session.close()
    finally:
        server.stop(0)
