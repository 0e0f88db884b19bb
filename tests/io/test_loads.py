"""Partitions loaded on several threads (trainfeed.io.loads): order kept, loads overlapped, a
reader per thread, errors where they belong, nothing left running after close."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pytest

from trainfeed.io.loads import Loads, load_threads
from trainfeed.io.partition_reader import ReadStats
from trainfeed.io.prefetch import TaskRef

WAIT_S = 30.0  # far beyond any load here: reached only if a load never runs


def task(partition: int) -> TaskRef:
    return TaskRef(0, partition, "shard", 0, 1, 1)


class Reader:
    """What a load is handed: counts who uses it at once, and whether it was closed."""

    def __init__(self) -> None:
        self.users = 0
        self.closed = False

    def close(self) -> None:
        self.closed = True


def loads_of(load: Callable[[Reader, TaskRef], pa.Table], threads: int,
             readers: list[Reader]) -> Loads:
    def new_reader() -> Reader:
        readers.append(Reader())
        return readers[-1]
    return Loads(new_reader, load, threads)  # type: ignore[arg-type]


def table_of(t: TaskRef) -> pa.Table:
    return pa.table({"partition": [t.partition]})


def test_partitions_come_in_task_order_whichever_load_ends_first() -> None:
    def load(reader: Reader, t: TaskRef) -> pa.Table:
        time.sleep(0.2 if t.partition == 0 else 0.0)  # the first ends last
        return table_of(t)

    readers: list[Reader] = []
    loads = loads_of(load, 2, readers)
    try:
        got = [(t.partition, outcome().column("partition")[0].as_py())
               for t, outcome in loads.in_order([task(p) for p in range(6)])]
    finally:
        loads.close()
    assert got == [(p, p) for p in range(6)]


def test_two_loads_run_at_once_each_with_a_reader_of_its_own() -> None:
    both = threading.Barrier(2, timeout=WAIT_S)  # broken (an error) if the loads never overlap
    shared = []

    def load(reader: Reader, t: TaskRef) -> pa.Table:
        reader.users += 1
        shared.append(reader.users)
        if t.partition < 2:
            both.wait()
        reader.users -= 1
        return table_of(t)

    readers: list[Reader] = []
    loads = loads_of(load, 2, readers)
    try:
        assert [o().num_rows for _, o in loads.in_order([task(p) for p in range(8)])] == [1] * 8
    finally:
        loads.close()
    assert max(shared) == 1  # no reader was ever used by two loads at once
    assert len(readers) == 2 and all(r.closed for r in readers)


def test_one_thread_loads_on_the_callers_thread_when_asked() -> None:
    where = []

    def load(reader: Reader, t: TaskRef) -> pa.Table:
        where.append(threading.current_thread())
        return table_of(t)

    readers: list[Reader] = []
    loads = loads_of(load, 1, readers)
    pending = loads.in_order([task(0), task(1)])
    _, first = next(pending)
    assert where == []  # nothing loaded before its outcome is asked for
    first()
    assert where == [threading.current_thread()]
    loads.close()
    assert len(readers) == 1 and readers[0].closed


def test_a_load_error_comes_with_its_own_task_and_the_others_still_load() -> None:
    def load(reader: Reader, t: TaskRef) -> pa.Table:
        if t.partition == 1:
            raise OSError("partition 1 is unreadable")
        return table_of(t)

    readers: list[Reader] = []
    loads = loads_of(load, 2, readers)
    outcomes = []
    try:
        for t, outcome in loads.in_order([task(p) for p in range(4)]):
            try:
                outcomes.append((t.partition, outcome().num_rows))
            except OSError as e:
                outcomes.append((t.partition, str(e)))
    finally:
        loads.close()
    assert outcomes == [(0, 1), (1, "partition 1 is unreadable"), (2, 1), (3, 1)]


def test_close_cancels_loads_not_started_and_waits_for_those_under_way() -> None:
    started, release = [], threading.Event()

    def load(reader: Reader, t: TaskRef) -> pa.Table:
        started.append(t.partition)
        release.wait(WAIT_S)
        return table_of(t)

    readers: list[Reader] = []
    loads = loads_of(load, 2, readers)
    pending = loads.in_order([task(p) for p in range(10)])
    next(pending)  # every load is submitted; two run
    deadline = time.monotonic() + WAIT_S
    while len(started) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Timer(0.2, release.set).start()
    loads.close()  # returns once the two running loads ended
    assert sorted(started) == [0, 1]
    assert all(r.closed for r in readers)
    assert not [t for t in threading.enumerate() if t.name.startswith("trainfeed-load")]


def test_a_load_stuck_on_its_storage_delays_close_for_a_stated_bound_only(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import trainfeed.io.loads as loads_module

    monkeypatch.setattr(loads_module, "SAY_AFTER_S", 0.2)
    stuck, release = threading.Event(), threading.Event()

    def load(reader: Reader, t: TaskRef) -> pa.Table:
        stuck.set()
        release.wait(WAIT_S)  # a stalled mount
        return table_of(t)

    readers: list[Reader] = []
    loads = loads_of(load, 2, readers)
    next(loads.in_order([task(0)]))
    assert stuck.wait(WAIT_S)
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="trainfeed.io.loads"):
        loads.close(timeout=1.0)
    waited = time.monotonic() - started
    release.set()
    assert 1.0 <= waited < WAIT_S / 2
    assert "waiting for 1 partition load(s) to end, at most until" in caplog.text
    [held] = readers
    assert not held.closed  # the stuck load still holds its reader: left to it
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("trainfeed-load"))


def test_threads_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="≥ 1"):
        Loads(lambda: None, lambda r, t: table_of(t), 0)  # type: ignore[arg-type,return-value]


def test_load_threads_follow_the_cores_this_process_may_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import trainfeed.io.loads as loads_module

    monkeypatch.setattr(loads_module, "usable_cores", lambda: 1)
    assert load_threads() == 1
    monkeypatch.setattr(loads_module, "usable_cores", lambda: 16)
    assert load_threads() == loads_module.PARALLEL_LOADS


def test_read_stats_count_every_byte_added_from_many_threads() -> None:
    stats = ReadStats()

    def add() -> None:
        for _ in range(20_000):
            stats.add_payload(3)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.payload_bytes == 4 * 20_000 * 3


def test_payload_indexes_parse_on_many_threads_at_once() -> None:
    """numpy parses an .npy header with ast.literal_eval; CPython 3.11 raised SystemError when
    two threads built ASTs at once and a collection's finalizer let one in mid-way (seen in CI
    with two load threads). Here three threads parse indexes with collections running
    finalizers all the time: every parse must succeed."""
    import gc
    import io
    import sys

    import numpy as np

    from trainfeed.io.partition_reader import parsed_index

    buffer = io.BytesIO()
    np.save(buffer, np.arange(200, dtype=np.int64).reshape(25, 2, 4))
    data = buffer.getvalue()

    class Garbage:
        def __del__(self) -> None:  # Python code inside a collection: a thread switch point
            sum(range(50))

    failures: list[str] = []

    def parse() -> None:
        for _ in range(3_000):
            cycle = Garbage()
            cycle.me = cycle  # type: ignore[attr-defined]
            del cycle
            try:
                assert parsed_index(data).shape == (25, 2, 4)
            except SystemError as e:
                failures.append(str(e))
                return

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(10, 1, 1)
    try:
        threads = [threading.Thread(target=parse) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    assert failures == []
