"""Decoded pixels through shared memory, for a decoder on the trainer's own host.

Over the network each image costs the trainer its socket reads and Flight's joining of the
message (about 0.3 ms of CPU per 224x224x3 image on one core: docs/benchmarks.md). A decoder on
the same host instead writes the pixels of a request straight into memory the trainer made for
it, and the Flight stream carries only the small fields and which images decoded.

The trainer gives each call a sealed memfd (`SharedPixels`, reused once the pixels of its last
call are dropped) of at least the request's pixel bytes, allocated by the trainer
(`posix_fallocate`: its memory, charged to it), sealed against shrinking and growing, and named
`trainfeed-pixels-<128 random bits>`. The request names it as `"<pid>/<fd>/<name>"`; the decoder
(`PixelsWriter`) opens `/proc/<pid>/fd/<fd>` and maps only the request's pixel bytes, and only
if it is that memfd (the name, which only the trainer and the decoders it asks know, read back
from the decoder's own descriptor), sealed, large enough, and allocated in full. So:

- a trainer cannot make a decoder allocate: the decoder maps memory the trainer allocated, of
  the size its own request bounds (records x image bytes), and writes nothing else;
- a trainer cannot make a decoder write outside that memfd (the name check), nor fault it with
  SIGBUS by shrinking the file (the seal);
- a decoder cannot make a trainer read out of bounds: the trainer computes every offset itself
  from the rows it counted, each checked against the request, in a mapping the decoder cannot
  shrink.

A decoder that cannot open the memfd (another host, another pid namespace) refuses the call
with `NO_SHARED_PIXELS`, and the trainer asks again over the network.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import re
import secrets
import weakref
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from trainfeed.errors import DecoderRefusedError

__all__ = ["NO_SHARED_PIXELS", "PixelsWriter", "SharedPixels", "SharedPixelsUnavailable",
           "is_local", "pixel_bytes"]

PREFIX = "trainfeed-pixels-"
# "<pid>/<fd>/<name>": what a request may name, and nothing else.
_ADDRESS = re.compile(r"([1-9][0-9]{0,9})/([0-9]{1,9})/(" + PREFIX + r"[0-9a-f]{32})")
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
# Flight's extra_info of a refusal that means "ask me again over the network".
NO_SHARED_PIXELS = b"no-shared-pixels"
# MAP_POPULATE: the pages are mapped in one call, not faulted in one by one (Linux).
_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
LOCAL_HOSTS = ("127.", "localhost:", "[::1]:")


def is_local(address: str) -> bool:
    """Whether a decoder's "host:port" is on this host's loopback (shared memory may work)."""
    return address.startswith(LOCAL_HOSTS)


def pixel_bytes(records: int, image_bytes: int, image_fields: int) -> int:
    """Bytes of a request's pixels: each image field's images one after another."""
    return records * image_bytes * image_fields


class SharedPixelsUnavailable(DecoderRefusedError):
    """The decoder cannot open the trainer's memfd (not the same host or pid namespace):
    the trainer asks again over the network."""


class SharedPixels:
    """A sealed memfd of the trainer's, reused from call to call: making fresh memory costs
    more than the pixels' transport (on the project VM, allocating, mapping and freeing 150 KB
    cost ~0.3 ms, copying it into warm memory 0.03 ms).

    `view(size)` is one call's pixels; the columns `column()` makes from it keep it alive, and
    `recycle()` hands the memfd to `put` once the last of them is gone. Not thread-safe: one
    call at a time uses one."""

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"a shared memfd needs a capacity > 0, got {capacity}")
        self.name = PREFIX + secrets.token_hex(16)
        self.capacity = capacity
        self.pid = os.getpid()  # (a forked child makes its own: both would write to one)
        self._fd: int | None = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self._fd, capacity)
            os.posix_fallocate(self._fd, 0, capacity)  # the trainer's memory, not the decoder's
            fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, _SEALS)
            self._mapped: mmap.mmap | None = mmap.mmap(self._fd, capacity, flags=_FLAGS)
        except BaseException:
            self.close()
            raise
        self.address = f"{self.pid}/{self._fd}/{self.name}"
        self._pixels: np.ndarray | None = None

    def view(self, size: int) -> None:
        """Starts a call of `size` pixel bytes (at most the capacity)."""
        if self._mapped is None or not 0 < size <= self.capacity:
            raise ValueError(f"a call of {size} bytes does not fit this {self.capacity}-byte "
                             f"memfd (or it is closed)")
        # (numpy's view: an Arrow buffer's slice is read-only, numpy's slices are not, and
        # torch warns on read-only arrays.)
        self._pixels = np.frombuffer(self._mapped, np.uint8, count=size)

    def column(self, start: int, rows: int, image_bytes: int,
               validity: pa.Array) -> pa.Array:
        """`rows` images of `image_bytes` each from byte `start` of this call's view on, as a
        fixed-size binary column (zero-copy, null where `validity` is false); raises
        DecoderRefusedError for rows outside the view or a validity column that is not one
        boolean per row."""
        assert self._pixels is not None, "view() first"
        end = start + rows * image_bytes
        if not 0 <= start <= end <= len(self._pixels):
            raise DecoderRefusedError(f"a decoder sent rows at bytes [{start}, {end}) of a "
                                      f"{len(self._pixels)}-byte call")
        if (validity.type != pa.bool_() or len(validity) != rows or validity.null_count
                or validity.offset):
            raise DecoderRefusedError(f"a decoder sent {validity.type} of {len(validity)} "
                                      f"values as the validity of {rows} images")
        bitmap = None if validity.false_count == 0 else validity.buffers()[1]
        return pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(image_bytes), rows, [bitmap, pa.py_buffer(self._pixels[start:end])])

    def recycle(self, put: Callable[[SharedPixels], None]) -> None:
        """Ends the call: `put(self)` once no column of it is left (at once if none is)."""
        pixels, self._pixels = self._pixels, None
        if pixels is None:
            put(self)
        else:
            weakref.finalize(pixels, put, self)

    def close(self) -> None:
        """Closes the descriptor and drops the mapping (idempotent); columns still using it
        keep it mapped until they are dropped, and a decoder's own descriptor stays valid
        until its call ends."""
        fd, self._fd = self._fd, None
        self._mapped = self._pixels = None
        if fd is not None:
            os.close(fd)


class PixelsWriter:
    """A decoder's view of the memfd a request names, checked (see the module docstring).
    Raises SharedPixelsUnavailable when it cannot be opened here, DecoderRefusedError when it is
    not what the request says."""

    def __init__(self, address: str, size: int):
        found = _ADDRESS.fullmatch(address) if isinstance(address, str) else None
        if found is None:
            raise DecoderRefusedError(f"shared_pixels {str(address)[:100]!r} is not "
                                      f"'<pid>/<fd>/{PREFIX}<32 hex digits>'")
        pid, number, name = found.groups()
        try:
            fd = os.open(f"/proc/{pid}/fd/{number}", os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise SharedPixelsUnavailable(f"cannot open the trainer's shared memfd here "
                                     f"({e.strerror}): not on its host?") from None
        try:
            # (Not populated: the decoder's page tables grow only as it writes pixels.)
            self._mapped = mmap.mmap(fd, _checked(fd, name, size), flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.size = size
        self._view: np.ndarray | None = np.frombuffer(self._mapped, np.uint8)

    def write(self, start: int, data: np.ndarray) -> None:
        """`data`'s bytes at byte `start` (a decoder's own bound: inside the memfd)."""
        assert self._view is not None, "the memfd is closed"
        flat = data.reshape(-1)
        if not 0 <= start <= start + flat.size <= self.size:
            raise DecoderRefusedError(f"pixels at bytes [{start}, {start + flat.size}) do "
                                      f"not fit the {self.size}-byte memfd")
        self._view[start:start + flat.size] = flat

    def close(self) -> None:
        """Unmaps (idempotent)."""
        if self._view is not None:
            self._view = None
            self._mapped.close()


def _checked(fd: int, name: str, size: int) -> int:
    """`size`, once the open descriptor is shown to be the named, sealed, allocated memfd."""
    if os.readlink(f"/proc/self/fd/{fd}") != f"/memfd:{name} (deleted)":
        raise SharedPixelsUnavailable(f"no shared memfd {name} here: not on the trainer's host?")
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    if seals & (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) != (fcntl.F_SEAL_SHRINK
                                                               | fcntl.F_SEAL_GROW):
        raise DecoderRefusedError("the shared memfd is not sealed against resizing")
    stat = os.fstat(fd)
    if stat.st_size < size:
        raise DecoderRefusedError(f"the shared memfd has {stat.st_size} bytes; the request's "
                                  f"pixels are {size}")
    if stat.st_blocks * 512 < stat.st_size:
        raise DecoderRefusedError("the shared memfd is not allocated in full by the trainer")
    return size
