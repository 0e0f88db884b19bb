"""The checksums of the values an upload indexes and a reader verifies, computed fast.

- CRC-32C (the `crc32c` package, compiled: the CPU's instruction, SSE 4.2 or ARMv8, with a
  slice-by-8 table where the CPU has none) is what readers verify per value read by range. It
  releases the GIL while it hashes a value of 32 KiB or more: a raw 256-px image (~170 KB) takes
  ~13 µs to hash, and google-crc32c, used before, held the GIL for all of its ~18 µs, during
  which no decode thread could take up its next image (issue 39: the 256-px reader's cap).
- CRC-32 (zlib's polynomial) is in every index as well, for readers of trainfeed versions that
  checked it where google-crc32c had no compiled code, and is the only checksum of indexes of 3
  columns, written by those versions. zlib's (1.2.13, table-driven) takes ~20 µs per 83 KB photo,
  5 % of a plain upload's CPU; ISA-L's (the `isal` package: carry-less multiplication, PCLMULQDQ
  on x86, PMULL on ARM) ~1.6 µs, with the same values. Where `isal` has no wheel, zlib's.
"""
from __future__ import annotations

from crc32c import crc32c, hardware_based

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - a platform without an isal wheel
    from zlib import crc32

# Whether the CRC-32C runs on the CPU's own instruction (else crc32c's slice-by-8 table, ~5x
# slower: what `trainfeed doctor` shows).
CRC32C_IN_HARDWARE: bool = hardware_based

__all__ = ["CRC32C_IN_HARDWARE", "crc32", "crc32c"]
