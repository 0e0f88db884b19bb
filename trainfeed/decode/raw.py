"""Raw pixel records: an image stored as its uint8 pixels (HWC), read without a decode.

Small images decode slower than they copy: FFCV's ImageNet recipe stores half its 256-px images
as raw pixels for that reason. `upload --raw-below PIXELS` stores every image of at most PIXELS
pixels (height x width, after --max-side) this way (trainfeed.ingest.transform), and the one
decode chain (trainfeed.decode.image) cuts the crop window out of the stored bytes as a view and
resizes it: the same window, seeding and resize as for a JPEG or PNG of the same pixels.

A record is a 16-byte header and the pixels, row by row:

    offset  size  what
    0       8     MAGIC, b"\\x93TFRAW\\x01\\x00" (no image format starts so: 0x93 is not a
                  JPEG's 0xFF, a PNG's 0x89, a GIF's "G", a BMP's "B", ...; the 7th byte is
                  this layout's version)
    8       2     height, little-endian uint16, at least 1
    10      2     width, little-endian uint16, at least 1
    12      2     channels, little-endian uint16: 3 (RGB) or 1 (grey)
    14      2     zero
    16      h*w*c the pixels, uint8, HWC

The header is a door (docs/security.md): a record's bytes come from storage, which anyone
able to write the dataset's folder controls. `parse` checks the declared shape against the
record's length (exactly) and against the pixel budget before any array is made; a raw record
is never copied to be read (`pixels` is a view of its bytes).
"""
from __future__ import annotations

import struct

import numpy as np

from trainfeed.decode.pixel_budget import check_pixels

MAGIC = b"\x93TFRAW\x01\x00"
_HEADER = struct.Struct("<8sHHHH")
HEADER_BYTES = _HEADER.size  # 16
CHANNELS = (1, 3)
# The longest side a header can state (uint16): a raw record is meant for small images.
MAX_SIDE = 0xFFFF


def is_raw(data: bytes | memoryview) -> bool:
    """Whether `data` is a raw pixel record (starts with MAGIC). Compared without a copy: a
    decode thread asks this of every image with the GIL held."""
    return data[:len(MAGIC)] == MAGIC


def encode(pixels: np.ndarray) -> bytes:
    """The raw record of `pixels` ((H, W, C) uint8, C 1 or 3, sides 1..65,535).

    Raises:
        ValueError: `pixels` has another dtype, rank, channel count or size.
    """
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] not in CHANNELS:
        raise ValueError(f"a raw pixel record holds (H, W, 1 or 3) uint8 pixels, got "
                         f"{pixels.dtype} {pixels.shape}")
    height, width, channels = pixels.shape
    if not (1 <= height <= MAX_SIDE and 1 <= width <= MAX_SIDE):
        raise ValueError(f"a raw pixel record's sides are 1..{MAX_SIDE}, got {width}x{height}")
    return (_HEADER.pack(MAGIC, height, width, channels, 0)
            + np.ascontiguousarray(pixels).tobytes())


def parse(data: bytes | memoryview, max_pixels: int) -> tuple[int, int, int]:
    """(height, width, channels) of a raw record, checked before any pixel is touched.

    Raises:
        ValueError: the header is short or damaged, the channels are not 1 or 3, a side is 0,
            or the record's length is not the header plus height x width x channels bytes
            (a truncated or padded record).
        PixelBudgetError (a ValueError): it declares more than `max_pixels` pixels.
    """
    if len(data) < HEADER_BYTES:
        raise ValueError(f"raw pixel record of {len(data)} bytes, shorter than its "
                         f"{HEADER_BYTES}-byte header")
    magic, height, width, channels, zero = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or zero != 0:
        raise ValueError("not a raw pixel record of this layout (damaged header)")
    if channels not in CHANNELS or height < 1 or width < 1:
        raise ValueError(f"raw pixel record declares {width}x{height} pixels of {channels} "
                         f"channel(s); expected sides ≥ 1 and 1 or 3 channels")
    check_pixels(height, width, max_pixels)
    expected = HEADER_BYTES + height * width * channels
    if len(data) != expected:
        raise ValueError(f"raw pixel record declares {width}x{height}x{channels} "
                         f"({expected:,} bytes with its header) but holds {len(data):,} bytes: "
                         f"truncated or damaged")
    return height, width, channels


def pixels(data: bytes | memoryview, max_pixels: int) -> np.ndarray:
    """The record's pixels as a read-only (H, W, C) uint8 view of `data`, checked by
    `parse` first (raises as it does)."""
    height, width, channels = parse(data, max_pixels)
    return np.ndarray((height, width, channels), np.uint8, data, HEADER_BYTES)
