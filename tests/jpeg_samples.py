"""JPEGs for the region decoder's tests: natural-looking photos in every sampling, and a window
decoded the way trainfeed/worker/roi.py does (tests/worker/test_jpeg_region.py,
test_jpeg_restarts.py)."""
from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

from trainfeed.upload import UploadOptions, upload
from trainfeed.worker import roi

region = roi._jpeg_region


def photo(height: int, width: int, sample: str = "flower.jpg") -> np.ndarray:
    """A natural photo (one of scikit-learn's samples, shipped with it: "flower.jpg" or
    "china.jpg") resized to (height, width)."""
    from sklearn.datasets import load_sample_image
    source = Image.fromarray(load_sample_image(sample))
    return np.asarray(source.resize((width, height), Image.Resampling.BICUBIC))


def encode(pixels: np.ndarray, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90, **options)
    return out.getvalue()


def decode_window(data: bytes, left: int, top: int, width: int, height: int, scale: int = 1,
                  channels: int = 3) -> np.ndarray:
    out = np.empty(height * (width + region.MARGIN) * channels, np.uint8)
    row, dx = region.decode_region(data, out, left, top, width, height, scale, channels, False)
    assert row >= width and dx <= region.MARGIN
    return out[:height * row * channels].reshape(height, row, channels)[:, dx:dx + width]


def upload_photos(folder: Path, photos: Iterable[np.ndarray]) -> str:
    """Stores `photos` as JPEGs in dataset "photos" (labels a, b in turn; row groups of 8, so
    partitions of 8) under folder/storage, which it returns."""
    source = folder / "photos"
    (source / "images").mkdir(parents=True)
    lines = []
    for i, pixels in enumerate(photos):
        (source / f"images/{i:03d}.jpg").write_bytes(encode(pixels))
        lines.append(f"images/{i:03d}.jpg\t{'ab'[i % 2]}\n")
    (source / "train_data.list").write_text("".join(lines))
    storage = str(folder / "storage")
    upload(str(source / "train_data.list"), "photos", storage, UploadOptions(row_group_rows=8),
           progress=False)
    return storage


# ---- Hand-assembled JPEGs: the segments spelled out, for the crafted files of the safety tests
# (tests/worker/test_jpeg_region_safety.py) and the fuzz corpus (tools/fuzz/seeds.py).

def segment(marker: int, body: bytes) -> bytes:
    """One header segment: 0xFF, its marker, the big-endian length (which counts itself)."""
    if len(body) > 0xFFFF - 2:
        raise ValueError(f"a segment body holds at most 65,533 bytes, got {len(body)}")
    return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body


def huffman_table(table_class: int, index: int, codes_of_length: list[int],
                  symbols: bytes) -> bytes:
    """A DHT segment of one table: `codes_of_length[i]` codes of i + 1 bits, for `symbols`."""
    counts = bytes(codes_of_length) + bytes(16 - len(codes_of_length))
    return segment(0xC4, bytes([table_class << 4 | index]) + counts + symbols)


def stuffed(bits: str) -> bytes:
    """Entropy-coded bytes for a string of '0'/'1' bits, padded with 1s, 0xFF stuffed."""
    bits += "1" * (-len(bits) % 8)
    out = bytearray()
    for i in range(0, len(bits), 8):
        out.append(int(bits[i:i + 8], 2))
        if out[-1] == 0xFF:
            out.append(0x00)
    return bytes(out)


def oversized_dc_jpeg(comment_bytes: int = 6000) -> bytes:
    """An 8x8 grey baseline JPEG whose one block's DC difference is category 15 (a 1-bit code
    in its DC table), 15 bits no 8-bit JPEG may hold, after a COM segment of `comment_bytes`.

    libjpeg decodes it (the coefficient is merely large) but refuses to re-encode it ("DCT
    coefficient out of range"), after the comment was written: with >= 4 KiB of comment that
    grew jpeg_mem_dest's buffer first, which made add_restarts free a buffer twice (issue 25).
    """
    quantization = segment(0xDB, bytes([0x00]) + bytes([1] * 64))
    frame = segment(0xC0, bytes([8, 0, 8, 0, 8, 1, 1, 0x11, 0]))
    dc = huffman_table(0, 0, [1], bytes([15]))      # code '0' -> category 15
    ac = huffman_table(1, 0, [1], bytes([0x00]))    # code '0' -> end of block
    scan = segment(0xDA, bytes([1, 1, 0x00, 0, 63, 0]))
    data = stuffed("0" + "1" * 15 + "0")            # DC: category 15, +32767; AC: EOB
    return (b"\xff\xd8" + segment(0xFE, b"C" * comment_bytes) + quantization + frame + dc + ac
            + scan + data + b"\xff\xd9")
