"""The input-bound share a reader measures (issue 29) against a trainer that times its own waits.

The trainer below asks for each batch with its own stopwatch around `next()` and "trains" for a
fixed time per batch, while storage reads are slowed so that it waits about half the time. The
reader's `stats().input_bound` (TRAIN_LOCAL, and through a master) and the master's figure for
that reader on `/status.json` must agree with the trainer's own within 5 points.

Both times are scaled to the load (machine_load.latency_bound): what the trainer and the meter do
not time alike (setting up a pass before the meter's first look, the moment a summary is taken
after the pass) is CPU work and scheduling, seconds of it beside stress-ng, and must stay a small
share of the wall time, as it is on an idle machine."""
from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from machine_load import hang_bound, latency_bound

from trainfeed import LocalSource, MasterSource, dist
from trainfeed.io.partition_reader import PartitionReader
from trainfeed.master.serve.process import MasterProcess

pytestmark = [pytest.mark.integration, pytest.mark.timing]

# Seconds per partition read (10 records) and per batch of training (5 records): the trainer
# waits for about half of each partition's time.
# (On an idle machine; `pace` scales both.)
READ_S = 0.12
TRAIN_S = 0.03


@pytest.fixture
def pace() -> tuple[float, float]:
    """(seconds per partition read, per batch of training), scaled to the load now."""
    factor = latency_bound(1.0)
    return READ_S * factor, TRAIN_S * factor


@pytest.fixture
def slow_storage(monkeypatch: pytest.MonkeyPatch, pace: tuple[float, float]) -> None:
    read = PartitionReader.read
    read_s = pace[0]

    def slow(self: PartitionReader, *args: Any, **kwargs: Any) -> Any:
        time.sleep(read_s)
        return read(self, *args, **kwargs)
    monkeypatch.setattr(PartitionReader, "read", slow)


def train(reader: Any, train_s: float) -> tuple[float, float, int]:
    """One pass, timed by the trainer: (its wait, its wall time, records)."""
    waited = 0.0
    records = 0
    batches = iter(reader.column_batches(5))
    started = time.perf_counter()
    while True:
        asked = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            waited += time.perf_counter() - asked
            break
        waited += time.perf_counter() - asked
        records += len(batch["_id"])
        time.sleep(train_s)
    return waited, time.perf_counter() - started, records


def check_share(reader: Any, pace: tuple[float, float]) -> float:
    read_s, train_s = pace
    waited, wall, records = train(reader, train_s)
    assert records == 100
    own = waited / wall
    stats = reader.stats()
    assert 0.25 < own < 0.85, f"the throttle should make the trainer wait about half: {own:.2f}"
    assert abs(stats.input_bound - own) < 0.05, (stats, own)
    assert stats.records == 100 and stats.bytes_read > 0 and stats.read_s >= 10 * read_s * 0.9
    return own


def test_a_local_reader_measures_its_trainers_wait(storage: str, slow_storage: None,
                                                  pace: tuple[float, float],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAIN_LOCAL", "1")
    reader = dist.reader("flowers", source=LocalSource(storage=storage, prefetch_partitions=1))
    try:
        check_share(reader, pace)
    finally:
        reader.close()


def test_the_master_gets_the_share_a_reader_measures(storage: str, slow_storage: None,
                                                     pace: tuple[float, float]) -> None:
    with MasterProcess(storage) as master:  # (heartbeats every 10 s: few while it runs)
        reader = dist.reader("flowers", source=MasterSource(master.address, "waits",
                                                            prefetch_partitions=1))
        try:
            own = check_share(reader, pace)
            # The pass's last DONE goes with a Report soon after its end, with the last summary.
            deadline = time.monotonic() + hang_bound(10)
            url = master.metrics_url.replace("/metrics", "/status.json")  # type: ignore
            while True:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    job = json.load(answer)["jobs"][0]
                if job["readers"] and job["readers"][0]["records"] == 100:
                    break
                assert time.monotonic() < deadline, job
                time.sleep(0.1)
            assert job["job"] == "waits" and len(job["readers"]) == 1
            assert abs(job["input_wait_s"] / job["wall_s"] - own) < 0.05, (job, own)
            assert job["readers"][0]["records"] == 100
        finally:
            reader.close()
