"""Overlapping work with training: the one background thread-and-queue helper, and the partition
prefetcher built on it.

`Background` runs a producer in a daemon thread and hands what it puts through a queue to a single
consumer, in order; errors in the producer surface in the consumer, and `close()` stops and joins
the thread, also when the consumer quits mid-way. Two stages use it: `PrefetchStream` (partitions
read ahead of the consumer; `credits` bound how many are loaded or being consumed at once, so a
reader never leases work it will not start soon) and the input pipeline's batch preparation
(trainfeed.reader.batcher: a bounded queue of decoded batches).
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pyarrow as pa

# Memory a reader may spend on partitions loaded ahead of the trainer. The window in partitions
# follows from it and the dataset's average partition size, clamped: at least 2 so that reading
# overlaps training, at most 32 so that one reader does not lease work others could take.
# benchmarks/read_throughput.py measured raw reads of small JPEGs at 0.69x of local with a window
# of 8 and 0.8x with 32: the window sets how many tasks one GetTasks call carries.
DEFAULT_PREFETCH_BYTES = 64 << 20
MIN_PREFETCH, MAX_PREFETCH = 2, 32
# How often a blocked producer re-checks whether the consumer closed the stream.
POLL_S = 0.1
# The longest `close()` waits for a producer to end (one in a native read, or a pass's batch
# preparation finishing the piece it converts): the longest any close of a reader waits for a
# thread (the lease session joins its own in 10 s).
JOIN_S = 30.0

T = TypeVar("T")


def prefetch_depth(num_bytes: int, num_partitions: int,
                   budget_bytes: int = DEFAULT_PREFETCH_BYTES) -> int:
    """Partitions to load ahead: as many as fit `budget_bytes` on average, within [2, 32]."""
    average = max(1, num_bytes // max(1, num_partitions))
    return max(MIN_PREFETCH, min(MAX_PREFETCH, budget_bytes // average))


@dataclass(frozen=True)
class TaskRef:
    """A partition to read, and in which epoch (the local reader uses the same shape)."""

    epoch: int
    partition: int
    shard: str
    row_group_start: int
    row_group_stop: int
    num_records: int
    # Leading records (in the partition's delivery order) already handed to a trainer by an
    # earlier holder or before a checkpoint.
    skip: int = 0
    lease: int = 0  # the master's fencing token of this lease (0: local, no master)
    # A slice of a row group (trainfeed.planning.partitions): the partition is rows
    # [row_start, row_start + num_records) counted from the start of row group
    # `row_group_start`; `skip` counts from the partition's first record, not the group's.
    row_start: int = 0
    # Records (in delivery order, counted like `skip`) after which this task delivers nothing:
    # a synchronous epoch's cut, or a rank's quota ending inside the partition. 0: none.
    stop: int = 0

    @property
    def delivers(self) -> int:
        """Records this task hands to the trainer: [skip, stop or num_records)."""
        return max(0, (self.stop or self.num_records) - self.skip)


@dataclass(frozen=True)
class LoadedPartition:
    task: TaskRef
    table: pa.Table

    def without_rows(self) -> LoadedPartition:
        """The partition's task alone: what the bookkeeping of a pass keeps once the rows went
        into the batcher's buffer. Holding the rows there, until the trainer had the last of
        them, kept the buffers they were read into alive long after their rows were decoded:
        with a shuffle buffer, more of them than the read-buffer pool
        (trainfeed.io.array_pool) keeps, so row groups were read into pages the kernel
        zeroed first (5 % of the train reader's CPU with the other causes, measured with
        perf)."""
        return LoadedPartition(self.task, _NO_ROWS)


_NO_ROWS = pa.table({})


class Stopped(Exception):
    """Raised inside the producer when the consumer closed the stream."""


_END = object()
_FLUSH = object()


class Background(Generic[T]):
    """Runs `produce(self)` in a daemon thread; iterating yields what it `put`s, in order.

    Single producer, single consumer. `maxsize` bounds the queue (0: unbounded, for producers
    bounded otherwise, such as by credits); a full queue blocks `put` until the consumer takes an
    item or `close()` is called (then `put` raises Stopped, which ends the producer quietly).
    Iterating yields None where the producer called `flush()`. `close()` is idempotent.
    """

    def __init__(self, produce: Callable[[Background[T]], None], maxsize: int = 0,
                 name: str = "trainfeed-background",
                 on_empty: Callable[[], None] = lambda: None,
                 stop: threading.Event | None = None):
        self._stop = stop or threading.Event()
        self._queue: queue.Queue[object] = queue.Queue(maxsize)
        self._produce = produce
        self._on_empty = on_empty
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _RUNNING.add(self)

    @classmethod
    def of(cls, items: Iterable[T], maxsize: int, name: str) -> Background[T]:
        """Iterates `items` in the background, at most `maxsize` ahead of the consumer; a
        generator among them is closed on this thread however the iteration ends, so that
        what it runs (threads of its own) ends before `close()` returns, not when it is
        collected."""
        def produce(out: Background[T]) -> None:
            try:
                for item in items:
                    out.put(item)
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()
        return cls(produce, maxsize, name)

    def put(self, item: T) -> None:
        """Hands an item to the consumer (producer side); blocks while the queue is full."""
        while True:
            if self._stop.is_set():
                raise Stopped
            try:
                self._queue.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def flush(self) -> None:
        """Makes the consumer's iteration yield None (see PrefetchStream)."""
        self.put(_FLUSH)  # type: ignore[arg-type]

    @property
    def buffered(self) -> int:
        """Items put but not yet taken by the consumer (approximate)."""
        return self._queue.qsize()

    def _run(self) -> None:
        try:
            self._produce(self)
            item: object = _END
        except Stopped:
            item = _END
        except BaseException as e:  # handed to the consumer, which re-raises it
            item = e
        while True:
            try:
                self._queue.put(item, timeout=POLL_S)
                return
            except queue.Full:
                if self._stop.is_set():  # the consumer is gone: never block for good
                    return

    def __iter__(self) -> Iterator[T | None]:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                self._on_empty()
                item = self._queue.get()
            if item is _END:
                return
            if item is _FLUSH:
                yield None
                continue
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]

    def stop(self) -> None:
        """Tells the producer to stop at its next `put` (or credit wait); does not wait."""
        self._stop.set()

    def close(self, timeout: float = JOIN_S) -> None:
        """Stops the producer and joins it. Idempotent."""
        self.stop()
        self._thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()


class Credits:
    """A counter of free prefetch slots that the producer waits on and the consumer refills."""

    def __init__(self, total: int, stop: threading.Event):
        self.total = total
        self._free = total
        self._want = 1  # what the waiting producer needs; wake it only then (no churn)
        self._cond = threading.Condition()
        self._stop = stop

    def take_all(self, at_least: int = 1, starving: Callable[[], bool] = lambda: False,
                 poll_s: float = POLL_S) -> int:
        """Blocks until `at_least` slots are free (or one is and `starving()`, which `poke()`
        makes it re-check); takes and returns every free slot. Raises Stopped once the
        consumer closed the stream, free slots or not (a producer that long-polls between two
        calls would otherwise never notice)."""
        with self._cond:
            self._want = max(1, at_least)
            while True:
                if self._stop.is_set():
                    raise Stopped
                if self._free and (self._free >= at_least or starving()):
                    break
                self._cond.wait(poll_s)
            self._want = 1
            taken, self._free = self._free, 0
            return taken

    def give(self, n: int = 1) -> None:
        with self._cond:
            self._free += n
            if self._free >= self._want or self._stop.is_set():
                self._cond.notify_all()

    def poke(self) -> None:
        """Makes a waiting producer re-check `starving()` (the consumer ran out of data)."""
        with self._cond:
            self._cond.notify_all()


class PrefetchStream(Background[LoadedPartition]):
    """Partitions loaded ahead: runs `produce(stream, credits)` in the background.

    `produce` must call `credits.take_all()` before loading partitions and `put` each one; the
    consumer calls `release(part)` when every row of one moved on, which frees its slot.

    Iterating yields None where the producer called `flush()`: nothing more is coming for now (the
    epoch's remaining tasks are held by others), so a consumer holding a partial batch should hand
    it over; otherwise its partitions are never acknowledged and the epoch can never end.
    """

    def __init__(self, produce: Callable[[PrefetchStream, Credits], None],
                 depth: int, name: str = "trainfeed-prefetch"):
        if depth < 1:
            raise ValueError(f"prefetch depth must be ≥ 1, got {depth}")
        stop = threading.Event()
        self.credits = Credits(depth, stop)
        # Running dry: the producer should not wait for its low-water mark.
        super().__init__(lambda out: produce(self, self.credits), 0, name, self.credits.poke,
                         stop)

    def release(self, part: LoadedPartition) -> None:
        self.credits.give(1)

    def close(self, timeout: float = JOIN_S) -> None:
        """Stops the producer and joins it. Idempotent."""
        self.stop()
        self.credits.poke()
        self._thread.join(timeout)


# Producers still running when the interpreter exits (a pass abandoned mid-epoch, a reader never
# closed): at exit each is stopped and joined, up to EXIT_JOIN_S in all. A daemon thread left
# inside a native read (pyarrow, a decoder) while the interpreter finalizes is killed there,
# which C++ code answers with std::terminate ("terminate called without an active exception":
# a training script that finished aborts with SIGABRT, seen under load in CI's torchrun run).
_RUNNING: weakref.WeakSet[Background[Any]] = weakref.WeakSet()
EXIT_JOIN_S = 10.0
# How long a join waits before it says what for and until when (`join_threads`).
SAY_AFTER_S = 5.0


def _stop_all_at_exit() -> None:
    running = list(_RUNNING)
    for background in running:
        background.stop()
        if isinstance(background, PrefetchStream):
            background.credits.poke()
    join_threads([background._thread for background in running], EXIT_JOIN_S,
                 logging.getLogger(__name__),
                 "exiting: waiting for %d read-ahead thread(s) to stop, at most until %s")


def join_threads(threads: Sequence[threading.Thread], timeout: float, log: logging.Logger,
                 waiting: str, say_after: float = SAY_AFTER_S) -> None:
    """Joins `threads` for at most `timeout` seconds in all. Past `say_after` it says once
    (no silent waits) how many it still waits for and until when: `waiting` is a %-format of
    that count and the time ("HH:MM:SS")."""
    started = time.monotonic()
    said = False
    for thread in threads:
        while thread.is_alive() and time.monotonic() - started < timeout:
            thread.join(min(0.5, max(0.0, timeout - (time.monotonic() - started))))
            if not said and thread.is_alive() and time.monotonic() - started >= say_after:
                said = True
                log.warning(waiting, sum(t.is_alive() for t in threads), time.strftime(
                    "%H:%M:%S", time.localtime(time.time() + timeout - say_after)))


atexit.register(_stop_all_at_exit)
