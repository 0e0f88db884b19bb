"""Decompression bombs for tests, made in milliseconds: images whose headers declare far more
pixels than their bytes hold (issue 25 §3).

The JPEGs are written by hand rather than encoded from a huge array: one quantization table of
ones and Huffman tables with a single 1-bit code each (DC category 0, AC end-of-block), so that
every 8x8 block is a flat grey block coded in 2 bits (1 for a DC-only progressive scan) and the
entropy-coded data is all zero bytes. A 16,384² greyscale baseline JPEG is then a valid 1 MiB
file; the same header over 400 bytes of data is a truncated one that libjpeg still decodes in
full (it pads a premature end with zeros, which are valid data here).
"""
from __future__ import annotations

import struct
import zlib


def _segment(marker: int, body: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(body) + 2) + body


def jpeg_bomb(height: int, width: int, components: int = 1, progressive: bool = False,
              data_bytes: int | None = None, subsampled: bool = False) -> bytes:
    """A JPEG declaring height x width, flat grey. `components` 1 (grey) or 3 (YCbCr, 4:4:4, or
    4:2:0 if `subsampled`); `progressive`: one DC-only scan (SOF2), as a progressive file cut
    after its first scan; `data_bytes`: cut the entropy-coded data to that many bytes (a
    truncated file), default the whole of it."""
    sampling = [0x22 if subsampled else 0x11] + [0x11] * (components - 1)
    step = 16 if subsampled else 8
    mcus = -(-height // step) * -(-width // step)
    blocks = mcus * (4 + components - 1 if subsampled else components)
    bits = blocks * (1 if progressive else 2)
    data = bytes(data_bytes if data_bytes is not None else -(-bits // 8))
    parts = [b"\xff\xd8", _segment(0xDB, b"\x00" + bytes([1]) * 64)]
    frame = struct.pack(">BHHB", 8, height, width, components)
    frame += b"".join(bytes([c + 1, sampling[c], 0]) for c in range(components))
    parts.append(_segment(0xC2 if progressive else 0xC0, frame))
    one_code = bytes([1] + [0] * 15)
    parts.append(_segment(0xC4, b"\x00" + one_code + b"\x00"))  # DC table 0: category 0
    if not progressive:
        parts.append(_segment(0xC4, b"\x10" + one_code + b"\x00"))  # AC table 0: end of block
    scan = bytes([components]) + b"".join(bytes([c + 1, 0x00]) for c in range(components))
    scan += bytes([0, 0, 0]) if progressive else bytes([0, 63, 0])
    parts += [_segment(0xDA, scan), data, b"\xff\xd9"]
    return b"".join(parts)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(
        ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def zero_png(height: int, width: int) -> bytes:
    """A black 8-bit greyscale PNG of height x width: ~1 KB per megapixel (20,000² is 389 KB)."""
    compressor = zlib.compressobj(9)
    row = bytes(1 + width)  # filter byte 0, then the pixels
    rows_per_piece = max(1, (1 << 20) // len(row))
    piece = row * rows_per_piece
    parts = []
    for start in range(0, height, rows_per_piece):
        count = min(rows_per_piece, height - start)
        parts.append(compressor.compress(piece if count == rows_per_piece else row * count))
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", b"".join(parts))
            + _chunk(b"IEND", b""))
