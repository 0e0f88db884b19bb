"""What an upload may do to a file's bytes before storing them: shrink a large image
(--max-side, lossy), store a small one as raw pixels (--raw-below, trainfeed.decode.raw) and
rewrite a JPEG with restart markers (--jpeg-restarts, lossless).

The raw-pixel rule: an image whose stored size (after --max-side) is at most --raw-below pixels
(height x width) is stored as its RGB pixels, the ones --max-side's resize made (no JPEG
re-encode: lossless from there) or the file's own decoded; every other file as --max-side and
--jpeg-restarts say. A file no decoder reads is stored as it is (--check-images refuses it).

Both run on a packer's reading threads and release the GIL in their C parts (libjpeg-turbo
through simplejpeg and trainfeed's region extension, Pillow's resampling), and both are
deterministic: the same file gives the same bytes in any process, which the shard plan relies
on (trainfeed.ingest.plan).

Memory: a rewrite holds every DCT coefficient of its file (128 bytes per 8x8 block per
component, which its frame header announces) plus its output; a resize holds the decoded pixels
(3 bytes each) and the resized copy. Each reserves that from one budget (`memory_bytes`), so
that large files wait for room instead of running on every reading thread at once, and one
larger than the whole budget runs alone. An image over the pixel budget
($TRAINFEED_MAX_IMAGE_PIXELS) is stored as it is, with a warning: readers refuse it as they
would anyway.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from trainfeed.errors import ConfigurationError
from trainfeed.ingest.options import UploadOptions

logger = logging.getLogger(__name__)

# (where, for messages; the file's bytes) -> the bytes to store.
Transform = Callable[[str, bytes], bytes]


def make_transform(options: UploadOptions, memory_bytes: int) -> Transform | None:
    """The transform of `options` (None when files are stored as they are). Refuses at once,
    before anything is written, when --jpeg-restarts lacks the region decoder."""
    if not options.transforms:
        return None
    # The compiled parts and Pillow, only when asked.
    from trainfeed.decode import roi
    from trainfeed.decode.memory_budget import MemoryBudget
    from trainfeed.decode.pixel_budget import jpeg_frame, max_image_pixels

    if options.jpeg_restarts and roi.region_decoder() is None:
        raise ConfigurationError(
            "--jpeg-restarts needs trainfeed's JPEG region decoder, which was not built "
            "(libjpeg-turbo's headers were missing at install: see `trainfeed doctor`)")
    memory = MemoryBudget(memory_bytes, "upload (rewriting images)")
    budget = max_image_pixels()

    def transform(where: str, data: bytes) -> bytes:
        frame = jpeg_frame(data)
        if frame is not None and frame.height * frame.width > budget:
            logger.warning("%s declares %dx%d pixels, over the pixel budget of %d "
                           "($TRAINFEED_MAX_IMAGE_PIXELS): stored as it is; readers will "
                           "refuse it (--check-images refuses the upload)",
                           where, frame.width, frame.height, budget)
            return data
        need = 3 * len(data) + (frame.coefficient_bytes if frame is not None else 0)
        if (options.max_side is not None or options.raw_below is not None) and frame:
            need += 6 * frame.height * frame.width
        with memory.reserve(need, where):
            out = data
            if options.raw_below is not None:
                record = raw_record(data, options, budget, where)
                if record is not None:
                    return record
            if options.max_side is not None:
                out = shrink(out, options.max_side, options.quality, budget, where)
            if options.jpeg_restarts:
                rewritten = roi.with_restarts(out, budget)
                out = rewritten if len(rewritten) <= options.max_record_bytes else out
            return out

    return transform


def raw_record(data: bytes, options: UploadOptions, budget: int, where: str = "") -> bytes | None:
    """The raw pixel record of `data` when its stored size (after `options.max_side`) is at
    most `options.raw_below` pixels and the record fits `options.max_record_bytes`, else None
    (also for files no decoder reads). A JPEG's or PNG's size comes from its header: a larger
    image is never decoded here."""
    from trainfeed.decode import raw
    from trainfeed.decode.pixel_budget import header_size

    assert options.raw_below is not None
    size = header_size(data)
    if size is not None and options.max_side is not None and max(size) > options.max_side:
        size = _target(*size, options.max_side)
    if size is not None and size[0] * size[1] > options.raw_below:
        return None
    stored = stored_pixels(data, options.max_side, budget, where)
    if stored is None or stored[0].shape[0] * stored[0].shape[1] > options.raw_below:
        return None
    pixels = stored[0]
    if max(pixels.shape[:2]) > raw.MAX_SIDE:
        return None
    record = raw.encode(pixels)
    return record if len(record) <= options.max_record_bytes else None


def stored_pixels(data: bytes, max_side: int | None, budget: int,
                  where: str = "") -> tuple[np.ndarray, bool] | None:
    """The RGB pixels of `data` as an upload stores them, and whether they were resized:
    resized to a longer side of `max_side` where larger, else decoded whole; None for a file
    no decoder reads (it is stored as it is).

    A JPEG decodes straight into its target size (the smallest DCT scale still covering it,
    then OpenCV's INTER_AREA average, as FFCV's ingest does: trainfeed.decode.image); other
    formats decode whole and are resized the same way."""
    from trainfeed.decode.crops import Plan
    from trainfeed.decode.image import decode_into, decode_whole
    from trainfeed.decode.pixel_budget import header_size, is_jpeg

    size = header_size(data) if is_jpeg(data) else None
    try:
        if size is not None and max_side is not None and max(size) > max_side:
            pixels = np.empty((*_target(*size, max_side), 3), np.uint8)
            decode_into(data, Plan(antialias=True), pixels, budget)
            return pixels, True
        whole, _ = decode_whole(data, 3, budget)
    except (ValueError, OSError, SyntaxError) as e:  # the decoders' refusals; PixelBudgetError
        logger.debug("%s: not decodable (%s): stored as it is", where, e)
        return None
    if max_side is None or max(whole.shape[:2]) <= max_side:
        return whole, False
    from trainfeed.decode.resize import resize_into

    pixels = np.empty((*_target(whole.shape[0], whole.shape[1], max_side), 3), np.uint8)
    resize_into(whole, pixels, antialias=True)
    return pixels, True


def shrink(data: bytes, max_side: int, quality: int, budget: int, where: str = "") -> bytes:
    """`data` re-encoded as a JPEG at `quality` with its longer side at most `max_side` pixels
    (aspect kept, rounded), or `data` itself when it is no larger, or not an image Pillow or
    libjpeg can read (it is stored as it is: --check-images is the check for that).

    The pixels come from the readers' own decoder (`stored_pixels`), and libjpeg-turbo encodes
    them at 4:2:0 with its standard tables (the --jpeg-restarts rewrite then keeps them:
    trainfeed/decode/_jpeg_region.c)."""
    import simplejpeg

    from trainfeed.decode.pixel_budget import header_size, is_jpeg

    size = header_size(data) if is_jpeg(data) else None
    if size is not None and max(size) <= max_side:
        return data
    stored = stored_pixels(data, max_side, budget, where)
    if stored is None or not stored[1]:
        return data
    out: bytes = simplejpeg.encode_jpeg(stored[0], quality=quality, colorspace="RGB",
                                        colorsubsampling="420")
    return out


def _target(height: int, width: int, max_side: int) -> tuple[int, int]:
    """(height, width) with the longer side `max_side`, the other rounded (at least 1)."""
    scale = max_side / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def describe(options: UploadOptions) -> dict[str, object]:
    """What the manifest records of the transforms readers must know of: a lossy resize
    (`extra["resized"]`) and raw pixel records (`extra["raw_pixels"]`, which also makes the
    manifest's format version 2: trainfeed.formats.manifest), or {}."""
    from trainfeed.formats.manifest import RAW_PIXELS

    out: dict[str, object] = {}
    if options.max_side is not None:
        out["resized"] = {"max_side": options.max_side, "quality": options.quality,
                          "format": "jpeg", "subsampling": "4:2:0"}
    if options.raw_below is not None:
        out[RAW_PIXELS] = {"max_pixels": options.raw_below, "layout": "trainfeed.raw/1",
                           "dtype": "uint8", "order": "HWC", "channels": 3}
    return out


