"""Issue 26 §3, §4 and two papercuts, with a real master process:

- One job, one delivery order: the README's reader snippets run one after another in one process
  against one master (a plain reader, then one with resample="uniform" and a shuffle buffer, then
  the checkpoint restore) hung silently; now the second is refused at once, naming both option
  sets and a job of its own, and following that advice works.
- No wait over 5 s without a log line saying what for and until when: an unreachable master
  (with its retry deadline), and a pass at an epoch's end waiting for a dead reader's lease.
- A restored checkpoint's old reader is told why its leases went (not "frozen or cut off").
- The TLS hint is not given on a plain "connection refused".
"""
from __future__ import annotations

import itertools
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from machine_load import hang_bound, latency_bound

from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LabelOptions,
    MasterSource,
    PipelineOptions,
    SamplingOptions,
    batch,
    dist,
)
from trainfeed.errors import DeliveryOrderError, MasterUnavailableError, SupersededError
from trainfeed.lease.client import WAIT_LOG_EVERY_S, WAIT_LOG_S, MasterClient
from trainfeed.master.serve.process import MasterProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]
# What the issue asks: a log line once a wait passes 5 s (WAIT_LOG_S); allow 1.5 s for the
# scheduler, scaled to the load (the logging thread's latency: beside stress-ng a process waits
# seconds for a core).
LOG_SLACK_S = 1.5


def log_within() -> float:
    """How long after a wait began its log line may come: 6.5 s on an idle machine."""
    return WAIT_LOG_S + latency_bound(LOG_SLACK_S)


@pytest.fixture
def master(storage: str) -> Any:
    with MasterProcess(storage, extra_args=["--lease-timeout", "12"]) as m:
        yield m


def logged(caplog: pytest.LogCaptureFixture, pattern: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if re.search(pattern, r.getMessage())]


@pytest.mark.timeout(180)
def test_the_readme_snippets_in_one_process_get_a_clear_error_not_a_hang(
        master: MasterProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINFEED_MASTER", master.address)
    for name in ("TRAIN_LOCAL", "TRAINFEED_JOB"):
        monkeypatch.delenv(name, raising=False)
    # "The training script"
    reader = dist.reader("flowers")
    for _ in range(2):
        assert len(list(reader())) == 100
    assert sum(len(m) for m in batch(reader, 128)()) == 100
    assert sum(len(c["_id"]) for c in batch(reader, 128, columnar=True)()) == 100
    saved = reader.state_dict()
    # "Ready mini-batches of arrays": another delivery order in the same (default) job.
    pipeline = PipelineOptions(
        decode=DecodeOptions(True, image_size=(64, 64), normalizing_const=255.0),
        labels=LabelOptions(one_hot=True),
        sampling=SamplingOptions(shuffle_buffer=10_000, resample="uniform"),
        batch=BatchOptions(size=128))
    started = time.monotonic()
    with pytest.raises(DeliveryOrderError) as refused:
        list(dist.reader("flowers", source=MasterSource(seed=0), pipeline=pipeline)())
    # At once, not after a wait (the lease's 12 s): a few calls, scaled to the load.
    assert time.monotonic() - started < latency_bound(15)
    message = str(refused.value)
    assert "job 'default' is read with seed=0, shuffle_buffer=0, resample=None" in message
    assert 'asks for seed=0, shuffle_buffer=10000, resample="uniform"' in message
    job = re.search(r"TRAINFEED_JOB=(\S+)", message)
    assert job and job.group(1).startswith("default-"), message
    # Its advice works: the job of its own reads its (resampled) epoch.
    own = dist.reader("flowers", source=MasterSource(job=job.group(1), seed=0),
                      pipeline=pipeline)
    assert sum(len(b["_id"]) for b in own()) > 0
    own.close()
    # "Checkpoints": the restore snippet, in the default job, goes on.
    restored = dist.reader("flowers", state=saved)
    assert sorted(int(i) for c in batch(restored, 50, columnar=True)() for i in c["_id"]) \
        == list(range(100))
    restored.close()
    reader.close()


def test_an_unreachable_master_is_logged_with_its_retry_deadline(
        caplog: pytest.LogCaptureFixture) -> None:
    """And the error of a plain "connection refused" carries no TLS hint (papercut)."""
    caplog.set_level(logging.INFO)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    # It logs on the first retry past WAIT_LOG_S before it gives up: 3 s for that retry on an
    # idle machine (8 s in all), scaled to the load, but short of a second line.
    give_up = round(min(WAIT_LOG_S + latency_bound(3), WAIT_LOG_S + WAIT_LOG_EVERY_S - 1), 1)
    started = time.time()
    with MasterClient(f"127.0.0.1:{port}", give_up_s=give_up) as client, \
            pytest.raises(MasterUnavailableError) as e:
        client.job_status("j")
    assert "TLS" not in str(e.value), str(e.value)
    (line,) = logged(caplog, r"unreachable for \d+ s .*retrying until \d\d:\d\d:\d\d")
    assert line.created - started <= log_within(), line.created - started
    assert f"TRAINFEED_MASTER_GIVE_UP_S={give_up:g}" in line.getMessage()


READER_A = """
import sys, time
from trainfeed import BatchOptions, MasterSource, PipelineOptions, dist
reader = dist.reader("flowers", source=MasterSource(sys.argv[1], job="tail", prefetch_partitions=4),
                     pipeline=PipelineOptions(batch=BatchOptions(size=10)))
batches = iter(reader())
next(batches)
print("ready", flush=True)
time.sleep(3600)
"""


def test_a_dead_readers_lease_at_the_epochs_end_is_logged_with_its_holder_and_time(
        storage: str, caplog: pytest.LogCaptureFixture) -> None:
    """B's pass says it waits for the dead A's lease, and until when, while that lease still
    runs: so B must reach the epoch's end and wait WAIT_LOG_S within A's lease timeout. Its lease
    is those 5 s and 7 s for B to start and read its share (scaled to the load: beside stress-ng
    B's share took longer than the 12 s lease of the other tests, and nothing was said)."""
    caplog.set_level(logging.INFO)
    lease = WAIT_LOG_S + latency_bound(7)
    with MasterProcess(storage, extra_args=["--lease-timeout", f"{lease:.1f}"]) as master:
        read_after_a_dead_reader(master, caplog)


def read_after_a_dead_reader(master: MasterProcess, caplog: pytest.LogCaptureFixture) -> None:
    a = subprocess.Popen([sys.executable, "-c", READER_A, master.address],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert a.stdout is not None and a.stdout.readline().strip() == "ready"
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        reader = dist.reader("flowers", source=MasterSource(master.address, job="tail"),
                             pipeline=PipelineOptions(batch=BatchOptions(size=10)))
        got: list[tuple[float, int]] = []
        for b in reader():
            got.extend((time.time(), int(i)) for i in b["_id"])
        reader.close()
    finally:
        if a.poll() is None:
            a.kill()
    lines = logged(caplog, rf"waiting for partitions .*held by {re.escape(socket.gethostname())}"
                           rf":{a.pid}-\w+ until \d\d:\d\d:\d\d \(not heard from")
    assert lines, [r.getMessage() for r in caplog.records]
    # The pass waited for A's partitions once its own were delivered: said within log_within().
    before = [t for t, _ in got if t < lines[0].created]
    assert before and lines[0].created - max(before) <= log_within()
    assert len({i for _, i in got}) >= 90  # A's partitions came after its lease ran out


@pytest.mark.timeout(120)
def test_a_restored_checkpoints_old_reader_is_told_why_its_leases_went(
        master: MasterProcess, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    old = dist.reader("flowers",
                      source=MasterSource(master.address, job="restore", prefetch_partitions=4),
                      pipeline=PipelineOptions(batch=BatchOptions(size=10)))
    batches = iter(old())
    list(itertools.islice(batches, 2))
    state = old.state_dict()
    new = dist.reader("flowers", source=MasterSource(master.address, job="restore"),
                      pipeline=PipelineOptions(batch=BatchOptions(size=10)), state=state)
    rest = [int(i) for b in new() for i in b["_id"]]
    assert len(rest) == 80
    deadline = time.monotonic() + hang_bound(10)
    while not logged(caplog, "took away") and time.monotonic() < deadline:
        time.sleep(0.1)
    (line,) = logged(caplog, "took away")
    assert "a reader restored from this reader's checkpoint" in line.getMessage()
    assert "frozen" not in line.getMessage()
    # The old reader gets no more tasks (they would be delivered twice): its pass says why.
    with pytest.raises(SupersededError, match="restored from this reader's checkpoint"):
        list(batches)
    new.close()
    old.close()


@pytest.mark.timeout(120)
def test_an_epoch_held_by_a_live_reader_is_logged_with_its_holder(
        master: MasterProcess, caplog: pytest.LogCaptureFixture) -> None:
    """Reader A took 5 records of a partition and stopped (its trainer is busy): B, done with
    the rest, says within log_within() that it waits for A's partition, renewed while A lives."""
    caplog.set_level(logging.INFO)
    a = dist.reader("flowers",
                    source=MasterSource(master.address, job="held", prefetch_partitions=2),
                    pipeline=PipelineOptions(batch=BatchOptions(size=5)))
    b = dist.reader("flowers", source=MasterSource(master.address, job="held"),
                    pipeline=PipelineOptions(batch=BatchOptions(size=5)))
    try:
        a_pass = iter(a())  # kept: a pass dropped is abandoned, and hands its leases back
        taken = [int(i) for i in next(a_pass)["_id"]]
        got: list[tuple[float, int]] = []

        def read_b() -> None:
            for batch_ in b():
                now = time.time()
                got.extend((now, int(i)) for i in batch_["_id"])

        b_pass = threading.Thread(target=read_b, daemon=True)
        b_pass.start()
        deadline = time.monotonic() + hang_bound(30)
        waiting: list[logging.LogRecord] = []
        while not waiting and time.monotonic() < deadline:
            time.sleep(0.1)
            waiting = logged(caplog, r"waiting for partitions 1 held by .*"
                                     r"\(renewed while it lives\)$")
        assert waiting, [r.getMessage() for r in caplog.records]
        assert a._backend.session.worker in waiting[0].getMessage()  # A, and only A
        assert b._backend.session.worker not in waiting[0].getMessage()
        before = [t for t, _ in got if t < waiting[0].created]
        assert before and waiting[0].created - max(before) <= log_within()
        a.close()  # hands its partition back: B's pass ends with the rest of it
        b_pass.join(hang_bound(60))
        assert not b_pass.is_alive()
        b_ids = [i for _, i in got]
        # (A's batch was in its trainer's hands, never acknowledged: B may deliver it again.)
        assert len(set(b_ids)) == len(b_ids) and set(b_ids) | set(taken) == set(range(100))
    finally:
        a.close()
        b.close()
