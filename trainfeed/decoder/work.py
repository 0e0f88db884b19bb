"""One decode request as chunks of decoded records: read, order, decode, pack. No I/O shell.

Thread-safe: the Flight server runs each call on its own thread; datasets and decoders are
shared through small locked caches (an ImageDecoder is safe to call from several threads).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from trainfeed.decode.pixel_budget import max_image_pixels
from trainfeed.decode.pixels import DecodedBatch, ImageDecoder, binary_views
from trainfeed.decode.remote.wire import DecodeRequest, DecoderRefusedError
from trainfeed.errors import DatasetNotFoundError
from trainfeed.formats.confine import path_problem
from trainfeed.formats.manifest import ID_COLUMN
from trainfeed.io.prefetch import TaskRef
from trainfeed.reader.batcher import partition_loader
from trainfeed.reader.options import MODES, DecodeOptions
from trainfeed.reader.pipeline import image_decoder
from trainfeed.reader.producer import Dataset
from trainfeed.storage import Storage

__all__ = ["Datasets", "Decoders", "decoded_chunks", "warm_up"]

# Datasets (manifests read, partition readers' buffers) and decoders (thread pools) kept between
# calls: a decoder serves a few jobs at a time, each with one dataset and one or two modes.
KEPT = 8


class Datasets:
    """Datasets of one storage by (name, version), each resolved once (manifest read)."""

    def __init__(self, storage: Storage):
        self.storage = storage
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, int | None], Dataset] = OrderedDict()

    def get(self, name: str, version: int | None) -> Dataset:
        key = (name, version)
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        problem = path_problem(name)
        if problem is not None:
            raise DecoderRefusedError(f"dataset {name[:200]!r}: {problem}")
        try:
            dataset = Dataset.in_storage(self.storage, name, version)
        except (DatasetNotFoundError, FileNotFoundError) as e:
            raise DecoderRefusedError(f"this decoder's storage has no dataset {name!r} "
                                      f"version {version}: {e}") from None
        with self._lock:
            self._kept[key] = dataset
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        return dataset


class Decoders:
    """Image decoders by (options, mode), each with `threads` decode threads."""

    def __init__(self, threads: int | None):
        self.threads = threads
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[DecodeOptions, str, int], ImageDecoder] = OrderedDict()

    def get(self, fields: dict[str, Any], mode: str, max_pixels: int) -> ImageDecoder:
        """The decoder of these DecodeOptions fields in `mode`, with the trainer's pixel budget
        (refused when over this decoder's own: $TRAINFEED_MAX_IMAGE_PIXELS here)."""
        own = max_image_pixels()
        if not 1 <= max_pixels <= own:
            raise DecoderRefusedError(
                f"the trainer's pixel budget of {max_pixels} pixels is outside this decoder's "
                f"[1, {own}] (TRAINFEED_MAX_IMAGE_PIXELS of the decoder)")
        if mode not in MODES:
            raise DecoderRefusedError(f"unknown mode {mode!r}; expected one of {sorted(MODES)}")
        try:
            options = DecodeOptions(**_tuples(fields))
        except (TypeError, ValueError) as e:
            raise DecoderRefusedError(f"decode options refused: {e}") from None
        if not options.enabled or options.image_size is None:
            raise DecoderRefusedError("remote decode needs decode=True and image_size")
        key = (options, mode, max_pixels)
        with self._lock:
            decoder = self._kept.get(key)
            if decoder is None:
                decoder = self._kept[key] = image_decoder(options, mode, self.threads,
                                                          max_pixels)
                while len(self._kept) > KEPT:
                    self._kept.popitem(last=False)[1].close()
            return decoder

    def close(self) -> None:
        with self._lock:
            while self._kept:
                self._kept.popitem()[1].close()


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples DecodeOptions holds (image_size, crop pairs)."""
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def warm_up() -> None:
    """Imports now what a decoder's first request would import: pandas (pyarrow's
    ChunkedArray.to_numpy imports it, in the partition reader and in `_decoded`) and OpenCV
    (the crops' resize). That was 1.3-1.6 s of its first request on a loaded 2-core machine
    (0.14 s warm; benchmarks/decoder_faults.py), paid by the first partition a trainer sent it:
    a partition waits for its slowest segment, and a trainer asks a decoder it has just been
    told of before the others, so every restarted decoder stalled a trainer. Called before the
    decoder listens and registers: once listed, it answers as fast as any."""
    pa.chunked_array([pa.array([0], pa.int64())]).to_numpy()
    from trainfeed.decode.resize import cv2_module
    cv2_module()


def decoded_chunks(request: DecodeRequest, datasets: Datasets,
                   decoders: Decoders) -> Iterator[pa.RecordBatch]:
    """The request's records in delivery order, `request.chunk` at a time, image fields as
    decoded pixels; at least one batch (empty when the request delivers no record)."""
    dataset = datasets.get(request.dataset, request.version)
    if (tuple(request.fields) != dataset.field_names
            or not set(request.image_fields) <= set(dataset.binary_fields)):
        raise DecoderRefusedError(
            f"dataset {request.dataset!r} version {dataset.version} has fields "
            f"{list(dataset.field_names)} (binary {list(dataset.binary_fields)}), the request "
            f"names {list(request.fields)} (images {list(request.image_fields)})")
    decoder = decoders.get(request.decode, request.mode, request.max_pixels)
    task = TaskRef(request.epoch, request.partition, request.shard, request.row_group_start,
                   request.row_group_stop, request.num_records, skip=request.skip,
                   row_start=request.row_start, stop=request.stop)
    reader = dataset.partition_reader()
    try:
        table = partition_loader(None, request.shuffle_seed)(reader, task)
    finally:
        reader.close()
    image_bytes = request.image_bytes()
    for start in range(0, max(1, table.num_rows), request.chunk):
        piece = table.slice(start, request.chunk)
        yield _decoded(piece, request, decoder, image_bytes)


def _decoded(piece: pa.Table, request: DecodeRequest, decoder: ImageDecoder,
             image_bytes: int) -> pa.RecordBatch:
    """One chunk: its image fields decoded (seeded per record as local decode seeds them)."""
    ids = piece.column(ID_COLUMN).to_numpy()
    names = [f"record {int(i)} of shard {request.shard}" for i in ids]
    columns: list[pa.Array] = []
    for name in piece.column_names:
        column = piece.column(name)
        if name in request.image_fields:
            decoded = decoder.decode(binary_views(column), names, ids=ids, seed=request.seed,
                                     epoch=request.epoch)
            columns.append(pixels_array(decoded, len(ids), image_bytes))
        else:
            columns.append(column.combine_chunks())
    return pa.RecordBatch.from_arrays(columns, names=piece.column_names)


def pixels_array(decoded: DecodedBatch, rows: int, image_bytes: int) -> pa.Array:
    """Decoded images as one fixed-size binary value per row (null where a record failed)."""
    if decoded.ok.all():
        images = np.ascontiguousarray(decoded.images).reshape(-1)
        validity = None
    else:
        images = np.zeros((rows, image_bytes), np.uint8)
        images[decoded.ok] = decoded.images.reshape(len(decoded.images), -1)
        validity = pa.array(decoded.ok).buffers()[1]
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(image_bytes), rows,
                                                [validity, pa.py_buffer(images)])
