"""Decode, crop, resize and flip one image in one step, decoding no more than the crop needs.

`decode_crop` is what a decode thread does per image when the reader has crop options
(`random_resized_crop=`, `resize_shorter=`): read the JPEG header (~1 µs), ask the crop plan
for the window, decode, and resize the window (a view, never copied) straight into the image's
slot of the batch, mirrored if asked. Every step but the header and the plan runs without the
GIL.

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
- Partial (region) decoding, which tf.data's `decode_and_crop_jpeg` and DALI's ROI decoder use,
  is not available from PyPI on Linux x86_64 here: PyTurboJPEG 2.x needs the TurboJPEG 3 API
  (Debian 12 ships libjpeg-turbo 2.1.5) and has no cropping-region decode either; PyTurboJPEG
  1.x crops losslessly (entropy-decode everything, re-encode the window, decode it again),
  measured slower than a full decode; simplejpeg, Pillow and OpenCV expose only DCT scaling.
  docs/imagenet.md has the figures.

Everything simplejpeg refuses (PNG, GIF, CMYK or arithmetic-coded JPEGs) is decoded whole by
Pillow and then cropped the same way: slower, never wrong.
"""
from __future__ import annotations

import io
import math
from collections.abc import Callable

import numpy as np
import simplejpeg
from PIL import Image

from trainfeed.worker.crops import Window
from trainfeed.worker.resize import resize_into

JPEG_MAGIC = b"\xff\xd8"
# The DCT scales worth using (SIMD IDCT paths), largest reduction first.
DCT_REDUCTIONS = (8, 4, 2)
# A plan: the window to keep of an image of (height, width).
Planner = Callable[[int, int], Window]


def dct_reduction(window: Window, target: tuple[int, int]) -> int:
    """The largest of 8, 4, 2 (else 1) such that the window is at least that many times the
    target (height, width) in both directions: the decoder may shrink by it and the final
    resize still only shrinks."""
    for k in DCT_REDUCTIONS:
        if window.height >= k * target[0] and window.width >= k * target[1]:
            return k
    return 1


def _pillow_decode(data: bytes | memoryview, channels: int) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as pil:
        image = np.asarray(pil.convert("RGB" if channels == 3 else "L"))
    return image[:, :, None] if image.ndim == 2 else image


def decode_crop(data: bytes | memoryview, plan: Planner, dst: np.ndarray, flip: bool = False,
                antialias: bool = False, fast_dct: bool = False) -> str:
    """Decodes `data`, keeps `plan(height, width)` of it and resizes that into `dst`
    ((h, w, C) uint8, C 3 for RGB or 1 for grey), mirrored if `flip`. `fast_dct`: libjpeg's
    fast integer IDCT (JDCT_IFAST). Returns the library that decoded it ("simplejpeg" or
    "pillow").

    Raises ValueError or OSError (from Pillow) on bytes that are not a decodable image.
    """
    channels = dst.shape[2]
    colorspace = "RGB" if channels == 3 else "GRAY"
    image: np.ndarray | None = None
    backend = "simplejpeg"
    window: Window | None = None
    if data[:2] == JPEG_MAGIC:
        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            window = plan(height, width)
            k = dct_reduction(window, dst.shape[:2])
            if k == 1:
                image = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=fast_dct)
            else:  # edges on the k-grid (≤ k/2 px moved): the scaled pixels match exactly
                image = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=fast_dct,
                                               min_height=math.ceil(height / k),
                                               min_width=math.ceil(width / k))
                window = window.on_grid(k, height, width).divided(k)
        except ValueError:
            image = None  # e.g. a CMYK, progressive-arithmetic or damaged JPEG: Pillow tries
    if image is None:
        backend = "pillow"
        image = _pillow_decode(data, channels)
        window = plan(image.shape[0], image.shape[1])
    assert window is not None
    crop = image[window.top:window.top + window.height, window.left:window.left + window.width]
    resize_into(crop, dst, antialias=antialias, flip=flip)
    return backend
