"""Partitions loaded on a few threads at once, handed over in the order of their tasks.

One thread used to load every partition of a pass (trainfeed.reader.producer), and on the 256-px
raw-pixel workload it was the ceiling of the whole read path: with nothing decoded, one reader
delivered ~17,600 records/s, its one load thread always busy (~55 µs of CPU a record: the copy
out of the page cache, the CRC-32C, Arrow's calls per partition). The copy and the checksum let
the GIL go, so a second thread loading the next partition meanwhile lifts that to ~22,500
records/s on the same 2 cores (benchmarks/reader_bounds.py, `no-decode`, issue 39). On storage
with latency (S3, GlusterFS, HDFS) it also overlaps two partitions' round trips.

- **Order is kept.** Partitions reach the consumer in the order of their tasks, whichever load
  ends first: a pass's delivery order, and so its shuffle, does not depend on the threads.
- **Memory stays bounded by the prefetch credits.** A task is loaded only once the producer
  holds a credit for it, as before; the threads only overlap loads the window already allows.
- **A `PartitionReader` is not thread-safe:** each load thread gets one of its own (at most one
  per thread exists), and all are closed with the loads.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future

import pyarrow as pa

from trainfeed.cores import usable_cores
from trainfeed.io.load import Load
from trainfeed.io.partition_reader import PartitionReader
from trainfeed.io.prefetch import JOIN_S, TaskRef, join_threads
from trainfeed.io.prefetch import SAY_AFTER_S as PREFETCH_SAY_AFTER_S

# Partitions a pass loads at once. Two: a load is mostly the kernel's copy and the checksum
# (without the GIL), so two keep a core busy between them where one left gaps; more would hold
# more partitions half-loaded for no gain on the 2-core machine measured.
PARALLEL_LOADS = 2

# How long `close` waits for a load under way before it says so (trainfeed.io.prefetch's).
SAY_AFTER_S = PREFETCH_SAY_AFTER_S

logger = logging.getLogger(__name__)

# A task's partition, or the error its load raised (raised by calling it).
Outcome = Callable[[], pa.Table]


def load_threads() -> int:
    """Partitions a pass loads at once by default: PARALLEL_LOADS where this process may run on
    that many cores (its CPU affinity), else one."""
    return max(1, min(PARALLEL_LOADS, usable_cores()))


class Loads:
    """Loads tasks' partitions with `load` on up to `threads` threads (one: on the caller's
    thread, when its outcome is asked for), each with a reader of its own from `new_reader`.

    Use from one thread (the pass's producer). The load threads are daemons, as the producer
    is: a load stuck in a native read (a stalled mount) must not keep the process from exiting
    (trainfeed.io.prefetch stops and joins the producers at exit, for a bounded time).
    """

    def __init__(self, new_reader: Callable[[], PartitionReader], load: Load, threads: int = 1,
                 name: str = "trainfeed-load"):
        if threads < 1:
            raise ValueError(f"load threads must be ≥ 1, got {threads}")
        self._new_reader = new_reader
        self._load = load
        self._idle: queue.SimpleQueue[PartitionReader] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[tuple[TaskRef, Future[pa.Table]] | None] = \
            queue.SimpleQueue()
        self._pending: list[Future[pa.Table]] = []
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
                         for i in range(threads)] if threads > 1 else []
        self._started = False

    def in_order(self, tasks: Sequence[TaskRef]) -> Iterator[tuple[TaskRef, Outcome]]:
        """Each of `tasks` with its outcome, in the tasks' order. With threads, every task's
        load is queued now (at most `threads` run at once); its outcome waits for it."""
        if not self._threads:
            for task in tasks:
                yield task, lambda task=task: self._one(task)  # type: ignore[misc]
            return
        if not self._started:
            self._started = True
            for thread in self._threads:
                thread.start()
        queued = []
        for task in tasks:
            loading: Future[pa.Table] = Future()
            self._jobs.put((task, loading))
            queued.append((task, loading))
        self._pending = [loading for _, loading in queued]
        for task, loading in queued:
            yield task, loading.result

    def _work(self) -> None:
        """A load thread: loads queued tasks until told to stop (None)."""
        while (job := self._jobs.get()) is not None:
            task, loading = job
            if not loading.set_running_or_notify_cancel():
                continue  # cancelled by close()
            try:
                loading.set_result(self._one(task))
            except BaseException as e:  # the producer raises it in the task's turn
                loading.set_exception(e)

    def _one(self, task: TaskRef) -> pa.Table:
        """`task`'s partition, read with an idle reader (a new one if none is idle: never more
        than one per thread, since a thread holds one reader at a time)."""
        try:
            reader = self._idle.get_nowait()
        except queue.Empty:
            reader = self._new_reader()
        try:
            return self._load(reader, task)
        finally:
            self._idle.put(reader)

    def close(self, timeout: float = JOIN_S) -> None:
        """Cancels the loads not started, waits up to `timeout` for those under way, and
        closes the readers no load holds any more."""
        for loading in self._pending:
            loading.cancel()
        if self._started:
            for _ in self._threads:
                self._jobs.put(None)
            join_threads(self._threads, timeout, logger, "closing a pass: waiting for %d "
                         "partition load(s) to end, at most until %s", say_after=SAY_AFTER_S)
        while True:  # a reader a stuck load still holds is left to it
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                break
