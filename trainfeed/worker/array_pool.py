"""Batch arrays recycled once nobody holds them, so the kernel does not zero every batch again.

A batch of 256 ImageNet crops is a 38 MB array. Allocated fresh, it is mapped fresh (glibc maps
anything over 32 MB on its own, and numpy asks for huge pages above 4 MB), and the first write to
each page makes the kernel zero it: measured with `perf` on the train workload, 8 % of the
reader's CPU went to `clear_page_erms` under the resize that writes the crops, and twice as much
in two readers sharing the machine. Reusing an array costs nothing of the kind.

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

    def __init__(self, keep: int = DEFAULT_KEEP):
        if keep < 1:
            raise ValueError(f"keep must be ≥ 1, got {keep}")
        self.keep = keep
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
                    del self._handed[i]  # (by index: deque.remove would compare arrays)
                    self._handed.append(array)
                    self.reused += 1
                    return array
            array = np.empty(shape, want)
            self._handed.append(array)
            if len(self._handed) > self.keep:
                self._handed.popleft()
            return array
