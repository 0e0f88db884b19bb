"""What a reader measures of itself (issue 29): above all, how long its trainer waited for data.

The one question a user of an input pipeline asks first is whether the accelerators wait for
data. A `ReaderMeter` answers it where the answer is: it times every call the trainer makes for
its next batch (`timed`), so the *input-bound share* is the time the trainer spent blocked in
those calls over the wall time since its first one. Beside it: batches and records handed over,
seconds spent loading partitions (`timed_load`), and the figures other parts keep themselves
(payload bytes read from storage, records decoded and the time it took, decode failures), read
through `counters` as running totals.

Everything is a running total since the reader's first batch was asked for; `take_summary()`
returns what changed since the previous summary as a `pb.ReaderStats`, which the lease session
sends with the GetTasks and Report calls it makes anyway (no extra round trip), and the master
sums per reader (trainfeed.master.core.reader_stats). `totals()` is what `reader.stats()` returns,
also for a local (`TRAIN_LOCAL=1`) reader, which never sends it anywhere.

Pure apart from its clock, which is an argument (tests pass a fake one). Thread-safe: the
trainer's thread records waits, loader threads record reads, the session's threads take
summaries.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from trainfeed.v1 import master_pb2 as pb

T = TypeVar("T")
# The id column of every batch dict (trainfeed.formats.manifest.ID_COLUMN): its length is the
# batch's record count. (Not imported: the meter needs no format to count a batch.)
_ID_KEY = "_id"


@dataclass(frozen=True)
class Counters:
    """Running totals that a reader's parts keep themselves, read when a figure is asked for."""

    bytes_read: int = 0
    records_decoded: int = 0
    decode_s: float = 0.0
    decode_failures: int = 0


@dataclass(frozen=True)
class ReaderFigures:
    """A reader's figures over `wall_s` seconds (running totals, or the change over a window).

    `input_bound` is the share of that wall time the trainer spent blocked waiting for its
    next batch: near 0 the trainer never waits (the input pipeline keeps up), near 1 it waits
    for data nearly all the time (add readers, decode threads, or a faster storage)."""

    wall_s: float = 0.0
    input_wait_s: float = 0.0
    batches: int = 0
    records: int = 0
    bytes_read: int = 0
    read_s: float = 0.0
    records_decoded: int = 0
    decode_s: float = 0.0
    decode_failures: int = 0

    @property
    def input_bound(self) -> float:
        """Share of the wall time the trainer waited for data, 0..1 (0 before any time)."""
        return min(1.0, self.input_wait_s / self.wall_s) if self.wall_s > 0 else 0.0

    @property
    def records_per_s(self) -> float:
        """Records handed to the trainer per second of wall time."""
        return self.records / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def read_bytes_per_s(self) -> float:
        """Payload bytes read from storage per second of wall time."""
        return self.bytes_read / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decoded_per_s(self) -> float:
        """Records decoded per second of wall time (0 for a reader that decodes nothing)."""
        return self.records_decoded / self.wall_s if self.wall_s > 0 else 0.0

    def minus(self, earlier: ReaderFigures) -> ReaderFigures:
        """What changed since `earlier` (running totals of the same reader)."""
        return ReaderFigures(**{f.name: getattr(self, f.name) - getattr(earlier, f.name)
                                for f in dataclasses.fields(self)})

    def to_pb(self) -> pb.ReaderStats:
        """As sent; a figure that went back (a part's counter replaced) counts 0, since the
        wire's counts are unsigned."""
        return pb.ReaderStats(**{k: max(0, v) for k, v in dataclasses.asdict(self).items()})

    @classmethod
    def from_pb(cls, stats: pb.ReaderStats) -> ReaderFigures:
        return cls(**{f.name: getattr(stats, f.name) for f in dataclasses.fields(cls)})


def records_of(item: Any) -> int:
    """Records in one thing a pass yields: a batch dict (its id column), a list of instances,
    or one instance (a tuple, a packed buffer's dict without ids)."""
    if isinstance(item, dict):
        ids = item.get(_ID_KEY)
        return len(ids) if ids is not None and hasattr(ids, "__len__") else 1
    if isinstance(item, list):
        return len(item)
    return 1


class ReaderMeter:
    """A reader's running totals; see the module docstring.

    Args:
        clock: seconds, monotonic (the default `time.monotonic`; tests pass a fake one).
        counters: the running totals kept elsewhere (bytes read, decode figures); settable
            later through `counters` (a reader connects lazily).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 counters: Callable[[], Counters] = Counters):
        self._clock = clock
        self.counters = counters
        self._lock = threading.Lock()
        self._started: float | None = None  # the trainer's first ask for a batch
        # (seconds waited, batches, records, when the wait in progress began or None): written
        # whole, by the trainer's thread only, so a reader of it never sees half an update and
        # the hot path takes no lock (a raw pass yields every record: ~0.3 us each, measured).
        self._trainer: tuple[float, int, int, float | None] = (0.0, 0, 0, None)
        self._read_s = 0.0
        self._taken = ReaderFigures()  # the totals of the last summary

    # -- what the trainer and the loaders do ----------------------------------------------
    def begin_wait(self) -> None:
        """The trainer asks for its next batch (and is blocked until `end_wait`). Called from
        the trainer's thread only, like `end_wait` and `timed`."""
        now = self._clock()
        if self._started is None:
            self._started = now
        waited, batches, records, _ = self._trainer
        self._trainer = (waited, batches, records, now)

    def end_wait(self, records: int) -> None:
        """The trainer got a batch of `records` records (0: the pass ended instead)."""
        now = self._clock()
        waited, batches, total, since = self._trainer
        if since is not None:
            waited += now - since
        self._trainer = (waited, batches + (1 if records else 0), total + records, None)

    def timed(self, items: Iterable[T]) -> Iterator[T]:
        """`items`, timing how long each `next()` blocks its caller (the trainer). Closing
        the result closes `items` (a pass abandoned early ends its stream)."""
        source = iter(items)
        clock = self._clock
        self.begin_wait()  # (sets the start)
        try:
            while True:
                # begin_wait, inlined: this runs once per record on the raw paths.
                waited, batches, records, _ = self._trainer
                self._trainer = (waited, batches, records, clock())
                try:
                    item = next(source)
                except StopIteration:
                    self.end_wait(0)
                    return
                except BaseException:
                    self.end_wait(0)
                    raise
                # end_wait, inlined: this runs once per record on the raw paths.
                waited, batches, records, since = self._trainer
                self._trainer = (waited + clock() - since if since is not None else waited,
                                 batches + 1,
                                 records + (1 if type(item) is tuple else records_of(item)),
                                 None)
                yield item
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def add_read(self, seconds: float) -> None:
        """A loader spent `seconds` reading one partition from storage."""
        with self._lock:
            self._read_s += seconds

    def timed_load(self, load: Callable[..., T]) -> Callable[..., T]:
        """`load` (a partition loader), adding the time of each call to the read time."""
        def timed(*args: Any) -> T:
            started = self._clock()
            try:
                return load(*args)
            finally:
                self.add_read(self._clock() - started)
        return timed

    # -- what is read off ------------------------------------------------------------------
    def totals(self) -> ReaderFigures:
        """Running totals since the trainer first asked for a batch (all 0 before); a wait in
        progress counts up to now."""
        counters = self.counters()
        waited, batches, records, since = self._trainer  # one consistent read
        now = self._clock()
        started = self._started
        if started is None:
            return ReaderFigures(bytes_read=counters.bytes_read,
                                 records_decoded=counters.records_decoded,
                                 decode_s=counters.decode_s,
                                 decode_failures=counters.decode_failures)
        waiting = max(0.0, now - since) if since is not None else 0.0
        with self._lock:
            read_s = self._read_s
        return ReaderFigures(
            wall_s=now - started, input_wait_s=waited + waiting, batches=batches,
            records=records, bytes_read=counters.bytes_read, read_s=read_s,
            records_decoded=counters.records_decoded, decode_s=counters.decode_s,
            decode_failures=counters.decode_failures)

    def take_summary(self) -> pb.ReaderStats | None:
        """What changed since the previous summary (None before the trainer's first ask, or
        when no time passed): what rides on the next call to the master."""
        totals = self.totals()
        with self._lock:
            change = totals.minus(self._taken)
            if change.wall_s <= 0:
                return None
            self._taken = totals
        return change.to_pb()
