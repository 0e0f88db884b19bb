"""What an upload may do to a file's bytes before storing them: shrink a large image
(--max-side, lossy) and rewrite a JPEG with restart markers (--jpeg-restarts, lossless).

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
        if options.max_side is not None and frame is not None:
            need += 6 * frame.height * frame.width
        with memory.reserve(need, where):
            out = data
            if options.max_side is not None:
                out = shrink(out, options.max_side, options.quality, budget, where)
            if options.jpeg_restarts:
                rewritten = roi.with_restarts(out, budget)
                out = rewritten if len(rewritten) <= options.max_record_bytes else out
            return out

    return transform


def shrink(data: bytes, max_side: int, quality: int, budget: int, where: str = "") -> bytes:
    """`data` re-encoded as a JPEG at `quality` with its longer side at most `max_side` pixels
    (aspect kept, rounded), or `data` itself when it is no larger, or not an image Pillow or
    libjpeg can read (it is stored as it is: --check-images is the check for that).

    The pixels come from the readers' own decoder (trainfeed.decode.image: a JPEG at the
    smallest DCT scale still covering the target, then OpenCV's INTER_AREA average, as FFCV's
    ingest does), and libjpeg-turbo encodes them at 4:2:0 with its standard tables (the
    --jpeg-restarts rewrite then keeps them: trainfeed/decode/_jpeg_region.c)."""
    import numpy as np
    import simplejpeg

    from trainfeed.decode.crops import Plan
    from trainfeed.decode.image import decode_into, decode_whole
    from trainfeed.decode.pixel_budget import header_size, is_jpeg
    from trainfeed.decode.resize import resize_into

    size = header_size(data) if is_jpeg(data) else None
    if size is not None and max(size) <= max_side:
        return data
    try:
        if size is not None:  # the target is known from the header: one decode into it
            pixels = np.empty((*_target(*size, max_side), 3), np.uint8)
            decode_into(data, Plan(antialias=True), pixels, budget)
        else:
            whole, _ = decode_whole(data, 3, budget)
            if max(whole.shape[:2]) <= max_side:
                return data
            pixels = np.empty((*_target(whole.shape[0], whole.shape[1], max_side), 3), np.uint8)
            resize_into(whole, pixels, antialias=True)
    except (ValueError, OSError, SyntaxError) as e:  # the decoders' refusals; PixelBudgetError
        logger.debug("%s: not resized (%s): stored as it is", where, e)
        return data
    out: bytes = simplejpeg.encode_jpeg(pixels, quality=quality, colorspace="RGB",
                                        colorsubsampling="420")
    return out


def _target(height: int, width: int, max_side: int) -> tuple[int, int]:
    """(height, width) with the longer side `max_side`, the other rounded (at least 1)."""
    scale = max_side / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def describe(options: UploadOptions) -> dict[str, object]:
    """What the manifest records of a lossy transform (`extra["resized"]`), or {}."""
    if options.max_side is None:
        return {}
    return {"resized": {"max_side": options.max_side, "quality": options.quality,
                        "format": "jpeg", "subsampling": "4:2:0"}}


