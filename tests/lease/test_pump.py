"""The progress pump (trainfeed.lease.pump): several sessions' unanswered progress goes as one
Session message per tick, and a stream that broke after carrying some has every session whose
progress rode it send its progress again."""
from __future__ import annotations

import time

from trainfeed.lease.pump import PUMP_S, ProgressPump
from trainfeed.v1 import master_pb2 as pb


class Stream:
    """What the pump sends on: a Session stream's `send`, recorded."""

    def __init__(self) -> None:
        self.sent: list[pb.SessionMessage] = []

    def send(self, message: pb.SessionMessage) -> None:
        self.sent.append(message)


def progress(worker: str, consumed: int) -> pb.ReportRequest:
    return pb.ReportRequest(worker_id=worker, session_secret=f"secret-{worker}", reports=[
        pb.TaskReport(epoch=0, partition=1, lease=7, outcome=pb.TaskReport.PROGRESS,
                      consumed=consumed)])


def wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_progress_of_several_sessions_goes_as_one_message_a_tick() -> None:
    pump, stream = ProgressPump("t"), Stream()
    assert not pump.put(progress("a", 1), lambda: None)  # no stream: the session sends it
    pump.attach("a", stream)
    started = time.monotonic()
    for worker, consumed in (("a", 3), ("b", 2), ("c", 9)):
        assert pump.put(progress(worker, consumed), lambda: None)
    wait_for(lambda: stream.sent)
    assert time.monotonic() - started >= PUMP_S * 0.9
    [message] = stream.sent
    assert not message.seq and not message.HasField("report")
    assert [(e.worker_id, e.reports[0].consumed) for e in message.progress_of] == [
        ("a", 3), ("b", 2), ("c", 9)]
    assert pump.messages == 1


def test_a_broken_stream_has_the_sessions_it_carried_send_again() -> None:
    pump, first, second = ProgressPump("t"), Stream(), Stream()
    lost: list[str] = []
    pump.attach("a", first)
    assert pump.put(progress("b", 2), lambda: lost.append("b"))
    wait_for(lambda: first.sent)
    pump.attach("c", second)
    pump.detach("c", second)  # carried nothing: nobody is told
    assert lost == []
    pump.detach("a", first)  # carried b's progress: b sends it again
    assert lost == ["b"]
    assert not pump.put(progress("b", 3), lambda: None)  # no stream left
