"""A budget of bytes shared by threads: work that announces its memory waits for room.

Uploads decode or transcode whole images on many threads (`--check-images`, `--jpeg-restarts`).
Thread counts bound how many run at once, not what they hold: sixteen threads each rewriting a
16,384² JPEG hold 16 x 512 MiB of DCT coefficients. So each task reserves what its header
announces before it starts, and waits while the reservations in flight leave no room. A task
larger than the whole budget runs alone (it waits for every other task to end, and no task
starts beside it), so one large file never fails for want of budget, and never shares memory.

Reservations are granted in arrival order: a large task at the head of the queue is not starved
by small ones slipping past it. Waiting is never silent: a wait over 5 s logs what it waits for.

Memory a task freed is handed back to the system when its reservation was large (`malloc_trim`,
glibc only): libjpeg allocates a component's coefficients in one block, and blocks under glibc's
dynamic mmap threshold (up to 32 MiB) land in the freeing thread's own heap arena, which keeps
them. Measured: eight 8,000² JPEGs rewritten one at a time on 16 threads peaked at 707 MB of
RSS without the trim, 331 MB with one arena (what the trim gets back).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

# A wait longer than this is logged (the house rule: no silent wait over 5 s).
LOG_WAIT_S = 5.0
# Reservations from this size on hand their freed memory back to the system when they end: a
# trim walks every heap arena (well under a millisecond here), noise beside the seconds that
# decoding or rewriting 16 MiB of pixels or coefficients takes; smaller tasks skip it.
TRIM_BYTES = 16 << 20


def _malloc_trim() -> ctypes._NamedFuncPointer | None:
    """glibc's malloc_trim, or None elsewhere (musl, macOS: their allocators differ)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()


class MemoryBudget:
    """`total` bytes shared by threads, reserved in arrival order. Thread-safe.

    Example:
        >>> budget = MemoryBudget(100, "demo")
        >>> with budget.reserve(60, "a.jpg"):
        ...     budget.in_use
        60
        >>> budget.in_use
        0
    """

    def __init__(self, total: int, purpose: str):
        if total < 1:
            raise ValueError(f"a memory budget must be ≥ 1 byte, got {total}")
        self.total = total
        self.purpose = purpose
        self.in_use = 0
        self.peak = 0  # the most bytes reserved at once (tests, reports)
        self._holders = 0
        self._queue: deque[object] = deque()
        self._changed = threading.Condition()

    def _fits(self, nbytes: int) -> bool:
        return self._holders == 0 or self.in_use + nbytes <= self.total

    @contextmanager
    def reserve(self, nbytes: int, what: str) -> Iterator[None]:
        """Holds `nbytes` of the budget for the `with` block, waiting until they fit (or,
        when `nbytes` exceeds the whole budget, until nothing else is reserved). `what` names
        the task in the log line of a long wait."""
        ticket = object()
        with self._changed:
            self._queue.append(ticket)
            started = time.monotonic()
            next_log = started + LOG_WAIT_S
            while self._queue[0] is not ticket or not self._fits(nbytes):
                self._changed.wait(timeout=max(0.0, next_log - time.monotonic()))
                if time.monotonic() >= next_log:
                    logger.info(
                        "%s: %s has waited %.0f s for %.0f MiB of the budget of %.0f MiB "
                        "(%.0f MiB held by %d task(s) still running); it starts when they "
                        "end", self.purpose, what, time.monotonic() - started, nbytes / 2**20,
                        self.total / 2**20, self.in_use / 2**20, self._holders)
                    next_log = time.monotonic() + LOG_WAIT_S
            self._queue.popleft()
            self.in_use += nbytes
            self._holders += 1
            self.peak = max(self.peak, self.in_use)
            self._changed.notify_all()  # the next in line may fit too
        try:
            yield
        finally:
            if _trim is not None and nbytes >= TRIM_BYTES:
                _trim(0)  # before the next task may start: its memory is then truly free
            with self._changed:
                self.in_use -= nbytes
                self._holders -= 1
                self._changed.notify_all()
