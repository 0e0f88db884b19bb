"""The pixel budget: what an image's header announces, checked before a single pixel is allocated.

An image file is a promise about memory: 630 bytes of JPEG may declare 28,000x30,000 pixels, and
libjpeg then allocates (and, padding the missing data, touches) 2.4 GB; 389 KB of PNG inflate to
400 MB; a progressive JPEG makes libjpeg hold every DCT coefficient (128 bytes per 8x8 block per
component) before the first pixel. So every decode path of trainfeed (simplejpeg, the region
decoder, Pillow, the `--jpeg-restarts` rewrite, `upload --check-images`) reads the declared size
from the header first and refuses an image above one budget, `TRAINFEED_MAX_IMAGE_PIXELS`
(default 89,478,485: Pillow's own `MAX_IMAGE_PIXELS`, a 0.25 GiB RGBA image). What passes costs
at most, per image in flight: 3 bytes per pixel of output, plus for a progressive JPEG its
coefficients (2 to 6 bytes per pixel: 2 for greyscale, 3 at 4:2:0, 6 at 4:4:4), plus for
Pillow's formats its own image and a converted copy (up to 4 + 3 bytes per pixel).

Headers are parsed here in Python, so the check does not depend on the compiled region decoder
being built: a JPEG's frame (SOF0-SOF15, progressive and lossless included) and a PNG's IHDR.
Where the region decoder was built, its own frame parser reads a JPEG's size on the hot path
instead: 0.5 µs against 11-13 µs for the Python parser or simplejpeg's header call on a photo
with EXIF and ICC segments (measured here), all of it with the GIL held. Other formats (GIF,
BMP, TIFF, WebP) are opened lazily by Pillow, whose `size` is checked before `load()`; Pillow's
own DecompressionBombError (at twice `PIL.Image.MAX_IMAGE_PIXELS`) is reported the same way,
and its DecompressionBombWarning (above `MAX_IMAGE_PIXELS`) can only precede a refusal while
the budget is at its default (Pillow's): that image is over it too.
Every refusal is a `PixelBudgetError`, a ValueError, which the decoders turn into a DecodeError
naming the record's file and list line (or, with decode_errors="skip", a counted, logged
failure).
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from trainfeed import settings
from trainfeed.errors import PixelBudgetError

try:  # built by setup.py where libjpeg-turbo's headers were found (see trainfeed.decode.roi)
    import trainfeed.decode._jpeg_region as _jpeg_region
except ImportError:  # pragma: no cover - depends on the install
    _jpeg_region = None  # type: ignore[assignment]

# How every JPEG file starts (its SOI marker): the one test of "is this a JPEG" in trainfeed.
JPEG_MAGIC = b"\xff\xd8"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Bytes of one 8x8 block of DCT coefficients in libjpeg's memory (64 16-bit values).
BLOCK_BYTES = 128
# SOF markers: every frame type but DHT (C4), JPG (C8) and DAC (CC), which share the range.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
# Markers without a length: TEM, RST0-7 (SOI and EOI never occur inside a header).
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})


def is_jpeg(data: bytes | memoryview) -> bool:
    """Whether `data` starts as a JPEG does: libjpeg-turbo's decoders get it before Pillow."""
    return data[:2] == JPEG_MAGIC


def max_image_pixels() -> int:
    """The pixel budget in effect ($TRAINFEED_MAX_IMAGE_PIXELS, read now)."""
    return settings.MAX_IMAGE_PIXELS.get()


def check_pixels(height: int, width: int, budget: int) -> None:
    """Raises PixelBudgetError if an image of height x width is over `budget` pixels."""
    if height * width > budget:
        raise PixelBudgetError(
            f"it declares {width:,}x{height:,} pixels ({height * width:,}), over the pixel "
            f"budget of {budget:,}: refused before decoding, as a possible decompression bomb "
            f"(raise ${settings.MAX_IMAGE_PIXELS.name} if such images are meant to be data)")


@dataclass(frozen=True)
class JpegFrame:
    """What a JPEG's frame header (SOF) announces."""

    height: int
    width: int
    sampling: tuple[tuple[int, int], ...]  # (horizontal, vertical) factor of each component
    progressive: bool

    @property
    def coefficient_bytes(self) -> int:
        """The DCT coefficients of the whole image, as libjpeg holds them to decode a
        progressive file or to transcode any file (`--jpeg-restarts`): every component's blocks,
        padded to whole MCUs, at 128 bytes each."""
        h_max = max(h for h, _ in self.sampling)
        v_max = max(v for _, v in self.sampling)
        mcus_across = -(-self.width // (8 * h_max))
        mcus_down = -(-self.height // (8 * v_max))
        return sum(mcus_across * h * mcus_down * v for h, v in self.sampling) * BLOCK_BYTES


def jpeg_frame(data: bytes | memoryview) -> JpegFrame | None:
    """The frame of a JPEG: its first SOF segment before the first scan, or None if `data` is
    not a JPEG, has no frame before its first scan, or its header markers are damaged (libjpeg
    then refuses it without allocating pixels). Reads only within `data`."""
    size = len(data)
    if size < 4 or not is_jpeg(data):
        return None
    at = 2
    while at + 4 <= size:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte before the marker
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # EOI or a scan: no frame came first
            return None
        (length,) = struct.unpack_from(">H", data, at + 2)
        if length < 2 or at + 2 + length > size:
            return None
        if marker in _SOF:
            return _frame(data, at + 4, length - 2, marker in _PROGRESSIVE)
        at += 2 + length
    return None


def _frame(data: bytes | memoryview, at: int, length: int, progressive: bool) -> JpegFrame | None:
    if length < 6:
        return None
    _, height, width, count = struct.unpack_from(">BHHB", data, at)
    if height == 0 or width == 0 or count == 0 or length < 6 + 3 * count:
        return None  # a DNL height (libjpeg refuses those) or a damaged frame
    sampling = tuple((data[at + 7 + 3 * c] >> 4, data[at + 7 + 3 * c] & 15) for c in range(count))
    if any(not (1 <= h <= 4 and 1 <= v <= 4) for h, v in sampling):
        return None  # libjpeg refuses these factors before allocating anything
    return JpegFrame(height, width, sampling, progressive)


def header_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(height, width) as a JPEG's or PNG's header declares it, or None for other formats (and
    for damaged headers): Pillow then reads the size of those before their pixels."""
    if is_jpeg(data):
        if _jpeg_region is not None:  # the same rule in C (any SOF before the first scan)
            return _jpeg_region.image_size(data)
        frame = jpeg_frame(data)
        return (frame.height, frame.width) if frame is not None else None
    if data[:8] == PNG_MAGIC and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack_from(">II", data, 16)
        return height, width
    return None


def check_header(data: bytes | memoryview, budget: int) -> None:
    """Raises PixelBudgetError if the JPEG or PNG header of `data` declares too many pixels."""
    size = header_size(data)
    if size is not None:
        check_pixels(*size, budget)


def pillow_decode(data: bytes | memoryview, channels: int, budget: int) -> np.ndarray:
    """`data` decoded by Pillow as uint8 HxWxC (C = `channels`, 3 for RGB or 1 for grey), its
    size checked against `budget` after Pillow read the header and before it reads a pixel.

    Raises:
        PixelBudgetError: over the budget, including Pillow's own decompression-bomb refusal.
        ValueError: not an image Pillow can identify, said without Pillow's repr of the stream.
        OSError, SyntaxError: damaged image data (Pillow's messages).
    """
    check_header(data, budget)  # before Pillow's own check could warn about it
    try:
        with Image.open(io.BytesIO(data)) as pil:
            check_pixels(pil.height, pil.width, budget)
            # The original is freed when the `with` closes it, before the array's copy.
            converted = pil.convert("RGB" if channels == 3 else "L")
    except UnidentifiedImageError:
        raise ValueError(f"not an image format trainfeed can decode (JPEG, PNG, GIF, BMP, "
                         f"TIFF, WebP...); its first bytes are {bytes(data[:8])!r}") from None
    except Image.DecompressionBombError as e:
        raise PixelBudgetError(f"Pillow refused it as a possible decompression bomb ({e}); "
                               f"PIL.Image.MAX_IMAGE_PIXELS sets Pillow's own limit") from None
    image = np.asarray(converted)
    return image[:, :, None] if image.ndim == 2 else image


# What a decode of untrusted bytes may raise, all of it a failure of that one record: Pillow
# raises OSError, SyntaxError or ValueError for damaged files, simplejpeg ValueError, the budget
# PixelBudgetError, and an image within the budget may still not fit (MemoryError).
DECODE_FAILURES: tuple[type[BaseException], ...] = (
    ValueError, OSError, SyntaxError, MemoryError, Image.DecompressionBombError)


def failure_reason(error: BaseException) -> str:
    """Why a record failed to decode, in words: the error's message, or what a bare
    MemoryError means and what to do about it."""
    if isinstance(error, MemoryError):
        return (f"out of memory while decoding it: lower ${settings.MAX_IMAGE_PIXELS.name} "
                f"(the most pixels an image may declare) or the decode threads")
    return str(error) or type(error).__name__


# Bytes per pixel a Pillow decode may hold at once: its own image (up to 4: RGBA, 32-bit modes;
# RGB is stored as 4 too) and the converted RGB copy (4), then that copy and the array (4 + 3).
PILLOW_BYTES_PER_PIXEL = 8


def decode_bytes(head: bytes | memoryview, budget: int) -> int:
    """What decoding the image whose file starts with `head` may hold at its peak (an upper
    bound, for scheduling decodes by memory): 3 bytes per pixel of RGB output, plus the
    coefficients of a progressive JPEG, or Pillow's copies for other formats. 0 when the header
    is over `budget` (the decode refuses it before allocating); `budget` pixels' worth of
    Pillow's when `head` says nothing (an unknown or damaged format, or a header longer than
    `head`), which makes such a file's decode run alone under a MemoryBudget."""
    frame = jpeg_frame(head)
    if frame is not None:
        if frame.height * frame.width > budget:
            return 0
        return 3 * frame.height * frame.width + (frame.coefficient_bytes
                                                 if frame.progressive else 0)
    size = header_size(head)
    if size is None and not is_jpeg(head):
        try:  # Pillow reads the size of its other formats from the first bytes, lazily
            with Image.open(io.BytesIO(head)) as pil:
                size = (pil.height, pil.width)
        except DECODE_FAILURES:
            size = None
    if size is None:
        return budget * PILLOW_BYTES_PER_PIXEL
    pixels = size[0] * size[1]
    return 0 if pixels > budget else pixels * PILLOW_BYTES_PER_PIXEL
