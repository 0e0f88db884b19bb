"""Grants on the Session stream (issues 28, 36): a reader asks for its leases as `get_tasks`
messages of its Session stream, and the master answers each with a grant (fenced, once durable), so
that a partition costs stream messages instead of a unary call (protocol 3 has no other way).

- With the stream up, a reader's passes open no other stream (the master's own call metrics),
  long-polls at the epoch's tail included, and deliver every record exactly once.
- A stream that keeps breaking (cancelled every few hundred ms, grants in flight with it) is
  reopened, with no call of another dialect, and every record is still delivered exactly once;
  so is a master killed mid-epoch and restarted on its state (the master's side of the stream
  breaks: issue 36).
- Over the wire: a `get_tasks` message is answered with a grant whose leases are the session's
  (a heartbeat with its token is taken); a report on another session's token in it is refused:
  listed (`refused`, and the grant's `revoked`), it changes nothing.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from integration.services import free_port
from sample_data import make_image_list
from test_push_watch import calls, session_of, wait_until

from trainfeed import MasterSource, dist
from trainfeed.lease import transport as transport_module
from trainfeed.lease.client import MasterClient, tasks_request
from trainfeed.lease.session import WorkerSession
from trainfeed.master.serve.process import MasterProcess
from trainfeed.master.serve.service import MAX_GRANTS_IN_FLIGHT
from trainfeed.upload import UploadOptions, upload
from trainfeed.v1 import master_pb2 as pb

RECORDS = 64  # 16 partitions of 4
pytestmark = pytest.mark.integration


@pytest.fixture
def master4(tmp_path: Path) -> Iterator[MasterProcess]:
    """A master with its defaults over 64 records in 16 partitions of 4."""
    source = make_image_list(tmp_path / "source", RECORDS)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=4), progress=False)
    with MasterProcess(storage) as master:
        yield master


def read_epochs(reader: Any, epochs: int, got: Counter[tuple[int, int]],
                between: Callable[[], None] = lambda: None) -> None:
    """`epochs` whole passes of batches of 4, counting (epoch, id) in `got`."""
    for _ in range(epochs):
        for batch in reader.column_batches(4):
            for record in batch["_id"].tolist():
                got[(int(reader.epoch or 0), int(record))] += 1
            between()


def first_batch(reader: Any, got: Counter[tuple[int, int]]
                ) -> tuple[Iterator[Any], int, WorkerSession]:
    """Starts a pass of batches of 4: its first batch counted in `got`, once the master said it
    grants on the stream. Returns the pass's other batches, its epoch and the reader's session."""
    batches = iter(reader.column_batches(4))
    first = next(batches)
    epoch = int(reader.epoch or 0)
    for record in first["_id"].tolist():
        got[(epoch, int(record))] += 1
    session = session_of(reader)
    wait_until(lambda: session.transport.up, 10, "the Session stream is up")
    return batches, epoch, session


def assert_exactly_once(got: Counter[tuple[int, int]], epochs: int) -> None:
    """Every record of each of `epochs` epochs delivered once."""
    seen = sorted({e for e, _ in got})
    assert len(seen) == epochs, seen
    for e in seen:
        ids = Counter(r for (ep, r), n in got.items() if ep == e for _ in range(n))
        assert sorted(ids) == list(range(RECORDS)) and set(ids.values()) == {1}, (e, ids)


def test_a_reader_with_its_stream_up_makes_no_get_tasks_calls(master4: MasterProcess) -> None:
    reader = dist.reader("flowers", source=MasterSource(master4.address, "grants",
                                                        prefetch_partitions=2))
    got: Counter[tuple[int, int]] = Counter()
    try:
        batches, epoch, session = first_batch(reader, got)
        before = calls(master4)
        for batch in batches:  # the rest of the first pass, tail long-poll included
            for record in batch["_id"].tolist():
                got[(epoch, int(record))] += 1
        read_epochs(reader, 2, got)  # two more whole passes
        after = calls(master4)
    finally:
        reader.close()
    assert after.get("Session", 0) == before.get("Session", 0), \
        f"{after.get('Session', 0) - before.get('Session', 0):.0f} other streams ended"
    assert set(after) <= {"OpenJob", "Session", "LeaveJob", "GetJobStatus", "Check"}, after
    assert session.grants_on_stream >= 3 * RECORDS // 4 // 2  # (up to 2 partitions a grant)
    assert_exactly_once(got, 3)


def test_a_breaking_stream_is_reopened_and_delivers_exactly_once(
        master4: MasterProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "RETRY_MIN_S", 0.05)
    monkeypatch.setattr(transport_module, "RETRY_MAX_S", 0.2)
    reader = dist.reader("flowers", source=MasterSource(master4.address, "breaking",
                                                        prefetch_partitions=2))
    got: Counter[tuple[int, int]] = Counter()
    stop = threading.Event()
    breaks = [0]

    def breaker() -> None:  # cancels the reader's Session stream every 0.15-0.3 s
        while not stop.wait(0.15 + 0.15 * (breaks[0] % 2)):
            if session.transport.up:
                session.transport.reconnect()
                breaks[0] += 1

    try:
        batches, epoch, session = first_batch(reader, got)
        before = calls(master4)
        thread = threading.Thread(target=breaker, daemon=True)
        thread.start()
        for batch in batches:
            for record in batch["_id"].tolist():
                got[(epoch, int(record))] += 1
            time.sleep(0.02)
        read_epochs(reader, 2, got, between=lambda: time.sleep(0.02))
        stop.set()
        thread.join(5)
        after = calls(master4)
    finally:
        stop.set()
        reader.close()
    assert breaks[0] >= 3, breaks
    # (Each break needs a stream up: one opened after the last break may come too late.)
    assert session.transport.opened >= breaks[0], "a broken stream was not reopened"
    for method in ("GetTasks", "Report", "Watch"):  # no other dialect while it was down
        assert after.get(method, 0) == before.get(method, 0), (method, before, after)
    assert set(after) <= {"OpenJob", "LeaveJob", "GetJobStatus", "Check"}, after
    assert session.grants_on_stream >= 1
    assert_exactly_once(got, 3)


def test_a_master_restarted_mid_epoch_breaks_the_stream_and_the_reader_reconnects(
        tmp_path: Path) -> None:
    """The master's side of the stream goes away mid-epoch (its process killed, then started
    again on its state): the reader reopens its stream with its session's secret, re-sends what
    the lost stream carried, and every record of every epoch is delivered exactly once."""
    source = make_image_list(tmp_path / "source", RECORDS)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=4), progress=False)
    state, port = f"sqlite:///{tmp_path / 'master.db'}", free_port()
    master = MasterProcess(storage, state=state, port=port)
    reader = dist.reader("flowers", source=MasterSource(master.address, "restart",
                                                        prefetch_partitions=2))
    got: Counter[tuple[int, int]] = Counter()
    try:
        batches, epoch, session = first_batch(reader, got)
        for _, batch in zip(range(3), batches):  # a few batches into epoch 0
            for record in batch["_id"].tolist():
                got[(epoch, int(record))] += 1
        opened = session.transport.opened
        master.kill()
        master = MasterProcess(storage, state=state, port=port)
        for batch in batches:  # the rest of the epoch, across the restart
            for record in batch["_id"].tolist():
                got[(epoch, int(record))] += 1
        read_epochs(reader, 1, got)
        assert session.transport.opened > opened, "the stream was not reopened"
        assert calls(master).get("GetTasks", 0) == calls(master).get("Report", 0) == 0
    finally:
        reader.close()
        master.stop()
    assert_exactly_once(got, 2)


# -- over the wire -------------------------------------------------------------------------------
def read_events(call: Any) -> queue.Queue[pb.WatchEvent | grpc.RpcError]:
    """A Session stream's events (or its error) on a queue, read by a thread."""
    events: queue.Queue[pb.WatchEvent | grpc.RpcError] = queue.Queue()

    def read() -> None:
        try:
            for event in call:
                events.put(event)
        except grpc.RpcError as e:
            events.put(e)
    threading.Thread(target=read, daemon=True).start()
    return events


def grant_answer(events: queue.Queue[pb.WatchEvent | grpc.RpcError], seq: int) -> pb.WatchEvent:
    while True:
        event = events.get(timeout=10)
        assert isinstance(event, pb.WatchEvent), event
        if event.answers == seq:
            return event


def test_a_grant_on_the_stream_is_fenced_as_a_call(master4: MasterProcess) -> None:
    with MasterClient(master4.address, give_up_s=10) as client:
        worker = client.open_job("wire", "flowers", seed=0).worker_id
        other = client.open_job("wire", "flowers", seed=0).worker_id
        call = client.session("wire", worker)
        events = read_events(call)
        try:
            opened = events.get(timeout=10)
            assert isinstance(opened, pb.WatchEvent) and opened.grants, opened
            call.send(pb.SessionMessage(seq=1, get_tasks=tasks_request(
                0, 2, 0, [], [], 0, (), None, None)))
            grant = grant_answer(events, 1)
            assert not grant.grant_refused, grant.grant_refused
            assert grant.grant.status == pb.GetTasksResponse.TASKS
            mine = list(grant.grant.tasks)
            assert len(mine) == 2 and all(t.lease for t in mine)
            # The leases are the session's: a heartbeat with their tokens is taken.
            held = [(t.epoch, t.partition, t.lease) for t in mine]
            reported = client.report("wire", worker, [pb.TaskReport(
                epoch=0, partition=mine[0].partition, lease=mine[0].lease,
                outcome=pb.TaskReport.DONE)], held)
            assert not reported.revoked, reported
            # Another session's grant is not this one's: its token on this stream is refused.
            [theirs] = client.get_tasks("wire", other, 0, 1, 0).tasks
            done_before = client.job_status("wire").done
            refused_before = client.job_status("wire").reports_refused
            call.send(pb.SessionMessage(seq=2, get_tasks=tasks_request(
                0, 1, 0, [pb.TaskReport(epoch=0, partition=theirs.partition, lease=theirs.lease,
                                        outcome=pb.TaskReport.DONE)],
                held[1:], 0, (), None, None)))
            refused = grant_answer(events, 2)
            stale = [(0, theirs.partition, theirs.lease)]
            assert not refused.grant_refused, refused
            assert [(t.epoch, t.partition, t.lease) for t in refused.refused] == stale
            assert refused.refused_count == 1
            assert [(t.epoch, t.partition, t.lease) for t in refused.grant.revoked] == stale
            # ... and changed nothing: the partition is not done, the other still holds it.
            assert client.job_status("wire").done == done_before
            assert client.job_status("wire").reports_refused == refused_before + 1
            assert not client.report("wire", other, [], [(0, theirs.partition, theirs.lease)]
                                     ).revoked
        finally:
            call.cancel()


def test_a_stream_asking_more_grants_than_the_bound_is_refused_at_once(
        master4: MasterProcess) -> None:
    """A session flooding its stream with long-polling `get_tasks` messages gets a task on the
    master for at most MAX_GRANTS_IN_FLIGHT of them; the rest are refused at once
    (RESOURCE_EXHAUSTED, which a reader answers by making the call), not held open each."""
    flood = MAX_GRANTS_IN_FLIGHT + 4
    with MasterClient(master4.address, give_up_s=10) as client:
        worker = client.open_job("flood", "flowers", seed=0).worker_id
        mine = client.get_tasks("flood", worker, 0, 16, 0).tasks  # every partition: polls wait
        held = [(t.epoch, t.partition, t.lease) for t in mine]
        assert len(held) == 16
        call = client.session("flood", worker)
        events = read_events(call)
        try:
            opened = events.get(timeout=10)
            assert isinstance(opened, pb.WatchEvent) and opened.grants, opened
            for seq in range(1, flood + 1):
                call.send(pb.SessionMessage(seq=seq, get_tasks=tasks_request(
                    0, 1, 4000, [], held, 0, (), None, None)))
            answered: list[pb.WatchEvent] = []
            while len(answered) < flood:
                event = events.get(timeout=20)
                assert isinstance(event, pb.WatchEvent), event
                if event.answers:
                    answered.append(event)
        finally:
            call.cancel()
    # The messages past the bound were answered first, refused; the long-polls after them.
    refused, polled = answered[:4], answered[4:]
    assert {e.answers for e in refused} == set(range(MAX_GRANTS_IN_FLIGHT + 1, flood + 1))
    assert all(e.grant_refused.startswith("RESOURCE_EXHAUSTED") for e in refused), refused
    assert all(not e.grant_refused and not e.grant.tasks for e in polled), polled
