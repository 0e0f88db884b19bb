"""The Reader: what `dist.reader(...)` returns. A reader creator, Paddle-style.

Each call `reader()` is one pass (epoch) yielding one instance at a time, a tuple in the `.list`
file's column order. `reader.column_batches(n)` is the fast path: dicts of columns, no Python tuple
per instance. A partition is acknowledged (reported done) only after the trainer was handed its
last instance and asked for the next one, so a crash never loses records the trainer did not see.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from trainfeed.formats.manifest import ID_COLUMN, PACKED_KIND
from trainfeed.preprocess.packed import decode_buffer
from trainfeed.reader.backends import Backend, PassStream
from trainfeed.reader.pipeline import Pipeline, PipelineOptions
from trainfeed.reader.position import ReaderPosition
from trainfeed.storage import Storage
from trainfeed.worker.partition_reader import Selector
from trainfeed.worker.prefetch import LoadedPartition

logger = logging.getLogger(__name__)

ColumnBatch = dict[str, Any]
# In the tuple path, progress within a partition is noted every this many instances: cheap
# (one modulo per instance) and a crash repeats at most this many more instances.
PROGRESS_EVERY = 64


def _rows(table: pa.Table, names: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
    """The table's instances as tuples of the fields, in order."""
    return zip(*(table.column(n).to_pylist() for n in names))


def handed_over(stream: PassStream, batch: list[tuple[LoadedPartition, int, pa.Table]]) -> None:
    """The trainer is about to get `batch` (pieces: partition, its rows handed with this
    batch, the slice): from now on `state()` counts them. (The master hears of them only once
    the trainer asks for more: see `consumed` in `_batched`.)"""
    for part, handed, _ in batch:
        stream.positions[part.task.partition] = part.task.skip + handed


def _columns(table: pa.Table, names: tuple[str, ...]) -> ColumnBatch:
    batch: ColumnBatch = {name: table.column(name).to_pylist() for name in names}
    batch[ID_COLUMN] = table.column(ID_COLUMN).to_numpy()
    return batch


class Reader:
    """A reader creator over one dataset. Thread-safety: one pass at a time; `close()` is
    idempotent and also ends a pass in progress (unfinished tasks go back to the master).
    """

    def __init__(self, make_backend: Callable[[ReaderPosition | None], Backend], name: str,
                 mode: str, state: dict[str, Any] | None = None,
                 options: PipelineOptions | None = None):
        self._make_backend = make_backend
        self._backend: Backend | None = None
        self.options = options or PipelineOptions()
        self._pipeline: Pipeline | None = None
        self._lock = threading.Lock()
        self.name = name
        self.mode = mode
        self.closed = False
        self._resume: ReaderPosition | None = None
        if state is not None:
            self.restore(state)

    @property
    def backend(self) -> Backend:
        """Connects (to storage or the master) on first use, so building a reader is free."""
        with self._lock:
            if self.closed:
                raise ValueError(f"reader of {self.name!r} is closed")
            if self._backend is None:
                self._backend = self._make_backend(self._resume)
            return self._backend

    def state(self) -> dict[str, Any]:
        """Where the trainer stands in the epoch, as a small JSON-able dict to save with a
        checkpoint; `dist.reader(..., state=saved)` (or `restore`) continues from it.

        Exact: what the trainer was handed counts, what was prefetched does not. In a cluster
        the restored reader also gets back what the crashed one consumed after the checkpoint
        (the master undoes it), so the restored model sees every record of the epoch once."""
        return self.backend.position().to_dict()

    def restore(self, state: dict[str, Any]) -> None:
        """Continues from a saved `state()` instead of the job's current position. Only before
        the first pass (it decides how this reader joins)."""
        position = ReaderPosition.from_dict(state, self.name, self.mode)
        with self._lock:
            if self._backend is not None:
                raise ValueError("restore() must come before the reader's first pass "
                                 "(or pass state= to dist.reader)")
            self._resume = position

    @property
    def field_names(self) -> tuple[str, ...]:
        """Names of the fields, in `.list` column order (`image`, `label` for file lists)."""
        return self.backend.field_names

    @property
    def epoch(self) -> int | None:
        """The epoch of the current or last pass (None before the first)."""
        return self.backend.epoch

    @property
    def pipeline(self) -> Pipeline:
        """Decoding, labels, resampling, shuffling and batching (built on first use)."""
        backend = self.backend
        with self._lock:
            if self._pipeline is None:
                self._pipeline = Pipeline(self.options, backend.manifest, backend.seed,
                                          backend.dataset_folder)
            return self._pipeline

    def output_spec(self) -> dict[str, tuple[tuple[int | None, ...], Any]]:
        """Per field of a batch: its shape (None for the batch dimension) and numpy dtype."""
        return self.pipeline.output_spec()

    @property
    def class_values(self) -> tuple[str, ...]:
        """The labels behind class ids 0..K-1 (pass them to a validation reader)."""
        classes = self.pipeline.classes
        if classes is None:
            raise ValueError(f"dataset {self.name!r} has no labels")
        return classes.values

    @property
    def decode_failures(self) -> int:
        """Records dropped so far because they could not be decoded (decode_errors="skip")."""
        return self._pipeline.decode_failures if self._pipeline is not None else 0

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
        return self.backend.dataset_folder

    @property
    def payload_bytes_read(self) -> int:
        """Bytes of payload (file bytes) this reader fetched from storage so far."""
        return self.backend.read_stats.payload_bytes

    def _run_pass(self, body: Callable[[PassStream], Iterator[Any]],
                  selector: Selector | None = None) -> Iterator[Any]:
        stream = self.backend.open_pass(selector)
        finished = False
        try:
            yield from body(stream)
            finished = True
        finally:
            stream.close(finished)

    def __call__(self) -> Iterator[Any]:
        """One pass. Raw (no pipeline option): each instance as a tuple (bytes for files, str
        for text columns). With options: dicts of arrays per `batch_size` records, or without
        batch_size each instance as a tuple with every option applied."""
        manifest = self.backend.manifest
        if manifest.kind == PACKED_KIND and not self.options.active:
            return self._run_pass(lambda stream: self._buffers(stream, manifest.extra["tensors"]))
        if self.options.active:
            pipeline = self.pipeline
            size = self.options.batch_size
            return self._run_pass(
                (lambda stream: pipeline.batches(stream, size)) if size is not None
                else pipeline.instances, pipeline.selector)
        names = self.field_names

        def instances(stream: PassStream) -> Iterator[tuple[Any, ...]]:
            positions = stream.positions
            for part in stream:
                if part is None:
                    continue
                partition, skip = part.task.partition, part.task.skip
                for handed, row in enumerate(_rows(part.table, names), start=1):
                    positions[partition] = skip + handed  # exact, for state(); a dict store
                    yield row
                    if handed % PROGRESS_EVERY == 0:  # the trainer asked for the next one
                        stream.progress(part, handed)
                stream.taken(part)
                stream.consumed(part)
        return self._run_pass(instances)

    @staticmethod
    def _buffers(stream: PassStream, tensors: dict[str, str]) -> Iterator[dict[str, Any]]:
        """A packed dataset (trainfeed.preprocess): one dict of arrays per buffer."""
        for part in stream:
            if part is None:
                continue
            for handed, row in enumerate(part.table.to_pylist(), start=1):
                stream.positions[part.task.partition] = part.task.skip + handed
                yield decode_buffer(row, tensors, row[ID_COLUMN])
                stream.progress(part, handed)  # buffers are big: each one counts
            stream.taken(part)
            stream.consumed(part)

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
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1 or None, got {batch_size}")

        def per_partition(stream: PassStream) -> Iterator[Any]:
            for part in stream:
                if part is not None:
                    handed_over(stream, [(part, part.table.num_rows, part.table)])
                    yield convert(part.table)
                    stream.taken(part)
                    stream.consumed(part)

        def batches(stream: PassStream) -> Iterator[Any]:
            assert batch_size is not None
            # Rows waiting for the next batch: (partition, its rows handed once this batch is
            # consumed, the slice).
            pieces: list[tuple[LoadedPartition, int, pa.Table]] = []
            buffered = 0
            # Partitions whose every row is in `pieces` or already yielded: acknowledged once the
            # batch holding their last rows was handed over and the trainer asked for the next.
            sliced: list[LoadedPartition] = []

            def consumed(batch: list[tuple[LoadedPartition, int, pa.Table]],
                         acked: list[LoadedPartition]) -> None:
                for part, handed, _ in batch:
                    stream.progress(part, handed)
                for done in acked:
                    stream.consumed(done)

            for part in stream:
                if part is None:  # nothing coming for now: hand the partial batch over
                    batch, acked = pieces, sliced
                    pieces, buffered, sliced = [], 0, []
                    if batch and not drop_last:
                        handed_over(stream, batch)
                        yield convert(pa.concat_tables([t for _, _, t in batch]))
                    consumed(batch, acked)
                    continue
                offset = 0
                while offset < part.table.num_rows:
                    take = min(batch_size - buffered, part.table.num_rows - offset)
                    pieces.append((part, offset + take, part.table.slice(offset, take)))
                    buffered += take
                    offset += take
                    if buffered == batch_size:
                        batch, acked = pieces, sliced
                        pieces, buffered, sliced = [], 0, []
                        handed_over(stream, batch)
                        yield convert(pa.concat_tables([t for _, _, t in batch]))
                        consumed(batch, acked)
                stream.taken(part)
                sliced.append(part)
                if not pieces:  # the partition ended exactly at a batch boundary (or was empty)
                    consumed([], sliced)
                    sliced = []
            if pieces and not drop_last:
                handed_over(stream, pieces)
                yield convert(pa.concat_tables([t for _, _, t in pieces]))
            consumed(pieces, sliced)
        return self._run_pass(per_partition if batch_size is None else batches)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            backend, self._backend = self._backend, None
            if self._pipeline is not None:
                self._pipeline.close()
        if backend is not None:
            backend.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
