"""The CRC-32 an upload writes in its payload indexes (trainfeed.formats.crc): ISA-L's where the
`isal` package is installed (a declared dependency: ~12x zlib's on 83 KB photos, issue 30 §2),
always zlib's values, on every kind of buffer a packer hands it."""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from isal import isal_zlib

from trainfeed.formats import crc


def test_it_is_isa_l_s_where_isal_is_installed() -> None:
    assert crc.crc32 is isal_zlib.crc32


@pytest.mark.parametrize("size", [0, 1, 7, 64, 4096, 83_000, 1 << 20])
def test_it_gives_zlib_s_values(size: int) -> None:
    data = os.urandom(size)
    view = np.frombuffer(bytearray(b"xx" + data), dtype=np.uint8)[2:]
    assert crc.crc32(data) == zlib.crc32(data)
    assert crc.crc32(memoryview(data)) == zlib.crc32(data)
    assert crc.crc32(view) == zlib.crc32(data)  # a numpy view, as PackedValues hands them
    assert crc.crc32(data, 12345) == zlib.crc32(data, 12345)
