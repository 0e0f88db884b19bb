"""The session's I/O shell (trainfeed.lease.session and its transport): when it connects, what
rides on its messages, and how it keeps its one conversation with the master, the Session stream
(issue 36: no other dialect, a broken stream reopened).

Opening is tested against the real master process; the stream's use against a tiny in-test
master (`FakeMaster`: real gRPC, OpenJob, LeaveJob and a scripted Session stream, counted). The
end-to-end tests are tests/integration/test_push_watch.py and test_stream_grants.py."""
from __future__ import annotations

import queue
import re
import subprocess
import sys
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
    MasterUnavailableError,
    ProtocolVersionError,
    SupersededError,
    SyncGroupBrokenError,
    dist,
)
from trainfeed.errors import CallCancelled
from trainfeed.io.prefetch import TaskRef
from trainfeed.lease import session as session_module
from trainfeed.lease import shutdown
from trainfeed.lease import transport as transport_module
from trainfeed.lease.client import PROTOCOL_VERSION, MasterClient
from trainfeed.lease.session import CLOSE_BOUND_S, Join, WorkerSession
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload
from trainfeed.v1 import master_pb2 as pb
from trainfeed.v1 import master_pb2_grpc

LEASE_TIMEOUT_S = 30.0  # heartbeats every 10 s: none within these tests' windows
_CLOSE = object()


class FakeMaster(master_pb2_grpc.MasterServicer):
    """A master that speaks only what a reader may use after OpenJob (issue 36): LeaveJob and
    the Session stream. It grants every request for tasks the partitions it is told to, answers
    every message with a seq (unless `mute`), and pushes the events the test puts in `events`
    (`_CLOSE` ends the stream). Counts calls and stream messages, and keeps every request."""

    def __init__(self, refuse_version: bool = False, mute: bool = False,
                 close_at_once: bool = False):
        self.refuse_version = refuse_version
        self.mute = mute  # a master cut off or stalled on the stream's path: no answers
        self.close_at_once = close_at_once  # a master that keeps dropping its streams
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
                                  protocol_version=PROTOCOL_VERSION)

    def LeaveJob(self, request: pb.LeaveJobRequest, context: grpc.ServicerContext
                 ) -> pb.LeaveJobResponse:
        self._count("LeaveJob", request)
        return pb.LeaveJobResponse()

    def Session(self, request_iterator: Iterator[pb.SessionMessage],
                context: grpc.ServicerContext) -> Iterator[pb.WatchEvent]:
        self._count("Session", next(request_iterator).open)
        answers: queue.Queue[object] = queue.Queue()
        threading.Thread(target=self._read, args=(request_iterator, answers),
                         daemon=True).start()
        yield pb.WatchEvent(current_epoch=0, grants=True)
        while not self.close_at_once and context.is_active():
            for source in (answers, self.events):
                try:
                    event = source.get(timeout=0.02)
                except queue.Empty:
                    continue
                if event is _CLOSE:
                    return
                assert isinstance(event, pb.WatchEvent)
                yield event

    def _read(self, messages: Iterator[pb.SessionMessage], answers: queue.Queue[object]) -> None:
        try:
            for message in messages:
                kind = "get_tasks" if message.HasField("get_tasks") else "report"
                self._count(f"SessionMessage.{kind}", getattr(message, kind))
                if self.mute or not message.seq:
                    continue
                if kind == "report":
                    answers.put(pb.WatchEvent(answers=message.seq))
                    continue
                with self.lock:
                    tasks, self.grant = self.grant, []
                answers.put(pb.WatchEvent(answers=message.seq, grant=pb.GetTasksResponse(
                    status=pb.GetTasksResponse.TASKS, tasks=tasks, todo_left=1)))
        except grpc.RpcError:
            pass  # the stream ended

    def messages(self) -> int:
        with self.lock:
            return sum(n for k, n in self.calls.items() if k.startswith("SessionMessage"))

    def reports(self) -> list[pb.TaskReport]:
        with self.lock:
            return [r for q in self.requests if isinstance(q, (pb.ReportRequest,
                                                               pb.GetTasksRequest))
                    for r in q.reports]


def serve(servicer: FakeMaster) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(8))
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def fake() -> Iterator[tuple[FakeMaster, str]]:
    servicer = FakeMaster()
    server, address = serve(servicer)
    try:
        yield servicer, address
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


def done_task(session: WorkerSession, partition: int, lease: int) -> TaskRef:
    task = TaskRef(0, partition, "s", 0, 1, 8, lease=lease)
    with session.locked() as book:
        book.handed_over()
    assert session.claim(task) is False
    return task


def test_building_a_session_or_reader_connects_nothing(tmp_path: Path) -> None:
    source = make_image_list(tmp_path / "source", 16)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    with MasterProcess(storage) as master, MasterClient(master.address) as client:
        threads = ours()
        session = WorkerSession(client, Join("j", "flowers"))
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
        # The reporter and the stream's reader (gRPC may start a thread of its own for the
        # stream: only trainfeed's are counted).
        assert ours() == threads + 2
        session.close()
        reader.close()
        assert ours() == threads


def test_a_master_of_another_protocol_version_is_named() -> None:
    servicer = FakeMaster(refuse_version=True)
    server, address = serve(servicer)
    try:
        with MasterClient(address) as client:
            with pytest.raises(ProtocolVersionError, match=rf"speaks version {PROTOCOL_VERSION}"
                               r", the master speaks version 7"):
                client.open_job("j", "flowers", 0)
        [request] = servicer.requests
        assert isinstance(request, pb.OpenJobRequest)
        assert request.protocol_version == PROTOCOL_VERSION
    finally:
        server.stop(0)


def test_a_reader_with_unstarted_leases_sends_nothing_and_hears_pushed_news(
        fake: tuple[FakeMaster, str]) -> None:
    servicer, address = fake
    with MasterClient(address) as client:
        session = WorkerSession(client, Join("j", "flowers")).open()
        try:
            lease_two(session, servicer)
            wait_until(lambda: not session._resync)
            before = servicer.calls.copy()
            time.sleep(1.5)  # six polls' worth of a reader before the stream
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
            assert set(servicer.calls) <= {"OpenJob", "Session", "SessionMessage.get_tasks",
                                           "SessionMessage.report"}, servicer.calls
        finally:
            session.close()


def test_a_stream_the_master_ends_is_reopened_and_told_the_leases_held(
        fake: tuple[FakeMaster, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The master ends the stream (a restart): the reader opens a new one and at once sends an
    answered heartbeat listing its held leases on it (what it missed comes in the answer);
    then it is quiet again. No call of another dialect is made meanwhile."""
    servicer, address = fake
    with MasterClient(address) as client:
        session = WorkerSession(client, Join("j", "flowers")).open()
        try:
            lease_two(session, servicer)
            servicer.events.put(_CLOSE)  # the master ends the stream
            wait_until(lambda: servicer.calls["Session"] >= 2, timeout=5.0)  # reopened
            wait_until(lambda: servicer.calls["SessionMessage.report"] >= 1, timeout=5.0)
            heartbeat = [q for q in servicer.requests if isinstance(q, pb.ReportRequest)][-1]
            assert {(t.partition, t.lease) for t in heartbeat.held} == {(1, 11), (2, 12)}
            wait_until(lambda: session.transport.up and not session._resync)
            before = servicer.calls.copy()
            time.sleep(1.0)
            assert servicer.calls == before  # up again: quiet again
            assert set(servicer.calls) <= {"OpenJob", "Session", "SessionMessage.get_tasks",
                                           "SessionMessage.report"}, servicer.calls
        finally:
            session.close()


def test_stats_ride_on_every_request_and_heartbeat(fake: tuple[FakeMaster, str]) -> None:
    servicer, address = fake
    figures = iter(range(1, 1000))
    with MasterClient(address) as client:
        session = WorkerSession(client, Join("j", "flowers"),
                                stats=lambda: pb.ReaderStats(batches=next(figures))).open()
        try:
            lease_two(session, servicer)
            session.send()
        finally:
            session.close()
    sent = [r for r in servicer.requests
            if isinstance(r, (pb.GetTasksRequest, pb.ReportRequest))]
    assert len(sent) >= 3  # the request for tasks, the heartbeat, and close()'s
    assert all(r.HasField("stats") and r.stats.batches > 0 for r in sent)
    batches = [r.stats.batches for r in sent]
    assert batches == sorted(batches) and len(set(batches)) == len(batches)  # asked each time


def test_a_broken_group_or_a_supersession_pushed_on_the_stream_ends_the_passes(
        fake: tuple[FakeMaster, str]) -> None:
    servicer, address = fake
    with MasterClient(address) as client:
        session = WorkerSession(client, Join("j", "flowers")).open()
        try:
            wait_until(lambda: session.transport.up)
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


def test_an_unanswered_heartbeat_reopens_the_stream_and_goes_again(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A DONE sent on the Session stream whose answer does not come: after ANSWER_TIMEOUT_S the
    stream is reopened (logged: nothing waits silently) and the DONE goes again on the new
    one; its answer confirms it."""
    monkeypatch.setattr(session_module, "ANSWER_TIMEOUT_S", 0.5)
    servicer = FakeMaster()
    server, address = serve(servicer)
    try:
        with MasterClient(address) as client:
            session = WorkerSession(client, Join("j", "flowers")).open()
            try:
                lease_two(session, servicer)
                servicer.mute = True
                session.set_fetching(False)
                session.report_done(done_task(session, 1, 11))
                wait_until(lambda: servicer.calls["SessionMessage.report"] >= 1, timeout=5.0)
                wait_until(lambda: servicer.calls["Session"] >= 2, timeout=5.0)  # reopened
                assert "did not answer a heartbeat" in caplog.text
                servicer.mute = False
                wait_until(lambda: session.held() == {(0, 2): 12})  # the answer confirmed it
                dones = [r for r in servicer.reports() if r.outcome == pb.TaskReport.DONE]
                assert len(dones) >= 2 and {(r.partition, r.lease) for r in dones} == {(1, 11)}
            finally:
                session.close()
    finally:
        server.stop(0)


def test_a_stream_refused_for_its_session_ends_the_passes_naming_the_master() -> None:
    """A master that refuses the stream (PERMISSION_DENIED: it does not know the session's
    secret) is not asked again and again: the session's passes end with its refusal."""

    class Refusing(FakeMaster):
        def Session(self, request_iterator: Iterator[pb.SessionMessage],
                    context: grpc.ServicerContext) -> Iterator[pb.WatchEvent]:
            self._count("Session", next(request_iterator).open)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "no such session")
            yield pb.WatchEvent()  # (unreached: makes this a generator)

    servicer = Refusing()
    server, address = serve(servicer)
    try:
        with MasterClient(address) as client:
            session = WorkerSession(client, Join("j", "flowers")).open()
            try:
                with pytest.raises(JobError, match=r"refused the Session stream.*"
                                                   r"PERMISSION_DENIED: no such session"):
                    session.get_tasks(0, 1, 0, 0)
                with pytest.raises(JobError, match="PERMISSION_DENIED"):
                    session.check()
                assert servicer.calls["Session"] == 1
            finally:
                session.close()
    finally:
        server.stop(0)


def test_reopened_session_streams_leave_no_thread_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC feeds a stream's messages from a thread of its own, blocked on the session's queue
    until told the stream is over: a reader whose stream broke 70 times had 70 more threads."""
    monkeypatch.setattr(transport_module, "RETRY_MIN_S", 0.01)
    monkeypatch.setattr(transport_module, "RETRY_MAX_S", 0.05)
    monkeypatch.setattr(session_module, "HAND_BACK_S", 0.5)  # (no stream answers its close)
    servicer = FakeMaster(close_at_once=True)
    server, address = serve(servicer)
    try:
        with MasterClient(address) as client:
            session = WorkerSession(client, Join("j", "flowers")).open()
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


def test_a_stream_that_stays_down_says_why_and_until_when_then_gives_up(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No silent waits (issue 26): a stream the master keeps refusing as UNAVAILABLE (a master
    restarting) is reopened with backoff, logged with why and until when once it was down
    WAIT_LOG_S; after the client's give-up time the session's passes end, naming the master."""
    monkeypatch.setattr(transport_module, "WAIT_LOG_S", 0.3)

    class Restarting(FakeMaster):
        def Session(self, request_iterator: Iterator[pb.SessionMessage],
                    context: grpc.ServicerContext) -> Iterator[pb.WatchEvent]:
            self._count("Session", next(request_iterator).open)
            context.abort(grpc.StatusCode.UNAVAILABLE, "the master is restarting")
            yield pb.WatchEvent()  # (unreached: makes this a generator)

    servicer = Restarting()
    server, address = serve(servicer)
    try:
        with MasterClient(address, give_up_s=1.5) as client:
            session = WorkerSession(client, Join("j", "flowers")).open()
            try:
                with pytest.raises(MasterUnavailableError, match=rf"master {address} "
                                   r"unreachable for \d+ s \(UNAVAILABLE: the master is "
                                   r"restarting\).*TRAINFEED_MASTER_GIVE_UP_S=1.5"):
                    session.get_tasks(0, 1, 0, 0)
                assert servicer.calls["Session"] >= 3  # reopened, with backoff
                assert re.search(r"the Session stream to master \S+ is down for \d+ s "
                                 r"\(UNAVAILABLE: the master is restarting\); reopening it "
                                 r"until \d\d:\d\d:\d\d", caplog.text), caplog.text
                with pytest.raises(MasterUnavailableError):
                    session.check()
            finally:
                session.close()
    finally:
        server.stop(0)


def test_a_client_closed_under_the_session_ends_its_stream_quietly(
        fake: tuple[FakeMaster, str], caplog: pytest.LogCaptureFixture) -> None:
    """Its client closed first (a process going down; tests that play a killed reader do it):
    the stream is not reopened again and again against a closed channel, nothing is logged as
    a master that is down, and what waits on the stream raises."""
    servicer, address = fake
    client = MasterClient(address)
    session = WorkerSession(client, Join("j", "flowers")).open()
    try:
        wait_until(lambda: session.transport.up)
        client.close()
        wait_until(lambda: session.transport.error is not None)
        opened = servicer.calls["Session"]
        time.sleep(0.5)
        assert servicer.calls["Session"] == opened
        with pytest.raises(CallCancelled, match="was closed"):
            session.get_tasks(0, 1, 0, 0)
        assert "is down for" not in caplog.text
    finally:
        session.close()


# A script that opens a session against the master at argv[1], leases two partitions, and
# exits without closing it (the README's train.py). With argv[2] == "fork" it first forks a
# child that exits at once (a DataLoader worker), says so, and waits for a line on stdin.
EXIT_WITHOUT_CLOSE = """
import os, sys
from trainfeed.lease.client import MasterClient
from trainfeed.lease.session import CLOSE_BOUND_S, Join, WorkerSession
session = WorkerSession(MasterClient(sys.argv[1]), Join("j", "flowers")).open()
session.get_tasks(0, 2, 0, 0)
print("held", sorted(session.held()), flush=True)
if sys.argv[2] == "mute":  # the test mutes the master, then lets the script end
    sys.stdin.readline()
if sys.argv[2] == "fork":
    child = os.fork()
    if child == 0:
        from trainfeed.lease import shutdown
        print("child would close", len(shutdown._SESSIONS), flush=True)
        sys.exit(0)  # a normal exit: the interpreter's atexit hooks run in the child
    os.waitpid(child, 0)
    print("child exited", flush=True)
    sys.stdin.readline()
"""


def exit_without_close(fake: tuple[FakeMaster, str], mode: str) -> subprocess.Popen[str]:
    """EXIT_WITHOUT_CLOSE against `fake`, which grants it partitions 1 and 2."""
    servicer, address = fake
    servicer.grant = [pb.Task(epoch=0, partition=p, lease=10 + p, num_records=8) for p in (1, 2)]
    return subprocess.Popen([sys.executable, "-c", EXIT_WITHOUT_CLOSE, address, mode],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def seconds_of_day(t: time.struct_time) -> int:
    return t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec


def test_an_exit_held_up_by_a_master_that_does_not_answer_says_until_when(
        fake: tuple[FakeMaster, str]) -> None:
    """No silent waits (issue 38): a script ending while its master stopped answering waits at
    exit for its hand-back. After 5 s it says what it waits for and by when it gives up, and it
    ends by then (the bound is CLOSE_BOUND_S per session: reporter, hand-back, one LeaveJob)."""
    servicer, _ = fake
    proc = exit_without_close(fake, "mute")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("held")
        servicer.mute = True
        _, err = proc.communicate("\n", timeout=300)
        ended = time.time()
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    said = re.search(r"exiting: still handing the tasks of 1 reader\(s\) back to the master "
                     r"\(reports, then LeaveJob\) since (\d\d:\d\d:\d\d); a master that does "
                     r"not answer is given up by (\d\d:\d\d:\d\d) at the latest", err)
    assert said, err
    since, latest = (seconds_of_day(time.strptime(t, "%H:%M:%S")) for t in said.groups())
    assert (latest - since) % 86400 == CLOSE_BOUND_S
    # It kept its word, to the second the message shows (modulo a day: a run past midnight).
    assert (latest + 1 - seconds_of_day(time.localtime(ended))) % 86400 < 43200
    assert "could not hand tasks back on close" in err
    assert servicer.calls["LeaveJob"] == 0, servicer.calls


def test_a_script_that_exits_without_closing_hands_its_leases_back_and_leaves(
        fake: tuple[FakeMaster, str]) -> None:
    """Issue 38: nothing else sends a session's last reports when its script ends without
    `reader.close()` (a daemon reporter, a Reader in a reference cycle), so the master saw a
    synchronous rank go silent inside an epoch and called a finished group broken."""
    servicer, _ = fake
    proc = exit_without_close(fake, "plain")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert "held [(0, 1), (0, 2)]" in out
    assert servicer.calls["LeaveJob"] == 1, servicer.calls
    [leave] = [q for q in servicer.requests if isinstance(q, pb.LeaveJobRequest)]
    assert leave.worker_id == "w1"


def test_a_forked_child_that_exits_does_not_close_its_parents_session(
        fake: tuple[FakeMaster, str]) -> None:
    """A DataLoader worker is a fork of the process that opened the session: its exit must not
    hand back the parent's leases (the master would think the parent left)."""
    servicer, _ = fake
    proc = exit_without_close(fake, "fork")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("held")
        # (Without forgetting them, its close fails: gRPC does not work in a forked child.)
        assert proc.stdout.readline().strip() == "child would close 0"
        assert proc.stdout.readline().strip() == "child exited"
        # The child's exit is over (waited for): a LeaveJob of its own would have been answered.
        assert servicer.calls["LeaveJob"] == 0, servicer.calls
        out, _ = proc.communicate("\n", timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert servicer.calls["LeaveJob"] == 1, servicer.calls
