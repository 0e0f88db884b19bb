"""Where a shard's encoder finds each binary value (trainfeed.formats.shards._locate_group): a
place is taken when the bytes there have the value's length and checksum, the CRC-32C (the
CRC-32 of the value is still computed once, for the index), the CRC-32 in a 3-column index
(issue 30 §2: the second CRC-32 per value cost 0.07 CPU-s of a 3,000-photo upload's 1.4)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from trainfeed.formats import shards as shard_format
from trainfeed.formats.crc import crc32c

VALUES = [b"first value", b"the second one", b"3rd"]


def laid_out(values: list[bytes]) -> memoryview:
    """Values as PLAIN encoding lays them: each after its 4-byte little-endian length."""
    return memoryview(b"".join(len(v).to_bytes(4, "little") + v for v in values))


def index_of(values: list[bytes], columns: int) -> np.ndarray:
    """What ShardEncoder.add records per value: (0, length, CRC-32[, CRC-32C])."""
    out = np.zeros((len(values), 1, columns), dtype=np.int64)
    for row, value in enumerate(values):
        out[row, 0, 1:3] = len(value), zlib.crc32(value)
        if columns > shard_format.CRC32C_COLUMN:
            out[row, 0, shard_format.CRC32C_COLUMN] = crc32c(value)
    return out


@pytest.mark.parametrize("columns", [shard_format.INDEX_COLUMNS, shard_format.CRC32C_COLUMN])
def test_every_value_is_located_after_its_length(columns: int) -> None:
    out = index_of(VALUES, columns)
    assert shard_format._locate_group(laid_out(VALUES), 1000, out)
    starts = [1000 + 4 + sum(4 + len(v) for v in VALUES[:i]) for i in range(len(VALUES))]
    assert out[:, 0, 0].tolist() == starts


def test_with_a_crc32c_column_the_place_is_checked_by_its_crc32c() -> None:
    """A CRC-32C that is not the bytes' refuses the place even where the CRC-32 matches: the
    check no longer computes a second CRC-32 per value."""
    out = index_of(VALUES, shard_format.INDEX_COLUMNS)
    out[1, 0, shard_format.CRC32C_COLUMN] ^= 1
    assert not shard_format._locate_group(laid_out(VALUES), 0, out)


def test_without_a_crc32c_column_the_place_is_checked_by_its_crc32() -> None:
    out = index_of(VALUES, shard_format.CRC32C_COLUMN)
    out[2, 0, shard_format.CRC32_COLUMN] ^= 1
    assert not shard_format._locate_group(laid_out(VALUES), 0, out)


def test_a_value_behind_a_page_header_is_found_past_it() -> None:
    """Bytes between two values (a page header) are skipped: the search goes on from there."""
    data = memoryview(laid_out(VALUES[:1]).tobytes() + b"\x15page header\x00"
                      + laid_out(VALUES[1:]).tobytes())
    out = index_of(VALUES, shard_format.INDEX_COLUMNS)
    assert shard_format._locate_group(data, 0, out)
    assert data[int(out[1, 0, 0]):int(out[1, 0, 0]) + len(VALUES[1])].tobytes() == VALUES[1]


def test_packed_values_are_checksummed_in_place_not_copied() -> None:
    """A row group's values read into one buffer are handed to the checksums as numpy views of
    that buffer (a copy per photo cost 2 µs; a memoryview would pin the buffer), and checksum
    the same."""
    data = bytearray(b"".join(VALUES))
    offsets = np.cumsum([0] + [len(v) for v in VALUES], dtype=np.int64)
    packed = shard_format.PackedValues(memoryview(data), offsets)
    views = list(shard_format._values_of(packed))
    held = np.frombuffer(data, dtype=np.uint8)
    assert all(np.shares_memory(view, held) for view in views)
    assert [crc32c(v) for v in views] == [crc32c(v) for v in VALUES]
    assert [zlib.crc32(v) for v in views] == [zlib.crc32(v) for v in VALUES]
    assert list(shard_format._values_of(VALUES)) == VALUES
