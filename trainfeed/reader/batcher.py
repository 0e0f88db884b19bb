"""The one batcher: every path from loaded partitions to what the trainer holds goes through it.

Tuples, `batch(reader, n)`, `batch(..., columnar=True)`, the decode pipeline (with or without
`batch_size`), packed buffers and the framework adapters all run `deliver()`, which owns the
acknowledge protocol of a pass (see trainfeed.reader.backends.PassStream):

- `taken`: a partition's rows are all in the batcher's buffer; its prefetch slot is free.
- positions: before the trainer gets a batch (or instance), `state()` counts its records.
- `progress`: once the trainer asked for the next one, the master hears how far it got inside
  each partition (for instances: every `progress_every` of them and at each batch's end).
- `consumed`: once the trainer was handed a partition's last record and asked for more.

Positions are exact because each partition is consumed as a *prefix of its delivery order*:

- without shuffling, the delivery order is the stored order;
- with a shuffle buffer or resampling, a partition's records (after resampling: its copies) are
  permuted by an order derived from (seed, epoch, partition) alone, as Grain derives its order, and
  the buffer only interleaves partitions: each window draws a random sequence of partition labels
  (the multiset of its rows' partitions) and fills each label's places with that partition's next
  records. A uniformly random interleaving of independently, uniformly permuted partitions *is* a
  uniform permutation of the window, so this is the same shuffle as permuting the buffer, and yet
  "the first n records of partition p" names exactly what the trainer got of p.

So a reader's state (and the master's progress) is a count per partition, the same on every path,
and a restore re-reads the partitions in hand and skips exactly their first n records in delivery
order: nothing the saved model saw comes again and nothing is skipped.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np
import pyarrow as pa

from trainfeed.errors import CheckpointError
from trainfeed.io.gather import compacted, take_rows
from trainfeed.io.load import Load, plain_load
from trainfeed.io.partition_reader import COPIES_COLUMN, PartitionReader, Selector, read_task
from trainfeed.io.prefetch import Background, LoadedPartition, TaskRef
from trainfeed.reader.backends import PassStream

# Streams of the seed (seed, STREAM, epoch, ...) so that draws are independent of each other and
# of resampling's (trainfeed.reader.resample).
PARTITION_ORDER_STREAM = 0x0D
WINDOW_STREAM = 0x5F
# In the instance paths, the master hears of progress inside a partition every this many
# instances: cheap (one modulo per instance) and a crash repeats at most this many more.
PROGRESS_EVERY = 64
# What a convert function puts in place of an instance it dropped (a record that failed to decode
# under decode_errors="skip"): counted as delivered, never yielded.
DROPPED = object()


@dataclass
class Piece:
    """What the batcher cut: rows for the trainer and which partitions they come out of.

    `runs` are (slot, rows) in delivery order; a slot numbers a partition of the pass in arrival
    order. `entered` are the partitions that joined the batcher since the previous piece, with
    how many records each will deliver (0: acknowledged at once). `table` None: nothing for the
    trainer (the piece only registers partitions); `dropped`: a partial batch drop_last drops
    (its records count as delivered).
    """

    table: pa.Table | None
    runs: list[tuple[int, int]]
    entered: list[tuple[int, LoadedPartition, int]] = field(default_factory=list)
    dropped: bool = False
    epoch: int = 0
    index: int = 0  # pieces cut before this one in the pass (seeds augmentations)
    shards: dict[int, str] = field(default_factory=dict)  # slot -> shard, for error messages

    def row_slots(self) -> np.ndarray:
        """The slot of each row of `table`."""
        if not self.runs:
            return np.empty(0, np.int64)
        slots, counts = zip(*self.runs)
        return np.repeat(np.array(slots, np.int64), np.array(counts, np.int64))

    @property
    def shows(self) -> bool:
        return self.table is not None and not self.dropped


def past_the_end(task: TaskRef, delivered: int) -> CheckpointError:
    """A partition that starts after more records than it delivers: a restored state's position
    past its end (or a master told so). Raised, not read as an empty partition, which silently
    lost its records (issue 25)."""
    return CheckpointError(
        f"partition {task.partition} of epoch {task.epoch}: {task.skip} of its records were "
        f"handed to the trainer before, but it delivers {delivered} in this reader's order: a "
        f"restored reader state with a position past the partition's end; restore the state "
        f"the reader saved, unchanged, into a reader with the same options")


def bounded_load(reader: PartitionReader, task: TaskRef) -> pa.Table:
    """`plain_load`, refusing a skip past the partition's records (a SQL bucket's count is
    unknown until its query runs: 0, not checked)."""
    if task.num_records and task.skip > task.num_records:
        raise past_the_end(task, task.num_records)
    return plain_load(reader, task)


def partition_loader(selector: Selector | None, shuffle_seed: int | None) -> Load:
    """How a pass reads a task (in the producer's thread): its records in delivery order, minus
    the first `task.skip`. With a `selector` (resampling) each kept row comes as many times as it
    says; with a `shuffle_seed` the partition's records are permuted by (seed, epoch, partition),
    so that every holder of a partition (after a crash, a restore) agrees on its order."""
    if selector is None and shuffle_seed is None:
        return bounded_load

    def load(reader: PartitionReader, task: TaskRef) -> pa.Table:
        # Skip and stop count in delivery order: read the whole partition, then cut it.
        table = read_task(reader, dataclasses.replace(task, skip=0, stop=0), selector)
        rows = np.arange(table.num_rows)
        if COPIES_COLUMN in table.column_names:
            rows = np.repeat(rows, table.column(COPIES_COLUMN).to_numpy())
            table = table.drop_columns([COPIES_COLUMN])
        if shuffle_seed is not None:
            rng = np.random.default_rng((shuffle_seed, PARTITION_ORDER_STREAM, task.epoch,
                                         task.partition))
            rows = rows[rng.permutation(len(rows))]
        if task.skip > len(rows):
            raise past_the_end(task, len(rows))
        rows = rows[task.skip:task.stop or None]
        if len(rows) == table.num_rows and (rows == np.arange(len(rows))).all():
            return table
        return take_rows(table, rows)
    return load


def _runs(slots: np.ndarray) -> list[tuple[int, int]]:
    """Run-length encoding of a slot sequence: [(slot, length), ...]."""
    if not len(slots):
        return []
    starts = np.flatnonzero(np.concatenate(([True], slots[1:] != slots[:-1])))
    lengths = np.diff(np.append(starts, len(slots)))
    return list(zip(slots[starts].tolist(), lengths.tolist()))


class Cutter:
    """Cuts one pass's partitions (each already in delivery order) into pieces.

    `batch_size` None: one piece per partition. `shuffle` (seed, buffer): records of at least
    `max(batch_size, buffer)` are interleaved at random before cutting (see the module docstring).
    Single-threaded; deterministic given its input and the seed.
    """

    def __init__(self, batch_size: int | None, drop_last: bool = False,
                 shuffle: tuple[int, int] | None = None):
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1 or None, got {batch_size}")
        if shuffle is not None and batch_size is None:
            raise ValueError("shuffling needs a batch_size")
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.fill = max(batch_size or 1, shuffle[1] if shuffle else 0)
        self._next_slot = 0
        self._entered: list[tuple[int, LoadedPartition, int]] = []
        self._shards: dict[int, str] = {}
        self._tables: list[pa.Table] = []
        self._slots: list[np.ndarray] = []  # shuffling: per table in _tables, each row's slot
        self._queued: deque[tuple[int, int]] = deque()  # (slot, rows) buffered, in order
        self._buffered = 0
        self._window = 0
        self._cut = 0
        self._epoch = 0

    def _piece(self, table: pa.Table | None, runs: list[tuple[int, int]],
               dropped: bool = False) -> Piece:
        entered, self._entered = self._entered, []
        piece = Piece(table, runs, entered, dropped, self._epoch, self._cut, self._shards)
        if table is not None:
            self._cut += 1
        return piece

    def add(self, part: LoadedPartition) -> list[Piece]:
        """Takes every row of `part` into the buffer; returns the pieces now complete."""
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        table = part.table
        self._epoch = part.task.epoch
        self._shards[slot] = part.task.shard
        self._entered.append((slot, part.without_rows(), table.num_rows))
        if self.batch_size is None:
            return [self._piece(table, [(slot, table.num_rows)] if table.num_rows else [])]
        if table.num_rows:
            self._tables.append(table)
            if self.shuffle is not None:
                self._slots.append(np.full(table.num_rows, slot, np.int64))
            else:
                self._queued.append((slot, table.num_rows))
            self._buffered += table.num_rows
        if self._buffered < self.fill:
            return []
        return self._cut_buffer(everything=False)

    def flush(self) -> list[Piece]:
        """Everything buffered, a last short batch included (the pass ends, or nothing is coming
        for now), and a piece registering partitions that entered without rows."""
        pieces = self._cut_buffer(everything=True) if self._buffered else []
        if self._entered:
            pieces.append(self._piece(None, []))
        return pieces

    def _cut_buffer(self, everything: bool) -> list[Piece]:
        assert self.batch_size is not None
        size = self.batch_size
        table = (self._tables[0] if len(self._tables) == 1
                 else pa.concat_tables(self._tables))
        if self.shuffle is None:
            return self._cut_in_order(table, everything)
        slots = self._slots[0] if len(self._slots) == 1 else np.concatenate(self._slots)
        if self.shuffle is not None:  # (always, past _cut_in_order)
            rng = np.random.default_rng((self.shuffle[0], WINDOW_STREAM, self._epoch,
                                         self._window))
            self._window += 1
            # Each partition's rows, contiguous and in its delivery order (stable sort) ...
            grouped = np.argsort(slots, kind="stable")
            # ... go to the places its label holds in a random sequence of the labels.
            labels = rng.permutation(slots[grouped])
            order = np.empty_like(grouped)
            order[np.argsort(labels, kind="stable")] = grouped
            table, slots = take_rows(table, order), labels
        n = table.num_rows
        usable = n if everything else n // size * size
        pieces = []
        for start in range(0, usable, size):
            stop = min(start + size, usable)
            dropped = self.drop_last and stop - start < size
            pieces.append(self._piece(table.slice(start, stop - start),
                                      _runs(slots[start:stop]), dropped))
        rest = n - usable
        self._tables = [compacted(table.slice(usable))] if rest else []
        self._slots = [slots[usable:]] if rest else []
        self._buffered = rest
        return pieces

    def _cut_in_order(self, table: pa.Table, everything: bool) -> list[Piece]:
        """The unshuffled cut: runs follow the buffered partitions (no per-row bookkeeping)."""
        assert self.batch_size is not None
        size, n = self.batch_size, table.num_rows
        usable = n if everything else n // size * size
        pieces = []
        for start in range(0, usable, size):
            rows = min(size, usable - start)
            runs: list[tuple[int, int]] = []
            want = rows
            while want:
                slot, count = self._queued[0]
                take = min(want, count)
                runs.append((slot, take))
                if take == count:
                    self._queued.popleft()
                else:
                    self._queued[0] = (slot, count - take)
                want -= take
            pieces.append(self._piece(table.slice(start, rows), runs,
                                      self.drop_last and rows < size))
        rest = n - usable
        self._tables = [table.slice(usable)] if rest else []
        self._buffered = rest
        return pieces


class Acknowledger:
    """The trainer-side bookkeeping of a pass: positions, progress and acknowledgements.

    Runs in the trainer's thread only. Per slot it knows the partition, how many of its records
    the trainer was handed and how many are left.
    """

    def __init__(self, stream: PassStream):
        self.stream = stream
        self.parts: dict[int, LoadedPartition] = {}
        self.handed: dict[int, int] = {}
        self.left: dict[int, int] = {}
        self.forgotten: set[int] = set()  # slots whose lease was lost: their rows are dropped

    def enter(self, entered: list[tuple[int, LoadedPartition, int]]) -> None:
        for slot, part, units in entered:
            self.stream.entered(part)
            if units == 0:  # every record dropped, or all were delivered before (skip)
                self.stream.consumed(part)
                continue
            self.parts[slot], self.handed[slot], self.left[slot] = part, 0, units

    @staticmethod
    def totals(runs: list[tuple[int, int]]) -> dict[int, int]:
        counts: dict[int, int] = {}
        for slot, n in runs:
            counts[slot] = counts.get(slot, 0) + n
        return counts

    def lost(self, piece: Piece) -> set[int]:
        """Slots of `piece` whose lease the master took away (issue 14's fencing): their rows
        not yet handed over go to another reader, so they are dropped here, at hand-over, and
        the partition is forgotten (the session reports nothing for a revoked lease)."""
        lost = {slot for slot, _ in piece.runs
                if slot in self.parts and self.stream.lost(self.parts[slot])}
        for slot in lost:
            part = self.parts.pop(slot)
            del self.handed[slot], self.left[slot]
            self.stream.forget(part)
        self.forgotten |= lost
        # A partition spans pieces: its rows in later ones are dropped too.
        return lost | {slot for slot, _ in piece.runs if slot in self.forgotten}

    def hand(self, counts: dict[int, int]) -> None:
        """The trainer is about to get these records: from now on `state()` counts them."""
        positions = self.stream.positions
        for slot, n in counts.items():
            task = self.parts[slot].task
            positions[task.partition] = task.skip + self.handed[slot] + n
        self.stream.delivered += sum(counts.values())

    def abandoned(self) -> None:
        """The trainer stopped mid-pass (a `break`, `itertools.islice`): tells the master exactly
        how far it got in each partition in its hands (`positions` counts every record it was
        handed, the last one included), so that the pass that goes on repeats nothing of them;
        progress is otherwise only reported every PROGRESS_EVERY instances."""
        positions = self.stream.positions
        for slot, part in list(self.parts.items()):
            got = positions.get(part.task.partition, part.task.skip) - part.task.skip
            if got > self.handed[slot]:
                self.stream.progress(part, got)

    def acknowledge(self, counts: dict[int, int]) -> None:
        """The trainer asked for more after getting these records: tell the master."""
        for slot, n in counts.items():
            self.handed[slot] += n
            self.left[slot] -= n
            if self.left[slot] == 0:
                part = self.parts.pop(slot)
                del self.handed[slot], self.left[slot]
                self.stream.consumed(part)
            else:
                self.stream.progress(self.parts[slot], self.handed[slot])

    def instances(self, piece: Piece, values: Iterable[Any],
                  progress_every: int) -> Iterator[Any]:
        """Hands a piece over one instance at a time, positions exact per instance."""
        positions = self.stream.positions
        it = iter(values)
        touched: list[int] = []
        for slot, n in piece.runs:
            part = self.parts[slot]
            partition = part.task.partition
            start = self.handed[slot]
            base = part.task.skip + start
            for i, value in enumerate(islice(it, n), start=1):
                positions[partition] = base + i  # exact, for state(); a dict store
                if value is not DROPPED:
                    yield value
                if i % progress_every == 0:  # the trainer asked for the next one
                    self.stream.progress(part, start + i)
            self.handed[slot] = start + n
            self.left[slot] -= n
            if self.left[slot] == 0:
                del self.parts[slot], self.handed[slot], self.left[slot]
                self.stream.consumed(part)
            else:
                touched.append(slot)
        for slot in dict.fromkeys(touched):
            if slot in self.parts:
                self.stream.progress(self.parts[slot], self.handed[slot])


Convert = Callable[[Piece], Any]


def without(piece: Piece, slots: set[int]) -> Piece:
    """`piece` minus the rows of `slots` (partitions whose lease was taken away)."""
    assert piece.table is not None
    keep = ~np.isin(piece.row_slots(), np.fromiter(slots, np.int64))
    return dataclasses.replace(piece, table=piece.table.filter(pa.array(keep)),
                               runs=[(s, n) for s, n in piece.runs if s not in slots])


def _cut(stream: PassStream, cutter: Cutter) -> Iterator[Piece]:
    """Partitions in, pieces out (shuffled and cut; not converted yet)."""
    for part in stream:
        if part is None:  # nothing coming for now: hand over what is buffered
            ready = cutter.flush()
        else:
            ready = cutter.add(part)
            stream.taken(part)
        yield from ready
    yield from cutter.flush()


def _pieces(stream: PassStream, cutter: Cutter, convert: Convert,
            converters: int = 1) -> Iterator[tuple[Any, Piece]]:
    """The producing half: partitions in, converted pieces out (in the background or inline),
    in order. `converters` > 1 converts that many pieces at once (see `_overlapped`)."""
    if converters > 1:
        yield from _overlapped(_cut(stream, cutter), convert, converters)
        return
    for piece in _cut(stream, cutter):
        yield (convert(piece) if piece.shows else None), piece


_END = object()


def _overlapped(pieces: Iterator[Piece], convert: Convert,
                converters: int) -> Iterator[tuple[Any, Piece]]:
    """Converts up to `converters` pieces at once, each on its own thread, and yields them in
    order: the decode pipeline's serial steps for one batch (arrays, concatenation, stacking)
    then overlap the decoding of the one before, instead of leaving the decode threads idle
    between batches (measured: ~0.17 of 2 cores idle with one converter).

    The pieces are cut on a thread of their own, so that a piece is yielded as soon as it is
    converted, never held back while the cutting waits for more partitions: a distributed
    pass's partial batch must reach the trainer for its partitions to be acknowledged before
    the master hands out more (a flush), and a local pass's prefetch credits come back the
    same way."""
    pool = ThreadPoolExecutor(converters, thread_name_prefix="trainfeed-convert")
    ready: queue.Queue[Any] = queue.Queue(maxsize=converters)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def cut() -> None:
        try:
            for piece in pieces:
                if not put((pool.submit(convert, piece) if piece.shows else None, piece)):
                    return
            put(_END)
        except BaseException as e:  # handed to the consumer, which re-raises it
            put(e)

    cutter_thread = threading.Thread(target=cut, daemon=True, name="trainfeed-cut")
    cutter_thread.start()
    failed = False  # a conversion raised
    try:
        while True:
            item = ready.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            done, piece = item
            try:
                value = done.result() if done is not None else None
            except BaseException:
                failed = True
                raise
            yield value, piece
    finally:
        # However the pass ends, its converters and cutting thread are joined here, so that
        # none outlives it: the cutting ended with its last put (_END, an error), or ends at
        # its next put, or when `deliver` closes the stream after stopping this (the consumer
        # stopped the pass: trainfeed.io.prefetch.Background.of closes this on its thread).
        # After a failed conversion the consumer must get the error first (it then closes the
        # stream): the cutting is not waited for.
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)  # a piece being converted finishes
        if not failed:
            cutter_thread.join()

def deliver(stream: PassStream, cutter: Cutter, convert: Convert, *, unbatch: bool = False,
            background: int = 0, converters: int = 1, progress_every: int = PROGRESS_EVERY,
            name: str = "trainfeed-batches") -> Iterator[Any]:
    """One pass: the converted pieces (or, with `unbatch`, each instance of them) to the trainer,
    acknowledged as it consumes them; ends (and closes) the stream however the pass ends.

    `convert(piece)` turns a piece into what the trainer gets (with `unbatch`: an iterable of one
    value per row, DROPPED for a row it dropped). `background` > 0 converts in a background
    thread, that many pieces ahead (the decode pipeline); 0 converts inline in the trainer's
    thread (the raw paths, where a thread hop would cost more than it saves). `converters`:
    pieces converted at once in the background (see `_pieces`); `convert` must then be
    thread-safe.
    """
    items: Iterable[tuple[Any, Piece] | None]
    worker: Background[tuple[Any, Piece]] | None = None
    if background:
        worker = Background.of(_pieces(stream, cutter, convert, converters), background, name)
        items = worker
    else:
        items = _pieces(stream, cutter, convert)
    ack = Acknowledger(stream)
    finished = False
    try:
        for item in items:
            assert item is not None  # flushes are turned into pieces by the cutter
            value, piece = item
            ack.enter(piece.entered)
            lost = ack.lost(piece)
            if lost:  # rare: convert again without the revoked partitions' rows
                piece = without(piece, lost) if piece.table is not None else piece
                value = convert(piece) if piece.shows and piece.runs else None
                if not piece.runs:
                    continue
            counts = ack.totals(piece.runs)
            if not piece.shows:
                ack.hand(counts)
                ack.acknowledge(counts)
            elif unbatch:
                yield from ack.instances(piece, value, progress_every)
            else:
                ack.hand(counts)
                yield value
                ack.acknowledge(counts)  # the trainer asked for the next one
        finished = True
    finally:
        if not finished:
            ack.abandoned()
        if worker is not None:
            worker.stop()
        stream.close(finished)  # stops the prefetcher; the background thread then ends
        if worker is not None:
            worker.close()
