"""Batch arrays and read buffers recycled once nobody holds them, so the kernel does not zero
them again.

A batch of 256 ImageNet crops is a 38 MB array. Allocated fresh, it is mapped fresh (glibc maps
anything over 32 MB on its own, and numpy asks for huge pages above 4 MB), and the first write to
each page makes the kernel zero it: measured with `perf` on the train workload, 8 % of the
reader's CPU went to `clear_page_erms` under the resize that writes the crops, and twice as much
in two readers sharing the machine. Reusing an array costs nothing of the kind. The same goes
for the buffers a row group's JPEGs are read into (~8 MB each, `buffer`): 3 % of the reader's
CPU zeroed them before `preadv` overwrote them.

An array is reused only when Python says nobody else can reach its memory: its reference count
is the pool's own. Every numpy view holds a reference to the array that owns the memory
(`view.base`), and so do torch tensors made with `torch.from_numpy`, memoryviews, DLPack
capsules and TensorFlow tensors that alias a numpy array, so a batch the trainer (or a slice of
it, or a tensor sharing it) still holds is never written over.

The count the pool itself accounts for is measured once, not written down: CPython versions
differ in whether a loop variable holds a reference of its own (3.14 borrows it), and a wrong
constant would either never reuse or, worse, reuse a batch still in use.
"""
from __future__ import annotations

import sys
import threading
from collections import deque

import numpy as np

# `buffer` rounds what it allocates up to a multiple of this, so that buffers of similar sizes
# (the row groups of one dataset differ by a few records) can stand in for one another.
BUFFER_GRANULE = 1 << 20

# Arrays a pool keeps. A reader has a few batches in flight (two converting, the prefetch queue,
# the one the trainer holds): with more than this, the oldest is left to the trainer and the pool
# allocates, as if it were not there.
DEFAULT_KEEP = 8


def _references(arrays: deque[np.ndarray], i: int) -> int:
    """sys.getrefcount of arrays[i], counted the same way for the calibration and the pool."""
    return sys.getrefcount(arrays[i])


def _pool_only_references() -> int:
    """What `_references` says of an array that nothing but the deque holds."""
    probe: deque[np.ndarray] = deque([np.empty(0)])
    return _references(probe, 0)


_POOL_ONLY = _pool_only_references()


class ArrayPool:
    """`empty(shape, dtype)`: like np.empty, but the memory of a batch nobody holds any more."""

    def __init__(self, keep: int = DEFAULT_KEEP, keep_bytes: int | None = None):
        """`keep` arrays at most, and, if `keep_bytes` is set, no more bytes than that (but at
        least the newest array): what the pool can hold on to once its arrays are let go."""
        if keep < 1:
            raise ValueError(f"keep must be ≥ 1, got {keep}")
        if keep_bytes is not None and keep_bytes < 0:
            raise ValueError(f"keep_bytes must be ≥ 0, got {keep_bytes}")
        self.keep = keep
        self.keep_bytes = keep_bytes
        self.reused = 0  # how many arrays came from the pool (for tests and `trainfeed doctor`)
        self._handed: deque[np.ndarray] = deque()
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        want = np.dtype(dtype)
        with self._lock:
            for i in range(len(self._handed)):
                if _references(self._handed, i) != _POOL_ONLY:
                    continue
                array = self._handed[i]
                if array.shape == tuple(shape) and array.dtype == want:
                    return self._reuse(i)
            return self._hand(np.empty(shape, want))

    def buffer(self, nbytes: int) -> np.ndarray:
        """`nbytes` uint8 as the first bytes of a pooled buffer nobody holds any more, of at
        least `nbytes` and at most twice that (a small read does not pin a large buffer).

        The view holds its buffer (`view.base`), and so does anything made from the view
        (`pa.py_buffer`, memoryviews, the Arrow arrays and slices built on them): the buffer
        is free only when all of those are gone. For reads of varying sizes (a row group's
        payloads) that would otherwise each map and zero fresh pages."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be ≥ 0, got {nbytes}")
        with self._lock:
            best, best_size = -1, 0
            for i in range(len(self._handed)):
                if _references(self._handed, i) != _POOL_ONLY:  # (before binding it here)
                    continue
                candidate = self._handed[i]
                if (candidate.ndim == 1 and candidate.dtype == np.uint8
                        and nbytes <= candidate.size <= 2 * max(nbytes, BUFFER_GRANULE)
                        and (best < 0 or candidate.size < best_size)):
                    best, best_size = i, candidate.size
            if best >= 0:
                base = self._reuse(best)
            else:
                size = -(-max(nbytes, 1) // BUFFER_GRANULE) * BUFFER_GRANULE
                base = self._hand(np.empty(size, np.uint8))
            return base[:nbytes]

    def _reuse(self, i: int) -> np.ndarray:
        """The pool's array i, handed out again (now the newest); under the lock."""
        array = self._handed[i]
        del self._handed[i]  # (by index: deque.remove would compare arrays)
        self._handed.append(array)
        self.reused += 1
        return array

    def _hand(self, array: np.ndarray) -> np.ndarray:
        """Keeps `array` among the pool's (the oldest are let go beyond `keep` arrays or
        `keep_bytes`); under the lock."""
        self._handed.append(array)
        held = sum(a.nbytes for a in self._handed) if self.keep_bytes is not None else 0
        while len(self._handed) > self.keep or (
                self.keep_bytes is not None and len(self._handed) > 1 and held > self.keep_bytes):
            held -= self._handed.popleft().nbytes
        return array
