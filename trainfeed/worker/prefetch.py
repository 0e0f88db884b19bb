"""Overlapping I/O with training: a background thread that reads partitions ahead of the consumer.

The producer runs in one thread and hands loaded partitions through a bounded queue; `credits`
bounds how many partitions are loaded or being consumed at once (so a reader never leases work it
will not start soon). Errors in the producer surface in the consumer, and `close()` stops and joins
the thread, also when the consumer quits mid-way.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

# Memory a reader may spend on partitions loaded ahead of the trainer. The window in partitions
# follows from it and the dataset's average partition size, clamped: at least 2 so that reading
# overlaps training, at most 32 so that one reader does not lease work others could take.
# benchmarks/read_throughput.py measured raw reads of small JPEGs at 0.69x of local with a window
# of 8 and 0.8x with 32: the window sets how many tasks one GetTasks call carries.
DEFAULT_PREFETCH_BYTES = 64 << 20
MIN_PREFETCH, MAX_PREFETCH = 2, 32


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
    skip: int = 0  # leading records already handed to a trainer by an earlier holder
    lease: int = 0  # the master's fencing token of this lease (0: local, no master)


@dataclass(frozen=True)
class LoadedPartition:
    task: TaskRef
    table: pa.Table


class Stopped(Exception):
    """Raised inside the producer when the consumer closed the stream."""


_END = object()
_FLUSH = object()


class Credits:
    """A counter of free prefetch slots that the producer waits on and the consumer refills."""

    def __init__(self, total: int, stop: threading.Event):
        self.total = total
        self._free = total
        self._want = 1  # what the waiting producer needs; wake it only then (no churn)
        self._cond = threading.Condition()
        self._stop = stop

    def take_all(self, at_least: int = 1, starving: Callable[[], bool] = lambda: False,
                 poll_s: float = 0.1) -> int:
        """Blocks until `at_least` slots are free (or one is and `starving()`, which `poke()`
        makes it re-check); takes and returns every free slot."""
        with self._cond:
            self._want = max(1, at_least)
            while self._free == 0 or (self._free < at_least and not starving()):
                if self._stop.is_set():
                    raise Stopped
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


class PrefetchStream:
    """Runs `produce(stream, credits)` in a thread; iterating yields what it puts, in order.

    `produce` must call `credits.take_all()` before loading partitions and `put` each one; the
    consumer calls `release(part)` when done with one's rows, which frees its slot. Single
    consumer.

    Iterating yields None where the producer called `flush()`: nothing more is coming for now (the
    epoch's remaining tasks are held by others), so a consumer holding a partial batch should hand
    it over; otherwise its partitions are never acknowledged and the epoch can never end.
    """

    def __init__(self, produce: Callable[[PrefetchStream, Credits], None],
                 depth: int, name: str = "trainfeed-prefetch"):
        if depth < 1:
            raise ValueError(f"prefetch depth must be ≥ 1, got {depth}")
        self._stop = threading.Event()
        self.credits = Credits(depth, self._stop)
        self._queue: queue.Queue[object] = queue.Queue()
        self._produce = produce
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: LoadedPartition) -> None:
        """Hands a loaded partition to the consumer (producer side)."""
        if self._stop.is_set():
            raise Stopped
        self._queue.put(item)

    @property
    def buffered(self) -> int:
        """Partitions loaded but not yet taken by the consumer (approximate)."""
        return self._queue.qsize()

    def flush(self) -> None:
        """Tells the consumer that no partition is coming soon (see the class docstring)."""
        self._queue.put(_FLUSH)

    def _run(self) -> None:
        try:
            self._produce(self, self.credits)
            self._queue.put(_END)
        except Stopped:
            self._queue.put(_END)
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._queue.put(e)

    def __iter__(self) -> Iterator[LoadedPartition | None]:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                self.credits.poke()  # running dry: the producer should not wait for low water
                item = self._queue.get()
            if item is _END:
                return
            if item is _FLUSH:
                yield None
                continue
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, LoadedPartition)
            yield item

    def release(self, part: LoadedPartition) -> None:
        self.credits.give(1)

    def close(self, timeout: float = 30.0) -> None:
        """Stops the producer and joins it. Idempotent."""
        self._stop.set()
        self.credits.poke()
        self._thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()
