"""One image: encoded bytes to pixels in their slot of a batch, through one chain of decoders.

`decode_into(data, plan, out)` is what a decode thread does per image, crops or not:
1. read the image's size from its header (~0.5 µs for a JPEG) and refuse it there if it is over
   the pixel budget (trainfeed.decode.pixel_budget), before any decoder allocates a pixel;
2. ask the plan (trainfeed.decode.crops.Plan) for the window to keep: a RandomResizedCrop or
   validation window, the whole image, or its centred region of the output's aspect ratio;
3. decode no more than that window needs, by the first decoder that accepts the file:
   - the region decoder (the window alone, trainfeed.decode.roi), DCT-scaled by 1/2, 1/4 or 1/8
     when the window is at least that many times the output;
   - simplejpeg (the whole JPEG, DCT-scaled the same way) where the region decoder was not built
     or refuses the file (CMYK, damage);
   - Pillow, at full size, for PNG, GIF, BMP, TIFF, WebP and the JPEGs both refuse;
   - no decoder for a raw pixel record (`upload --raw-below`, trainfeed.decode.raw): its shape
     is checked against its length and the budget, and the window is a view of its bytes;
4. resize the window (a view, never copied) straight into `out` with the one resizer (OpenCV,
   trainfeed.decode.resize), mirrored if the plan says so, then colour-jitter it in place.
Every step but the header and the plan runs without the GIL.

The whole-image path of the reader (`image_size=` without crop options) is the same call with
the whole image (or, with `crop=True`, its centred region of the target's aspect ratio) as the
window, resized with an area average when shrinking (`antialias`), the closest of OpenCV's
filters to the antialiased bilinear resize of Pillow that this path used before (within the
tolerances tests/decode/test_image.py states). `decode_whole` is the chain without a plan or a
resize, for images kept at their own size.
"""
from __future__ import annotations

import math

import numpy as np
import simplejpeg

from trainfeed.decode import raw, roi
from trainfeed.decode.crops import Plan, Window
from trainfeed.decode.jitter import color_jitter
from trainfeed.decode.pixel_budget import (
    check_pixels,
    header_size,
    is_jpeg,
    max_image_pixels,
    pillow_decode,
)
from trainfeed.decode.resize import resize_into
from trainfeed.errors import PixelBudgetError

WHOLE = Plan()  # the whole image, as it is: what `decode_whole` decodes
RAW = "raw pixels"  # the "decoder" of a raw pixel record


def decode_into(data: bytes | memoryview, plan: Plan, out: np.ndarray,
                max_pixels: int | None = None) -> str:
    """Decodes `data`, keeps `plan.window(height, width)` of it and resizes that into `out`
    ((h, w, C) uint8, C 3 for RGB or 1 for grey), mirrored and jittered as `plan` says.
    `max_pixels`: the pixel budget (default: $TRAINFEED_MAX_IMAGE_PIXELS, read now). Returns
    the decoder that made the pixels ("libjpeg-turbo region", "simplejpeg", "pillow" or
    "raw pixels").

    Thread-safe; `out` is written only after its image decoded.

    Raises:
        PixelBudgetError (a ValueError): the image declares more pixels than the budget,
            refused before decoding anything.
        ValueError, OSError, SyntaxError (from Pillow): `data` is not a decodable image.
    """
    budget = max_pixels if max_pixels is not None else max_image_pixels()
    pixels, decoder = _decode(data, plan, out.shape[:2], out.shape[2], budget)
    resize_into(pixels, out, antialias=plan.antialias, flip=plan.flip)
    if plan.jitter is not None:
        color_jitter(out, plan.jitter)
    return decoder


def decode_whole(data: bytes | memoryview, channels: int = 3,
                 max_pixels: int | None = None) -> tuple[np.ndarray, str]:
    """`data` decoded whole at its own size, as (H, W, `channels`) uint8 in an array of its
    own, and the decoder that made it ("simplejpeg" or "pillow"): `decode_into`'s chain
    without the region decoder (whose pixels live in a scratch buffer) or a resize. Raises as
    `decode_into` does."""
    budget = max_pixels if max_pixels is not None else max_image_pixels()
    image, decoder = _decode(data, WHOLE, None, channels, budget)
    if decoder == RAW:  # a view of the record's (read-only) bytes: a copy of its own
        image = image.copy()
    return image, decoder


def _decode(data: bytes | memoryview, plan: Plan, target: tuple[int, int] | None,
            channels: int, budget: int) -> tuple[np.ndarray, str]:
    """The plan's window of `data`, decoded at the smallest scale that still covers `target`
    (height, width; None: at full scale, in an array of its own), and its decoder. The chain
    of decoders, written once: the region decoder, simplejpeg, Pillow (and none for a raw
    pixel record)."""
    if raw.is_raw(data):
        image = _channels(raw.pixels(data, budget), channels)
        return _cut(image, plan.window(image.shape[0], image.shape[1])), RAW
    size = header_size(data) if is_jpeg(data) else None
    if size is not None:  # else not a JPEG, or no frame header: Pillow says what it can
        check_pixels(*size, budget)  # before any decoder, fallbacks included
        decoded = _decode_jpeg(data, plan, size, target, channels, budget)
        if decoded is not None:
            return decoded
    image = pillow_decode(data, channels, budget)
    return _cut(image, plan.window(image.shape[0], image.shape[1])), "pillow"


def _decode_jpeg(data: bytes | memoryview, plan: Plan, size: tuple[int, int],
                 target: tuple[int, int] | None, channels: int,
                 budget: int) -> tuple[np.ndarray, str] | None:
    """The plan's window of a JPEG of `size` (height, width) by the region decoder or
    simplejpeg, or None where both refuse it (a CMYK, progressive-arithmetic or damaged JPEG:
    Pillow's turn). PixelBudgetError is never such a refusal: it propagates."""
    height, width = size
    try:
        window = plan.window(height, width)
        k = roi.dct_reduction(window, target) if target is not None else 1
        if target is not None:  # the region's pixels live until this thread's next call
            region = roi.decode_region(data, window, k, height, width, channels,
                                       plan.fast_dct, budget)
            if region is not None:
                return region, "libjpeg-turbo region"
        colorspace = "RGB" if channels == 3 else "GRAY"
        if k == 1:
            image = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=plan.fast_dct)
        else:  # edges on the k-grid (≤ k/2 px moved): the scaled pixels match exactly
            image = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=plan.fast_dct,
                                           min_height=math.ceil(height / k),
                                           min_width=math.ceil(width / k))
            window = window.on_grid(k, height, width).divided(k)
    except PixelBudgetError:
        raise
    except ValueError:
        return None
    return _cut(image, window), "simplejpeg"


def _channels(image: np.ndarray, channels: int) -> np.ndarray:
    """`image` with `channels` channels, converted as Pillow converts a decoded image (RGB to
    grey by ITU-R 601-2 luma, grey to RGB by copying), so that a raw record gives the pixels
    its image stored losslessly (a PNG) would."""
    if image.shape[2] == channels:
        return image
    if channels == 3:
        return np.repeat(image, 3, axis=2)
    from PIL import Image
    return np.asarray(Image.fromarray(image).convert("L"))[:, :, None]


def _cut(image: np.ndarray, window: Window) -> np.ndarray:
    """`window` of `image`: a view, never a copy (the whole image itself when it is all)."""
    if window == (0, 0, *image.shape[:2]):
        return image
    return image[window.top:window.top + window.height, window.left:window.left + window.width]
