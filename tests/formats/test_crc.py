"""The checksums of indexed values (trainfeed.formats.crc).

- The CRC-32 an upload writes in its payload indexes: ISA-L's where the `isal` package is
  installed (a declared dependency: ~12x zlib's on 83 KB photos, issue 30 §2), always zlib's
  values, on every kind of buffer a packer hands it.
- The CRC-32C readers check: the standard one, and a reader's check of a large value runs
  without the GIL (issue 39: google-crc32c, used before, held it for ~18 µs per raw 256-px
  image, during which no decode thread could take up its next image)."""
from __future__ import annotations

import os
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from isal import isal_zlib

from trainfeed.formats import crc
from trainfeed.formats.crc import crc32, crc32c
from trainfeed.formats.shards import CRC32_COLUMN, CRC32C_COLUMN, INDEX_COLUMNS
from trainfeed.io.partition_reader import _checksum_of

# Long enough that a thread waiting for the GIL gets it while the hash runs (~5 ms in hardware).
LARGE = 64 << 20


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


def test_the_checksums_are_the_standard_ones() -> None:
    """The check values of the CRC catalogue (the CRC of the ASCII digits 1 to 9)."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32(b"123456789") == 0xCBF43926


def test_a_numpy_view_and_a_memoryview_checksum_as_their_bytes() -> None:
    data = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8)
    expected = crc32c(data[10:90_000].tobytes())
    assert crc32c(data[10:90_000]) == expected
    assert crc32c(memoryview(data)[10:90_000]) == expected


@pytest.fixture
def only_voluntary_switches() -> Iterator[None]:
    """No thread is made to drop the GIL (a switch interval of an hour): another thread runs
    Python only while the one holding the GIL lets it go of its own accord."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(3600.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def ran_python_during(hash_value: Callable[[Any], int], attempts: int = 50) -> bool:
    """Whether a second thread ran Python while `hash_value` hashed LARGE bytes.

    The second thread counts and gives the GIL back after every count (time.sleep(0)); with no
    forced switches (`only_voluntary_switches`) it can count between reading `before` and
    `after` only while `hash_value` has let the GIL go. A function that keeps the GIL gives 0
    counts every time; one that lets it go gives some on the first attempts that the thread is
    not kept off the CPU (a busy machine), hence several attempts."""
    data = np.zeros(LARGE, np.uint8)
    counts = [0]
    done = threading.Event()

    def count() -> None:
        while not done.is_set():
            counts[0] += 1
            time.sleep(0)  # lets the GIL go

    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    try:
        for _ in range(attempts):
            before = counts[0]
            hash_value(data)
            if counts[0] > before:
                return True
        return False
    finally:
        done.set()
        counter.join()


@pytest.mark.parametrize("columns", [INDEX_COLUMNS, CRC32C_COLUMN])
def test_the_readers_check_lets_other_threads_run_while_it_hashes(
        only_voluntary_switches: None, columns: int) -> None:
    """The check a reader makes of each value, for an index with a CRC-32C and for one with the
    CRC-32 alone, lets the GIL go while it hashes a large value: the decode threads go on."""
    checked = _checksum_of(columns)
    assert checked is not None
    column, hash_value = checked
    assert column == (CRC32C_COLUMN if columns == INDEX_COLUMNS else CRC32_COLUMN)
    assert ran_python_during(hash_value)


def test_a_hash_that_keeps_the_gil_is_caught(only_voluntary_switches: None) -> None:
    """The probe itself: a hash run with the GIL held (crc32c told never to let it go) gives
    the second thread no count."""
    assert not ran_python_during(lambda data: crc32c(data, gil_release_mode=0), attempts=5)
