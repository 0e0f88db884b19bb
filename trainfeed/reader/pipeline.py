"""The input pipeline between "partition read" and "batch handed to training".

Per pass, partitions are read in their delivery order (resampled at read time, each one's records
permuted by (seed, epoch, partition) when the pass shuffles: see trainfeed.reader.batcher), and a
background thread cuts them into batches through the one batcher (the shuffle buffer interleaves
partitions), maps labels to class ids, decodes the images on all cores, normalizes, transforms and
augments them, and queues ready batches (bounded), so that storage I/O (the prefetch thread),
decoding (the decoder's threads, GIL released) and training overlap. The trainer's thread only
takes batches off the queue; the batcher acknowledges partitions as it consumes them, and counts
what it was handed of each partition exactly, shuffled or not.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from trainfeed.decode.pixels import DecodedBatch, ImageDecoder, binary_views
from trainfeed.formats.manifest import ID_COLUMN, Manifest
from trainfeed.formats.sources import SourceIndex
from trainfeed.io.load import Load
from trainfeed.io.loads import load_threads
from trainfeed.io.partition_reader import Selector
from trainfeed.io.prefetch import TaskRef
from trainfeed.reader.backends import PassStream
from trainfeed.reader.batcher import DROPPED, Cutter, Piece, deliver, partition_loader
from trainfeed.reader.label_ids import check_pin, delivered
from trainfeed.reader.labels import ClassIndex
from trainfeed.reader.options import MODES, DecodeOptions, PipelineOptions
from trainfeed.reader.resample import Resampler, Target, ratio_factors
from trainfeed.reader.transforms import Augmentor, Standardize, load_transformer
from trainfeed.storage import Storage

if TYPE_CHECKING:  # (the client loads Arrow Flight and gRPC: imported where remote decode runs)
    from trainfeed.decode.remote.client import DecoderPool, RemoteLoad

logger = logging.getLogger(__name__)

__all__ = ["MODES", "Pipeline", "PipelineOptions", "delivery_order"]
# The per-record loss weight field of batches with class_weights (Keras's sample_weight).
WEIGHT_FIELD = "_weight"
# Records per internal batch when the trainer takes one instance at a time (no batch_size).
INSTANCE_CHUNK = 64
Batch = dict[str, Any]


def delivery_order(options: PipelineOptions, seed: int) -> str:
    """Names the order in which a reader with these options delivers a partition's records, which
    a saved position counts in: "stored", or the seed (and resampling target) of the shuffle."""
    if not options.shuffles:
        return "stored"
    order = f"shuffled seed={seed}"
    if options.resamples:
        order += f" resample={options.sampling.resample!r}"
    return order


class RecordNames(Sequence[str]):
    """The names of a batch's records for error messages, each made only when asked for: a
    name looks up the record's source file, which the hot path must never pay for."""

    def __init__(self, name: Callable[[int], str], count: int):
        self._name = name
        self._count = count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        if not 0 <= index < self._count:
            raise IndexError(index)
        return self._name(index)


def image_decoder(decode: DecodeOptions, mode: str, threads: int | None = None,
                  max_pixels: int | None = None) -> ImageDecoder:
    """The decoder a pipeline with these options runs in `mode` (`threads`: instead of the
    options' own; `max_pixels`: the pixel budget, default $TRAINFEED_MAX_IMAGE_PIXELS). A decode
    worker builds its decoders here too (trainfeed.decoder.work): remote and local decode are
    one code."""
    return ImageDecoder(decode.image_size, decode.channels,
                        threads if threads is not None else decode.threads, decode.errors,
                        decode.crop, crops=decode.crop_options(mode), max_pixels=max_pixels)


class Pipeline:
    """Turns one pass's partitions into batches (dicts of arrays keyed by field name)."""

    def __init__(self, options: PipelineOptions, manifest: Manifest, seed: int,
                 dataset_folder: Storage, decoders: DecoderPool | None = None):
        """`decoders`: decode workers that read and decode each partition (remote decode,
        trainfeed.reader.remote_decode); None: read and decode here."""
        self.options = options
        self.seed = seed
        self.fields = manifest.field_names
        self.label_field = manifest.label_field if manifest.label_histogram else None
        self.image_fields = tuple(f.name for f in manifest.fields
                                  if f.type == "binary") if options.decode.enabled else ()
        self.classes = _classes(manifest, options) if self.label_field else None
        self.resampler = _resampler(manifest, options, self.classes, seed)
        self.class_weights = _class_weights(manifest, options, self.classes)
        self.decoder = (image_decoder(options.decode, options.mode)
                        if options.decode.enabled else None)
        self.remote = (_remote_load(decoders, options, manifest, seed, self.image_fields)
                       if decoders is not None and self.image_fields else None)
        self.decode_failures = 0
        self.records_decoded = 0  # and the seconds it took: reader.stats() (issue 29)
        self.decode_s = 0.0
        self._failures_lock = threading.Lock()
        self.transformer = _transformer(options, dataset_folder)
        self.augmentor = (Augmentor(options.transform.augment) if options.augments else None)
        # Each record's file and list line, looked up only when an error names a record.
        self.sources = SourceIndex(dataset_folder, manifest.sources, manifest.source,
                                   [(v.sources, v.source) for v in manifest.versions])

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
                h, w = self.options.decode.image_size or (None, None)
                dtype = np.float32 if self.options.decode.normalizing_const else np.uint8
                spec[name] = ((None, h, w, self.options.decode.channels), np.dtype(dtype))
            elif name == self.label_field and self.classes is not None:
                spec[name] = (((None, self.classes.num_classes), np.dtype(np.float32))
                              if self.options.labels.one_hot else ((None,), np.dtype(np.int64)))
            else:
                spec[name] = ((None,), np.dtype(object))
        spec[ID_COLUMN] = ((None,), np.dtype(np.int64))
        if self.class_weights is not None:
            spec[WEIGHT_FIELD] = ((None,), np.dtype(np.float32))
        return spec

    def _convert(self, table: pa.Table, where: Callable[[int], str],
                 epoch: int = 0, ragged: bool = False) -> tuple[Batch, np.ndarray]:
        """Arrays of one batch, without the rows that failed to decode (under "skip"), and
        which rows of `table` are kept. `epoch` (with the records' ids) seeds decode-stage
        crops, so that a re-read makes the same crops. `ragged`: the rows go on one at a
        time, so images as stored may differ in size (an object array of arrays)."""
        keep = np.ones(table.num_rows, dtype=bool)
        out: Batch = {}
        for name in self.image_fields:
            started = time.perf_counter()
            decoded = self._decode(table.column(name), table.column(ID_COLUMN).to_numpy(),
                                   where, epoch, ragged)
            with self._failures_lock:  # pieces convert on two threads (see `_converters`)
                self.decode_failures += int(np.count_nonzero(~decoded.ok))
                self.records_decoded += len(decoded.ok)
                self.decode_s += time.perf_counter() - started
            if decoded.errors:
                for message in decoded.errors[:3]:
                    logger.warning("skipped: %s", message)
            keep &= decoded.ok
            out[name] = _scaled(_in_rows(decoded, table.num_rows),
                                self.options.decode.normalizing_const)
        for name in self.fields:
            if name in out:
                continue
            column = table.column(name)
            if name == self.label_field and self.classes is not None:
                ids = self.classes.ids(column, where=lambda: where(0))
                out[name] = (self.classes.one_hot(ids) if self.options.labels.one_hot
                             else ids)
                if self.class_weights is not None:
                    out[WEIGHT_FIELD] = self.class_weights[ids]
            else:
                out[name] = np.array(column.to_pylist(), dtype=object)
        out[ID_COLUMN] = table.column(ID_COLUMN).to_numpy()
        if not keep.all():
            out = {k: v[keep] for k, v in out.items()}
        return out, keep

    def _decode(self, column: pa.ChunkedArray, ids: np.ndarray, where: Callable[[int], str],
                epoch: int, ragged: bool) -> DecodedBatch:
        """One image field of a batch decoded here, or as a decode worker sent it (pixels in
        a fixed-size binary column: see trainfeed.decode.remote)."""
        if pa.types.is_fixed_size_binary(column.type):
            from trainfeed.decode.remote.client import received_pixels

            h, w = self.options.decode.image_size or (0, 0)
            return received_pixels(column, (h, w, self.options.decode.channels))
        assert self.decoder is not None
        blobs = binary_views(column)  # zero-copy (trainfeed.decode.pixels)
        return self.decoder.decode(blobs, RecordNames(where, len(blobs)),
                                   ids=ids, seed=self.seed, epoch=epoch,
                                   ragged=ragged)

    # -- the pass ----------------------------------------------------------------------------
    @property
    def order(self) -> str:
        """The delivery order of this pipeline's partitions (see `delivery_order`)."""
        return delivery_order(self.options, self.seed)

    def loader(self) -> Load:
        """How the prefetcher reads a partition: resampled, in delivery order, minus its skip
        (through decode workers, decoded there, with remote decode)."""
        if self.remote is not None:
            return self.remote
        return partition_loader(self.selector, self.seed if self.options.shuffles else None)

    @property
    def load_threads(self) -> int:
        """Partitions a pass loads at once (trainfeed.io.loads): one with remote decode, whose
        load hands each partition to the decode workers and spreads them itself."""
        return 1 if self.remote is not None else load_threads()

    def _cutter(self, batch_size: int) -> Cutter:
        buffer = self.options.sampling.shuffle_buffer
        return Cutter(batch_size, shuffle=(self.seed, buffer) if self.options.shuffles else None)

    def _name(self, record: int, shard: str) -> str:
        """A record as an error names it: its id, its source file and list line, its shard."""
        source = self.sources.describe(record)
        return f"record {record} ({source}) of shard {shard}" if source else \
            f"record {record} of shard {shard}"

    def _prepare(self, piece: Piece, ragged: bool = False) -> tuple[Batch, np.ndarray]:
        assert piece.table is not None
        ids = piece.table.column(ID_COLUMN).to_numpy()
        slots = piece.row_slots()
        batch, keep = self._convert(piece.table, lambda i: self._name(
            int(ids[i]), piece.shards[int(slots[i])]), piece.epoch, ragged)
        if self.transformer is not None:
            batch = self.transformer.apply(batch)
        if self.augmentor is not None:
            batch = self.augmentor(batch, np.random.default_rng(
                (self.seed, 0xA6, piece.epoch, piece.index)))
        return batch, keep

    def batches(self, stream: PassStream, batch_size: int) -> Iterator[Batch]:
        """One pass as batches, prepared in the background; acknowledged as consumed."""
        return deliver(stream, self._cutter(batch_size), lambda piece: self._prepare(piece)[0],
                       background=self.options.batch.prefetch, converters=self._converters,
                       name="trainfeed-pipeline")

    def instances(self, stream: PassStream) -> Iterator[tuple[Any, ...]]:
        """One pass as instance tuples in field order, every option applied."""
        names = self.fields

        def convert(piece: Piece) -> list[Any]:
            batch, keep = self._prepare(piece, ragged=True)  # one at a time: sizes may differ
            kept = iter(zip(*(batch[name] for name in names)))
            return [next(kept) if k else DROPPED for k in keep.tolist()]
        return deliver(stream, self._cutter(INSTANCE_CHUNK), convert, unbatch=True,
                       background=self.options.batch.prefetch, converters=self._converters,
                       name="trainfeed-pipeline")

    @property
    def _converters(self) -> int:
        """Pieces converted at once: two when images are decoded, so that one batch's serial
        steps overlap the decoding of the other (trainfeed.reader.batcher._pieces); one
        otherwise (converting is then cheap, and a thread hop would cost more), and one when
        the decoder has a single thread: it then decodes on the converting thread, and two
        converters would decode two batches at once against `decode_threads=1`."""
        return 2 if self.decoder is not None and self.decoder.threads > 1 else 1

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.close()


# -- what a pipeline is built from (Pipeline.__init__) ------------------------------------------
def _classes(manifest: Manifest, options: PipelineOptions) -> ClassIndex:
    """The class ids this pipeline delivers: the dataset's labels, or the pinned class_values,
    which must cover them (trainfeed.reader.label_ids)."""
    values = options.labels.class_values
    check_pin(manifest.name, manifest.dataset_version, manifest.classes, values)
    return ClassIndex(delivered(manifest.classes, values))


def _per_class(manifest: Manifest, classes: ClassIndex | None, ratios: Target,
               what: str) -> np.ndarray:
    """A factor per class id from the label histogram and the target `ratios` (a class this
    dataset lacks never occurs: 0); `what` names the option for a dataset without labels."""
    if classes is None:
        raise ValueError(f"dataset {manifest.name!r} has no labels to {what}")
    factors = ratio_factors(manifest.label_histogram, ratios)
    return np.array([factors.get(c, 0.0) for c in classes.values])


def _resampler(manifest: Manifest, options: PipelineOptions, classes: ClassIndex | None,
               seed: int) -> Resampler | None:
    """Resampling at read time to the target class ratios (None: the pass does not resample)."""
    target = options.sampling.resample
    if not options.resamples or target is None:  # (resamples: in "train" mode only)
        return None
    return Resampler(_per_class(manifest, classes, target, "rebalance"), seed)


def _class_weights(manifest: Manifest, options: PipelineOptions,
                   classes: ClassIndex | None) -> np.ndarray | None:
    """Per class id, the loss weight batches carry in WEIGHT_FIELD (None: no class_weights)."""
    weights = options.labels.class_weights
    if weights is None:
        return None
    return _per_class(manifest, classes, weights, "weight").astype(np.float32)


def _remote_load(decoders: DecoderPool, options: PipelineOptions, manifest: Manifest,
                 seed: int, image_fields: tuple[str, ...]) -> RemoteLoad:
    """Partitions read and decoded by the decode workers `decoders` (remote decode)."""
    # (Imported here: the client loads Arrow Flight and gRPC, which a reader that decodes
    # locally never needs; tests/reader/test_local_imports.py.)
    from trainfeed.decode.remote.client import RemoteLoad
    from trainfeed.reader.remote_decode import request_template

    return RemoteLoad(decoders, request_template(options, manifest, seed, image_fields))


def _transformer(options: PipelineOptions, dataset_folder: Storage) -> Standardize | None:
    """The transform: as given, or loaded by name from the dataset's folder."""
    transform = options.transform.transform
    return (load_transformer(dataset_folder, transform) if isinstance(transform, str)
            else transform)


def _in_rows(decoded: DecodedBatch, rows: int) -> np.ndarray:
    """The decoded images at their rows of the table (zeros, or None in an object array, where
    a record failed under "skip": those rows are dropped afterwards)."""
    if decoded.ok.all():
        return decoded.images
    if decoded.images.dtype == object:
        images = np.empty(rows, dtype=object)
    else:
        images = np.zeros((rows, *decoded.images.shape[1:]), np.uint8)
    images[decoded.ok] = decoded.images
    return images


def _scaled(images: np.ndarray, const: float | None) -> np.ndarray:
    """Pixels divided by `const` as float32 (None: uint8 as they are); an object array of
    images of different sizes (one-at-a-time reading) image by image."""
    if not const:
        return images
    scale = np.float32(1.0 / const)
    if images.dtype != object:
        return np.multiply(images, scale, dtype=np.float32)
    each = np.empty(len(images), dtype=object)
    for i, image in enumerate(images):
        each[i] = None if image is None else np.multiply(image, scale, dtype=np.float32)
    return each
