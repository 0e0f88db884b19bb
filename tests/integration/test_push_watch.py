"""Push, not poll (issue 28), end to end: real readers against a real master process.

- A reader holding leases its trainer has not started makes no calls at all (it used to call
  every 0.25 s so that a give-back could reach it; since issue 36 it makes no call but OpenJob
  and LeaveJob: it leases, reports and heartbeats on its Session stream): counted by the
  master's own call metrics over 3 s.
- A give-back still reaches that idle reader, pushed on its Session stream: another reader that
  ran out of work gets the partitions the idle one held, and no reader makes a call for it.
- A consuming reader's heartbeats and progress are messages of its stream.
"""
from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sample_data import make_image_list

from trainfeed import MasterSource, dist
from trainfeed.lease.session import WorkerSession
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload
from trainfeed.v1 import master_pb2 as pb

RECORDS = 64  # 8 partitions of 8
pytestmark = pytest.mark.integration


def calls(master: MasterProcess) -> dict[str, float]:
    """Calls the master answered so far, by method (its trainfeed_rpc_duration_seconds)."""
    assert master.metrics_url is not None
    with urllib.request.urlopen(master.metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    return {s.labels["method"].rsplit("/", 1)[-1]: s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "trainfeed_rpc_duration_seconds_count"}


def session_of(reader: Any) -> WorkerSession:
    backend = getattr(reader, "_backend", None) or reader.backend
    return backend.session  # type: ignore[no-any-return]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterProcess]:
    source = make_image_list(tmp_path / "source", RECORDS)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    with MasterProcess(storage) as master:
        yield master


def stalled(master: MasterProcess,
            job: str) -> tuple[Any, Iterator[Any], list[int], WorkerSession]:
    """A reader whose trainer took one record and stalls: it holds leases it has not started.
    Returns the reader, its pass (batches of one record), the ids it had, and its session."""
    reader = dist.reader("flowers", source=MasterSource(master.address, job,
                                                            prefetch_partitions=8))
    try:
        batches = iter(reader.column_batches(1))
        ids = next(batches)["_id"].tolist()
        session = session_of(reader)
        wait_until(lambda: session.transport.up, 10, "the reader's Session stream is up")
        wait_until(lambda: len(session.held()) >= 2, 10, "the reader leased ahead")
    except BaseException:
        reader.close()
        raise
    return reader, batches, ids, session


def test_a_reader_with_unstarted_leases_makes_no_calls(master: MasterProcess) -> None:
    reader, batches, _, session = stalled(master, "quiet")  # (the pass lives while `batches`)
    try:
        time.sleep(1.5)  # the one record's progress goes (PROGRESS_INTERVAL_S)
        assert any(lease not in session.book.started  # type: ignore[union-attr]
                   for lease in ((*key, token) for key, token in session.held().items()))
        time.sleep(3.0)
        # It leased on its stream and holds its leases there: no call but its OpenJob.
        assert calls(master) == {"OpenJob": 1.0}, calls(master)
    finally:
        batches.close()  # type: ignore[attr-defined]
        reader.close()


def test_a_give_back_reaches_an_idle_reader_through_the_stream(master: MasterProcess) -> None:
    holder, batches, mine, session = stalled(master, "steal")
    time.sleep(1.5)  # its lease depth topped up, its progress sent: from now on it is idle
    got: list[int] = []
    thief = dist.reader("flowers", source=MasterSource(master.address, "steal",
                                                           prefetch_partitions=2))

    errors: list[BaseException] = []

    def read_thief() -> None:
        try:
            for batch in thief.column_batches(8):
                got.extend(batch["_id"].tolist())
        except BaseException as e:  # reported by the test
            errors.append(e)

    thread = threading.Thread(target=read_thief, daemon=True)
    thread.start()
    try:
        # The thief reads the partitions nobody held, then some of the holder's unstarted
        # ones, which the master asks back through the holder's stream.
        wait_until(lambda: session.book is not None and bool(session.book.given), 20,
                   "the holder gave a lease back")
        time.sleep(1.5)  # it still holds unstarted leases: a polling reader calls 6 times
        # No reader makes calls at all: the holder's hand-backs (RELEASED reports) ride its
        # Session stream as answered messages, as each is asked.
        made = calls(master)
        assert not any(made.get(m, 0) for m in ("GetTasks", "Report", "Watch")), made
        # The holder's trainer goes on: the epoch completes, every record exactly once.
        for batch in batches:
            mine.extend(batch["_id"].tolist())
        thread.join(60)
        assert not thread.is_alive() and not errors, f"the thief's pass did not end: {errors}"
        assert sorted(mine + got) == list(range(RECORDS))
    finally:
        holder.close()
        thread.join(30)
        thief.close()


def test_a_consuming_reader_heartbeats_and_reports_progress_on_its_stream(
        tmp_path: Path) -> None:
    """A reader whose trainer consumes steadily inside a partition, with a 1.5 s lease timeout
    (a heartbeat every 0.5 s): its heartbeats and progress are messages of its Session stream,
    not Report calls; the heartbeats' answers keep its leases sure, and none expires."""
    source = make_image_list(tmp_path / "source", 128)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=64), progress=False)
    with MasterProcess(storage, extra_args=["--lease-timeout", "1.5",
                                            "--partitions", "2"]) as master:
        reader = dist.reader("flowers", source=MasterSource(master.address, "steady"))
        batches = iter(reader.column_batches(1))
        try:
            next(batches)
            session = session_of(reader)
            wait_until(lambda: session.transport.up, 10, "the Session stream is up")
            carrier = session.transport._stream
            assert carrier is not None
            sent: list[pb.SessionMessage] = []
            send = carrier.send

            def counted(message: pb.SessionMessage) -> None:
                sent.append(message)
                send(message)
            carrier.send = counted  # type: ignore[method-assign]
            before = calls(master)
            for _ in range(30):  # 3 s, 30 records of the first 64-record partition
                next(batches)
                time.sleep(0.1)
            after = calls(master)
            assert after.get("Report", 0) == before.get("Report", 0), (before, after)
            answered = [m for m in sent if m.seq]
            progress = [m for m in sent if any(r.outcome == pb.TaskReport.PROGRESS
                                               for r in m.report.reports)]
            assert len(answered) >= 4, f"{len(answered)} heartbeats in 3 s"
            assert len(progress) >= 2, f"{len(progress)} progress messages in 3 s"
            assert session.book is not None and session.book.sure_until > time.monotonic()
            assert "expired" not in "".join(master.log)
        finally:
            batches.close()  # type: ignore[attr-defined]
            reader.close()
