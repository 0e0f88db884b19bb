"""JPEGs for the region decoder's tests: natural-looking photos in every sampling, and a window
decoded the way trainfeed/decode/roi.py does (tests/decode/test_jpeg_region.py,
test_jpeg_restarts.py)."""
from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

from trainfeed.decode import roi
from trainfeed.upload import UploadOptions, upload

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
# (tests/decode/test_jpeg_region_safety.py) and the fuzz corpus (tools/fuzz/seeds.py).

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


def comments(total: int) -> bytes:
    """COM segments holding `total` bytes of text in all (65,533 at most each)."""
    sizes = [65533] * (total // 65533) + ([total % 65533] if total % 65533 else [])
    return b"".join(segment(0xFE, b"C" * size) for size in sizes)


GREY_TABLES = (segment(0xDB, bytes([0x00]) + bytes([1] * 64))   # quantization: all 1
               + huffman_table(0, 0, [1], bytes([0]))            # DC: code '0' -> category 0
               + huffman_table(1, 0, [1], bytes([0x00])))        # AC: code '0' -> end of block


def grey_frame(width: int, height: int, marker: int = 0xC0) -> bytes:
    """A one-component 8-bit frame (SOF0 baseline, SOF2 progressive...) of width x height."""
    return segment(marker, bytes([8]) + height.to_bytes(2, "big") + width.to_bytes(2, "big")
                   + bytes([1, 1, 0x11, 0]))


def scan(start: int = 0, end: int = 63, high: int = 0, low: int = 0) -> bytes:
    """The SOS segment of a one-component scan (spectral selection, successive approximation)."""
    return segment(0xDA, bytes([1, 1, 0x00, start, end, high << 4 | low]))


def oversized_dc_jpeg(comment_bytes: int = 6000) -> bytes:
    """An 8x8 grey baseline JPEG whose one block's DC difference is category 15 (a 1-bit code
    in its DC table), 15 bits no 8-bit JPEG may hold, after `comment_bytes` of COM segments.

    libjpeg decodes it (the coefficient is merely large) but refuses to re-encode it ("DCT
    coefficient out of range"), after the comments were written: with >= 4 KiB of them, which
    grew jpeg_mem_dest's buffer first, add_restarts freed a buffer twice (issue 25).
    """
    dc = huffman_table(0, 0, [1], bytes([15]))      # code '0' -> category 15
    data = stuffed("0" + "1" * 15 + "0")            # DC: category 15, +32767; AC: EOB
    return (b"\xff\xd8" + comments(comment_bytes) + GREY_TABLES + grey_frame(8, 8) + dc
            + scan() + data + b"\xff\xd9")


def declared_jpeg(width: int, height: int, progressive: bool = False) -> bytes:
    """A grey JPEG declaring a width x height frame: a decompression bomb.

    Baseline: a few hundred bytes, the entropy-coded data ending after one block (a whole-image
    decoder allocates for the frame first). Progressive: one DC scan of every block, 1 bit each
    (1.6 MB for 28,000 x 30,000): libjpeg keeps every coefficient of the image for the later
    scans, 128 bytes a block, and touches them all (1.7 GB for that size)."""
    if progressive:
        blocks = -(-width // 8) * -(-height // 8)
        return (b"\xff\xd8" + GREY_TABLES + grey_frame(width, height, 0xC2) + scan(0, 0)
                + bytes(-(-blocks // 8)) + b"\xff\xd9")
    return (b"\xff\xd8" + GREY_TABLES + grey_frame(width, height) + scan() + stuffed("00")
            + b"\xff\xd9")


def many_scans_jpeg(scans: int) -> bytes:
    """An 8x8 grey progressive JPEG of `scans` valid scans (1 to 631): a DC scan, then each AC
    coefficient in turn in 10 successive-approximation scans (bits 9..0). Every one passes
    over all of an image's blocks: thousands of them make a small file a CPU bomb."""
    if not 1 <= scans <= 631:
        raise ValueError(f"an 8x8 grey JPEG has 1-631 scans here, got {scans}")
    parts = [scan(0, 0), stuffed("0")]
    for k in range(1, 64):
        parts += [scan(k, k, 0, 9), stuffed("0")]
        parts += [item for bit in range(9, 0, -1) for item in (scan(k, k, bit, bit - 1),
                                                              stuffed("0"))]
    return (b"\xff\xd8" + GREY_TABLES + grey_frame(8, 8, 0xC2) + b"".join(parts[:2 * scans])
            + b"\xff\xd9")


def restart_indexed_jpeg(width: int, height: int, padding: int = 0) -> bytes:
    """A grey baseline JPEG of flat blocks with a restart marker after every MCU (8x8 px): the
    fast path's layout; `padding` zero bytes inside its first interval (which libjpeg would
    reject, but the layout parser only counts markers)."""
    blocks = -(-width // 8) * -(-height // 8)
    intervals = [stuffed("00") + (bytes(padding) if i == 0 else b"") for i in range(blocks)]
    data = b"".join(interval + (bytes([0xFF, 0xD0 + i % 8]) if i + 1 < blocks else b"")
                    for i, interval in enumerate(intervals))
    return (b"\xff\xd8" + GREY_TABLES + segment(0xDD, (1).to_bytes(2, "big"))
            + grey_frame(width, height) + scan() + data + b"\xff\xd9")
