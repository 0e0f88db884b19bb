"""Decoded pixels through shared memory, for a decoder on the trainer's own host.

Over the network each image costs the trainer its socket reads and Flight's joining of the
message (about 0.3 ms of CPU per 224x224x3 image on one core: docs/benchmarks.md). A decoder on
the same host instead writes the pixels of a request straight into memory the trainer made for
it, and the Flight stream carries only the small fields and which images decoded.

The trainer gives each call room in a sealed memfd (`SharedPixels`: kept, and its bytes reused
once the pixels of their call are dropped; consecutive calls' bytes one after another, so that a
batch spanning two partitions needs no copy), allocated by the trainer (`posix_fallocate`: its
memory, charged to it), sealed against shrinking and growing, and named
`trainfeed-pixels-<128 random bits>`. The request names it as `"<pid>/<fd>/<name>"` and where
its bytes start (`shared_offset`); the decoder (`PixelsWriter`) opens `/proc/<pid>/fd/<fd>`
and maps only the request's pixel bytes (from the start of the page they begin in), and only
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
import threading
import weakref
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from trainfeed.errors import DecoderRefusedError

__all__ = ["NO_SHARED_PIXELS", "PixelsCall", "PixelsWriter", "SharedPixels",
           "SharedPixelsUnavailable", "is_local", "pixel_bytes"]

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
    """A sealed memfd of the trainer's, kept from call to call: making fresh memory costs
    more than the pixels' transport (on the project VM, allocating, mapping and freeing 150 KB
    cost ~0.3 ms, copying it into warm memory 0.03 ms).

    Calls take room in it with `call(size)`: right after the previous call's bytes, so that
    consecutive calls' pixels (one partition's and the next's) lie one after another and a
    batch spanning both is a view of this memory, not a copy
    (trainfeed.decode.remote.client.received_pixels); from the start again once the end is
    reached. A call's bytes are free again once the last column made from them is dropped
    (`PixelsCall.end`). Thread-safe: calls of several threads may share one memfd, and the
    bytes come back from whichever thread drops the last column."""

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
        # (Reentrant: bytes come back when an array is dropped, which may happen inside.)
        self._lock = threading.RLock()
        self._taken: dict[int, int] = {}  # start -> end of the calls whose bytes are in use
        self._next = 0  # where the next call goes if it fits

    def call(self, size: int) -> PixelsCall | None:
        """Room for one call's `size` pixel bytes: after the previous call's, else from the
        start; None if neither is free (or the memfd is closed)."""
        if not 0 < size <= self.capacity:
            raise ValueError(f"a call of {size} bytes does not fit this {self.capacity}-byte "
                             f"memfd")
        with self._lock:
            if self._mapped is None:
                return None
            taken = tuple(self._taken.items())  # (a call ending inside changes the dict)
            for start in (self._next, 0):
                end = start + size
                if end <= self.capacity and all(e <= start or end <= s for s, e in taken):
                    self._taken[start] = end
                    self._next = end
                    # (numpy's view: an Arrow buffer's slice is read-only, numpy's slices are
                    # not, and torch warns on read-only arrays. Its slices' base is this
                    # array, so the call's bytes are in use while any of them is.)
                    return PixelsCall(self, start, np.frombuffer(self._mapped, np.uint8,
                                                                 count=size, offset=start))
        return None

    @property
    def idle(self) -> bool:
        """No call's bytes are in use."""
        with self._lock:
            return not self._taken

    def _release(self, start: int, idle: Callable[[SharedPixels], None] | None) -> None:
        with self._lock:
            self._taken.pop(start, None)
            now_idle = not self._taken
        if now_idle and idle is not None:
            idle(self)

    def close(self) -> None:
        """Closes the descriptor and drops the mapping (idempotent); columns still using it
        keep it mapped until they are dropped, and a decoder's own descriptor stays valid
        until its call ends."""
        fd, self._fd = self._fd, None
        self._mapped = None
        if fd is not None:
            os.close(fd)


class PixelsCall:
    """One call's pixels: bytes [offset, offset + len(pixels)) of a SharedPixels memfd, which
    the request names (`address`, `offset`). Not thread-safe: one call uses one."""

    def __init__(self, memory: SharedPixels, offset: int, pixels: np.ndarray):
        self.memory = memory
        self.address = memory.address
        self.offset = offset
        self._pixels: np.ndarray | None = pixels

    def column(self, start: int, rows: int, image_bytes: int,
               validity: pa.Array) -> pa.Array:
        """`rows` images of `image_bytes` each from byte `start` of this call's bytes on, as a
        fixed-size binary column (zero-copy, null where `validity` is false); raises
        DecoderRefusedError for rows outside the call or a validity column that is not one
        boolean per row."""
        assert self._pixels is not None, "the call ended"
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

    def end(self, clean: bool, idle: Callable[[SharedPixels], None] | None = None) -> None:
        """Ends the call. `clean`: its bytes are free for another call once no column of it
        is left (at once if none is), and then `idle(memory)` if no other call uses the
        memfd. Not clean (a call cut off, whose decoder may still write there): its bytes are
        never used again."""
        pixels, self._pixels = self._pixels, None
        if clean and pixels is not None:
            weakref.finalize(pixels, self.memory._release, self.offset, idle)


class PixelsWriter:
    """A decoder's view of the memfd a request names, checked (see the module docstring).
    Raises SharedPixelsUnavailable when it cannot be opened here, DecoderRefusedError when it is
    not what the request says."""

    def __init__(self, address: str, size: int, offset: int = 0):
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
        # (A mapping starts on a page: the page the request's bytes start in, which the
        # previous call's last bytes may share; only the request's bytes are written.)
        page = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            # (Not populated: the decoder's page tables grow only as it writes pixels.)
            self._mapped = mmap.mmap(fd, _checked(fd, name, offset + size) - page,
                                     flags=mmap.MAP_SHARED, offset=page)
        finally:
            os.close(fd)
        self.size = size
        self._view: np.ndarray | None = np.frombuffer(self._mapped, np.uint8, count=size,
                                                      offset=offset - page)

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
    """`size` (where the request's pixels end), once the open descriptor is shown to be the
    named, sealed, allocated memfd, of at least that size."""
    if os.readlink(f"/proc/self/fd/{fd}") != f"/memfd:{name} (deleted)":
        raise SharedPixelsUnavailable(f"no shared memfd {name} here: not on the trainer's host?")
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    if seals & (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) != (fcntl.F_SEAL_SHRINK
                                                               | fcntl.F_SEAL_GROW):
        raise DecoderRefusedError("the shared memfd is not sealed against resizing")
    stat = os.fstat(fd)
    if stat.st_size < size:
        raise DecoderRefusedError(f"the shared memfd has {stat.st_size} bytes; the request's "
                                  f"pixels end at byte {size}")
    if stat.st_blocks * 512 < stat.st_size:
        raise DecoderRefusedError("the shared memfd is not allocated in full by the trainer")
    return size
