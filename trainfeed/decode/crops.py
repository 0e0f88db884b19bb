"""What to make of each image: its window (torchvision's RandomResizedCrop sampling, the
validation crop, the whole image or its centre of the target's aspect ratio), flip and jitter.

The decode stage decodes, crops, resizes and flips each image in one step at source resolution
(trainfeed.decode.image.decode_into), so it needs the crop window before it touches the pixels.
This module decides the windows and nothing else: pure functions of the image's size and of
per-record random numbers, bundled per image into a `Plan`.

Randomness is derived per record, never global: every draw of record `id` in epoch `epoch` of a
reader with seed `seed` is a fixed function of (seed, epoch, id, draw number), so a partition
that the master leases again after a crash, or a reader restored from a checkpoint, makes the
same crops and flips, whichever batch, thread or worker the record lands in. The draws come
from a counter-based hash (SplitMix64's finalizer) evaluated for a whole batch in one numpy call
rather than from a `numpy.random.Generator` per record: building a Generator costs ~20 µs with
the GIL held (measured here), 2-3 % of an image's whole decode budget on the hot path, where the
hash costs well under 1 µs per record. An over-sampled record (`resample=`) gets the same crop
for each of its copies in an epoch.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# torchvision.transforms.RandomResizedCrop's defaults (the ImageNet recipe of Szegedy et al.
# 2015, "Going deeper with convolutions"): 8 %-100 % of the area, aspect ratio 3/4-4/3.
DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3.0 / 4.0, 4.0 / 3.0)
# torchvision tries this many random windows before falling back to a centre crop.
ATTEMPTS = 10
# Uniform draws per record: two per attempt (area, log-ratio), two for the window's position,
# one for the flip.
FLIP_DRAW = 2 * ATTEMPTS + 2
# Colour jitter's factors (brightness, contrast, saturation): draws after the flip's, so that
# adding them changed no earlier crop or flip.
JITTER_DRAWS = (FLIP_DRAW + 1, FLIP_DRAW + 2, FLIP_DRAW + 3)
DRAWS = FLIP_DRAW + 4
# The ImageNet validation convention: resize the shorter side to 256, centre-crop 224.
VALIDATION_CROP_FRACTION = 224 / 256

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


class Window(NamedTuple):
    """A crop window in source pixels: rows top..top+height, columns left..left+width.

    A named tuple, as `Plan` is: a decode thread makes one per image with the GIL held, and a
    frozen dataclass took 2.2x as long to build (0.53 against 0.24 µs; issue 39)."""

    top: int
    left: int
    height: int
    width: int

    def on_grid(self, k: int, height: int, width: int) -> Window:
        """The window with its edges moved to the nearest multiple of `k` source pixels (the
        bottom and right edges kept inside an image of (height, width)), never empty: what a
        1/k DCT-scaled decode can cut out exactly, whole pixels for whole pixels. Each edge
        moves by at most k/2 pixels."""
        if k == 1:
            return self

        def snap(x: int) -> int:
            return (x + k // 2) // k * k

        top, left = min(snap(self.top), height - 1), min(snap(self.left), width - 1)
        bottom = max(top + 1, min(height, snap(self.top + self.height)))
        right = max(left + 1, min(width, snap(self.left + self.width)))
        return Window(top, left, bottom - top, right - left)

    def divided(self, k: int) -> Window:
        """This window (on the k-grid, see `on_grid`) in an image decoded at 1/k: libjpeg
        makes ceil(side / k) pixels of a side, so an edge at the image's end maps there too."""
        top, left = self.top // k, self.left // k
        return Window(top, left, -(-(self.top + self.height) // k) - top,
                      -(-(self.left + self.width) // k) - left)


# A window planner: the window to keep of an image of (height, width).
Planner = Callable[[int, int], Window]


def whole_image(height: int, width: int) -> Window:
    """The planner that keeps all of an image."""
    return Window(0, 0, height, width)


def aspect_crop(height: int, width: int, size: tuple[int, int]) -> Window:
    """The largest centred window of an image of (height, width) whose aspect ratio is that of
    `size` (height, width): what `crop=True` keeps, so that the resize stretches nothing.

    Example:
        >>> aspect_crop(10, 30, (5, 5))   # a wide image: its centre square
        Window(top=0, left=10, height=10, width=10)
    """
    aspect = size[0] / size[1]
    if height / width > aspect:  # too tall: trim top and bottom
        keep = max(1, round(width * aspect))
        return Window((height - keep) // 2, 0, keep, width)
    keep = max(1, round(height / aspect))
    return Window(0, (width - keep) // 2, height, keep)


class Plan(NamedTuple):
    """What to make of one image (trainfeed.decode.image.decode_into): the window to keep, as
    a function of the image's size (read from its header before anything is decoded); whether
    to mirror it left-right; the colour jitter factors (brightness, contrast, saturation) or
    None; whether the resize averages when shrinking (`antialias`, OpenCV's INTER_AREA; else
    bilinear); and whether libjpeg uses its fast integer IDCT (`fast_dct`). The output size is
    that of the array the image is decoded into. A named tuple: one is made per image, with
    the GIL held, and a frozen dataclass took 2.4x as long to build (0.60 against 0.25 µs)."""

    window: Planner = whole_image
    flip: bool = False
    jitter: tuple[float, float, float] | None = None
    antialias: bool = False
    fast_dct: bool = False


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijection of uint64 whose output bits all depend on all input
    bits (wrapping arithmetic, as uint64 arrays do in numpy)."""
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def record_uniforms(seed: int, epoch: int, ids: Sequence[int] | np.ndarray,
                    draws: int = DRAWS) -> np.ndarray:
    """(len(ids), draws) float64 uniforms in [0, 1): draw k of record ids[i] in `epoch` under
    `seed`. A pure function: the same arguments give the same numbers, in any batch order.

    Example:
        >>> a = record_uniforms(0, 1, [7, 8])
        >>> b = record_uniforms(0, 1, [8, 7])
        >>> bool((a[0] == b[1]).all()), a.shape
        (True, (2, 26))
    """
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64) + _GOLDEN)
        key = _mix(key ^ (np.array([epoch & 0xFFFFFFFFFFFFFFFF], np.uint64) * _GOLDEN))
        rid = np.asarray(ids, dtype=np.int64).astype(np.uint64)
        per_record = _mix(key ^ _mix(rid * _MIX2 + _GOLDEN))
        counters = np.arange(1, draws + 1, dtype=np.uint64) * _GOLDEN
        bits = _mix(per_record[:, None] + counters[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def random_resized_crop(height: int, width: int, u: Sequence[float],
                        scale: tuple[float, float] = DEFAULT_SCALE,
                        ratio: tuple[float, float] = DEFAULT_RATIO) -> Window:
    """torchvision's RandomResizedCrop window for an image of (height, width), from `u`
    (at least 2 * ATTEMPTS + 2 uniforms in [0, 1)).

    The documented algorithm: up to 10 times, draw a target area uniformly in
    scale × image area and an aspect ratio (width / height) log-uniformly in `ratio`; the
    window's sides are the rounded sqrt(area × ratio) and sqrt(area / ratio); the first window
    that fits is placed uniformly at random. If none fits, the largest centred window whose
    aspect ratio is clamped into `ratio` (the whole image when its own ratio is inside).

    Example:
        >>> random_resized_crop(400, 600, [0.999] * 23, scale=(0.08, 1.0))  # nothing fits
        Window(top=0, left=33, height=400, width=533)
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for attempt in range(ATTEMPTS):
        target = area * (scale[0] + (scale[1] - scale[0]) * u[2 * attempt])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[2 * attempt + 1])
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = min(height - h, int(u[2 * ATTEMPTS] * (height - h + 1)))
            left = min(width - w, int(u[2 * ATTEMPTS + 1] * (width - w + 1)))
            return Window(top, left, h, w)
    own = width / height
    if own < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif own > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return Window((height - h) // 2, (width - w) // 2, h, w)


def center_crop(height: int, width: int, resize_shorter: int,
                size: tuple[int, int]) -> Window:
    """The source window that "resize the shorter side to `resize_shorter`, then centre-crop
    `size` (height, width)" keeps (torchvision's Resize + CenterCrop), so that one resize of
    the window gives the same picture without resizing the whole image first.

    Example:
        >>> center_crop(375, 500, 256, (224, 224))   # ImageNet validation, a 4:3 photo
        Window(top=23, left=86, height=328, width=328)
    """
    factor = resize_shorter / min(height, width)
    h = min(height, max(1, int(round(size[0] / factor))))
    w = min(width, max(1, int(round(size[1] / factor))))
    return Window((height - h) // 2, (width - w) // 2, h, w)


@dataclass(frozen=True)
class CropOptions:
    """The decode stage's crops: every image comes out as `size` (height, width).

    `random_resized_crop=(scale, ratio)`: torchvision's RandomResizedCrop window (training);
    None: the validation crop, the centre `size` of the image resized so that its shorter side
    is `resize_shorter` (None: size / 0.875, ImageNet's 224-of-256). `flip`: the probability of
    mirroring an image left-right. `antialias`: average when shrinking (see
    trainfeed.decode.resize.resize_into); off by default, like tf.data's resize. `fast_dct`:
    libjpeg's fast integer IDCT, tf.data's default for `decode_jpeg` and
    `decode_and_crop_jpeg` (TensorFlow picks JDCT_IFAST "sacrificing decoding image quality for
    speed"): ~3 % faster here, within a grey level or two of the accurate IDCT.
    `color_jitter=(brightness, contrast, saturation)`: torchvision's ColorJitter factors, each
    drawn per record uniformly in [max(0, 1 - x), 1 + x] (0 leaves it off), applied in that
    fixed order to the resized image (see trainfeed.decode.jitter).
    """

    size: tuple[int, int]
    random_resized_crop: tuple[tuple[float, float], tuple[float, float]] | None = None
    resize_shorter: int | None = None
    flip: float = 0.0
    antialias: bool = False
    fast_dct: bool = True
    color_jitter: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        if len(self.size) != 2 or min(self.size) < 1:
            raise ValueError(f"crop size must be (height, width) ≥ 1, got {self.size!r}")
        if self.random_resized_crop is not None:
            try:
                (s_lo, s_hi), (r_lo, r_hi) = self.random_resized_crop
            except (TypeError, ValueError):
                raise ValueError(f"random_resized_crop must be ((min_scale, max_scale), "
                                 f"(min_ratio, max_ratio)), e.g. ((0.08, 1.0), (3/4, 4/3)), "
                                 f"got {self.random_resized_crop!r}") from None
            if not 0 < s_lo <= s_hi <= 1:
                raise ValueError(f"random_resized_crop scale must satisfy 0 < min ≤ max ≤ 1 "
                                 f"(fractions of the image's area), got {(s_lo, s_hi)}")
            if not 0 < r_lo <= r_hi:
                raise ValueError(f"random_resized_crop ratio must satisfy 0 < min ≤ max "
                                 f"(width / height), got {(r_lo, r_hi)}")
        if self.resize_shorter is not None and self.resize_shorter < 1:
            raise ValueError(f"resize_shorter must be ≥ 1 pixel, got {self.resize_shorter}")
        if not 0.0 <= self.flip <= 1.0:
            raise ValueError(f"flip probability must be in [0, 1], got {self.flip}")
        if self.color_jitter is not None and (
                len(self.color_jitter) != 3 or min(self.color_jitter) < 0):
            raise ValueError(f"color_jitter must be (brightness, contrast, saturation), each ≥ 0 "
                             f"(torchvision's ColorJitter), got {self.color_jitter!r}")

    @property
    def random(self) -> bool:
        """Whether crops depend on per-record random draws (and so need record ids)."""
        return (self.random_resized_crop is not None or self.flip > 0
                or self.jitters)

    @property
    def jitters(self) -> bool:
        return self.color_jitter is not None and max(self.color_jitter) > 0

    def jitter_factors(self, u: Sequence[float] | None) -> tuple[float, float, float] | None:
        """A record's (brightness, contrast, saturation) factors from its draws, or None."""
        if u is None or self.color_jitter is None or not self.jitters:
            return None
        factors = []
        for x, k in zip(self.color_jitter, JITTER_DRAWS):
            lo = max(0.0, 1.0 - x)
            factors.append(lo + (1.0 + x - lo) * float(u[k]) if x > 0 else 1.0)
        return factors[0], factors[1], factors[2]

    @property
    def shorter_side(self) -> int:
        """The validation crop's resize target for the shorter side."""
        if self.resize_shorter is not None:
            return self.resize_shorter
        return int(round(max(self.size) / VALIDATION_CROP_FRACTION))

    def plan(self, u: Sequence[float] | None) -> Plan:
        """The plan of one image (its window planner, flip and jitter), from the record's
        draws (`record_uniforms`; None when `random` is False)."""
        if self.random_resized_crop is not None:
            assert u is not None
            scale, ratio = self.random_resized_crop
            draws = u

            def window(height: int, width: int) -> Window:
                return random_resized_crop(height, width, draws, scale, ratio)
        else:
            shorter, size = self.shorter_side, self.size

            def window(height: int, width: int) -> Window:
                return center_crop(height, width, shorter, size)
        flip = u is not None and self.flip > 0 and u[FLIP_DRAW] < self.flip
        return Plan(window, bool(flip), self.jitter_factors(u), self.antialias, self.fast_dct)
