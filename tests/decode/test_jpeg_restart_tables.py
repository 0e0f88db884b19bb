"""`add_restarts` keeps a source's Huffman tables when they code every symbol (issue 30 §2):
skipping optimize_coding's statistics pass doubles the rewrites per second, which is what lets
`upload --jpeg-restarts` reach 400 images/s per core. A table that lacks a symbol is never
reused (libjpeg-turbo would write no code for it, silently): those files are rewritten with
optimized tables, losslessly, as before."""
from __future__ import annotations

import numpy as np
import pytest
import simplejpeg
from jpeg_samples import encode, photo

from trainfeed.decode import roi

region = roi._jpeg_region


def huffman_segments(data: bytes) -> list[bytes]:
    """The bodies of the DHT segments before the first scan, in order."""
    found, at = [], 2
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker, length = data[at + 1], int.from_bytes(data[at + 2:at + 4], "big")
        if marker == 0xDA:
            break
        if marker == 0xC4:
            found.append(data[at + 4:at + 2 + length])
        at += 2 + length
    return found


def tables(data: bytes) -> dict[tuple[int, int], bytes]:
    """(class, index) -> (bits, values) of every Huffman table a JPEG defines."""
    out = {}
    for body in huffman_segments(data):
        at = 0
        while at < len(body):
            count = sum(body[at + 1:at + 17])
            out[(body[at] >> 4, body[at] & 15)] = body[at + 1:at + 17 + count]
            at += 17 + count
    return out


@pytest.mark.parametrize("options", [{}, {"subsampling": 0}, {"subsampling": 2}])
def test_complete_tables_are_kept_and_the_rewrite_is_lossless(options: dict) -> None:
    data = encode(photo(403, 474), **options)  # Pillow writes the standard (complete) tables
    rewritten = region.add_restarts(data, roi.RESTART_TARGET_PIXELS)
    assert region.restart_interval(rewritten) > 0
    assert tables(rewritten) == tables(data)
    np.testing.assert_array_equal(simplejpeg.decode_jpeg(rewritten), simplejpeg.decode_jpeg(data))


def test_optimized_tables_missing_the_dc_values_a_restart_needs_are_not_reused() -> None:
    # A flat bright image: every DC difference is 0 but the first, so an optimized DC table
    # codes categories 0 and the first block's only; after each restart marker the difference
    # is the whole DC value again, which that table cannot code.
    pixels = np.full((64, 640, 3), 230, np.uint8)
    pixels[:, ::2] = 228
    data = encode(pixels, optimize=True)
    dc = [t for (cls, _), t in tables(data).items() if cls == 0]
    assert any(sum(t[:16]) < 12 for t in dc)  # incomplete: the case this test is about
    rewritten = region.add_restarts(data, roi.RESTART_TARGET_PIXELS)
    assert region.restart_interval(rewritten) > 0
    np.testing.assert_array_equal(simplejpeg.decode_jpeg(rewritten), simplejpeg.decode_jpeg(data))


def test_optimized_photo_tables_are_re_optimized_losslessly() -> None:
    data = encode(photo(403, 474, "china.jpg"), optimize=True)
    rewritten = region.add_restarts(data, roi.RESTART_TARGET_PIXELS)
    assert tables(rewritten) != tables(data)
    np.testing.assert_array_equal(simplejpeg.decode_jpeg(rewritten), simplejpeg.decode_jpeg(data))
