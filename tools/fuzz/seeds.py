"""Writes the seed corpus of tools/fuzz/fuzz_jpeg_region.c: small JPEGs of every kind the region
decoder meets or refuses, each behind the harness's parameter bytes in a few variants.

    python tools/fuzz/seeds.py DIR

Kinds: 4:2:0, 4:4:4, 4:2:2, grey and progressive photos; restart-marked ones (Pillow's markers
and trainfeed's rewrite); CMYK; a 12-bit frame; metadata larger than 4 KiB (APP1, APP2, COM) and
over 64 KiB in all; truncated streams; and the crafted files of
tests/decode/test_jpeg_region_safety.py (the double free, bombs, 501 scans). Generated, never
committed: every run starts from the same corpus.
"""
from __future__ import annotations

import hashlib
import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from jpeg_samples import (
    GREY_TABLES,
    comments,
    declared_jpeg,
    many_scans_jpeg,
    oversized_dc_jpeg,
    photo,
    restart_indexed_jpeg,
    scan,
    segment,
    stuffed,
)

from trainfeed.decode import roi

# The harness's parameter bytes (fuzz_jpeg_region.c, PARAMS): [0] scale (bits 0-1), grey
# (bit 2), fast DCT (bit 3), a buffer short by [11] bytes (bit 4); [1:9] the window's left,
# top, width, height (big-endian, reduced modulo the frame); [9] the restart target / 4.
VARIANTS = [bytes([0, 0, 0, 0, 0, 255, 255, 255, 255, 8, 0, 0]),    # the whole image, 1/1
            bytes([1, 0, 9, 0, 7, 0, 20, 0, 17, 4, 0, 0]),          # a window at 1/2
            bytes([4 | 8, 0, 30, 0, 2, 0, 5, 0, 40, 1, 0, 0]),      # grey, fast DCT
            bytes([3 | 16, 0, 1, 0, 1, 0, 3, 0, 3, 255, 0, 7])]     # 1/8, a short buffer


def encode(pixels: np.ndarray, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=85, **options)
    return out.getvalue()


def with_metadata(jpeg: bytes, *segments: bytes) -> bytes:
    """`jpeg` with `segments` right after its SOI (before JFIF: any order is legal)."""
    return jpeg[:2] + b"".join(segments) + jpeg[2:]


def twelve_bit() -> bytes:
    """A 16x16 grey frame of 12-bit samples (SOF1): libjpeg-turbo's 8-bit build refuses it."""
    frame = segment(0xC1, bytes([12, 0, 16, 0, 16, 1, 1, 0x11, 0]))
    return b"\xff\xd8" + GREY_TABLES + frame + scan() + stuffed("00" * 4) + b"\xff\xd9"


def jpegs() -> dict[str, bytes]:
    rgb = photo(48, 64)
    grey = np.asarray(Image.fromarray(rgb).convert("L"))
    kinds = {
        "420": encode(rgb), "444": encode(rgb, subsampling=0), "422": encode(rgb, subsampling=1),
        "grey": encode(grey), "progressive": encode(rgb, progressive=True),
        "progressive-grey": encode(grey, progressive=True),
        "odd-size": encode(photo(13, 37)), "one-pixel": encode(photo(1, 1)),
        "restarts-pillow": encode(rgb, restart_marker_blocks=4),
        "restarts-rows": encode(rgb, subsampling=0, restart_marker_rows=1),
        "restarts-indexed": restart_indexed_jpeg(64, 48),
        "restarts-padded": restart_indexed_jpeg(32, 32, padding=40),
        "cmyk": _cmyk(rgb, progressive=False), "cmyk-progressive": _cmyk(rgb, progressive=True),
        "12-bit": twelve_bit(),
        "app1-20k": with_metadata(encode(rgb), segment(0xE1, b"Exif\0\0" + bytes(20_000))),
        "app2-60k": with_metadata(encode(rgb, progressive=True),
                                  segment(0xE2, b"ICC_PROFILE\0\x01\x01" + bytes(60_000))),
        "com-5k": with_metadata(encode(grey), comments(5_000)),
        "metadata-70k": with_metadata(encode(rgb, subsampling=0), comments(40_000),
                                      segment(0xE1, b"http://ns.adobe.com/xap/1.0/\0"
                                              + b"x" * 30_000)),
        "double-free-6k": oversized_dc_jpeg(6_000), "double-free-70k": oversized_dc_jpeg(70_000),
        "bomb-baseline": declared_jpeg(4_000, 3_000),
        "bomb-progressive": declared_jpeg(1_200, 900, progressive=True),
        "scans-40": many_scans_jpeg(40), "scans-501": many_scans_jpeg(501),
    }
    if roi.region_decoder() is not None:  # trainfeed's own rewrite, when the extension is built
        for name in ("420", "444", "grey", "progressive"):
            kinds[f"rewritten-{name}"] = roi.with_restarts(kinds[name])
    for name in ("420", "progressive", "restarts-pillow", "app1-20k"):  # truncated streams
        data = kinds[name]
        for fraction in (0.1, 0.5, 0.9):
            kinds[f"{name}-cut-{fraction}"] = data[:int(len(data) * fraction)]
    kinds["header-only"] = kinds["420"][:kinds["420"].index(b"\xff\xda") + 14]
    kinds["empty"] = b""  # (a leak the first fuzz run found: libjpeg refuses it at once)
    return kinds


def _cmyk(rgb: np.ndarray, progressive: bool) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(out, "JPEG", quality=85, progressive=progressive)
    return out.getvalue()


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    total = count = 0
    for name, data in jpegs().items():
        for variant, params in enumerate(VARIANTS):
            seed = params + data
            digest = hashlib.sha1(seed).hexdigest()[:12]
            (folder / f"{name}-{variant}-{digest}").write_bytes(seed)
            total, count = total + len(seed), count + 1
    print(f"{count} seeds, {total:,} bytes, in {folder}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/fuzz/seeds.py DIR")
    main(Path(sys.argv[1]))
