"""Decoding no more of a JPEG than its crop window needs: the DCT scale and the region decoder.

trainfeed.decode.image.decode_into asks two things of this module per JPEG: by how much the
decoder may shrink the window (`dct_reduction`) and the window itself, decoded alone
(`decode_region`), when the region decoder was built.

Decoding less than the whole image:
- DCT-domain scaling (libjpeg-turbo through simplejpeg's `min_height`/`min_width`) at 1/2, 1/4
  or 1/8 when the window is at least 2x, 4x, 8x the target in both directions: the IDCT then
  skips the coefficients the target cannot show. Measured on 474x403 photos: 1/2 costs ~0.7x a
  full decode. A scaled pixel is the mean of a k x k block (within half a grey level, measured
  on photos), so the window's edges are moved to the nearest multiple of k source pixels (at
  most k/2 pixels, under 0.2 % of a side at least 2k x the target's) and the result equals a
  full decode of that window, area-resized, within a few grey levels; a shift of even one
  source pixel would not (a photo's pixels differ from their neighbours' by ~10 levels).
  Only these SIMD scales: simplejpeg's 5/8-7/8 scales are slower than a full decode (737
  and 878 against 1,072 images/s, measured for the issue).
- Region decoding (what tf.data's `decode_and_crop_jpeg` and DALI's ROI decoder do): the
  window alone, through trainfeed's own small libjpeg-turbo extension
  (trainfeed/decode/_jpeg_region.c): rows above it are entropy-decoded only, columns outside it
  never reconstructed, rows below it never read. 1.35x a whole decode on RandomResizedCrop
  windows of 474x403 photos, and bit-exact with it (docs/imagenet.md). No maintained binding
  offers it from PyPI: PyTurboJPEG 2.x needs the TurboJPEG 3 library (Debian 12 ships 2.1.5)
  and crops only losslessly (re-encode, decode again: slower than a whole decode); simplejpeg,
  Pillow and OpenCV expose only DCT scaling. If the extension was not built (no libjpeg-turbo
  headers at install), whole images are decoded and cropped: `trainfeed doctor` says which, and
  the reader warns once (`region_decoder_missing`).

What the region decoder refuses goes to simplejpeg, then Pillow (trainfeed.decode.image).
The image's declared size is checked against the pixel budget (trainfeed.decode.pixel_budget)
before any of these decoders runs: a crop of 16x16 pixels from a progressive JPEG still makes
libjpeg hold the coefficients of the whole image (1.6 GB for a 16,384² one at 4:4:4).
"""
from __future__ import annotations

import logging
import threading

import numpy as np

from trainfeed.decode.crops import Window
from trainfeed.decode.pixel_budget import (
    header_size,
    is_jpeg,
    max_image_pixels,
)
from trainfeed.errors import PixelBudgetError

try:  # built by setup.py where libjpeg-turbo's headers were found
    import trainfeed.decode._jpeg_region as _jpeg_region
except ImportError:  # pragma: no cover - depends on the install
    _jpeg_region = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

# The DCT scales worth using (SIMD IDCT paths), largest reduction first.
DCT_REDUCTIONS = (8, 4, 2)


def dct_reduction(window: Window, target: tuple[int, int]) -> int:
    """The largest of 8, 4, 2 (else 1) such that the window is at least that many times the
    target (height, width) in both directions: the decoder may shrink by it and the final
    resize still only shrinks."""
    for k in DCT_REDUCTIONS:
        if window.height >= k * target[0] and window.width >= k * target[1]:
            return k
    return 1


def region_decoder() -> str | None:
    """The libjpeg-turbo version the region decoder was built with ("2.1.5"), or None if it
    was not built (crops then decode whole images)."""
    if _jpeg_region is None:
        return None
    number = _jpeg_region.LIBJPEG_TURBO_VERSION_NUMBER  # e.g. 2001005
    return f"{number // 1000000}.{number // 1000 % 1000}.{number % 1000}"


_warned = threading.Event()


def region_decoder_missing() -> None:
    """Warns once per process that crops decode whole images (see the module's docstring)."""
    if _jpeg_region is None and not _warned.is_set():
        _warned.set()
        logger.warning("trainfeed's JPEG region decoder was not built (libjpeg-turbo headers "
                       "were missing at install): crops decode whole images, ~1.3x slower. "
                       "Install libjpeg-turbo's headers (Debian/Ubuntu: apt install libjpeg-dev) "
                       "and reinstall trainfeed; `trainfeed doctor` shows the result.")


# How wide an interval between restart markers `with_restarts` makes, at most, in pixels: the
# largest number of MCUs (16 px wide at 4:2:0, 8 at 4:4:4) that divides a row and spans no more.
# Narrower intervals cut windows closer to their edges but cost a marker each. Measured on the
# benchmark's photos (4:2:0): 16 and 32 px decode windows equally fast (0.73x the region
# decoder's time on the same JPEGs without markers), 64 px ~1.5 % slower; at 32 px the files
# grow by 2.7 % when their own (complete, standard) Huffman tables are kept, which doubles the
# rewrite's speed (0.997x when the tables were optimized); smoother images grow by 1-7 % (tests).
RESTART_TARGET_PIXELS = 32


def with_restarts(data: bytes, max_pixels: int | None = None) -> bytes:
    """`data` rewritten with restart markers so that a crop decodes its window alone (see
    trainfeed/decode/_jpeg_region.c), or `data` itself when it is not a JPEG that can be
    rewritten (PNG, CMYK, damaged: those keep their bytes and decode as before), or when its
    header declares more than `max_pixels` (default: $TRAINFEED_MAX_IMAGE_PIXELS): a rewrite
    holds all of its DCT coefficients, which a reader's decode would refuse to allocate too.

    Lossless: the DCT coefficients are copied, so every pixel decodes as before (tested); a
    progressive JPEG becomes a sequential one. Metadata segments (EXIF, ICC, comments) are kept.
    Releases the GIL. Needs the region decoder (`region_decoder()` is not None)."""
    if not is_jpeg(data):
        return data
    size = header_size(data)
    budget = max_pixels if max_pixels is not None else max_image_pixels()
    if size is not None and size[0] * size[1] > budget:
        return data
    try:  # the extension checks the budget again, from its own reading of the header
        rewritten: bytes = _jpeg_region.add_restarts(data, RESTART_TARGET_PIXELS,
                                                     max_pixels=budget)
    except ValueError:  # its PixelBudgetError included: the bytes are kept, as for damage
        return data
    return rewritten


_scratch = threading.local()


def decode_region(data: bytes | memoryview, window: Window, k: int, height: int, width: int,
                  channels: int, fast_dct: bool, budget: int) -> np.ndarray | None:
    """`window` of the JPEG `data` of (height, width) source pixels, decoded alone at 1/k (its
    edges moved to the k-grid first, see Window.on_grid): a view of this thread's scratch
    buffer, valid until the thread's next call. None where the region decoder was not built or
    refuses the file (damaged, CMYK...): the whole-image decoders say what they can of those.

    Raises PixelBudgetError where the extension's own reading of the header declares more than
    `budget` pixels: not a damaged file, so no whole-image decoder may try it either."""
    if _jpeg_region is None:
        return None
    scaled = window.on_grid(k, height, width).divided(k) if k > 1 else window
    try:
        return _decode_region(data, scaled, k, channels, fast_dct, budget)
    except PixelBudgetError:
        raise
    except ValueError:
        return None


def _decode_region(data: bytes | memoryview, window: Window, k: int, channels: int,
                   fast_dct: bool, budget: int) -> np.ndarray:
    """The window (in pixels of the image scaled by 1/k) decoded alone, as a view of this
    thread's scratch buffer: valid until the thread's next call.

    Raises PixelBudgetError where the extension's own reading of the header declares more than
    `budget` pixels (defence in depth: the caller checked its own reading already), not the
    ValueError of damaged data after which the whole-image decoders are tried."""
    need = window.height * (window.width + _jpeg_region.MARGIN) * channels
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.size < need:
        buffer = _scratch.buffer = np.empty(max(need, 1 << 20), np.uint8)
    try:
        row, dx = _jpeg_region.decode_region(data, buffer, window.left, window.top,
                                             window.width, window.height, k, channels, fast_dct,
                                             max_pixels=budget)
    except _jpeg_region.PixelBudgetError as e:
        raise PixelBudgetError(str(e)) from None
    rows = buffer[:window.height * row * channels].reshape(window.height, row, channels)
    return rows[:, dx:dx + window.width]
