"""Colour jitter of one decoded image, in place, with the GIL released: torchvision's
ColorJitter brightness, contrast and saturation on uint8 pixels.

The formulas are torchvision's (`adjust_brightness`, `adjust_contrast`, `adjust_saturation`):
brightness scales the pixels; contrast blends them with the mean of their grey image; saturation
blends each pixel with its own grey value (grey = 0.299 R + 0.587 G + 0.114 B, OpenCV's and
torchvision's weights); results are clipped to [0, 255] and truncated to uint8 after each step,
as torchvision does on uint8 images: OpenCV's `addWeighted` rounds, so each step subtracts half
a level (else the three steps drift ~1.5 levels brighter on average). OpenCV's grey image
rounds where torchvision's truncates: within two grey levels of torchvision, under 0.35 on
average (tests/decode/test_jitter.py). A 256-entry table (cv2.LUT) would be exact for the first
two steps but measured slower than `addWeighted` (0.06 against 0.04 ms).

Decided: the three run in this fixed order, not in torchvision's random order per image (one
more draw and a branch per image), and hue is not offered (it needs an HSV round trip per
image, not measured here; the official ResNet recipes use none of the four).
Measured on a 224x224 image, one thread: ~0.04 ms per step, ~0.15 ms for all three, against
~0.8 ms for decoding the image.
"""
from __future__ import annotations

import numpy as np

from trainfeed.decode.resize import cv2_module


def color_jitter(image: np.ndarray, factors: tuple[float, float, float]) -> None:
    """Applies (brightness, contrast, saturation) `factors` to `image` ((h, w, C) uint8, C 3
    for RGB or 1 for grey; saturation does nothing to grey) in place. A factor of 1 is a no-op
    and is skipped."""
    cv2 = cv2_module()
    brightness, contrast, saturation = factors
    truncate = -0.5  # OpenCV rounds; torchvision truncates (see the module's docstring)
    pixels = image if image.shape[2] == 3 else image[:, :, 0]
    if brightness != 1.0:
        cv2.addWeighted(pixels, brightness, pixels, 0.0, truncate, dst=pixels)
    if contrast != 1.0:
        grey = pixels if pixels.ndim == 2 else cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)
        mean = float(cv2.mean(grey)[0])
        cv2.addWeighted(pixels, contrast, pixels, 0.0, (1.0 - contrast) * mean + truncate,
                        dst=pixels)
    if saturation != 1.0 and pixels.ndim == 3:
        grey3 = cv2.cvtColor(cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)
        cv2.addWeighted(pixels, saturation, grey3, 1.0 - saturation, truncate, dst=pixels)
