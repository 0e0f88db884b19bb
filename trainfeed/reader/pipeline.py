"""The input pipeline between "partition read" and "batch handed to training".

Per pass, a background thread takes the loaded partitions of the pass in order, maps labels to
class ids, rebalances classes (resampling), shuffles within a buffer, cuts batches, decodes the
images on all cores and normalizes them, and queues ready batches (bounded), so that storage
I/O (the prefetch thread), decoding (the decoder's threads, GIL released) and training overlap.
The trainer's thread only takes batches off the queue and acknowledges partitions.

Acknowledgement keeps the reader's contract: a partition is reported done once the trainer was
handed its last record (after resampling: its last copy) and asked for the next batch. Shuffling
and resampling reorder records inside and across partitions, so a pipeline reports no progress
within a partition: after a crash, or a restore from `reader.state()`, a partition that was in
the trainer's hands is read again from its start (see docs).
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from trainfeed.formats.manifest import ID_COLUMN, Manifest
from trainfeed.reader.backends import PassStream
from trainfeed.reader.transforms import Augmentor, AugmentStep, Standardize, load_transformer
from trainfeed.storage import Storage
from trainfeed.worker.crops import CropOptions
from trainfeed.worker.decode import DECODE_POLICIES, ImageDecoder, binary_views
from trainfeed.worker.labels import ClassIndex
from trainfeed.worker.partition_reader import COPIES_COLUMN, Selector
from trainfeed.worker.prefetch import LoadedPartition, TaskRef
from trainfeed.worker.resample import Resampler, Target, ratio_factors

logger = logging.getLogger(__name__)

MODES = ("train", "validation", "score")
# The per-record loss weight field of batches with class_weights (Keras's sample_weight).
WEIGHT_FIELD = "_weight"
# Records per internal batch when the trainer takes one instance at a time (no batch_size).
INSTANCE_CHUNK = 64
Batch = dict[str, Any]


@dataclass(frozen=True)
class PipelineOptions:
    """What `dist.reader(...)` does to records before handing them over. See its docstring."""

    decode: bool = False
    image_size: tuple[int, int] | None = None
    crop: bool = False
    channels: int = 3
    normalizing_const: float | None = None
    one_hot: bool = False
    shuffle_buffer: int = 0
    resample: Target | None = None
    batch_size: int | None = None
    decode_errors: str = "raise"
    decode_threads: int | None = None
    prefetch_batches: int = 2
    mode: str = "train"
    transform: str | Standardize | None = None
    augment: tuple[AugmentStep, ...] = ()
    class_weights: Target | None = None
    class_values: tuple[str, ...] | None = None
    # Decode-stage crops (issue 15; trainfeed.worker.crops): ((scale), (ratio)) of torchvision's
    # RandomResizedCrop, a left-right flip with probability 0.5, the validation resize.
    random_resized_crop: tuple[tuple[float, float], tuple[float, float]] | None = None
    random_flip: bool = False
    resize_shorter: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {self.batch_size}")
        if self.shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be ≥ 0, got {self.shuffle_buffer}")
        if self.normalizing_const is not None and self.normalizing_const == 0:
            raise ValueError("normalizing_const must not be 0")
        if self.decode_errors not in DECODE_POLICIES:
            raise ValueError(f"decode_errors must be one of {DECODE_POLICIES}, "
                             f"got {self.decode_errors!r}")
        if self.prefetch_batches < 1:
            raise ValueError(f"prefetch_batches must be ≥ 1, got {self.prefetch_batches}")
        if ((self.image_size is not None or self.normalizing_const is not None or self.crop)
                and not self.decode):
            raise ValueError("image_size and normalizing_const apply to decoded images: "
                             "pass decode=True")
        self._check_crops()

    def _check_crops(self) -> None:
        """The decode-stage crop options need decoding and an output size, and replace `crop`."""
        if self.random_resized_crop is None and self.resize_shorter is None:
            if self.random_flip:
                raise ValueError("random_flip is a decode-stage option of random_resized_crop= "
                                 "or resize_shorter=; to mirror whole batches use "
                                 "augment=['trainfeed.augment:random_flip']")
            return
        if not self.decode or self.image_size is None:
            raise ValueError("random_resized_crop and resize_shorter crop decoded images to "
                             "image_size: pass decode=True and image_size=(height, width)")
        if self.crop:
            raise ValueError("crop=True and random_resized_crop/resize_shorter both choose the "
                             "crop: pass one of them")
        _ = self.crop_options  # CropOptions validates the values

    @property
    def crop_options(self) -> CropOptions | None:
        """What the decode threads crop: a random resized crop and flip in training, the
        resize-shorter-side + centre crop in validation and scoring."""
        if self.image_size is None or (self.random_resized_crop is None
                                       and self.resize_shorter is None):
            return None
        training = self.mode == "train"
        return CropOptions(
            self.image_size,
            self.random_resized_crop if training else None,
            self.resize_shorter,
            0.5 if training and self.random_flip else 0.0)

    @property
    def active(self) -> bool:
        """Whether any option asks for more than the raw Paddle-style records."""
        return self != PipelineOptions()

    @property
    def shuffles(self) -> bool:
        """Over-sampled copies are shuffled too (within the buffer, at least within the batches'
        window), so that replicas of a record do not sit together."""
        return self.mode == "train" and (self.shuffle_buffer > 1 or self.resample is not None)

    @property
    def resamples(self) -> bool:
        return self.mode == "train" and self.resample is not None


@dataclass
class _Ready:
    """One batch for the trainer, with what it takes out of which partitions."""

    batch: Batch | None  # None: only registers partitions (all their records were dropped)
    new_parts: list[tuple[LoadedPartition, int]] = field(default_factory=list)
    slots: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


class Pipeline:
    """Turns one pass's partitions into batches (dicts of arrays keyed by field name)."""

    def __init__(self, options: PipelineOptions, manifest: Manifest, seed: int,
                 dataset_folder: Storage):
        self.options = options
        self.seed = seed
        self.fields = manifest.field_names
        self.label_field = manifest.label_field if manifest.label_histogram else None
        self.image_fields = tuple(f.name for f in manifest.fields
                                  if f.type == "binary") if options.decode else ()
        self.classes = (ClassIndex(options.class_values) if options.class_values is not None
                        else ClassIndex.from_histogram(manifest.label_histogram)
                        if self.label_field else None)
        self.resampler: Resampler | None = None
        if options.resamples:
            if self.classes is None:
                raise ValueError(f"dataset {manifest.name!r} has no labels to rebalance")
            factors = ratio_factors(manifest.label_histogram, options.resample)  # type: ignore
            self.resampler = Resampler(  # a class this dataset lacks never occurs: 0
                np.array([factors.get(c, 0.0) for c in self.classes.values]), seed)
        self.class_weights: np.ndarray | None = None
        if options.class_weights is not None:
            if self.classes is None:
                raise ValueError(f"dataset {manifest.name!r} has no labels to weight")
            weights = ratio_factors(manifest.label_histogram, options.class_weights)
            self.class_weights = np.array([weights.get(c, 0.0) for c in self.classes.values],
                                          dtype=np.float32)
        self.decoder = (ImageDecoder(options.image_size, options.channels,
                                     options.decode_threads, options.decode_errors, options.crop,
                                     crops=options.crop_options)
                        if options.decode else None)
        self.decode_failures = 0
        transform = options.transform
        self.transformer = (load_transformer(dataset_folder, transform)
                            if isinstance(transform, str) else transform)
        self.augmentor = (Augmentor(options.augment)
                          if options.augment and options.mode == "train" else None)

    @property
    def selector(self) -> Selector | None:
        """For resampling at read time: copies per row from the rows' labels, so that the
        payloads of dropped records are never fetched (see PartitionReader.read_selected)."""
        resampler, classes, label = self.resampler, self.classes, self.label_field
        if resampler is None or classes is None or label is None:
            return None

        def copies(task: TaskRef, rows: pa.Table) -> np.ndarray:
            ids = classes.ids(rows.column(label), where=f"shard {task.shard}")
            return resampler.copies(ids, task.epoch, task.partition)
        return copies

    # -- what comes out --------------------------------------------------------------------
    def output_spec(self) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]:
        """Per field: the shape of one batch (None: the batch dimension) and the dtype."""
        spec: dict[str, tuple[tuple[int | None, ...], np.dtype]] = {}
        for name in self.fields:
            if name in self.image_fields:
                h, w = self.options.image_size or (None, None)
                dtype = np.float32 if self.options.normalizing_const else np.uint8
                spec[name] = ((None, h, w, self.options.channels), np.dtype(dtype))
            elif name == self.label_field and self.classes is not None:
                spec[name] = (((None, self.classes.num_classes), np.dtype(np.float32))
                              if self.options.one_hot else ((None,), np.dtype(np.int64)))
            else:
                spec[name] = ((None,), np.dtype(object))
        spec[ID_COLUMN] = ((None,), np.dtype(np.int64))
        if self.class_weights is not None:
            spec[WEIGHT_FIELD] = ((None,), np.dtype(np.float32))
        return spec

    def _convert(self, table: pa.Table, where: Callable[[int], str], epoch: int = 0) -> Batch:
        """Arrays of one batch, without the rows that failed to decode (under "skip")."""
        keep = np.ones(table.num_rows, dtype=bool)
        out: Batch = {}
        for name in self.image_fields:
            assert self.decoder is not None
            blobs = binary_views(table.column(name))  # zero-copy (trainfeed.worker.decode)
            # Record ids and the epoch seed the decode-stage crops (same crop on a re-read).
            decoded = self.decoder.decode(blobs, [where(i) for i in range(len(blobs))],
                                          ids=table.column(ID_COLUMN).to_numpy(),
                                          seed=self.seed, epoch=epoch)
            if decoded.errors:
                self.decode_failures += len(decoded.errors)
                for message in decoded.errors[:3]:
                    logger.warning("skipped: %s", message)
            keep &= decoded.ok
            images = np.zeros((table.num_rows, *decoded.images.shape[1:]), np.uint8) \
                if not decoded.ok.all() else decoded.images
            if not decoded.ok.all():
                images[decoded.ok] = decoded.images
            if self.options.normalizing_const:
                images = np.multiply(images, np.float32(1.0 / self.options.normalizing_const),
                                     dtype=np.float32)
            out[name] = images
        for name in self.fields:
            if name in out:
                continue
            column = table.column(name)
            if name == self.label_field and self.classes is not None:
                ids = self.classes.ids(column, where=where(0))
                out[name] = self.classes.one_hot(ids) if self.options.one_hot else ids
                if self.class_weights is not None:
                    out[WEIGHT_FIELD] = self.class_weights[ids]
            else:
                out[name] = np.array(column.to_pylist(), dtype=object)
        out[ID_COLUMN] = table.column(ID_COLUMN).to_numpy()
        if not keep.all():
            out = {k: v[keep] for k, v in out.items()}
        return out

    # -- the producer ------------------------------------------------------------------------
    def _produce(self, stream: PassStream, batch_size: int, emit: Callable[[_Ready], None],
                 stopping: Callable[[], bool]) -> None:
        tables: list[pa.Table] = []  # rows waiting, with a "_slot" column naming their partition
        buffered = 0
        new_parts: list[tuple[LoadedPartition, int]] = []
        next_slot = 0  # partitions are numbered in arrival order, here and in `batches`
        shard_of: dict[int, str] = {}  # slot -> shard, for error messages
        window = 0
        produced = 0  # batches so far: with the epoch, seeds the augmentations
        fill = max(batch_size, self.options.shuffle_buffer if self.options.shuffles else 0)

        def cut(everything: bool) -> None:
            nonlocal tables, buffered, new_parts, window, produced
            if not tables:
                if new_parts:
                    emit(_Ready(None, new_parts))
                    new_parts = []
                return
            table = pa.concat_tables(tables)
            if self.options.shuffles:
                rng = np.random.default_rng((self.seed, 0x5F, epoch_of(stream), window))
                table = table.take(rng.permutation(table.num_rows))
                window += 1
            usable = table.num_rows if everything else table.num_rows // batch_size * batch_size
            for start in range(0, usable, batch_size):
                if stopping():
                    return
                piece = table.slice(start, min(batch_size, usable - start))
                emit(self._ready(piece, new_parts, shard_of, epoch_of(stream), produced))
                produced += 1
                new_parts = []
            rest = table.slice(usable)
            tables, buffered = ([rest], rest.num_rows) if rest.num_rows else ([], 0)

        for part in stream:
            if stopping():
                return
            if part is None:  # nothing coming for now: hand over what is buffered
                cut(everything=True)
                continue
            table = part.table
            # Resampling decided at read time (`selector`, passed with every pass): emit each
            # kept row as many times as it says.
            if COPIES_COLUMN in table.column_names:
                copies = table.column(COPIES_COLUMN).to_numpy()
                table = table.drop_columns([COPIES_COLUMN])
                table = table.take(np.repeat(np.arange(table.num_rows), copies))
            slot, next_slot = next_slot, next_slot + 1
            shard_of[slot] = part.task.shard
            new_parts.append((part, table.num_rows))
            if table.num_rows:
                tables.append(table.append_column("_slot", pa.array(
                    np.full(table.num_rows, slot, np.int64))))
                buffered += table.num_rows
            stream.taken(part)
            if buffered >= fill:
                cut(everything=False)
        cut(everything=True)

    def _ready(self, piece: pa.Table, new_parts: list[tuple[LoadedPartition, int]],
               shard_of: dict[int, str], epoch: int, index: int) -> _Ready:
        slots = piece.column("_slot").to_numpy()
        piece = piece.drop_columns(["_slot"])
        ids = piece.column(ID_COLUMN).to_numpy()
        batch = self._convert(piece, lambda i: f"record {ids[i]} of shard "
                                               f"{shard_of[int(slots[i])]}", epoch)
        if self.transformer is not None:
            batch = self.transformer.apply(batch)
        if self.augmentor is not None:
            batch = self.augmentor(batch, np.random.default_rng((self.seed, 0xA6, epoch, index)))
        return _Ready(batch, list(new_parts), slots)

    # -- the pass ----------------------------------------------------------------------------
    def batches(self, stream: PassStream, batch_size: int) -> Iterator[Batch]:
        """One pass as batches; acknowledges partitions as the trainer consumes them."""
        ready: queue.Queue[_Ready | BaseException | None] = queue.Queue(
            self.options.prefetch_batches)
        stop = threading.Event()

        def emit(item: _Ready | BaseException | None) -> None:
            """Queues `item` unless the pass was stopped (then nobody would take it)."""
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        def run() -> None:
            try:
                self._produce(stream, batch_size, emit, stop.is_set)
                emit(None)  # the pass is over
            except BaseException as e:  # handed to the trainer's thread
                emit(e)

        producer = threading.Thread(target=run, daemon=True, name="trainfeed-pipeline")
        producer.start()
        parts: dict[int, LoadedPartition] = {}
        left: dict[int, int] = {}
        registered = 0
        try:
            while True:
                item = ready.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                for part, rows in item.new_parts:
                    slot, registered = registered, registered + 1
                    parts[slot], left[slot] = part, rows
                    if rows == 0:
                        self._acknowledge(stream, parts.pop(slot), left, slot)
                if item.batch is None:
                    continue
                yield item.batch
                # The trainer asked for the next batch: this one's records are consumed.
                slots, counts = np.unique(item.slots, return_counts=True)
                for slot, count in zip(slots.tolist(), counts.tolist()):
                    left[slot] -= count
                    if left[slot] == 0:
                        self._acknowledge(stream, parts.pop(slot), left, slot)
        finally:
            # The producer may be waiting for the next partition (a long-poll at an epoch's
            # tail): it stops once the pass's stream is closed, right after this; no join.
            stop.set()

    @staticmethod
    def _acknowledge(stream: PassStream, part: LoadedPartition, left: dict[int, int],
                     slot: int) -> None:
        del left[slot]
        stream.consumed(part)

    def instances(self, stream: PassStream) -> Iterator[tuple[Any, ...]]:
        """One pass as instance tuples in field order, every option applied."""
        names = self.fields
        for batch in self.batches(stream, INSTANCE_CHUNK):
            columns = [batch[name] for name in names]
            yield from zip(*columns)

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.close()


def epoch_of(stream: PassStream) -> int:
    return stream.epoch if stream.epoch is not None else 0
