"""The CRC-32 (zlib's polynomial) of the values an upload indexes, computed fast where it can be.

Every binary value of a shard gets a CRC-32 in its payload index (trainfeed.formats.shards), for
readers whose google-crc32c has no compiled code. zlib's (1.2.13, table-driven) takes ~20 µs per
83 KB photo, 5 % of a plain upload's CPU; ISA-L's (the `isal` package: carry-less multiplication,
PCLMULQDQ on x86, PMULL on ARM) ~1.6 µs, with the same values. Where `isal` has no wheel, zlib's.
"""
from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a platform without an isal wheel
    from zlib import crc32

__all__ = ["crc32"]
