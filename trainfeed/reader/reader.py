"""The Reader: what `dist.reader(...)` returns. A reader creator, Paddle-style.

Each call `reader()` is one pass (epoch) yielding one instance at a time, a tuple in the `.list`
file's column order. `reader.column_batches(n)` is the fast path: dicts of columns, no Python tuple
per instance. Every path runs through the one batcher (trainfeed.reader.batcher): a partition is
acknowledged (reported done) only after the trainer was handed its last instance and asked for
the next one, so a crash never loses records the trainer did not see, and `state_dict()` counts
exactly what the trainer was handed, shuffled or not.
"""
from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from trainfeed.formats.manifest import ID_COLUMN, PACKED_KIND
from trainfeed.formats.packed import decode_buffer
from trainfeed.io.load import Load
from trainfeed.io.loads import load_threads
from trainfeed.io.partition_reader import ReadStats
from trainfeed.reader.backends import Backend, PassStream
from trainfeed.reader.batcher import Cutter, Piece, bounded_load, deliver
from trainfeed.reader.label_ids import check_saved
from trainfeed.reader.meter import Counters, ReaderFigures, ReaderMeter
from trainfeed.reader.pipeline import Pipeline, PipelineOptions, delivery_order
from trainfeed.reader.position import ReaderPosition
from trainfeed.reader.remote_decode import decoder_pool
from trainfeed.reader.world import SyncGroup
from trainfeed.storage import Storage

logger = logging.getLogger(__name__)

ColumnBatch = dict[str, Any]
# Attributes of earlier releases: what replaces each (Reader.__getattr__ names it).
RETIRED = {
    "state": "was retired: use reader.state_dict() (version 2 of the state; version 1 is no "
             "longer read)",
    "restore": "was retired: use reader.load_state_dict(state), or dist.reader(..., state=state)",
    "backend": "is private: the reader's properties (field_names, epoch, dataset_folder, "
               "lost_partitions, payload_bytes_read) say what it knows",
    "pipeline": "is private: reader.options is the PipelineOptions it runs, and output_spec() and "
                "class_values what it makes",
}
# The order of the raw paths (tuples, batch(), column batches, packed buffers): as stored.
STORED = "stored"


def _rows(table: pa.Table, names: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
    """The table's instances as tuples of the fields, in order."""
    return zip(*(table.column(n).to_pylist() for n in names))


def _columns(table: pa.Table, names: tuple[str, ...]) -> ColumnBatch:
    batch: ColumnBatch = {name: table.column(name).to_pylist() for name in names}
    batch[ID_COLUMN] = table.column(ID_COLUMN).to_numpy()
    return batch


def _end_pass(running: Generator[Any, None, None] | None, name: str) -> None:
    """Ends a pass the trainer left mid-way (Reader.close), so that its threads (read-ahead,
    batch preparation, decoding) are stopped and joined now, not when its iterator is
    collected: a pass the trainer still holds, or one in a reference cycle, kept them running
    (and a master-fed one retrying a master that was gone) until then."""
    if running is None:
        return
    try:
        running.close()
    except ValueError:  # its trainer is inside it on another thread: it ends there
        logger.debug("reader of %r closed while another thread reads its pass", name)
    except Exception as e:  # the pass ended badly; closing must still finish
        logger.warning("the pass of reader %r in progress ended with: %s", name, e)


class Reader:
    """A reader creator over one dataset: each call `reader()` is one pass (epoch).

    Made by `dist.reader(...)`; nothing connects until the first pass or the first property
    that needs the dataset. Thread-safety: one pass at a time; `close()` is idempotent and also
    ends a pass in progress (unfinished tasks go back to the master). A context manager.

    Attributes:
        name: The dataset.
        mode: "local" (a LocalSource) or "distributed" (a MasterSource).
        options: The PipelineOptions it runs.
        seed: The source's seed.
        group: A synchronous reader's group (world size, rank, batch size), else None.
        closed: Whether `close()` was called.
    """

    def __init__(self, make_backend: Callable[[ReaderPosition | None], Backend], name: str,
                 mode: str, state: dict[str, Any] | None = None,
                 options: PipelineOptions | None = None, seed: int = 0,
                 group: SyncGroup | None = None):
        self._make_backend = make_backend
        self.group = group
        self._connected: Backend | None = None  # made on first use: see _backend
        self.options = options or PipelineOptions()
        self._built: Pipeline | None = None  # made on first use: see _pipeline
        # TRAINFEED_DECODE=remote: decode workers (options they cannot run refused now).
        self._decoders = (decoder_pool(self.options, master_lists=mode == "distributed")
                          if self.options.active else None)
        self._lock = threading.Lock()
        self.name = name
        self.mode = mode
        self.seed = seed
        self.closed = False
        self._resume: ReaderPosition | None = None
        self._passes = 0  # passes started
        # The last pass handed out (weak: a pass the trainer drops ends when it is collected),
        # ended by `close()` if it is still going (see `_end_pass`).
        self._pass: weakref.ref[Generator[Any, None, None]] | None = None
        # The trainer's waits, reads and decodes (issue 29): reader.stats(), and the master's.
        self.meter = ReaderMeter(counters=self._counters)
        self._read_stats: ReadStats | None = None
        # The delivery order of the current or last pass (what positions count in): a pass of
        # `reader()` with shuffling options, else the stored order.
        self._order = (delivery_order(self.options, seed) if self.options.active else STORED)
        if state is not None:
            self.load_state_dict(state)

    @property
    def _backend(self) -> Backend:
        """Connects (to storage or the master) on first use, so building a reader is free."""
        with self._lock:
            if self.closed:
                raise ValueError(f"reader of {self.name!r} is closed")
            if self._connected is None:
                self._connected = self._make_backend(self._resume)
                session = getattr(self._connected, "session", None)
                if session is not None:  # its messages to the master carry the summaries
                    session.stats = self.meter.take_summary
                    if self._decoders is not None:  # and the master lists the decoders
                        session.on_decoders = self._decoders.listed_by_master
            return self._connected

    if not TYPE_CHECKING:  # hidden from type checkers, which should flag these names
        def __getattr__(self, name: str) -> Any:
            """Names of earlier releases, each refused with what replaces it (called only for
            an attribute the reader does not have)."""
            if name in RETIRED:
                raise AttributeError(f"Reader.{name} {RETIRED[name]}")
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _position(self) -> ReaderPosition:
        with self._lock:
            backend, resume = self._connected, self._resume
        if backend is None:  # not connected yet: what it would resume from, or the start
            position = resume or ReaderPosition(self.mode, self.name, -1, seed=self.seed)
        else:
            position = backend.position()
        position.order = self._order
        built = self._built
        if built is not None and built.classes is not None:  # the ids it delivered
            position.class_values = built.classes.values
        return position

    def state_dict(self) -> dict[str, Any]:
        """Where the trainer stands in the epoch, to save with a checkpoint.

        torchdata's `Stateful` protocol: a small JSON-able dict with fixed keys, e.g. for
        `torchdata.stateful_dataloader.StatefulDataLoader` or `torch.distributed.checkpoint`;
        `load_state_dict` (or `dist.reader(..., state=saved)`) continues from it. Exact on every
        path: what the trainer was handed counts (per partition, in its delivery order, shuffled
        or not), what was prefetched or buffered does not. In a cluster the restored reader also
        gets back what the crashed one consumed after the checkpoint (the master undoes it), so
        the restored model sees every record of the epoch once. Building it does not connect.

        Returns:
            The state, version 2 (trainfeed.reader.position).
        """
        return self._position().to_state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a saved `state_dict()` instead of the job's current position.

        Only before the first pass (it decides how this reader joins); a connection made before
        it (e.g. by `output_spec()`) is dropped and made again from the state.

        Args:
            state: What `state_dict()` returned, unchanged (a JSON round trip is fine).

        Raises:
            CheckpointError: not a reader state of this dataset and mode (the message says
                which key or value is wrong); or a state whose reader delivered other class
                ids than this one's pinned `class_values` (here), or than the dataset version
                this reader opens (when it opens it, before its first record), naming both
                mappings (trainfeed.reader.label_ids).
            ValueError: the reader already started a pass.
        """
        position = ReaderPosition.from_dict(state, self.name, self.mode)
        pinned = self.options.labels.class_values
        if pinned is not None:  # known now: refused before anything connects
            check_saved(self.name, position.class_values, position.dataset_version, pinned, 0)
        with self._lock:
            if self._passes:
                raise ValueError("load_state_dict() must come before the reader's first pass "
                                 "(or pass state= to dist.reader)")
            backend, self._connected = self._connected, None
            self._resume = position if position.epoch >= 0 else None
        if backend is not None:
            backend.close()

    @property
    def field_names(self) -> tuple[str, ...]:
        """Names of the fields, in `.list` column order (`image`, `label` for file lists)."""
        return self._backend.field_names

    @property
    def steps_per_epoch(self) -> int | None:
        """Batches every pass yields, for a synchronous reader (`sync=SyncOptions()`): the same on
        every rank, every epoch. None for other readers, whose passes vary."""
        if self.group is None:
            return None
        return self.group.steps(self._backend.manifest.num_records)

    @property
    def dropped_per_epoch(self) -> int:
        """Records of each epoch a synchronous group does not deliver (fewer than world_size ×
        batch_size: the last of the epoch's shuffled order); 0 for other readers."""
        if self.group is None:
            return 0
        records = self._backend.manifest.num_records
        return records - self.group.kept(records)

    @property
    def epoch(self) -> int | None:
        """The epoch of the current or last pass (None before the first)."""
        return self._backend.epoch

    @property
    def _pipeline(self) -> Pipeline:
        """Decoding, labels, resampling, shuffling and batching (built on first use)."""
        backend = self._backend
        with self._lock:
            if self._built is None:
                self._built = Pipeline(self.options, backend.manifest, backend.seed,
                                       backend.dataset_folder, self._decoders)
            return self._built

    def output_spec(self) -> dict[str, tuple[tuple[int | None, ...], Any]]:
        """Per field of a batch: its shape (None for the batch dimension) and numpy dtype."""
        return self._pipeline.output_spec()

    @property
    def class_values(self) -> tuple[str, ...]:
        """The labels behind class ids 0..K-1 (pass them to a validation reader)."""
        classes = self._pipeline.classes
        if classes is None:
            raise ValueError(f"dataset {self.name!r} has no labels")
        return classes.values

    def stats(self) -> ReaderFigures:
        """This reader's figures since its trainer first asked for a batch: the input-bound
        share (`.input_bound`, the share of wall time the trainer was blocked waiting for its
        next batch), records, bytes read, read and decode time, decode failures. The same
        figures reach the master's status page with the calls this reader makes anyway."""
        return self.meter.totals()

    def _counters(self) -> Counters:
        connected = self._connected
        if connected is not None:  # (a master-fed backend's counters come with its first pass)
            self._read_stats = connected.read_stats  # kept: counted on after close()
        read, pipeline = self._read_stats, self._built
        return Counters(
            bytes_read=read.payload_bytes if read is not None else 0,
            records_decoded=pipeline.records_decoded if pipeline is not None else 0,
            decode_s=pipeline.decode_s if pipeline is not None else 0.0,
            decode_failures=pipeline.decode_failures if pipeline is not None else 0)

    @property
    def decode_failures(self) -> int:
        """Records dropped so far because they could not be decoded (decode_errors="skip")."""
        return self._built.decode_failures if self._built is not None else 0

    def as_tf_dataset(self, inputs: Any = None, targets: Any = None,
                      sample_weights: Any = None) -> Any:
        """This reader as a `tf.data.Dataset` for Keras `model.fit` (see
        trainfeed.reader.adapters.as_tf_dataset: needs the [tf] extra)."""
        from trainfeed.reader.adapters import as_tf_dataset
        return as_tf_dataset(self, inputs, targets, sample_weights)

    def as_torch(self, device: Any = None, mean: Any = None, std: Any = None,
                 pin_memory: bool | None = None) -> Any:
        """This reader as a `torch.utils.data.IterableDataset` of tensor dicts (needs [torch]);
        `device`, `mean`, `std`: moved and normalized on the device (see adapters.as_torch)."""
        from trainfeed.reader.adapters import as_torch
        return as_torch(self, device, mean, std, pin_memory)

    @property
    def dataset_folder(self) -> Storage:
        """The dataset's folder in storage (where `save_transformer` puts transformers)."""
        return self._backend.dataset_folder

    @property
    def lost_partitions(self) -> list[tuple[int, int, int, str]]:
        """(epoch, partition, records, reason) of every partition a finished pass went without
        because no reader could read it (master-fed passes; with lost_partitions="raise", the
        default, the pass also raised LostRecordsError). Local passes raise at once instead."""
        return list(getattr(self._backend, "lost", ()))

    @property
    def payload_bytes_read(self) -> int:
        """Bytes of payload (file bytes) this reader fetched from storage so far."""
        return self._backend.read_stats.payload_bytes

    def _run_pass(self, body: Callable[[PassStream], Iterator[Any]], load: Load = bounded_load,
                  order: str = STORED, threads: int | None = None) -> Iterator[Any]:
        """One pass through `body` (which runs the batcher; it ends the stream), which
        `close()` ends if the trainer is still in it. `threads`: partitions loaded at once
        (default: trainfeed.io.loads.load_threads())."""
        run = self._pass_run(body, load, order, load_threads() if threads is None else threads)
        self._pass = weakref.ref(run)
        return run

    def _pass_run(self, body: Callable[[PassStream], Iterator[Any]], load: Load,
                  order: str, threads: int) -> Generator[Any, None, None]:
        saved = self._resume
        if (not self._passes and saved is not None and saved.order and saved.positions
                and saved.order != order):
            raise ValueError(
                f"reader state counts records of partitions in the {saved.order!r} order, but "
                f"this pass delivers them in the {order!r} order: restore it into a reader with "
                "the same seed, shuffle_buffer and resample (and the same path: reader() or "
                "batch())")
        stream = self._backend.open_pass(self.meter.timed_load(load), threads)
        self._passes += 1
        self._order = order
        yield from self.meter.timed(body(stream))  # the trainer's waits

    def __call__(self) -> Iterator[Any]:
        """One pass. Raw (no pipeline option): each instance as a tuple (bytes for files, str
        for text columns). With options: dicts of arrays per `batch_size` records, or without
        batch_size each instance as a tuple with every option applied."""
        manifest = self._backend.manifest
        if manifest.kind == PACKED_KIND and not self.options.active:
            tensors = manifest.extra["tensors"]

            def buffers(piece: Piece) -> Iterator[dict[str, Any]]:
                """A packed dataset (trainfeed.preprocess): one dict of arrays per buffer."""
                assert piece.table is not None
                return (decode_buffer(row, tensors, row[ID_COLUMN])
                        for row in piece.table.to_pylist())
            # Buffers are big: each one counts as progress.
            return self._run_pass(lambda stream: deliver(stream, Cutter(None), buffers,
                                                         unbatch=True, progress_every=1))
        if self.options.active:
            pipeline = self._pipeline
            size = self.options.batch.size
            return self._run_pass(
                (lambda stream: pipeline.batches(stream, size)) if size is not None
                else pipeline.instances, pipeline.loader(), pipeline.order,
                pipeline.load_threads)
        names = self.field_names

        def instances(piece: Piece) -> Iterator[tuple[Any, ...]]:
            assert piece.table is not None
            return _rows(piece.table, names)
        return self._run_pass(lambda stream: deliver(stream, Cutter(None), instances,
                                                     unbatch=True))

    def column_batches(self, batch_size: int | None = None,
                       drop_last: bool = False) -> Iterator[ColumnBatch]:
        """One pass as column batches: `{field: list, "_id": int64 array}` of `batch_size` rows,
        or one batch per partition when None. The fast path: no tuple per instance.

        In a distributed pass a batch may come up short before the epoch ends, once per reader:
        when the epoch's last tasks are held by other readers, the partial batch is handed over so
        that its partitions can be acknowledged (`drop_last` drops it instead).
        """
        names = self.field_names
        return self._batched(batch_size, drop_last, lambda table: _columns(table, names))

    def instance_batches(self, batch_size: int,
                         drop_last: bool = False) -> Iterator[list[tuple[Any, ...]]]:
        """One pass as lists of up to `batch_size` instance tuples (what `batch()` yields)."""
        names = self.field_names
        return self._batched(batch_size, drop_last, lambda table: list(_rows(table, names)))

    def _batched(self, batch_size: int | None, drop_last: bool,
                 convert: Callable[[pa.Table], Any]) -> Iterator[Any]:
        if self.group is not None and batch_size != self.group.batch_size:
            raise ValueError(f"reader of {self.name!r} is synchronous with batch_size "
                             f"{self.group.batch_size}: read it with reader() (or batches of "
                             f"that size), not batches of {batch_size}")
        cutter = Cutter(batch_size, drop_last)  # checks batch_size now, not at the first next()
        return self._run_pass(lambda stream: deliver(
            stream, cutter, lambda piece: convert(piece.table)))

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            backend, self._connected = self._connected, None
        if backend is not None:  # (first: the session hands the pass's tasks back once)
            backend.close()
        _end_pass(self._pass() if self._pass is not None else None, self.name)
        if self._built is not None:  # (after the pass: nothing decodes any more)
            self._built.close()
        if self._decoders is not None:
            self._decoders.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Not while the interpreter finalizes (a script that ended without close(): its
        # session already closed itself at exit, trainfeed.lease.shutdown). gRPC's threads
        # are gone by then, and closing a channel there waited for ever (issue 38: a rank of
        # the finished-group test hung at exit, 1 run in 5).
        if sys.is_finalizing():
            return
        try:
            self.close()
        except Exception:
            pass
