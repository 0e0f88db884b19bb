"""Image decoding for the input pipeline: JPEG/PNG bytes to uint8 HxWxC arrays, in parallel.

JPEG goes through libjpeg-turbo (trainfeed's region decoder or simplejpeg; both release the GIL,
so threads scale with cores: ~29k 64x64 images/s per core here, ~4x Pillow); everything else
(PNG, GIF, BMP, a JPEG both refuse) through Pillow: one chain, trainfeed.decode.image. simplejpeg
is a core dependency and is imported unconditionally: a missing fast path must be a failed
install, never a silent 4-6x slowdown (`trainfeed doctor` shows which decoder each format uses).
Images are resized to a fixed shape when one is asked for, because a batch is one array. A
record that cannot be decoded raises DecodeError naming the record, its source file and list
line, or, with the "skip" policy, is dropped and counted. Every path checks the pixel budget
from the image's header before it allocates a pixel (trainfeed.decode.pixel_budget): a
decompression bomb, or an image that does not fit in memory, is such a record, never the end of
the pass.

Whenever the output has one size (`image_size`, or crop options:
trainfeed.decode.crops.CropOptions: torchvision's RandomResizedCrop, the validation centre crop,
a random flip, colour jitter) each decode thread decodes, crops, resizes and flips its images at
source resolution straight into the batch (trainfeed.decode.image.decode_into), seeded per
(seed, epoch, record id): nothing is resized twice, and nothing runs serially on the pipeline
thread.
"""
from __future__ import annotations

import functools
import struct
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import PIL
import pyarrow as pa
import simplejpeg
from PIL import features

from trainfeed import settings
from trainfeed.cores import usable_cores
from trainfeed.decode.crops import CropOptions, Plan, aspect_crop, record_uniforms, whole_image
from trainfeed.decode.image import decode_into, decode_whole
from trainfeed.decode.pixel_budget import DECODE_FAILURES, failure_reason, max_image_pixels
from trainfeed.decode.roi import region_decoder, region_decoder_missing
from trainfeed.errors import DecodeError
from trainfeed.io.array_pool import ArrayPool

DECODE_POLICIES = ("raise", "skip")
# Below this many images a batch is decoded on the calling thread: a pool hop costs more.
MIN_PARALLEL = 16
# Images per task when decoding into a batch: ~10 ms of work, so the pool's hand-off (~20 µs)
# is noise.
CROP_CHUNK = 8


def decoders() -> dict[str, str]:
    """Which library decodes each image format, with its version: what `trainfeed doctor` shows
    and what a bug report about decode speed needs first."""
    turbo = features.version("libjpeg_turbo") if features.check_feature("libjpeg_turbo") else None
    pillow = f"Pillow {PIL.__version__}"
    region = region_decoder()
    return {
        "jpeg": f"simplejpeg {simplejpeg.__version__} (libjpeg-turbo), GIL released; "
                f"{pillow} for JPEGs it refuses",
        "jpeg crops": (f"trainfeed region decoder (libjpeg-turbo {region}): the crop window "
                       f"alone (whole images too, when resized)" if region else
                       "NOT BUILT (libjpeg-turbo headers missing at install): crops decode "
                       "whole images, ~1.3x slower; apt install libjpeg-dev, then reinstall"),
        "png": f"{pillow} (libpng/zlib)",
        "other": f"{pillow} (GIF, BMP, TIFF, WebP{', libjpeg-turbo ' + turbo if turbo else ''})",
    }


def binary_views(column: pa.ChunkedArray) -> list[bytes | memoryview]:
    """The values of a binary column as zero-copy views of Arrow's buffers (simplejpeg and
    Pillow take any bytes-like object): `to_pylist()` copies every encoded image into a new
    bytes object, ~0.06 ms per 83 KB image measured here, 4 % of an image's whole decode
    budget. Columns with nulls keep `to_pylist()` (a null is an undecodable record)."""
    if column.null_count or not pa.types.is_binary(column.type):
        values: list[bytes | memoryview] = column.to_pylist()
        return values
    views: list[bytes | memoryview] = []
    for chunk in column.chunks:
        _, offsets_buffer, data = chunk.buffers()
        if data is None:  # every value empty
            views.extend(b"" for _ in range(len(chunk)))
            continue
        whole = memoryview(data).cast("B")
        if len(chunk) == 1:  # a row gathered on its own (trainfeed.io.gather): no numpy
            start, stop = struct.unpack_from("<2i", offsets_buffer, 4 * chunk.offset)
            views.append(whole[start:stop])
            continue
        offsets = np.frombuffer(offsets_buffer, np.int32)[
            chunk.offset:chunk.offset + len(chunk) + 1]
        views.extend(whole[start:stop] for start, stop in zip(offsets[:-1].tolist(),
                                                              offsets[1:].tolist()))
    return views


@dataclass(frozen=True)
class DecodedBatch:
    # (n_ok, H, W, C) uint8; with `ragged` images of different sizes, (n_ok,) object: one
    # HxWxC uint8 array each
    images: np.ndarray
    ok: np.ndarray  # (n,) bool: which input records decoded (all of them under "raise")
    errors: tuple[str, ...]  # one message per record that failed (under "skip")


def default_decode_threads(environ: Mapping[str, str] | None = None) -> int:
    """Decode threads when `decode_threads` is not given: the cores this process may run on (its
    CPU affinity, which a container's cpuset or `taskset` narrows, where os.cpu_count() counts
    the machine's), shared among the training processes torchrun started on this node
    (`LOCAL_WORLD_SIZE`): N ranks each decoding on every core would oversubscribe them N times
    (8 ranks on a 96-core node would start 768 decode threads). On the benchmark's 2 cores the
    difference was within the machine's noise (docs/benchmarks.md)."""
    return max(1, usable_cores() // (settings.LOCAL_WORLD_SIZE.get(environ) or 1))


class ImageDecoder:
    """Decodes batches of encoded images into one uint8 array of a fixed shape.

    `image_size` (height, width): every image is resized to it (OpenCV: bilinear when
    enlarging, an area average when shrinking, see trainfeed.decode.image); None keeps each
    image's own size, which then must agree within a batch. `crop`: first cut the largest
    centred region of the target's aspect ratio, so that nothing is stretched. `channels`: 3
    (RGB) or 1 (grey). `crops`: decode-stage crops (random resized crop, validation centre
    crop, flip) instead of `image_size`/`crop`; every image then comes out as `crops.size`.
    `max_pixels`: the pixel budget (default: $TRAINFEED_MAX_IMAGE_PIXELS, read here once);
    an image declaring more is a decode failure, refused from its header.
    """

    def __init__(self, image_size: tuple[int, int] | None = None, channels: int = 3,
                 threads: int | None = None, errors: str = "raise", crop: bool = False,
                 crops: CropOptions | None = None, max_pixels: int | None = None):
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels}")
        if errors not in DECODE_POLICIES:
            raise ValueError(f"decode errors policy must be one of {DECODE_POLICIES}, "
                             f"got {errors!r}")
        if image_size is not None and (len(image_size) != 2 or min(image_size) < 1):
            raise ValueError(f"image_size must be (height, width) ≥ 1, got {image_size!r}")
        if max_pixels is not None and max_pixels < 1:
            raise ValueError(f"max_pixels must be ≥ 1, got {max_pixels}")
        self.max_pixels = max_pixels if max_pixels is not None else max_image_pixels()
        self.image_size: tuple[int, int] | None = (
            (int(image_size[0]), int(image_size[1])) if image_size is not None else None)
        self.crops = crops
        if crops is not None:
            region_decoder_missing()  # warns once if crops must decode whole images
        self.channels = channels
        self.crop = crop
        self.errors = errors
        self.threads = threads or default_decode_threads()
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="trainfeed-decode") \
            if self.threads > 1 else None
        # Images decoded per library: proof that JPEGs take the fast path (tests, doctor).
        self.backend_counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        # Batches of one size are written into arrays the trainer has let go of (ArrayPool).
        self._batches = ArrayPool()
        # The plan of every image without crop options: the whole image (or its centred region
        # of image_size's aspect ratio, `crop`), area-averaged when shrinking like the
        # antialiased bilinear resize of Pillow this path used before (trainfeed.decode.image),
        # with libjpeg's accurate IDCT: an image already of image_size decodes exactly.
        window = (functools.partial(aspect_crop, size=self.image_size)
                  if crop and self.image_size is not None else whole_image)
        self._resize_plan = Plan(window, antialias=True)

    def decode_one(self, data: bytes | memoryview) -> np.ndarray:
        """One image as uint8 HxWxC (resized to image_size if set; crop options do not apply:
        they need a record id, see `decode`). Raises one of `DECODE_FAILURES` on bytes that
        are not a decodable image (PixelBudgetError, a ValueError, over the pixel budget)."""
        if self.image_size is None:
            return decode_whole(data, self.channels, self.max_pixels)[0]
        out = np.empty((*self.image_size, self.channels), np.uint8)
        decode_into(data, self._resize_plan, out, self.max_pixels)
        return out

    def decode(self, blobs: Sequence[bytes | memoryview], where: Sequence[str],
               ids: Sequence[int] | np.ndarray | None = None, seed: int = 0,
               epoch: int = 0, ragged: bool = False) -> DecodedBatch:
        """Decodes `blobs`; `where[i]` names record i for errors ("record 17 of shard …").

        With random crops, `ids` (the records' stable ids), `seed` and `epoch` seed each
        record's crop and flip: the same triple gives the same pixels in any batch or thread.
        Images kept at their own size (no image_size) must agree within the batch, unless
        `ragged` (the records go on one at a time, never stacked): then, where they differ,
        `images` is an object array of one array per image.
        """
        if self.crops is None and self.image_size is None:
            return self._decode_as_they_are(blobs, where, ragged)
        return self._decode_into_batch(blobs, where, self._plans(len(blobs), ids, seed, epoch))

    def _plans(self, n: int, ids: Sequence[int] | np.ndarray | None, seed: int,
               epoch: int) -> Callable[[int], Plan]:
        """The plan of record i of a batch of `n`: its crop, flip and jitter from its draws
        under crop options, else the one resize plan."""
        crops = self.crops
        if crops is None:
            plan = self._resize_plan
            return lambda i: plan
        if crops.random and (ids is None or len(ids) != n):
            raise ValueError("random crops need the records' ids (one per image) to seed them")
        if not crops.random or ids is None:
            fixed = crops.plan(None)
            return lambda i: fixed
        # Python floats, made in one call: the crop arithmetic on numpy scalars cost 0.7 µs more
        # per image (2.99 against 2.29 µs), under the GIL, in the decode threads (issue 39).
        draws = record_uniforms(seed, epoch, ids).tolist()
        return lambda i: crops.plan(draws[i])

    def _decode_as_they_are(self, blobs: Sequence[bytes | memoryview],
                            where: Sequence[str], ragged: bool) -> DecodedBatch:
        """Images kept at their own size, which must agree within the batch unless `ragged`."""
        n = len(blobs)
        results: list[np.ndarray | None] = [None] * n
        failures: list[str | None] = [None] * n

        def work(start: int, stop: int) -> None:
            counts: Counter[str] = Counter()
            for i in range(start, stop):
                try:
                    results[i], backend = decode_whole(blobs[i], self.channels, self.max_pixels)
                    counts[backend] += 1
                except DECODE_FAILURES as e:
                    failures[i] = f"{where[i]}: cannot decode image: {failure_reason(e)}"
            self._count(counts)

        self._run(work, n)
        errors = self._errors(failures)
        ok = np.array([r is not None for r in results], dtype=bool)
        good = [r for r in results if r is not None]
        if not good:
            return DecodedBatch(np.empty((0, 0, 0, self.channels), np.uint8), ok, errors)
        shapes = {g.shape for g in good}
        if len(shapes) == 1:
            return DecodedBatch(np.stack(good), ok, errors)
        if ragged:
            each = np.empty(len(good), dtype=object)
            for i, image in enumerate(good):  # one by one: numpy must not broadcast them
                each[i] = image
            return DecodedBatch(each, ok, errors)
        raise DecodeError(
            f"images of different shapes {sorted(shapes)[:3]} in one batch (first: "
            f"{where[0]}): a batch stacks images of one size; set DecodeOptions(image_size="
            f"(height, width)) to resize every image to it (crop=True to centre-crop first, "
            f"nothing stretched), or read one record at a time (no BatchOptions)")

    def _decode_into_batch(self, blobs: Sequence[bytes | memoryview], where: Sequence[str],
                           plans: Callable[[int], Plan]) -> DecodedBatch:
        """Images of one size: each thread writes its images straight into one preallocated
        batch (`decode_into`), record i as `plans(i)` says."""
        n = len(blobs)
        size = self.crops.size if self.crops is not None else self.image_size
        assert size is not None
        out = self._batches.empty((n, *size, self.channels), np.uint8)
        ok = np.ones(n, dtype=bool)
        failures: list[str | None] = [None] * n

        def work(start: int, stop: int) -> None:
            counts: Counter[str] = Counter()
            for i in range(start, stop):
                try:
                    counts[decode_into(blobs[i], plans(i), out[i], self.max_pixels)] += 1
                except DECODE_FAILURES as e:
                    failures[i] = f"{where[i]}: cannot decode image: {failure_reason(e)}"
                    ok[i] = False
            self._count(counts)

        # Small chunks taken in turn: a thread that drew cheap images takes more, instead of
        # idling at the batch's end while another finishes its fixed half.
        self._run(work, n, CROP_CHUNK)
        errors = self._errors(failures)
        return DecodedBatch(out if ok.all() else out[ok], ok, errors)

    def _count(self, counts: Counter[str]) -> None:
        with self._counts_lock:
            self.backend_counts.update(counts)

    def _errors(self, failures: list[str | None]) -> tuple[str, ...]:
        """The batch's failure messages; under the "raise" policy, the first raised."""
        errors = tuple(f for f in failures if f is not None)
        if errors and self.errors == "raise":
            raise DecodeError(errors[0] + (f" (and {len(errors) - 1} more in this batch)"
                                           if len(errors) > 1 else ""))
        return errors

    def _run(self, work: Callable[[int, int], None], n: int, chunk: int | None = None) -> None:
        """work(start, stop) over 0..n in chunks of `chunk` (default: one contiguous chunk per
        thread), on the pool, or inline for small batches.

        At most one pool task per thread: each task takes the next chunk of a shared queue until
        none is left, so a thread that drew cheap images still takes more. A task per chunk (32
        for a batch of 256) cost a future, a wake-up of the waiting thread and a lock hand-off
        each, all under the GIL: py-spy --gil put that at 0.6x the decode threads' own Python
        work on the 256-px train read (issue 39, item 2)."""
        if self._pool is None or n < MIN_PARALLEL:
            work(0, n)
            return
        step = chunk or -(-n // self.threads)
        starts = iter(range(0, n, step))  # next() on a range iterator is atomic under the GIL

        def drain() -> None:
            for start in starts:
                work(start, min(n, start + step))

        tasks = [self._pool.submit(drain) for _ in range(min(self.threads, -(-n // step)))]
        for task in tasks:
            task.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
